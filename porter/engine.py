"""The pure core: source text in, findings and fixed text out. No I/O, no printing.

One parse per pass; every enabled rule runs in a single traversal (a dispatch table from
node type to the rules' ``visit_*``/``leave_*`` methods). Fixes are applied by node identity,
the imports they need are added through LibCST's ``AddImportsVisitor`` and the ones they
leave unused removed through its ``RemoveImportsVisitor``, the result is parsed
again and re-checked until nothing more changes. A file whose fixes do not converge, or whose
output does not parse, is reported as failed and left as it was.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import libcst as cst

from porter import _libcst_compat as _compat
from porter._libcst_compat import child_fields as _child_fields
from porter._libcst_compat import is_node_type as is_node_type
from porter.context import FileContext
from porter.edits import FixFailed, apply_fixes
from porter.edits import add_imports as add_imports  # (re-exported: the engine's API before porter.edits)
from porter.edits import binds_looser as binds_looser
from porter.edits import keep_boundary as keep_boundary
from porter.edits import orphaned_imports, without_emptied_ifs, without_identical_arms, without_leading_blank_lines
from porter.edits import remove_imports as remove_imports
from porter.rules import Finding, NeedsHuman, Position, Rule, Safety, Severity

MAX_PASSES = 8
_SUPPRESS = re.compile(r"#\s*porter:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?")


class PorterError(Exception):
    """A file porter cannot process; the message is one line, for the user."""


@dataclass(frozen=True)
class Options:
    rules: tuple[type[Rule], ...]
    unsafe_fixes: bool = False


@dataclass
class CheckResult:
    findings: list[Finding]
    module: cst.Module


@dataclass
class FixResult:
    source: str  # the new text ("" when unchanged is signalled by changed=False)
    changed: bool
    fixed: dict[str, int]  # rule code -> number of fixes applied
    remaining: list[Finding]  # findings left for a human (with positions in the new text)
    # the tree the source text was parsed into (runner.verify_output reads its codegen instead
    # of parsing the source again)
    source_module: Optional[cst.Module] = field(default=None, repr=False, compare=False)


# --------------------------------------------------------------------------------------
# Limits
# --------------------------------------------------------------------------------------
# LibCST's native parser overflows its stack (the process dies, no message) on about 2,000
# nested brackets; its parse of a chain of binary operators grows as the cube of its length
# (1k/2k/4k terms of `+`: 1.8/10.4/87 s), and the tree of a long chain is as deep as the
# chain, deeper than Python's recursion limit for the walks over it past a few hundred terms.
# `precheck` refuses such a file, from its tokens, before LibCST sees it. The limits are far
# above real code: measured with benchmarks/limits_maxima.py over torch's, torchvision's and
# timm's installed sources and ../shared/corpus (2,604 files, 2026-12): deepest bracket
# nesting 26 (MAX_NESTING 100; CPython itself refuses 200), longest operator chain 29
# (MAX_CHAIN 100). The pre-check costs about a tenth of the parse (same script).
MAX_NESTING = 100
MAX_CHAIN = 100

_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
# operators that nest in the tree as a chain grows: binary and unary operators, attribute access
_CHAIN_OPS = frozenset({
    "+", "-", "*", "/", "//", "%", "@", "**", "<<", ">>", "&", "|", "^", "~", ".",
})
_CHAIN_WORDS = frozenset({"and", "or", "not"})


@dataclass(frozen=True)
class TextShape:
    """The largest nesting and operator chain of a text, and where they are (1-based lines)."""

    nesting: int = 0
    nesting_line: int = 0
    chain: int = 0
    chain_line: int = 0


def text_shape(source: str) -> TextShape:
    """Deepest bracket nesting and longest run of chaining operators at one bracket level
    (between commas, colons, assignments and line ends), from Python's tokenizer. A text the
    tokenizer rejects is measured up to the error (LibCST then reports the syntax error)."""
    import io
    import tokenize

    depth = nesting = nesting_line = chain = chain_line = 0
    runs = [0]
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            kind, text = tok.type, tok.string
            if kind == tokenize.OP:
                if text in _OPEN:
                    depth += 1
                    runs.append(0)
                    if depth > nesting:
                        nesting, nesting_line = depth, tok.start[0]
                elif text in _CLOSE:
                    if depth:
                        depth -= 1
                        runs.pop()
                elif text in _CHAIN_OPS:
                    runs[-1] += 1
                    if runs[-1] > chain:
                        chain, chain_line = runs[-1], tok.start[0]
                else:  # , : = ; -> augmented assignments, comparisons...: a new chain
                    if text != "==" and text not in ("<", ">", "<=", ">=", "!="):
                        runs[-1] = 0
            elif kind == tokenize.NAME and text in _CHAIN_WORDS:
                runs[-1] += 1
                if runs[-1] > chain:
                    chain, chain_line = runs[-1], tok.start[0]
            elif kind in (tokenize.NEWLINE, tokenize.NL) and depth == 0:
                runs[-1] = 0
            elif kind == tokenize.NAME and text in ("lambda", "if", "else", "for", "yield", "return"):
                runs[-1] = 0
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return TextShape(nesting, nesting_line, chain, chain_line)


def precheck(source: str, max_nesting: Optional[int] = None, max_chain: Optional[int] = None) -> None:
    """Raise PorterError for a text past porter's limits (by default MAX_NESTING, MAX_CHAIN)."""
    max_nesting = MAX_NESTING if max_nesting is None else max_nesting
    max_chain = MAX_CHAIN if max_chain is None else max_chain
    if "(" not in source and "[" not in source and "{" not in source and len(source) < max_chain:
        return
    shape = text_shape(source)
    if shape.nesting > max_nesting:
        raise PorterError(
            f"line {shape.nesting_line}: brackets nested {shape.nesting} deep, over porter's limit of "
            f"{max_nesting} (LibCST's parser would overflow its stack)"
        )
    if shape.chain > max_chain:
        raise PorterError(
            f"line {shape.chain_line}: a chain of {shape.chain} operators in one expression, over porter's "
            f"limit of {max_chain} (LibCST's parse time grows as its cube)"
        )


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------
def parse(source: str) -> cst.Module:
    precheck(source)
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise PorterError(_syntax_message(source, exc)) from None
    except (RecursionError, MemoryError) as exc:
        raise PorterError(f"cannot parse: {type(exc).__name__}") from None
    except Exception as exc:  # LibCST's native parser raises a few other kinds on odd input
        raise PorterError(f"cannot parse: {exc}".splitlines()[0]) from None


