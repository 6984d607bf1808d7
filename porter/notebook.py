"""Jupyter notebooks (``.ipynb``) as porter sources.

A notebook is read as one program: the source of its Python code cells, in order, joined
with one marker line before each cell (``__porter_cell__(N)``), so that the rules see across
cells (the imports in cell 1, the device in cell 3, the loop in cell 7). After the rules ran,
the program is cut at the markers again and only the ``source`` of the cells whose code
changed is replaced in the file's JSON text: markdown, outputs, metadata, cell ids, key order,
indentation, the ``ensure_ascii`` style and whether a source is a list of lines or one string
stay byte for byte as they were. The result is validated with nbformat before it is written.

Cell numbers are 1-based positions among all the cells of the notebook, markdown and raw
cells included: "cell 7" is the seventh cell from the top, as the user counts them
(execution counts change with every run; nbformat's list index is 0-based).

IPython syntax is masked before the rules see it and restored byte for byte afterwards:
line magics (``%matplotlib inline``), shell escapes (``!pip install ...``, ``files = !ls``),
help (``x?``, ``??x``) and the first line of a cell magic become a stand-in line
``__porter_ipython__(K)`` that no rule matches, one per physical line (backslash-continued
magics included), only where a Python statement could start (never inside brackets or
strings) and only where the line is not Python. Cells of the cell magics whose body is Python
(``%%time``, ``%%timeit``, ``%%capture``, ``%%prun``) are part of the program; every other
cell magic (``%%bash``, ``%%writefile``, ``%%html``...) leaves its cell alone.

Imports a fix needs (LibCST puts them at the head of the program, before the first marker)
go into the notebook's imports cell: the first Python code cell with a module-level import,
after its last module-level import; in a notebook without imports, the top of the first
Python code cell, after its leading IPython lines and comments.
"""
from __future__ import annotations

import ast
import copy
import difflib
import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from porter import engine
from porter.engine import PorterError

SUFFIX = ".ipynb"
CELL_MARK = "__porter_cell__"
IPYTHON_MARK = "__porter_ipython__"
# cell magics whose body is Python and is run as such: the body is ported, the magic line kept
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})

_MARK_LINE = re.compile(rf"^{CELL_MARK}\((\d+)\)\n", re.M)
CONTINUED = "\0"  # (prefix of a continuation line in Masked.lines: restored as written)
_STAND_IN = re.compile(rf"^([ \t]*){IPYTHON_MARK}\((\d+)\)[ \t]*$")
_ASSIGN_ESCAPE = re.compile(r"^[ \t]*[A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*[ \t]*=[ \t]*[!%]")
_HELP = re.compile(r"^[ \t]*(?:\?{1,2}[ \t]*\S.*|[A-Za-z_][\w.]*(?:\(\))?[ \t]*\?{1,2})[ \t]*$")
_WS = re.compile(r"[ \t\n\r]*")


def is_notebook(path) -> bool:
    return str(path).endswith(SUFFIX)


def _nbformat():
    try:
        import nbformat
    except ImportError:
        raise PorterError("reading notebooks needs nbformat: pip install 'porter[notebooks]'") from None
    return nbformat


# --------------------------------------------------------------------------------------
# The file's JSON text: where each cell's source is
# --------------------------------------------------------------------------------------
@dataclass
class _Span:
    start: int  # offset of the source value in the file's text
    end: int
    is_list: bool
    elements: list[tuple[int, int]]  # offsets of the list's strings


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def _source_spans(text: str) -> list[Optional[_Span]]:
    """For each cell of the top-level ``cells`` list, where its ``source`` value lies."""
    decoder = json.JSONDecoder()
    scan = json.decoder.scanstring  # type: ignore[attr-defined]

    def obj(pos: int, on_key) -> int:
        assert text[pos] == "{"
        pos = _skip(text, pos + 1)
        if text[pos] == "}":
            return pos + 1
        while True:
            key, pos = scan(text, pos + 1)
            pos = _skip(text, pos)
            assert text[pos] == ":"
            pos = _skip(text, pos + 1)
            pos = on_key(key, pos)
            pos = _skip(text, pos)
            if text[pos] == "}":
                return pos + 1
            assert text[pos] == ","
            pos = _skip(text, pos + 1)

    def value(pos: int) -> int:
        return decoder.raw_decode(text, pos)[1]

    spans: list[Optional[_Span]] = []

    def cell_key(key: str, pos: int) -> int:
        if key != "source":
            return value(pos)
        if text[pos] != "[":
            end = value(pos)
            spans[-1] = _Span(pos, end, False, [(pos, end)])
            return end
        elements = []
        p = _skip(text, pos + 1)
        while text[p] != "]":
            end = value(p)
            elements.append((p, end))
            p = _skip(text, end)
            if text[p] == ",":
                p = _skip(text, p + 1)
        spans[-1] = _Span(pos, p + 1, True, elements)
        return p + 1

    def top_key(key: str, pos: int) -> int:
        if key != "cells" or text[pos] != "[":
            return value(pos)
        p = _skip(text, pos + 1)
        while text[p] != "]":
            spans.append(None)
            p = obj(p, cell_key) if text[p] == "{" else value(p)
            p = _skip(text, p)
            if text[p] == ",":
                p = _skip(text, p + 1)
        return p + 1

    obj(_skip(text, 0), top_key)
    return spans


