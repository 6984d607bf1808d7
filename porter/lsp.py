"""``porter lsp``: porter's findings and fixes in the editor, over the Language Server Protocol.

A thin front end over the pure core (``porter.engine``): the same parse, rules, suppressions
and fixes as ``porter check`` / ``porter migrate``, with the rules and target of the
document's ``[tool.porter]`` (``porter.config``, looked up from the document's folder as the
CLI does from the path it is given).

- Diagnostics on open, save and change (debounced per document; the check runs in one worker
  thread, so the server keeps reading messages meanwhile; a result for a version the editor
  has already replaced is dropped). Code = rule id, link to the rule's page, severity of the
  rule, the CLI's message. A document that does not parse gets one diagnostic: the syntax
  error, at CPython's position.
- Code actions from the result cached for the document's version (the rules are not run
  again): a quick-fix per finding that applies exactly that finding's fix (and the imports it
  needs) as minimal text edits; "suppress with ``# porter: ignore[CODE]``"; and
  ``source.fixAll.porter`` (``porter migrate`` on this document), resolved lazily when the
  client supports ``codeAction/resolve``. Unsafe fixes are offered, titled "(unsafe)" and
  never preferred. "Fix all" and fixes that remove imports (seconds to minutes on a large
  file) run in a separate process, so the checks never wait for them.
- Positions in the encoding negotiated with the client (UTF-16 code units unless the client
  offers another); LibCST columns are code points, converted both ways.

Protocol code only: :class:`PorterServer` keeps the open documents (each with its
incremental checker, ``porter.incremental``), answers each request through porter's public
APIs (``engine.check``, ``porter.incremental.Document``, ``porter.edits.FixEditor`` for a fix's
text edits, ``engine.fix`` for "fix all") and turns the results into LSP types. The
functions above it are plain functions of text, usable without a client (the tests and the
benchmark call them too). This module needs pygls (the optional ``lsp`` dependency: ``porter
lsp`` says so when it is missing).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence
from urllib.parse import unquote, urlparse

import libcst as cst
from lsprotocol import types
from pygls.exceptions import JsonRpcContentModified, JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from porter import __version__, config, edits, engine, incremental, notebook, registry
from porter._layout import REPO
from porter.rules import Finding, Position, Safety, Severity
from porter.runner import Settings, UsageError, parse_error_message

SOURCE = "porter"
FIX_ALL_KIND = "source.fixAll.porter"
DEFAULT_DEBOUNCE = 0.15  # seconds between the last keystroke and the check
_SUPPRESS_CODES = re.compile(r"(#\s*porter:\s*ignore\[)([A-Za-z0-9_,\s]+)(\])")
_WHERE = re.compile(r"\bline (\d+)(?:, column (\d+))?")

log = logging.getLogger("porter.lsp")


# --------------------------------------------------------------------------------------
# Lines and position encodings
# --------------------------------------------------------------------------------------
split_lines = edits.split_lines  # the document's lines as LSP counts them (ends kept)


def _body(line: str) -> str:
    return line.rstrip("\r\n")


def units(text: str, encoding: str = "utf-16") -> int:
    """Length of ``text`` in the client's code units."""
    if encoding == "utf-8":
        return len(text.encode("utf-8", "surrogatepass"))
    if encoding == "utf-32":
        return len(text)
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF) if not text.isascii() else len(text)


def column_to_units(line: str, column: int, encoding: str = "utf-16") -> int:
    """A code-point column of ``line`` (LibCST's) -> client code units."""
    return units(_body(line)[:column], encoding)


def column_from_units(line: str, character: int, encoding: str = "utf-16") -> int:
    """Client code units -> a code-point column of ``line``, clamped to the line's end; a
    position inside a surrogate pair (or a UTF-8 sequence) goes to the character's start."""
    text = _body(line)
    if encoding == "utf-32" or text.isascii():
        return min(max(character, 0), len(text))
    count = 0
    for i, ch in enumerate(text):
        width = units(ch, encoding)
        if count + width > character:
            return i
        count += width
    return len(text)


# --------------------------------------------------------------------------------------
# Settings of a document
# --------------------------------------------------------------------------------------
def settings_for(path: Optional[Path]) -> Settings:
    """The settings ``porter check PATH`` would use: ``[tool.porter]`` of the nearest
    pyproject.toml above ``path`` (or the working folder). Raises UsageError for bad settings."""
    try:
        cfg = config.load(path if path is not None else Path.cwd())
    except config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    target = cfg.target or "torch-xla"
    if target not in registry.TARGETS:
        raise UsageError(f"unknown target {target!r} (from {cfg.source}); known: {', '.join(registry.TARGETS)}")
    settings = Settings(target, cfg.select, cfg.ignore, cfg.unsafe_fixes)
    if cfg.source is not None:
        settings.validate(f"[tool.porter] in {cfg.source}")
    settings.options()
    return settings


def rule_doc_uri(code: str) -> Optional[str]:
    """``docs/rules/<CODE>.md`` of porter's checkout as a file: URI (``porter explain CODE``
    prints the same page); None when porter runs from an installation without its docs."""
    page = REPO / "docs" / "rules" / f"{code}.md"
    return page.as_uri() if page.is_file() else None