_PY2 = re.compile(r"^\s*(print\s+[^\s(=]|exec\s+[\"'\w]|raise\s+\w+\s*,)|\bur[\"']|^\s*except\s+\w+\s*,\s*\w+\s*:|[^\w.]0[0-7]+\b|<>", re.M)


def _syntax_message(source: str, exc: cst.ParserSyntaxError) -> str:
    where = f"line {exc.raw_line}, column {exc.raw_column + 1}"
    if _PY2.search(source):
        return f"syntax error at {where}: this looks like Python 2 code; porter reads Python 3"
    first = str(exc.message).splitlines()[0] if exc.message else "invalid syntax"
    return f"syntax error at {where}: {first}"


# --------------------------------------------------------------------------------------
# Traversal
# --------------------------------------------------------------------------------------
_FIELDS = _compat.FIELDS
Handler = Callable[[cst.CSTNode], object]


class _Dispatcher:
    """One walk of the tree calling every rule's visit_/leave_ methods for each node.

    A rule's :class:`NeedsHuman` becomes a finding of the rule at the node visited; any other
    exception from a rule (a bug in porter) becomes the rule's internal-error finding at that
    node, the rule's other findings for the file are dropped and the rule is not called again
    in this walk; the other rules go on. RecursionError and MemoryError are limits of the
    file, not of a rule: they stop the walk."""

    def __init__(self, rules: Sequence[Rule], ctx: FileContext) -> None:
        self.ctx = ctx
        self.rules = list(rules)
        self.crashed: dict[int, Finding] = {}  # id(rule instance) -> its internal-error finding
        self._index()

    def _index(self) -> None:
        self.visit: dict[str, list[tuple[Rule, Handler]]] = {}
        self.leave: dict[str, list[tuple[Rule, Handler]]] = {}
        for rule in self.rules:
            if id(rule) in self.crashed:
                continue
            for attr in dir(type(rule)):
                if attr.startswith("visit_"):
                    self.visit.setdefault(attr[6:], []).append((rule, getattr(rule, attr)))
                elif attr.startswith("leave_"):
                    self.leave.setdefault(attr[6:], []).append((rule, getattr(rule, attr)))

    def _call(self, rule: Rule, handler: Handler, node: cst.CSTNode) -> None:
        try:
            handler(node)
        except NeedsHuman as exc:
            rule.report(node, str(exc) or "cannot be ported automatically")
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:
            self.crashed[id(rule)] = rule_crash(rule.code, node, exc, "while checking this code")
            self._index()

    def walk(self, node: cst.CSTNode) -> None:
        stack = self.ctx.ancestors
        kind = type(node)
        name = kind.__name__
        stack.append(node)
        if (kind is cst.Import or kind is cst.ImportFrom) and len(stack) > 2:
            self.ctx.add_import(node)
        for rule, handler in self.visit.get(name, ()):
            self._call(rule, handler, node)
        # porter's own rendered helpers in the module are target code: not walked (porter.emitted)
        skip = self.ctx.emitted if kind is cst.Module else ()
        for fname in _child_fields(kind):
            value = getattr(node, fname)
            vkind = type(value)
            if vkind is tuple or vkind is list:
                for item in value:
                    if is_node_type(type(item)) and id(item) not in skip:
                        self.walk(item)
            elif is_node_type(vkind):
                self.walk(value)
        for rule, handler in self.leave.get(name, ()):
            self._call(rule, handler, node)
        stack.pop()