def _ensure_ascii(text: str) -> bool:
    """Whether the file was written with json's ensure_ascii (non-ASCII text as \\u escapes)."""
    if not text.isascii():
        return False
    return re.search(r"(?<!\\)(?:\\\\)*\\u(?!00[0-7])[0-9a-fA-F]{4}", text) is not None


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _render_source(raw: str, span: _Span, source: str, ascii_only: bool) -> str:
    """The JSON text of ``source`` laid out like the value at ``span``."""
    if not span.is_list:
        return json.dumps(source, ensure_ascii=ascii_only)
    lines = source.splitlines(keepends=True)
    if not lines:
        return "[]"
    if span.elements:
        lead = raw[span.start + 1:span.elements[0][0]]
        trail = raw[span.elements[-1][1]:span.end - 1]
        sep = raw[span.elements[0][1]:span.elements[1][0]] if len(span.elements) > 1 else "," + lead
    else:  # an empty list: indent like the key, one level deeper
        key_indent = re.match(r"[ \t]*", raw[_line_start(raw, span.start):]).group(0)  # type: ignore[union-attr]
        if "\n" in raw[:span.start]:
            unit = " " * max(1, len(key_indent) // 3)
            lead, trail = "\n" + key_indent + unit, "\n" + key_indent
            sep = "," + lead
        else:
            lead = trail = ""
            sep = ", "
    return "[" + lead + sep.join(json.dumps(x, ensure_ascii=ascii_only) for x in lines) + trail + "]"


# --------------------------------------------------------------------------------------
# IPython syntax
# --------------------------------------------------------------------------------------
def _complete(text: str) -> bool:
    """Whether ``text`` ends outside brackets, strings and backslash continuations."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except tokenize.TokenError:
        return False
    except (SyntaxError, ValueError):
        return True
    return True


def _is_python(line: str) -> bool:
    try:
        compile(line.strip() or "pass", "<cell>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError:
        return False
    except (ValueError, RecursionError, MemoryError):
        return True
    return True


def _is_ipython(line: str) -> bool:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return False
    if not (stripped[0] in "%!?" or _ASSIGN_ESCAPE.match(line) or _HELP.match(line)):
        return False
    return not _is_python(stripped)


def _split_newline(line: str) -> tuple[str, str]:
    body = line.rstrip("\r\n")
    return body, line[len(body):]


def cell_magic(source: str) -> Optional[str]:
    """The name of the cell magic a cell starts with (``time`` for ``%%time``), else None."""
    m = re.match(r"%%([A-Za-z_][\w.]*)", source)
    return m.group(1) if m else None


def runs_python(source: str) -> bool:
    """Whether a code cell's source is Python to port: no cell magic, or one whose body is
    Python (``%%time``...); a ``%%bash`` or ``%%writefile`` cell is left alone."""
    name = cell_magic(source)
    return name is None or name in PYTHON_CELL_MAGICS


@dataclass
class Masked:
    text: str  # the cell with its IPython lines as stand-ins
    lines: dict[int, str]  # stand-in number -> the original line (no newline)
    where: dict[int, int]  # stand-in number -> its 1-based line in the cell


def mask(source: str, first: int = 0) -> Masked:
    """``source`` with each IPython line replaced by ``__porter_ipython__(K)`` (K from
    ``first``), at the line's indentation."""
    out: list[str] = []
    table: dict[int, str] = {}
    where: dict[int, int] = {}
    buf: list[str] = []
    continued = False
    indent = ""
    k = first
    for n, line in enumerate(source.splitlines(keepends=True), 1):
        body, nl = _split_newline(line)
        magic_start = n == 1 and body.startswith("%%")
        if continued or magic_start or (not buf and _is_ipython(body)):
            if not continued:  # a continuation line's stand-in takes its first line's indentation
                indent = body[:len(body) - len(body.lstrip(" \t"))]
            out.append(f"{indent}{IPYTHON_MARK}({k}){nl}")
            table[k], where[k] = (body if not continued else CONTINUED + body), n
            k += 1
            continued = body.endswith("\\") and not magic_start
            continue
        out.append(line)
        buf.append(line)
        if _complete("".join(buf) + ("" if nl else "\n")):
            buf = []
    return Masked("".join(out), table, where)


def unmask(text: str, lines: dict[int, str]) -> str:
    """Put the original IPython lines back in place of their stand-ins (each exactly once)."""
    seen: set[int] = set()
    out = []
    for line in text.splitlines(keepends=True):
        body, nl = _split_newline(line)
        m = _STAND_IN.match(body)
        if m and int(m.group(2)) in lines:
            k = int(m.group(2))
            if k in seen:
                raise PorterError(f"internal error: an IPython line was duplicated by a fix ({lines[k].strip()!r}); file left unchanged")
            seen.add(k)
            original = lines[k]
            if original.startswith(CONTINUED):
                out.append(original[len(CONTINUED):] + nl)
            else:
                out.append(m.group(1) + original.lstrip(" \t") + nl)
        else:
            out.append(line)
    return "".join(out)


# --------------------------------------------------------------------------------------
# The notebook
# --------------------------------------------------------------------------------------
@dataclass
class Cell:
    number: int  # 1-based among all cells
    cell_type: str
    source: str
    span: Optional[_Span]
    python: bool = False  # part of the program
    masked: Optional[Masked] = None
    why_left: str = ""  # why a code cell is not part of the program


@dataclass
class Notebook:
    text: str  # the file's text
    data: dict
    cells: list[Cell]
    ascii_only: bool
    program: str = ""
    marks: dict[int, int] = field(default_factory=dict)  # cell number -> program line of its marker
    imports_cell: Optional[int] = None

    def python_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.python]

    def cell(self, number: int) -> Cell:
        return self.cells[number - 1]

    def locate(self, line: int) -> tuple[int, int]:
        """Program line -> (cell number, line in the cell): :meth:`Program.locate`."""
        return Program(self.program, self.marks, {}, self.imports_cell).locate(line)

    def file_position(self, number: int, line: int, column: int) -> tuple[int, int]:
        """(line, column) in the .ipynb file's text, 1-based line and 0-based column, of a
        place in a cell (for SARIF): inside the JSON string that holds that source line."""
        cell = self.cell(number)
        span = cell.span
        if span is None:
            return 1, 0
        lines = cell.source.splitlines(keepends=True) or [""]
        line = min(max(line, 1), len(lines))
        if span.is_list and len(span.elements) == len(lines):
            start = span.elements[line - 1][0]
            before = lines[line - 1][:column]
        else:
            start = span.start
            before = "".join(lines[:line - 1]) + lines[line - 1][:column]
        offset = start + len(json.dumps(before, ensure_ascii=self.ascii_only)) - 1
        file_line = self.text.count("\n", 0, offset) + 1
        return file_line, offset - _line_start(self.text, offset)