# --------------------------------------------------------------------------------------
# One document version, checked
# --------------------------------------------------------------------------------------
TextChange = edits.TextEdit  # (the name of porter.edits.TextEdit in the server's code and tests)


@dataclass
class Analysis:
    """The result of checking one version of a document, kept for its code actions."""

    text: str
    lines: list[str]
    settings: Optional[Settings]
    module: Optional[cst.Module] = None
    findings: list[Finding] = field(default_factory=list)
    error: Optional[str] = None  # the document could not be checked: why
    error_at: tuple[int, int] = (0, 0)  # 0-based line, code-point column of the error
    seconds: float = 0.0
    editor: Optional[edits.FixEditor] = None  # the findings' fixes as text edits (porter.edits)
    fix_all: Optional[list[TextChange]] = None
    fix_all_error: Optional[str] = None  # why "fix all" failed (engine.PorterError)
    reparsed: Optional[int] = None  # incremental check: top-level statements parsed again (None: all)
    _inside_string: Optional[Callable[[int], bool]] = None


def analyze(text: str, settings: Optional[Settings], path: str = "<string>",
            document: Optional[incremental.Document] = None) -> Analysis:
    """``engine.check`` of ``text``, keeping what the code actions need (the tree, and a
    :class:`porter.edits.FixEditor` of it). Never raises: a parse error, bad settings or a
    crashing rule become ``Analysis.error``.

    With ``document`` (the incremental checker of this document, reused from version to
    version) only the statements an edit changed are parsed and checked again; the result
    is the same (porter.incremental, tests/test_incremental.py)."""
    t0 = time.perf_counter()
    an = Analysis(text, edits.split_lines(text), settings)
    if settings is None:
        an.error = "no settings"
        return an
    try:
        options = settings.options()
        if document is not None:
            checked = document.check(text)
            an.module, an.findings, an.reparsed = checked.module, checked.findings, checked.reparsed
            an.editor = edits.FixEditor(text, checked.module, checked.positions, checked.statement_starts, an.lines)
            an._inside_string = checked.positions.inside_string
        else:
            result = engine.check(text, options, path)
            an.module, an.findings = result.module, result.findings
            an.editor = edits.FixEditor(text, result.module, lines=an.lines)
    except engine.PorterError as exc:
        an.error = parse_error_message(exc, text)
        m = _WHERE.search(an.error)
        if m:
            line = max(int(m.group(1)) - 1, 0)
            col = max(int(m.group(2)) - 1, 0) if m.group(2) else 0
            an.error_at = (min(line, max(len(an.lines) - 1, 0)), col)
    except Exception as exc:  # a rule crashed: say so in the editor, keep serving
        log.error("porter: internal error on %s\n%s", path, traceback.format_exc())
        an.error = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
    an.seconds = time.perf_counter() - t0
    return an


def fix_changes(an: Analysis, finding: Finding) -> list[TextChange]:
    """Exactly ``finding``'s fix (its edits and the imports it needs) as minimal text edits
    of the analysed text (porter.edits.FixEditor; kept per analysis)."""
    assert an.editor is not None and finding.fix is not None
    return an.editor.edits(finding.fix)


def fix_known(an: Analysis, finding: Finding) -> bool:
    """Whether ``finding``'s fix is cheap to turn into edits now (computed already, or not one
    that needs the whole module's scope analysis)."""
    fix = finding.fix
    assert an.editor is not None and fix is not None
    return not an.editor.needs_whole_module(fix) or an.editor.known(fix) is not None


def fix_all_job(text: str, settings: Settings) -> list[TextChange]:
    """``porter migrate`` of ``text`` as text changes (run in the fixer process)."""
    result = engine.fix(text, settings.options())
    return edits.text_edits(text, result.source) if result.changed else []


def fix_job(text: str, settings: Settings, path: str, index: int, code: str) -> Optional[list[TextChange]]:
    """Finding ``index``'s fix as text changes, the document checked again in this process
    (run in the fixer process: the tree and its fixes do not cross processes). None when
    the check does not find that finding there."""
    an = analyze(text, settings, path)
    if an.error is not None or not 0 <= index < len(an.findings):
        return None
    f = an.findings[index]
    if f.code != code or f.fix is None:
        return None
    return fix_changes(an, f)


def suppress_change(an: Analysis, finding: Finding) -> Optional[TextChange]:
    """Add ``# porter: ignore[CODE]`` to the finding's first line (or add CODE to the
    bracket already there); the last line when the first one cannot take a comment (it ends
    inside a multi-line string or with a backslash). None when neither can."""
    pos = finding.position
    if pos is None:
        return None
    for lineno in dict.fromkeys((pos.line, pos.end_line)):
        i = lineno - 1
        if not 0 <= i < len(an.lines) or not _can_end_with_comment(an, lineno):
            continue
        body = _body(an.lines[i])
        m = _SUPPRESS_CODES.search(body)
        if m:
            codes = [c.strip() for c in m.group(2).split(",") if c.strip()]
            return TextChange((i, m.start(2)), (i, m.end(2)), ", ".join([*codes, finding.code]))
        return TextChange((i, len(body)), (i, len(body)), f"  # porter: ignore[{finding.code}]")
    return None