def rule_crash(code: str, node: cst.CSTNode, exc: BaseException, doing: str) -> Finding:
    """The finding that reports rule ``code``'s exception ``exc`` at ``node``: a bug in porter."""
    return Finding(
        code,
        f"internal error in rule {code} {doing} (a bug in porter; its findings and fixes are left out "
        f"for this file): {describe_exception(exc)}",
        node,
        Severity.ERROR,
        internal_error=True,
    )


def _library_roots() -> tuple[str, ...]:
    import os
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(os.path.dirname(os.path.abspath(cst.__file__)))
    mine = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # porter installed in site-packages
    return tuple(r.rstrip(os.sep) + os.sep for r in roots if not mine.startswith(r.rstrip(os.sep) + os.sep)) + (
        os.path.dirname(os.path.abspath(cst.__file__)) + os.sep,)


def describe_exception(exc: BaseException) -> str:
    """``Type: message (where)`` on one line (the message's line breaks made spaces), ``where``
    being the innermost frame outside LibCST and the standard library: the rule or the helper
    that raised, not the LibCST function it called."""
    import os
    import traceback

    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    libs = _library_roots()
    own = [f for f in frames if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(libs)]
    frame = own[-1] if own else (frames[-1] if frames else None)
    where = ""
    if frame is not None:
        parts = os.path.abspath(frame.filename).split(os.sep)
        where = f" ({'/'.join(parts[-2:])}:{frame.lineno})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"

def applicable_rules(rules: Iterable[type[Rule]], source: str, document: Optional[str] = None) -> list[type[Rule]]:
    """Rules whose cheap text pre-filters match: ``Rule.needs_text`` in ``source`` (this pass's
    text), ``Rule.needs_document`` in ``document`` (the text the run began with; by default
    ``source``)."""
    document = source if document is None else document
    return [r for r in rules if (not r.needs_text or any(w in source for w in r.needs_text))
            and (not getattr(r, "needs_document", ()) or any(w in document for w in r.needs_document))]