def _language(data: dict) -> Optional[str]:
    meta = data.get("metadata") or {}
    for value in ((meta.get("kernelspec") or {}).get("language"), (meta.get("language_info") or {}).get("name")):
        if isinstance(value, str) and value:
            return value
    return None


def _join(source) -> str:
    return "".join(source) if isinstance(source, list) else (source or "")


def parse(text: str) -> Notebook:
    """Read a notebook's text, or raise a one-line :class:`PorterError`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PorterError(f"not a notebook: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise PorterError("not a notebook: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise PorterError("not a notebook: the JSON document is not an object")
    version = data.get("nbformat")
    if version != 4:
        hint = " (convert it: jupyter nbconvert --to notebook --nbformat 4)" if isinstance(version, int) and version < 4 else ""
        raise PorterError(f"nbformat {version} notebook; porter reads nbformat 4{hint}")
    nbformat = _nbformat()

    try:
        nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
        nbformat.validate(nb)
    except Exception as exc:  # nbformat's ValidationError and friends
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PorterError(f"not a valid nbformat 4 notebook: {first}") from None
    language = _language(data)
    if language is not None and language.lower() not in ("python", "python3", "ipython"):
        raise PorterError(f"the notebook's kernel language is {language}, not Python; porter reads Python notebooks")
    try:
        spans = _source_spans(text)
    except (AssertionError, IndexError, ValueError):
        raise PorterError("not a notebook: cannot read the layout of its cells") from None
    raw_cells = data.get("cells") or []
    if len(spans) != len(raw_cells):
        raise PorterError("not a notebook: cannot read the layout of its cells")
    cells = []
    for i, (raw, span) in enumerate(zip(raw_cells, spans), 1):
        cell = Cell(i, raw.get("cell_type", ""), _join(raw.get("source")), span)
        if cell.cell_type == "code":
            lang = ((raw.get("metadata") or {}).get("vscode") or {}).get("languageId")
            if isinstance(lang, str) and lang.lower() not in ("python", "ipython"):
                raise PorterError(f"cell {i} is a {lang} cell (metadata.vscode.languageId), not Python; porter reads Python cells only")
            if runs_python(cell.source):
                cell.python = True
            else:
                cell.why_left = f"%%{cell_magic(cell.source)} cell"
        cells.append(cell)
    notebook = Notebook(text, data, cells, _ensure_ascii(text))
    if CELL_MARK in text or IPYTHON_MARK in text:
        raise PorterError(f"the notebook uses the names {CELL_MARK} or {IPYTHON_MARK}, which porter reserves")
    _build_program(notebook)
    return notebook


def read(path: Path) -> tuple[Notebook, "object"]:
    """The notebook at ``path`` and its :class:`porter.sources.SourceText` (bytes, mode)."""
    from porter.sources import read_source

    src = read_source(path)
    return parse(src.text), src


def _has_import(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in tree.body)


class CellSyntaxError(PorterError):
    """A Python cell that does not parse (IPython lines masked): ``cell`` 1-based, ``line``
    1-based in the cell, ``column`` 1-based (0: unknown)."""

    def __init__(self, cell: int, line: int, column: int, msg: str) -> None:
        where = f"line {line}" + (f", column {column}" if column else "")
        super().__init__(f"cell {cell}: syntax error at {where}: {msg} (not Python?)")
        self.cell, self.line, self.column = cell, line, column


@dataclass
class Program:
    """Python cells as one program: ``text``, each cell's marker line (1-based), its masked
    source, and the imports cell (where the imports a fix needs go)."""

    text: str
    marks: dict[int, int]
    masked: dict[int, Masked]
    imports_cell: Optional[int]

    def locate(self, line: int) -> tuple[int, int]:
        """Program line -> (cell number, line in the cell); the head (before the first cell)
        is the imports cell's first line, a marker line its cell's first line."""
        best = None
        for number, at in self.marks.items():
            if at <= line and (best is None or at > self.marks[best]):
                best = number
        if best is None:
            return (self.imports_cell or 1, 1)
        return best, max(1, line - self.marks[best])


def build_program(cells: Sequence[tuple[int, str]]) -> Program:
    """The program of ``cells`` ((number, source) of each Python cell, in order). Raises
    :class:`CellSyntaxError` for a cell that is not Python."""
    parts = []
    marks: dict[int, int] = {}
    masked_cells: dict[int, Masked] = {}
    imports_cell = None
    line = 1
    k = 0
    for number, source in cells:
        masked = mask(source, k)
        k += len(masked.lines)
        masked_cells[number] = masked
        try:
            compile(masked.text, f"<cell {number}>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as exc:
            raise CellSyntaxError(number, exc.lineno or 1, exc.offset or 0, exc.msg) from None
        except (ValueError, RecursionError, MemoryError):
            pass  # the engine's own checks report it
        body = masked.text if masked.text.endswith("\n") or not masked.text else masked.text + "\n"
        marks[number] = line
        parts.append(f"{CELL_MARK}({number})\n{body}")
        line += 1 + body.count("\n")
        if imports_cell is None and _has_import(masked.text):
            imports_cell = number
    if imports_cell is None and cells:
        imports_cell = cells[0][0]
    return Program("".join(parts), marks, masked_cells, imports_cell)


def _build_program(nb: Notebook) -> None:
    program = build_program([(c.number, c.source) for c in nb.python_cells()])
    for cell in nb.python_cells():
        cell.masked = program.masked[cell.number]
    nb.program, nb.marks, nb.imports_cell = program.text, program.marks, program.imports_cell


def insertion_line(masked_text: str) -> int:
    return _insertion_line(masked_text)


# --------------------------------------------------------------------------------------
# Back from the program to the cells
# --------------------------------------------------------------------------------------
@dataclass
class Rebuilt:
    text: str  # the new file text
    cells: dict[int, tuple[str, str]]  # cell number -> (old source, new source), changed cells only
    line_map: list[tuple[int, int]]  # new program line (index 0 = line 1) -> (cell, line in cell)


def _insertion_line(masked_text: str) -> int:
    """0-based line of the cell before which imports a fix needs go: after the last
    module-level import, else after the leading stand-ins, comments and blank lines."""
    try:
        tree = ast.parse(masked_text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    if tree is not None:
        ends = [s.end_lineno for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom)) and s.end_lineno]
        if ends:
            return max(ends)
    lines = masked_text.splitlines()
    at = 0
    while at < len(lines) and (not lines[at].strip() or lines[at].lstrip().startswith("#") or _STAND_IN.match(lines[at])):
        at += 1
    return at


def _blank_tail(lines: list[str]) -> int:
    n = 0
    while n < len(lines) and not lines[len(lines) - 1 - n].strip():
        n += 1
    return n


def _trim_blank_tail(old: str, new: str) -> str:
    """``new`` without the blank lines a fix added at the end of its cell (code inserted
    before the next cell's marker keeps the blank lines that ended the cell, then adds its
    own): as many trailing blank lines as the cell had."""
    lines = new.splitlines(keepends=True)
    keep = _blank_tail(old.splitlines(keepends=True))
    extra = _blank_tail(lines) - keep
    if extra <= 0 or extra >= len(lines):
        return new
    return "".join(lines[:len(lines) - extra])


def split_program(nb: Notebook, program: str) -> tuple[dict[int, str], list[tuple[int, int]]]:
    """The new masked text of each Python cell, and the program's line map."""
    marks = list(_MARK_LINE.finditer(program))
    numbers = [int(m.group(1)) for m in marks]
    if numbers != [c.number for c in nb.python_cells()]:
        raise PorterError("internal error: a fix moved code across the notebook's cell boundaries; file left unchanged")
    head = program[:marks[0].start()] if marks else ""
    texts: dict[int, str] = {}
    line_map: list[tuple[int, int]] = []
    head_lines = head.splitlines(keepends=True)
    while head_lines and not head_lines[-1].strip():
        head_lines.pop()
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(program)
        number = numbers[i]
        body = program[m.end():end]
        cell = nb.cell(number)
        assert cell.masked is not None
        body = _trim_blank_tail(cell.masked.text, body)
        if cell.source and not cell.source.endswith("\n") and body.endswith("\n"):
            body = body[:-1]
        texts[number] = body
    inserted = 0
    at = 0
    if head_lines and nb.imports_cell is not None:
        body = texts[nb.imports_cell]
        lines = body.splitlines(keepends=True)
        at = _insertion_line(body)
        insert = list(head_lines)
        if at == len(lines) and lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
            insert[-1] = insert[-1].rstrip("\n")
        texts[nb.imports_cell] = "".join(lines[:at] + insert + lines[at:])
        inserted = len(insert)
    # the line map, for positions of findings in the new program
    home = nb.imports_cell or 1
    for i in range(head.count("\n")):
        line_map.append((home, at + 1 + min(i, max(inserted - 1, 0))))
    for i, m in enumerate(marks):
        number = numbers[i]
        end = marks[i + 1].start() if i + 1 < len(marks) else len(program)
        segment = program[m.end():end]
        n_lines = segment.count("\n") + (1 if segment and not segment.endswith("\n") else 0)
        line_map.append((number, 1))  # the marker line: the cell's first line
        for j in range(1, n_lines + 1):
            line_map.append((number, j + inserted if number == home and inserted and j > at else j))
    return texts, line_map