def _can_end_with_comment(an: Analysis, lineno: int) -> bool:
    body = _body(an.lines[lineno - 1])
    if body.rstrip().endswith("\\"):
        return False
    if an._inside_string is None:
        assert an.editor is not None
        # (first, last) line of every string that spans lines
        positions = an.editor.positions
        assert isinstance(positions, dict)  # (the incremental checker's positions answer inside_string)
        spans = [(rng.start.line, rng.end.line) for node, rng in positions.items()
                 if rng.start.line != rng.end.line and isinstance(node, (cst.SimpleString, cst.FormattedString))]
        an._inside_string = lambda n: any(first <= n < last for first, last in spans)
    return not an._inside_string(lineno)

# --------------------------------------------------------------------------------------
# The language server
# --------------------------------------------------------------------------------------
def _path_of(uri: str) -> Optional[Path]:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    return Path(unquote(parsed.path))


# --------------------------------------------------------------------------------------
# Notebooks: the Python cells of one notebook checked as one program (porter/notebook.py)
# --------------------------------------------------------------------------------------
@dataclass
class NotebookAnalysis:
    """The check of a notebook's Python cells: an :class:`Analysis` of their program, and how
    its lines map to the cells."""

    cells: list  # (number, cell uri, text, version) of each Python cell, as checked
    analysis: Analysis
    program: Optional[notebook.Program] = None
    error: Optional[str] = None
    error_cell: Optional[int] = None
    error_at: tuple[int, int] = (0, 0)  # 0-based line and column in error_cell

    def number_of(self, uri: str) -> Optional[int]:
        for number, cell_uri, _, _ in self.cells:
            if cell_uri == uri or unquote(cell_uri) == unquote(uri):
                return number
        return None

    def uri_of(self, number: int) -> str:
        return next(c[1] for c in self.cells if c[0] == number)

    def version_of(self, number: Optional[int]) -> Optional[int]:
        return next((c[3] for c in self.cells if c[0] == number), None)

    def cell_lines(self, number: int) -> list[str]:
        return split_lines(next((c[2] for c in self.cells if c[0] == number), ""))

    def cell_range(self, f: Finding) -> Optional[tuple[int, int, int, int, int]]:
        """(cell, line, column, end line, end column), 0-based lines, of a finding."""
        if f.position is None or self.program is None:
            return None
        p = f.position
        cell, line = self.program.locate(p.line)
        end_cell, end_line = self.program.locate(p.end_line)
        if end_cell != cell:
            end_line, end_column = line, p.column + 1
        else:
            end_column = p.end_column
        return cell, line - 1, p.column, end_line - 1, end_column

    def cell_edits(self, changes: Sequence[TextChange]) -> Optional[list[tuple[int, TextChange]]]:
        """The program's text changes as (cell, change in the cell), or None when one of them
        would touch a marker or an IPython line, span cells, or cannot be placed."""
        assert self.program is not None
        program = self.program
        out = []
        plines = self.analysis.lines
        for c in changes:
            (l0, c0), (l1, c1) = c.start, c.end
            first = min(program.marks.values()) - 1 if program.marks else 0  # 0-based line of the first marker
            if l1 <= first and (l0, c0) == (l1, c1) and c0 == 0:  # an insertion in the head: imports
                number = program.imports_cell
                if number is None:
                    return None
                cell_text = next(x[2] for x in self.cells if x[0] == number)
                at = notebook.insertion_line(program.masked[number].text)
                text = c.text
                lines = split_lines(cell_text)
                if at >= len(lines) and lines and not lines[-1].endswith(("\n", "\r")):
                    out.append((number, TextChange((len(lines) - 1, len(_body(lines[-1]))), (len(lines) - 1, len(_body(lines[-1]))), "\n" + text.rstrip("\n"))))
                else:
                    out.append((number, TextChange((at, 0), (at, 0), text)))
                continue
            cell, line = program.locate(l0 + 1)
            end_cell, end_line = program.locate(l1 + 1 if c1 > 0 or l1 == l0 else l1)
            if cell != end_cell or program.marks.get(cell) == l0 + 1:
                return None
            for k in range(l0, min(l1 + 1, len(plines))):
                if notebook.IPYTHON_MARK in plines[k] or notebook.CELL_MARK in plines[k]:
                    if not (k == l1 and c1 == 0 and k != l0):
                        return None
            shift = program.marks[cell]  # program line (1-based) of the marker = 0-based line before the cell
            out.append((cell, TextChange((l0 - shift, c0), (l1 - shift, c1), c.text)))
        return out