def run_rules(module: cst.Module, rules: Sequence[type[Rule]], path: str = "<string>",
              ctx: Optional[FileContext] = None, text: Optional[str] = None,
              document: Optional[str] = None) -> list[Finding]:
    """Every rule of ``rules`` over ``module`` in one walk. ``ctx``: a fresh FileContext of
    this module to use (porter.incremental shares the module facts it computed with it);
    ``text``: the code ``module`` was parsed from (``FileContext.text`` without a codegen);
    ``document``: the text a fix run began from (``FileContext.document``)."""
    if not rules:
        return []
    if ctx is None:
        ctx = FileContext(module, path, text, document)
    instances = []
    crashed_init = []
    for rule in rules:
        try:
            instances.append(rule(ctx))
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:
            crashed_init.append(rule_crash(rule.code, module, exc, "while starting on this file"))
    dispatcher = _Dispatcher(instances, ctx)
    dispatcher.walk(module)
    findings: list[Finding] = list(crashed_init)
    for inst in instances:
        crash = dispatcher.crashed.get(id(inst))
        findings.extend([crash] if crash is not None else inst.findings)
    return findings


def node_positions(module: cst.Module) -> dict:
    """node -> CodeRange for every node, from one position-tracking codegen of the module
    (porter._libcst_compat; tests/test_engine.py checks it agrees with PositionProvider)."""
    return _compat.node_positions(module)