def rebuild(nb: Notebook, program: str) -> Rebuilt:
    """The notebook's new text after the rules turned ``nb.program`` into ``program``: only the
    sources of changed cells replaced, everything else as it was; validated with nbformat."""
    texts, line_map = split_program(nb, program)
    changed: dict[int, tuple[str, str]] = {}
    for cell in nb.python_cells():
        assert cell.masked is not None
        new = unmask(texts[cell.number], cell.masked.lines)
        missing = [k for k in cell.masked.lines if f"{IPYTHON_MARK}({k})" not in texts[cell.number]]
        if missing:
            raise PorterError(
                f"internal error: a fix removed the IPython line {cell.masked.lines[missing[0]].strip()!r} "
                f"of cell {cell.number}; file left unchanged"
            )
        if new != cell.source:
            changed[cell.number] = (cell.source, new)
    if not changed:
        return Rebuilt(nb.text, {}, line_map)
    text = nb.text
    for number in sorted(changed, key=lambda n: -nb.cell(n).span.start):  # type: ignore[union-attr]
        span = nb.cell(number).span
        assert span is not None
        text = text[:span.start] + _render_source(nb.text, span, changed[number][1], nb.ascii_only) + text[span.end:]
    _validate(nb, text, changed)
    return Rebuilt(text, changed, line_map)