def analyze_notebook(cells: list, settings: Optional[Settings], path: str) -> NotebookAnalysis:
    """Check the Python cells ``cells`` ((number, uri, text, version)) as one program."""
    cells = [c for c in cells if notebook.runs_python(c[2])]  # (%%bash cells and the like: left alone)
    try:
        program = notebook.build_program([(number, text) for number, _, text, _ in cells])
    except notebook.CellSyntaxError as exc:
        nan = NotebookAnalysis(cells, Analysis("", [], settings), error=str(exc), error_cell=exc.cell)
        nan.error_at = (max(exc.line - 1, 0), max(exc.column - 1, 0))
        return nan
    except engine.PorterError as exc:
        first = cells[0][0] if cells else None
        return NotebookAnalysis(cells, Analysis("", [], settings), error=str(exc), error_cell=first)
    an = analyze(program.text, settings, path)
    nan = NotebookAnalysis(cells, an, program)
    if an.error is not None:
        cell, line = program.locate(an.error_at[0] + 1)
        nan.error, nan.error_cell, nan.error_at = an.error, cell, (line - 1, an.error_at[1])
    return nan


class _Unreadable:
    """A request whose params do not fit its method (kept to answer it with an error)."""

    jsonrpc = "2.0"

    def __init__(self, msg_id, method: str, error: JsonRpcException) -> None:
        self.id, self.method, self.error = msg_id, method, error

class PorterProtocol(LanguageServerProtocol):
    """pygls logs a request it cannot deserialize and never answers it; the LSP wants an
    error response (Invalid Params), so the client does not wait forever."""

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "id" in data and "method" in data and data.get("jsonrpc") == "2.0":
                return _Unreadable(data["id"], str(data["method"]), exc)
            raise

    def handle_message(self, message):
        if isinstance(message, _Unreadable):
            self._send_response(message.id, error=types.ResponseError(
                code=message.error.code,
                message=f"{message.error.message or 'Invalid Params'}: the params of {message.method} do not match the LSP"))
            return
        super().handle_message(message)

SEVERITY = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
}