def positions_of(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> dict:
    """node -> CodeRange for (at least) ``nodes``, as :func:`node_positions` gives them, from a
    position-tracking codegen of only the top-level statements that hold one of ``nodes``
    (the statements before them generated as plain text, to count lines and columns; the ones
    after them not at all). A node not found by a walk of the statements' code-holding fields
    (the module itself, a comment of the header...) gets the whole module's codegen."""
    wanted = {id(n) for n in nodes}
    if id(module) in wanted:
        return node_positions(module)
    need: set[int] = set()
    for at, stmt in enumerate(module.body):
        if not wanted:
            break
        stack = [stmt]
        while stack:
            node = stack.pop()
            key = id(node)
            if key in wanted:
                wanted.discard(key)
                need.add(at)
            for fname in _child_fields(type(node)):
                value = getattr(node, fname)
                vkind = type(value)
                if vkind is tuple or vkind is list:
                    stack.extend(item for item in value if is_node_type(type(item)))
                elif is_node_type(vkind):
                    stack.append(value)
    if wanted:
        return node_positions(module)
    gen = _compat.PositionCodegen(module.default_indent, module.default_newline)
    last = max(need, default=-1)
    plain = _compat.PlainCodegen(module.default_indent, module.default_newline)
    for h in module.header:
        plain.add(h)
    for at, stmt in enumerate(module.body[: last + 1]):
        if at in need:
            gen.advance(plain.tokens)
            plain.tokens.clear()
            gen.add(stmt)
        else:
            plain.add(stmt)
    return gen.positions

def attach_positions(module: cst.Module, findings: list[Finding]) -> None:
    if not findings:
        return
    positions = positions_of(module, [f.node for f in findings])
    for f in findings:
        rng = positions.get(f.node)
        if rng is not None:
            f.position = Position(rng.start.line, rng.start.column, rng.end.line, rng.end.column)
    findings.sort(key=lambda f: (f.position.line, f.position.column, f.code) if f.position else (0, 0, f.code))


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def drop_suppressed(source: str, findings: list[Finding]) -> list[Finding]:
    """Honour ``# porter: ignore`` and ``# porter: ignore[CODE, ...]`` on a finding's lines."""
    if "porter:" not in source or not findings:
        return findings
    lines = _LINE_BREAK.split(source)  # line numbers count only \n, \r\n and \r (not U+2028...)
    kept = []
    for f in findings:
        if f.position is not None and _suppressed(lines, f):
            continue
        kept.append(f)
    return kept


def drop_yielding(findings: list[Finding]) -> list[Finding]:
    """Drop the findings of rules that yield a line (Rule.yields_line) on a line where a
    finding of another rule starts or ends: a line is reported once, by the rule that acts on
    it (the lines inside another finding's node, a class's body under its header, are not
    taken)."""
    if not any(f.yields for f in findings):
        return findings
    taken: set[int] = set()
    for f in findings:
        if not f.yields and f.position is not None:
            taken.update((f.position.line, f.position.end_line))
    return [f for f in findings if not (f.yields and f.position is not None
                                        and any(n in taken for n in range(f.position.line, f.position.end_line + 1)))]


def _suppressed(lines: list[str], f: Finding) -> bool:
    assert f.position is not None
    for lineno in {f.position.line, f.position.end_line}:
        if 0 < lineno <= len(lines):
            m = _SUPPRESS.search(lines[lineno - 1])
            if m and (m.group(1) is None or f.code in {c.strip() for c in m.group(1).split(",")}):
                return True
    return False


_TOO_DEEP = "too deeply nested for porter (RecursionError while walking the tree)"


def check(source: str, options: Options, path: str = "<string>") -> CheckResult:
    """All findings of the enabled rules, with positions, suppressions honoured. A rule that
    raises gives its internal-error finding (see :class:`_Dispatcher`)."""
    module = parse(source)
    try:
        findings = run_rules(module, applicable_rules(options.rules, source), path)
    except RecursionError:
        raise PorterError(_TOO_DEEP) from None
    attach_positions(module, findings)
    findings = drop_yielding(drop_suppressed(source, findings))
    return CheckResult(findings + marked_findings(source, findings, options.rules), module)


_MARKER = re.compile(r"#\s*porter: manual \((?P<code>[A-Z]{2}\d{3})\): (?P<reason>.+?)\s*$")


def marked_findings(text: str, findings: list[Finding], rules: Sequence) -> list[Finding]:
    """A finding for each `# porter: manual (CODE): reason` mark in ``text`` of a selected rule
    that no finding of that rule reports at its line: a line a rule marked for a person stays
    reported (at the statement it marks: its own line, or the next one for a comment above it)
    until the person removes the mark, whether or not the rule reports it again."""
    if "porter: manual (" not in text:
        return []
    severities = {r.code: r.severity for r in rules}
    have = {(f.code, f.position.line) for f in findings if f.position is not None}
    lines = text.splitlines()
    out: list[Finding] = []
    for i, line in enumerate(lines, 1):
        m = _MARKER.search(line)
        if m is None or m["code"] not in severities:
            continue
        at = i
        if line.lstrip().startswith("#"):  # a comment line: the statement below it
            while at < len(lines) and lines[at - 1].lstrip().startswith("#"):
                at += 1
        if (m["code"], at) in have or (m["code"], i) in have:
            continue
        stmt = lines[at - 1]
        column = len(stmt) - len(stmt.lstrip())
        out.append(Finding(m["code"], f"{m['reason']} (marked `# porter: manual` in the code)", None,  # type: ignore[arg-type]
                           severities[m["code"]], None, Position(at, column, at, len(stmt))))
        have.add((m["code"], at))
    return out


# --------------------------------------------------------------------------------------
# Fixing: the edits put in place and the imports they need (porter.edits)
# --------------------------------------------------------------------------------------

def _first_stage(chosen: list[Finding], options: Options) -> list[Finding]:
    """While a front end (MXNet/Gluon -> PyTorch) still has fixes to make, only its fixes are
    applied: the target's rules take the file once it is PyTorch (a target rule acting on the
    half-translated text would see a loop before its optimizer step exists)."""
    from porter.registry import FRONT_END_TARGETS

    targets = {r.code: r.target for r in options.rules}
    front = [f for f in chosen if targets.get(f.code) in FRONT_END_TARGETS]
    return front if front and len(front) < len(chosen) else chosen


def _apply_chosen(module: cst.Module, chosen: list[Finding]) -> tuple[cst.Module, list[Finding], list[Finding]]:
    """Apply the fixes of ``chosen``: (the new module, the findings whose fixes were applied,
    the findings that report fixes left out). A fix whose replacement raised
    :class:`NeedsHuman` is left out and reported with that message; a rule whose fix raised
    anything else (in its replacement, or in LibCST when the new node was put in place) is
    a bug: its fixes are left out and its internal error reported. The others still apply."""
    problems: list[Finding] = []
    chosen = list(chosen)
    while True:
        try:
            return apply_fixes(module, [f.fix for f in chosen if f.fix], FileContext(module)), chosen, problems
        except FixFailed as failed:
            owner = {id(e): f for f in chosen if f.fix for e in f.fix.edits}
            bad_codes: set[str] = set()
            dropped: set[int] = set()
            for edit, exc in failed.failures:
                f = owner.get(id(edit))
                if f is None:
                    continue
                dropped.add(id(f))
                if isinstance(exc, NeedsHuman):
                    problems.append(Finding(f.code, str(exc) or f.message, f.node, f.severity))
                elif f.code not in bad_codes:
                    bad_codes.add(f.code)
                    problems.append(rule_crash(f.code, edit.target, exc, "while fixing this code"))
            chosen = [f for f in chosen if id(f) not in dropped and f.code not in bad_codes]
        except (RecursionError, MemoryError):
            raise
        except Exception as exc:
            culprits = _failing_codes(module, chosen)
            if not culprits:
                raise
            for code in culprits:
                first = next(f for f in chosen if f.code == code)
                problems.append(rule_crash(code, first.node, culprits[code], "while fixing this code"))
            chosen = [f for f in chosen if f.code not in culprits]


def _by_code(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.code, []).append(f)
    return groups


def _failing_codes(module: cst.Module, chosen: Sequence[Finding]) -> dict[str, Exception]:
    """The rules whose fixes, applied alone, raise: rule code -> the exception."""
    failing: dict[str, Exception] = {}
    for code, group in _by_code(chosen).items():
        try:
            apply_fixes(module, [f.fix for f in group if f.fix], FileContext(module))
        except (RecursionError, MemoryError):
            raise
        except FixFailed:
            continue  # handled by the caller's next round
        except Exception as exc:
            failing[code] = exc
    return failing


def _unparsable(module: cst.Module, chosen: Sequence[Finding], exc: Exception) -> PorterError:
    """The error for fixes whose output does not parse, naming the rule(s) and the line:
    the rules whose fixes alone give code that does not parse, else all of them."""
    bad: list[str] = []
    where = _parse_error_where(exc)
    at = ""
    for code, group in _by_code(chosen).items():
        try:
            text = apply_fixes(module, [f.fix for f in group if f.fix], FileContext(module)).code
            cst.parse_module(text)
        except cst.ParserSyntaxError as own:
            if not bad:
                where = _parse_error_where(own)
                line = _first_changed_line(module.code, text)
                fixes = [f for f in group if f.fix]
                attach_positions(module, fixes)
                near = [f.position.line for f in fixes if f.position and f.position.line <= line] or [
                    f.position.line for f in fixes if f.position]
                at = f" at line {max(near)}" if near else ""
            bad.append(code)
        except Exception:
            continue
    codes = ", ".join(bad) if bad else ", ".join(sorted({f.code for f in chosen}))
    return PorterError(
        f"internal error: the fix of {codes}{at} produced code that does not parse ({where}); a bug in porter, "
        "file left unchanged"
    )


_LIBCST_AT = re.compile(r"^(?:parser error: )?error at \d+:\d+: ")


def _parse_error_where(exc: Exception) -> str:
    if isinstance(exc, cst.ParserSyntaxError):
        first = str(exc.message).splitlines()[0] if exc.message else "invalid syntax"
        return f"line {exc.raw_line} of the converted code: {_LIBCST_AT.sub('', first)}"
    return " ".join(str(exc).split())


def _first_changed_line(before: str, after: str) -> int:
    for n, (a, b) in enumerate(zip(before.splitlines(), after.splitlines()), 1):
        if a != b:
            return n
    return min(len(before.splitlines()), len(after.splitlines())) + 1


def fix(source: str, options: Options, path: str = "<string>") -> FixResult:
    """Apply every selected fix until nothing changes; then verify a pass changes nothing.

    A rule that raises is reported (its internal-error finding, see :class:`_Dispatcher`)
    and left out for the file; the other rules' fixes still apply. Fixes whose output does
    not parse leave the file unchanged (PorterError naming the rule and the line)."""
    try:
        return _fix(source, options, path)
    except RecursionError:
        raise PorterError(_TOO_DEEP) from None


def _fix(source: str, options: Options, path: str) -> FixResult:
    module = original = parse(source)
    counts: dict[str, int] = {}
    current = source
    settled: Optional[list[Finding]] = None  # findings of a pass that changed nothing
    problems: list[Finding] = []  # fixes left out (NeedsHuman, a rule's bug), with positions then
    rules = list(options.rules)
    suppressions = False  # whether the text has `# porter: ignore` comments (positions needed)
    for _ in range(MAX_PASSES):
        # the text pre-filter reads this pass's text: a rule may act on another rule's output;
        # the document gate (Rule.needs_document) reads the text the migrate began with
        findings = run_rules(module, applicable_rules(rules, current, source), path, text=current, document=source)
        suppressions = _SUPPRESS.search(current) is not None  # (not "porter: manual" marks)
        if suppressions:
            attach_positions(module, findings)
            findings = drop_suppressed(current, findings)
        chosen = _first_stage([f for f in findings if f.fix is not None and (options.unsafe_fixes or f.fix.safety is Safety.SAFE)], options)
        if not chosen:
            # the imports the port left unused go (a pass more: the findings are the final text's)
            # and so do the `if flag: pass` statements its fixes emptied
            orphans = orphaned_imports(original, module) if current != source else []
            cleaned = without_leading_blank_lines(module, remove_imports(module, orphans)) if orphans else module
            cleaned = without_emptied_ifs(original, cleaned) if current != source else cleaned
            cleaned = without_identical_arms(original, cleaned) if current != source else cleaned
            if cleaned.code == current:
                settled = findings
                break
            module, current = cst.parse_module(cleaned.code), cleaned.code
            continue
        new_module, applied, left_out = _apply_chosen(module, chosen)
        left_out += [f for f in findings if f.internal_error]
        if left_out:
            attach_positions(module, left_out)
            problems.extend(left_out)
            crashed = {f.code for f in left_out if f.internal_error}
            rules = [r for r in rules if r.code not in crashed]  # a rule that failed is not run again
        new_source = new_module.code
        if new_source == current:
            settled = findings
            break
        for f in applied:
            counts[f.code] = counts.get(f.code, 0) + 1
        try:
            module = cst.parse_module(new_source)
        except Exception as exc:
            raise _unparsable(module, applied, exc) from None
        current = new_source
    else:
        codes = ", ".join(sorted(counts))
        raise PorterError(f"fixes did not converge after {MAX_PASSES} passes (rules {codes}); file left unchanged")
    # The last pass ran every rule on the final tree and changed nothing: its findings are the
    # ones left (no second run of the rules).
    remaining = settled
    if not suppressions:
        attach_positions(module, remaining)
    remaining = drop_yielding(remaining)
    remaining = remaining + marked_findings(current, remaining, options.rules)
    seen = {id(f) for f in remaining}
    return FixResult(current, current != source, counts, remaining + [f for f in problems if id(f) not in seen],
                     original)