def _validate(nb: Notebook, text: str, changed: dict[int, tuple[str, str]]) -> None:
    """The new text is a valid notebook equal to the old one but for the changed sources."""
    nbformat = _nbformat()

    try:
        new = json.loads(text)
        nbformat.validate(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
    except Exception as exc:
        raise PorterError(f"internal error: the converted notebook is not valid ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); file left unchanged") from None
    expected = copy.deepcopy(nb.data)
    for number, (_, source) in changed.items():
        raw = expected["cells"][number - 1]
        raw["source"] = source.splitlines(keepends=True) if isinstance(raw.get("source"), list) else source
    if new != expected:
        raise PorterError("internal error: the converted notebook differs from the original outside the changed cells; file left unchanged")


def cell_diff(changed: dict[int, tuple[str, str]], name: str) -> str:
    """Per-cell unified diffs, headed ``--- nb.ipynb (cell 7)``."""
    out = []
    for number in sorted(changed):
        before, after = changed[number]
        if before and after and not before.endswith("\n") and not after.endswith("\n"):
            before, after = before + "\n", after + "\n"  # (cells rarely end with a newline: no marker for that)
        label = f"{name} (cell {number})"
        for line in difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=label, tofile=label,
        ):
            if not line.endswith(("\n", "\r")):
                line += "\n\\ No newline at end of cell\n"
            out.append(line)
    return "".join(out)