class PorterServer(LanguageServer):
    """porter's language server: the open documents and notebooks, each request answered by
    porter's public APIs (``engine.check`` / ``porter.incremental`` for diagnostics,
    ``porter.edits`` for the fixes' text edits), the results turned into LSP types."""

    def __init__(self, debounce: float = DEFAULT_DEBOUNCE) -> None:
        super().__init__("porter", __version__, protocol_cls=PorterProtocol, notebook_document_sync=types.NotebookDocumentSyncOptions(
            notebook_selector=[types.NotebookDocumentFilterWithCells(
                cells=[types.NotebookCellLanguage(language="python")], notebook="jupyter-notebook")],
            save=True,
        ))
        # open notebooks: notebook uri -> (version, NotebookAnalysis)
        self.notebooks: dict[str, tuple[Optional[int], NotebookAnalysis]] = {}
        self.debounce = debounce
        self.analyses: dict[str, tuple[Optional[int], Analysis]] = {}
        self.pending: dict[str, asyncio.Task] = {}
        # every rule run (checks, fix-all) in this one thread: in order, off the loop
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="porter-check")
        # the check running for a document: (version, text, settings, future)
        self.inflight: dict[str, tuple] = {}
        self.fixer = None  # the process for "fix all" and slow fixes (in_fixer)
        # each open document's incremental checker (used in the worker thread only)
        self.documents: dict[str, incremental.Document] = {}

        # the requests and notifications porter answers: the methods below, as functions
        # (pygls marks each handler function; it passes the server as their `self`, known by
        # the annotation)
        self.feature(types.TEXT_DOCUMENT_DID_OPEN)(PorterServer.on_did_open)
        self.feature(types.TEXT_DOCUMENT_DID_CHANGE)(PorterServer.on_did_change)
        self.feature(types.TEXT_DOCUMENT_DID_SAVE)(PorterServer.on_did_save)
        self.feature(types.TEXT_DOCUMENT_DID_CLOSE)(PorterServer.on_did_close)
        self.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)(PorterServer.on_notebook_did_open)
        self.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)(PorterServer.on_notebook_did_change)
        self.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)(PorterServer.on_notebook_did_save)
        self.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)(PorterServer.on_notebook_did_close)
        self.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.SourceFixAll, FIX_ALL_KIND],
            resolve_provider=True,
        ))(PorterServer.on_code_action)
        self.feature(types.SHUTDOWN)(PorterServer.on_shutdown)
        self.feature(types.CODE_ACTION_RESOLVE)(PorterServer.on_code_action_resolve)

    # -- positions ------------------------------------------------------------------
    @property
    def encoding(self) -> str:
        enc = getattr(self.server_capabilities, "position_encoding", None) if self.protocol.server_capabilities else None
        return str(getattr(enc, "value", enc) or "utf-16")

    def to_lsp(self, lines: Sequence[str], line: int, column: int):
        if line >= len(lines):
            return types.Position(line=len(lines), character=0) if not lines or lines[-1].endswith(("\n", "\r")) else types.Position(line=len(lines) - 1, character=units(_body(lines[-1]), self.encoding))
        return types.Position(line=line, character=column_to_units(lines[line], column, self.encoding))

    def from_lsp(self, lines: Sequence[str], pos) -> tuple[int, int]:
        if pos.line >= len(lines):
            return (len(lines), 0)
        return (pos.line, column_from_units(lines[pos.line], pos.character, self.encoding))

    # -- checking -------------------------------------------------------------------
    def settings(self, uri: str) -> Settings:
        return settings_for(_path_of(uri))

    def schedule(self, uri: str, delay: float) -> None:
        old = self.pending.pop(uri, None)
        if old is not None:
            old.cancel()
        self.pending[uri] = asyncio.get_running_loop().create_task(self._check_later(uri, delay))

    async def _check_later(self, uri: str, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            await self.current(uri)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.error("porter lsp: check of %s failed\n%s", uri, traceback.format_exc())

    async def current(self, uri: str) -> Optional[Analysis]:
        """The analysis of the document's current version: cached, or run now (in the
        worker thread) and published."""
        doc = self.workspace.text_documents.get(uri)
        if doc is None:
            return None
        version, text = doc.version, doc.source
        try:
            settings = self.settings(uri)
            error = None
        except UsageError as exc:
            settings, error = None, str(exc)
        cached = self.analyses.get(uri)
        if cached is not None and cached[0] == version and cached[1].text == text and cached[1].settings == settings:
            return cached[1]  # (a save after editing pyproject.toml checks again)
        running = self.inflight.get(uri)
        if running is not None and running[:3] == (version, text, settings):
            future = running[3]  # a code action while the check of this version runs: wait for it
        else:
            path = str(_path_of(uri) or uri)
            document = None
            if settings is not None:
                document = self.documents.get(uri)
                rules = settings.options().rules
                if document is None or document.rules != tuple(rules) or document.path != path:
                    document = self.documents[uri] = incremental.Document(rules, path)
            future = asyncio.get_running_loop().run_in_executor(self.worker, analyze, text, settings, path, document)
            self.inflight[uri] = (version, text, settings, future)
        try:
            an = await asyncio.shield(future)
        finally:
            if future.done() and self.inflight.get(uri, (None,) * 4)[3] is future:
                del self.inflight[uri]
        if error is not None:
            an.error = f"cannot read porter's settings: {error}"
        now = self.workspace.text_documents.get(uri)
        if now is None or now.version != version:
            return an  # the editor moved on: nothing published for a stale version
        self.analyses[uri] = (version, an)
        self.publish(uri, version, an)
        return an

    def publish(self, uri: str, version: Optional[int], an: Analysis) -> None:
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, version=version, diagnostics=self.diagnostics(an, version))
        )

    def diagnostics(self, an: Analysis, version: Optional[int]) -> list:
        if an.error is not None:
            line, col = an.error_at
            start = self.to_lsp(an.lines, line, col)
            end_col = len(_body(an.lines[line])) if line < len(an.lines) else 0
            end = self.to_lsp(an.lines, line, max(end_col, col))
            return [types.Diagnostic(range=types.Range(start=start, end=end), message=an.error,
                                     severity=types.DiagnosticSeverity.Error, source=SOURCE)]
        out = []
        for i, f in enumerate(an.findings):
            out.append(types.Diagnostic(
                range=self.range_of(an, f), message=f.message + _mark(f), severity=SEVERITY[f.severity],
                code=f.code, source=SOURCE,
                code_description=types.CodeDescription(href=href) if (href := rule_doc_uri(f.code)) else None,
                data={"version": version, "index": i},
            ))
        return out

    def range_of(self, an: Analysis, f: Finding):
        p = f.position or Position(1, 0, 1, 0)
        return types.Range(start=self.to_lsp(an.lines, p.line - 1, p.column),
                           end=self.to_lsp(an.lines, p.end_line - 1, p.end_column))

    def edit(self, uri: str, version: Optional[int], an: Analysis, changes: Sequence[TextChange]):
        edits = [types.TextEdit(range=types.Range(start=self.to_lsp(an.lines, *c.start), end=self.to_lsp(an.lines, *c.end)),
                                new_text=c.text) for c in changes]
        caps = self.client_capabilities
        versioned = bool(caps.workspace and caps.workspace.workspace_edit and caps.workspace.workspace_edit.document_changes)
        if versioned:
            return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version), edits=edits)])
        return types.WorkspaceEdit(changes={uri: edits})

    def resolve_supported(self) -> bool:
        ca = self.client_capabilities.text_document and self.client_capabilities.text_document.code_action
        rs = ca.resolve_support if ca else None
        return bool(rs and "edit" in rs.properties)

    async def finding_actions(self, uri: str, version, an: Analysis, i: int, wanted) -> list:
        f = an.findings[i]
        diag = self.diagnostics_for(an, version, [i])
        out = []
        if f.fix is not None and wanted(types.CodeActionKind.QuickFix):
            unsafe = f.fix.safety is not Safety.SAFE
            what = f.fix.description or registry.find(f.code).summary
            action = types.CodeAction(
                title=f"Fix {f.code}: {what}" + (" (unsafe)" if unsafe else ""),
                kind=types.CodeActionKind.QuickFix, diagnostics=diag, is_preferred=not unsafe,
                data={"uri": uri, "version": version, "index": i},
            )
            if f.fix.remove_imports and not fix_known(an, f):
                # deciding which imports become unused takes LibCST's scope analysis of
                # the whole module (seconds on a large file): in the worker, and only when
                # the client asks for this action (codeAction/resolve), if it can
                if not self.resolve_supported():
                    await self.resolve_fix(action)
                    if action.edit is not None:
                        out.append(action)
                else:
                    out.append(action)
            else:
                action.edit = self.edit(uri, version, an, fix_changes(an, f))
                out.append(action)
        if wanted(types.CodeActionKind.QuickFix):
            change = suppress_change(an, f)
            if change is not None:
                out.append(types.CodeAction(
                    title=f"Suppress {f.code} on this line (# porter: ignore[{f.code}])",
                    kind=types.CodeActionKind.QuickFix, diagnostics=diag,
                    edit=self.edit(uri, version, an, [change]),
                ))
        return out

    async def resolve_fix(self, action) -> None:
        """Fill in the edit of a quick-fix offered without one (or leave it None when the
        document has changed since)."""
        data = action.data if isinstance(action.data, dict) else {}
        uri, index = data.get("uri"), data.get("index")
        cached = self.analyses.get(uri) if isinstance(uri, str) else None
        if cached is None or cached[0] != data.get("version") or not isinstance(index, int) or not 0 <= index < len(cached[1].findings):
            return
        an = cached[1]
        f = an.findings[index]
        if f.fix is None:
            return
        assert an.editor is not None and isinstance(uri, str)
        if not fix_known(an, f):
            path = str(_path_of(uri) or uri)
            changes = await self.in_fixer(fix_job, an.text, an.settings, path, index, f.code)
            if changes is None:
                return
            an.editor.remember(f.fix, changes)
        action.edit = self.edit(uri, cached[0], an, fix_changes(an, f))

    async def in_fixer(self, job, *args):
        """Run ``job`` in the fixer process: "fix all" and fixes that remove imports take
        seconds to minutes on a large file, and must not hold up the checks (the
        worker thread) nor the messages (the event loop). One process, started on
        first use, replaced if it dies."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        if self.fixer is None:
            self.fixer = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self.fixer, job, *args)
        except BrokenProcessPool:
            self.fixer = None
            raise

    def diagnostics_for(self, an: Analysis, version, indices: Sequence[int]) -> list:
        return [types.Diagnostic(range=self.range_of(an, an.findings[i]), message=an.findings[i].message + _mark(an.findings[i]),
                                 severity=SEVERITY[an.findings[i].severity], code=an.findings[i].code, source=SOURCE,
                                 data={"version": version, "index": i}) for i in indices]


    # -- requests and notifications ---------------------------------------------------

    def on_did_open(self: PorterServer, params: types.DidOpenTextDocumentParams) -> None:
        self.schedule(params.text_document.uri, 0)

    def on_did_change(self: PorterServer, params: types.DidChangeTextDocumentParams) -> None:
        self.schedule(params.text_document.uri, self.debounce)

    def on_did_save(self: PorterServer, params: types.DidSaveTextDocumentParams) -> None:
        self.schedule(params.text_document.uri, 0)

    def on_did_close(self: PorterServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        task = self.pending.pop(uri, None)
        if task is not None:
            task.cancel()
        self.analyses.pop(uri, None)
        self.documents.pop(uri, None)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    # -- notebooks (LSP 3.17 notebook document sync): the Python cells as one program -------
    def notebook_cells(self, uri: str) -> list[tuple[int, str, str, int]]:
        """(cell number, cell document uri, its text, its version) of each Python code cell."""
        nb = self.workspace.get_notebook_document(notebook_uri=uri)
        if nb is None:
            return []
        out = []
        for number, cell in enumerate(nb.cells, 1):
            if cell.kind != types.NotebookCellKind.Code:
                continue
            doc = self.workspace.text_documents.get(unquote(cell.document)) or self.workspace.text_documents.get(cell.document)
            if doc is None or (doc.language_id or "python").lower() not in ("python", "ipython"):
                continue
            out.append((number, cell.document, doc.source, doc.version))
        return out

    async def check_notebook(self, uri: str) -> Optional[NotebookAnalysis]:
        nb = self.workspace.get_notebook_document(notebook_uri=uri)
        if nb is None:
            return None
        version = nb.version
        cells = self.notebook_cells(uri)
        cached = self.notebooks.get(uri)
        if cached is not None and cached[0] == version and cached[1].cells == cells:
            return cached[1]
        try:
            settings: Optional[Settings] = self.settings(uri)
        except UsageError:
            settings = None
        path = str(_path_of(uri) or uri)
        nan = await asyncio.get_running_loop().run_in_executor(self.worker, analyze_notebook, cells, settings, path)
        now = self.workspace.get_notebook_document(notebook_uri=uri)
        if now is None or now.version != version:
            return nan
        old = self.notebooks.get(uri)
        self.notebooks[uri] = (version, nan)
        published = {c[1] for c in cells}
        for number, cell_uri, text, cell_version in cells:
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
                uri=cell_uri, version=cell_version, diagnostics=self.notebook_diagnostics(nan, number)))
        if old is not None:  # cells no longer in the notebook (or no longer Python): cleared
            for _, cell_uri, _, _ in old[1].cells:
                if cell_uri not in published:
                    self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell_uri, diagnostics=[]))
        return nan

    def notebook_diagnostics(self, nan: NotebookAnalysis, number: int) -> list:
        if nan.error is not None:
            if nan.error_cell != number:
                return []
            line, col = nan.error_at
            lines = nan.cell_lines(number)
            start = self.to_lsp(lines, line, col)
            end = self.to_lsp(lines, line, max(len(_body(lines[line])) if line < len(lines) else 0, col))
            return [types.Diagnostic(range=types.Range(start=start, end=end), message=nan.error,
                                     severity=types.DiagnosticSeverity.Error, source=SOURCE)]
        an = nan.analysis
        out = []
        for i, f in enumerate(an.findings):
            where = nan.cell_range(f)
            if where is None or where[0] != number:
                continue
            out.append(types.Diagnostic(
                range=self.cell_lsp_range(nan, where), message=f.message + _mark(f), severity=SEVERITY[f.severity],
                code=f.code, source=SOURCE,
                code_description=types.CodeDescription(href=href) if (href := rule_doc_uri(f.code)) else None,
                data={"version": nan.version_of(number), "index": i},
            ))
        return out

    def cell_lsp_range(self, nan: NotebookAnalysis, where):
        number, line, col, end_line, end_col = where
        lines = nan.cell_lines(number)
        return types.Range(start=self.to_lsp(lines, line, col), end=self.to_lsp(lines, end_line, end_col))

    def schedule_notebook(self, uri: str, delay: float) -> None:
        key = "notebook:" + uri
        old = self.pending.pop(key, None)
        if old is not None:
            old.cancel()

        async def later() -> None:
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await self.check_notebook(uri)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.error("porter lsp: check of %s failed\n%s", uri, traceback.format_exc())

        self.pending[key] = asyncio.get_running_loop().create_task(later())

    def on_notebook_did_open(self: PorterServer, params: types.DidOpenNotebookDocumentParams) -> None:
        self.schedule_notebook(params.notebook_document.uri, 0)

    def on_notebook_did_change(self: PorterServer, params: types.DidChangeNotebookDocumentParams) -> None:
        self.schedule_notebook(params.notebook_document.uri, self.debounce)

    def on_notebook_did_save(self: PorterServer, params: types.DidSaveNotebookDocumentParams) -> None:
        self.schedule_notebook(params.notebook_document.uri, 0)

    def on_notebook_did_close(self: PorterServer, params: types.DidCloseNotebookDocumentParams) -> None:
        uri = params.notebook_document.uri
        task = self.pending.pop("notebook:" + uri, None)
        if task is not None:
            task.cancel()
        old = self.notebooks.pop(uri, None)
        for cell in params.cell_text_documents:
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell.uri, diagnostics=[]))
        del old

    async def notebook_code_actions(self, notebook_uri: str, params: types.CodeActionParams) -> list:
        nan = await self.check_notebook(notebook_uri)
        if nan is None or nan.error is not None or nan.analysis.module is None:
            return []
        cell_uri = params.text_document.uri
        number = nan.number_of(cell_uri)
        if number is None:
            return []
        an = nan.analysis
        only = params.context.only
        if only and not any(str(getattr(o, "value", o)) in ("", types.CodeActionKind.QuickFix.value) for o in only):
            return []  # (only quick-fixes for notebook cells)
        chosen: list[int] = []
        for d in params.context.diagnostics:
            data = d.data if isinstance(d.data, dict) else {}
            i = data.get("index")
            if d.source == SOURCE and isinstance(i, int) and 0 <= i < len(an.findings) and an.findings[i].code == d.code:
                chosen.append(i)
        if not params.context.diagnostics:
            lines = nan.cell_lines(number)
            start, end = self.from_lsp(lines, params.range.start), self.from_lsp(lines, params.range.end)
            for j, f in enumerate(an.findings):
                where = nan.cell_range(f)
                if where is not None and where[0] == number and (where[1], where[2]) <= end and (where[3], where[4]) >= start:
                    chosen.append(j)
        actions = []
        for i in dict.fromkeys(chosen):
            f = an.findings[i]
            if f.fix is None or (f.fix.remove_imports and not fix_known(an, f)):
                continue  # (fixes that remove imports: `porter migrate` on the notebook)
            edits = nan.cell_edits(fix_changes(an, f))
            if edits is None:
                continue  # the fix would touch an IPython line or lies across cells
            unsafe = f.fix.safety is not Safety.SAFE
            what = f.fix.description or registry.find(f.code).summary
            where = nan.cell_range(f)
            diag = [types.Diagnostic(range=self.cell_lsp_range(nan, where), message=f.message + _mark(f),
                                     severity=SEVERITY[f.severity], code=f.code, source=SOURCE,
                                     data={"version": nan.version_of(number), "index": i})] if where else []
            by_cell: dict[str, list] = {}
            for cell_number, change in edits:
                lines = nan.cell_lines(cell_number)
                by_cell.setdefault(nan.uri_of(cell_number), []).append(types.TextEdit(
                    range=types.Range(start=self.to_lsp(lines, *change.start), end=self.to_lsp(lines, *change.end)), new_text=change.text))
            caps = self.client_capabilities
            versioned = bool(caps.workspace and caps.workspace.workspace_edit and caps.workspace.workspace_edit.document_changes)
            if versioned:
                edit = types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
                    text_document=types.OptionalVersionedTextDocumentIdentifier(uri=u, version=nan.version_of(nan.number_of(u))), edits=e)
                    for u, e in by_cell.items()])
            else:
                edit = types.WorkspaceEdit(changes=by_cell)
            actions.append(types.CodeAction(
                title=f"Fix {f.code}: {what}" + (" (unsafe)" if unsafe else ""), kind=types.CodeActionKind.QuickFix,
                diagnostics=diag, is_preferred=not unsafe, edit=edit,
            ))
        return actions

    async def on_code_action(self: PorterServer, params: types.CodeActionParams):
        uri = params.text_document.uri
        notebook_doc = self.workspace.get_notebook_document(cell_uri=uri)
        if notebook_doc is not None:
            return await self.notebook_code_actions(notebook_doc.uri, params)
        doc = self.workspace.text_documents.get(uri)
        if doc is None:
            return []
        version = doc.version
        an = await self.current(uri)
        if an is None or an.error is not None or an.module is None:
            return []
        only = params.context.only

        def wanted(kind) -> bool:
            kind = str(getattr(kind, "value", kind))
            return not only or any(kind == str(getattr(o, "value", o)) or kind.startswith(str(getattr(o, "value", o)) + ".") for o in only)

        # the findings of the diagnostics the client sent, else those the range touches
        chosen: list[int] = []
        for d in params.context.diagnostics:
            if d.source != SOURCE:
                continue
            data = d.data if isinstance(d.data, dict) else {}
            i = data.get("index")
            if data.get("version") == version and isinstance(i, int) and 0 <= i < len(an.findings) and an.findings[i].code == d.code:
                chosen.append(i)
                continue
            for j, f in enumerate(an.findings):
                if f.code == d.code and self.range_of(an, f) == d.range:
                    chosen.append(j)
                    break
        if not params.context.diagnostics:
            start = self.from_lsp(an.lines, params.range.start)
            end = self.from_lsp(an.lines, params.range.end)
            for j, f in enumerate(an.findings):
                p = f.position
                if p is not None and (p.line - 1, p.column) <= end and (p.end_line - 1, p.end_column) >= start:
                    chosen.append(j)
        actions = []
        for i in dict.fromkeys(chosen):
            actions.extend(await self.finding_actions(uri, version, an, i, wanted))
        allowed = an.settings.unsafe_fixes if an.settings else False
        fixable = [f for f in an.findings if f.fix is not None and (allowed or f.fix.safety is Safety.SAFE)]
        if fixable and wanted(FIX_ALL_KIND):
            action = types.CodeAction(
                title="Fix all porter findings in this file" + (" (unsafe fixes included, [tool.porter] unsafe-fixes)" if allowed else ""),
                kind=FIX_ALL_KIND, data={"uri": uri, "version": version, "fixAll": True},
            )
            if not self.resolve_supported():
                await self.resolve_fix_all(action)
            if action.edit is not None or self.resolve_supported():
                actions.append(action)
        return actions

    async def resolve_fix_all(self, action) -> None:
        data = action.data if isinstance(action.data, dict) else {}
        uri = data.get("uri")
        cached = self.analyses.get(uri) if isinstance(uri, str) else None
        if cached is None or cached[0] != data.get("version") or cached[1].module is None:
            return  # the document changed since: no edit (the client asks again)
        an = cached[1]
        if an.fix_all is None:
            try:
                an.fix_all = await self.in_fixer(fix_all_job, an.text, an.settings)
            except engine.PorterError as exc:
                an.fix_all_error = str(exc)
                return
        assert isinstance(uri, str)
        action.edit = self.edit(uri, cached[0], an, an.fix_all)

    def on_shutdown(self: PorterServer, params) -> None:
        if self.fixer is not None:
            for proc in list(getattr(self.fixer, "_processes", {}).values()):
                proc.terminate()  # a "fix all" still running is of no use to anyone now
            self.fixer.shutdown(wait=False, cancel_futures=True)
            self.fixer = None

    async def on_code_action_resolve(self: PorterServer, action: types.CodeAction):
        if isinstance(action.data, dict) and action.edit is None:
            if action.data.get("fixAll"):
                await self.resolve_fix_all(action)
            else:
                await self.resolve_fix(action)
            if action.edit is None:
                raise JsonRpcContentModified("the document changed since this action was offered, or its fixes failed; ask for code actions again")
        return action



def build_server(debounce: float = DEFAULT_DEBOUNCE) -> PorterServer:
    """The server, not started (``serve`` starts it on stdin/stdout)."""
    return PorterServer(debounce)


def _mark(f: Finding) -> str:
    """The CLI's marker after a message (``porter check``'s text output)."""
    if f.fix is None:
        return ""
    return " [*]" if f.fix.safety is Safety.SAFE else " [unsafe fix]"


def serve(debounce: float = DEFAULT_DEBOUNCE) -> None:
    """Run the server on stdin/stdout until the client says exit."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    server = build_server(debounce)
    registry.rules_for("torch-xla")  # import the rules before the first document arrives
    server.start_io()