# --------------------------------------------------------------------------------------
# What other checks read
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IPythonLine:
    cell: int  # 1-based cell number (as in findings)
    line: int  # 1-based line in the cell
    text: str  # the line as written (no newline)
    kind: str  # "shell" (!cmd, x = !cmd), "magic" (%name), "cell-magic" (%%name), "help"


def _kind(text: str) -> str:
    s = text.lstrip()
    if s.startswith("%%"):
        return "cell-magic"
    if s.startswith("!") or re.match(r"^[^=]*=\s*!", s):
        return "shell"
    if s.startswith("%") or re.match(r"^[^=]*=\s*%", s):
        return "magic"
    return "help"


def ipython_lines(source: str | Notebook) -> list[IPythonLine]:
    """The IPython lines of a notebook (its text, or a parsed :class:`Notebook`), in order:
    what porter masks before its rules run. ``[l for l in ipython_lines(nb) if l.kind ==
    "shell"]`` are its shell escapes (``!pip install torch==2.9.0``); a backslash-continued
    line is one entry per physical line, as written. Cells left alone (``%%bash``...) are not
    read. Raises :class:`PorterError` for a file that is not a Python notebook."""
    nb = parse(source) if isinstance(source, str) else source
    found = []
    for cell in nb.python_cells():
        assert cell.masked is not None
        for k, text in sorted(cell.masked.lines.items()):
            if text.startswith(CONTINUED):
                found.append(IPythonLine(cell.number, cell.masked.where[k], text[len(CONTINUED):], found[-1].kind))
            else:
                found.append(IPythonLine(cell.number, cell.masked.where[k], text, _kind(text)))
    return found


def shell_lines(source: str | Notebook) -> list[IPythonLine]:
    """The shell escapes (``!pip install ...``, ``files = !ls``) of a notebook."""
    return [x for x in ipython_lines(source) if x.kind == "shell"]


# --------------------------------------------------------------------------------------
# check / migrate of one notebook file (called by porter.runner)
# --------------------------------------------------------------------------------------
def _records(nb: Notebook, name: str, findings: Sequence, locate):
    from porter.runner import FindingRecord

    out = []
    for f in findings:
        rec = FindingRecord.of(name, f)
        cell, line = locate(rec.line)
        end_cell, end_line = locate(rec.end_line)
        column, end_column = rec.column, rec.end_column
        if end_cell != cell:  # a finding over several cells: to the end of its first cell's line
            end_line, end_column = line, column + 1
        file_line, file_col = nb.file_position(cell, line, column)
        file_end_line, file_end_col = nb.file_position(cell, end_line, end_column)
        out.append(FindingRecord(
            rec.path, rec.code, rec.message, rec.severity, line, column, end_line, end_column,
            rec.fixable, rec.safety, cell=cell, file_region=(file_line, file_col, file_end_line, file_end_col),
        ))
    return tuple(out)


_TIMED = re.compile(r"^([ \t]*%(?:time|timeit|prun)[ \t]+)(?!-)(\S.*)$")
TIMED_NOTE = " (on a %time/%timeit/%prun line, which porter does not rewrite: port it by hand)"


def _timed_code(line: str) -> Optional[tuple[int, str]]:
    """(length of the ``%time `` prefix with its indentation, the statement) of a line magic
    that runs one Python statement; None for other lines (and for magic options: -n 3)."""
    m = _TIMED.match(line)
    if not m or not _is_python(m.group(2)):
        return None
    return len(m.group(1)), m.group(2)


def timed_findings(nb: Notebook, options, name: str) -> tuple:
    """The findings on the statements of ``%time STATEMENT`` (``%timeit``, ``%prun``) lines.

    Those lines are masked like every IPython line, so no fix touches them; the rules are run
    once more on the program with their statements in place, and what they find on those
    lines is reported (not fixable), at the line and column in the cell: the port says what
    it left undone instead of leaving a ``.cuda()`` there silently."""
    from porter.runner import FindingRecord

    lines = nb.program.splitlines(keepends=True)
    hits: dict[int, tuple[int, int, int]] = {}  # program line -> (cell, line in cell, column shift)
    for cell in nb.python_cells():
        assert cell.masked is not None
        for k, text in cell.masked.lines.items():
            got = None if text.startswith(CONTINUED) else _timed_code(text)
            if got is None:
                continue
            at = nb.marks[cell.number] + cell.masked.where[k]
            indent = text[:len(text) - len(text.lstrip(" \t"))]
            lines[at - 1] = indent + got[1] + "\n"
            hits[at] = (cell.number, cell.masked.where[k], got[0] - len(indent))
    if not hits:
        return ()
    try:
        result = engine.check("".join(lines), options, name)
    except PorterError:
        return ()
    out = []
    for f in result.findings:
        p = f.position
        if p is None or p.line not in hits or p.end_line != p.line or f.internal_error:
            continue
        cell_number, line, shift = hits[p.line]
        column, end_column = p.column + shift, p.end_column + shift
        start, end = nb.file_position(cell_number, line, column), nb.file_position(cell_number, line, end_column)
        out.append(FindingRecord(name, f.code, f.message + TIMED_NOTE, f.severity.value, line, column, line, end_column,
                                 False, None, cell=cell_number, file_region=(*start, *end)))
    return tuple(out)


def pin_findings(nb: Notebook, name: str, settings) -> tuple:
    """The ``!pip install NAME==VERSION`` lines of the notebook's cells whose pins differ from
    the target's profile (porter.platforms), as the target's PV rule's findings at the cell."""
    from porter import runner
    from porter.platforms import notebook_pin_findings

    rule = runner.pin_rule(settings)
    if rule is None:
        return ()
    out = []
    lines = [x for x in ipython_lines(nb) if x.kind == "shell" or x.text.lstrip().startswith(("%pip", "%conda"))]
    for cell, f in notebook_pin_findings(lines, settings.target):
        start = nb.file_position(cell, f.line, f.column)
        end = nb.file_position(cell, f.line, f.end_column)
        out.append(runner.FindingRecord(name, rule.code, f.message, rule.severity.value, f.line, f.column, f.line,
                                        f.end_column, False, None, cell=cell, file_region=(*start, *end)))
    return tuple(out)


def check_file(path: Path, settings):
    from porter import runner

    name = runner.display(path)
    try:
        nb, _ = read(path)
        if not nb.python_cells():
            return runner.FileOutcome(name, "unchanged")
        result = engine.check(nb.program, settings.options(), name)
        timed = timed_findings(nb, settings.options(), name) + pin_findings(nb, name, settings)
    except PorterError as exc:
        return runner.FileOutcome(name, "failed", str(exc))
    except MemoryError:
        return runner.FileOutcome(name, "failed", runner.memory_message(settings))
    except Exception as exc:
        return runner.FileOutcome(name, "failed", runner.internal_error(exc))
    found = _records(nb, name, result.findings, nb.locate) + timed
    return runner.FileOutcome(name, "unchanged", findings=tuple(sorted(found, key=lambda r: (r.cell or 0, r.line, r.column))))


def migrate_file(path: Path, settings, mode: str, out: Optional[Path] = None):
    from porter import runner
    from porter.sources import write_atomic

    name = runner.display(path)
    out_name = runner.display(out) if out is not None else ""
    try:
        nb, src = read(path)
        findings: tuple = ()
        rebuilt = None
        fixed: tuple = ()
        if nb.python_cells():
            result = engine.fix(nb.program, settings.options(), name)
            if result.changed:
                runner.verify_output(nb.program, result.source)
                rebuilt = rebuild(nb, result.source)
                new_nb = parse(rebuilt.text) if rebuilt.cells else nb
                line_map = rebuilt.line_map

                def locate(line: int) -> tuple[int, int]:
                    if 1 <= line <= len(line_map):
                        return line_map[line - 1]
                    return line_map[-1] if line_map else (nb.imports_cell or 1, 1)
                findings = _records(new_nb, out_name if mode == "out" else name, result.remaining, locate)
                findings += timed_findings(new_nb, settings.options(), out_name if mode == "out" else name)
                fixed = tuple(sorted(result.fixed.items()))
            else:
                findings = _records(nb, out_name if mode == "out" else name, result.remaining, nb.locate)
                findings += timed_findings(nb, settings.options(), out_name if mode == "out" else name)
        changed = rebuilt is not None and bool(rebuilt.cells)
        data = src.encode(rebuilt.text) if changed else src.raw  # type: ignore[attr-defined,union-attr]
        if mode == "out":
            assert out is not None
            write_atomic(out, data, src.mode, follow_symlinks=False)  # type: ignore[attr-defined]
            if not changed:
                runner.keep_times(path, out)
        if not changed:
            return runner.FileOutcome(name, "unchanged", findings=findings, out=out_name)
        if mode == "write":
            write_atomic(path, data, src.mode)  # type: ignore[attr-defined]
        diff = cell_diff(rebuilt.cells, name) if mode == "diff" else ""  # type: ignore[union-attr]
        return runner.FileOutcome(name, "changed", diff=diff, findings=findings, fixed=fixed, out=out_name)
    except PorterError as exc:
        return runner.FileOutcome(name, "failed", str(exc))
    except OSError as exc:
        where = f" {runner.display(Path(exc.filename))}" if exc.filename else ""
        return runner.FileOutcome(name, "failed", f"cannot write{where}: {exc.strerror or exc}")
    except MemoryError:
        return runner.FileOutcome(name, "failed", runner.memory_message(settings))
    except Exception as exc:
        return runner.FileOutcome(name, "failed", runner.internal_error(exc))
