"""The pure core: source text in, findings and fixed text out. No I/O, no printing.

One parse per pass; every enabled rule runs in a single traversal (a dispatch table from
node type to the rules' ``visit_*``/``leave_*`` methods). Fixes are applied by node identity,
the imports they need are added through LibCST's ``AddImportsVisitor`` and the ones they
leave unused removed through its ``RemoveImportsVisitor``, the result is parsed
again and re-checked until nothing more changes. A file whose fixes do not converge, or whose
output does not parse, is reported as failed and left as it was.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence, Union

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem, RemoveImportsVisitor
from libcst._nodes.internal import CodegenState
from libcst.metadata.position_provider import PositionProvidingCodegenState

from porter.context import PREFERRED_ALIASES, FileContext
from porter.rules import Edit, Finding, Fix, NeedsHuman, Position, Rule, Safety, Severity

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
_SKIP_FIELD = re.compile(
    r"^(whitespace.*|lpar|rpar|comma|semicolon|header|footer|leading_lines|lines_after_decorators"
    r"|newline|equal|colon|dot|lbracket|rbracket|lbrace|rbrace|operator|star|asynchronous"
    r"|first_line|trailing_whitespace|default_indent|default_newline|encoding|has_trailing_newline)$"
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(kind: type) -> tuple[str, ...]:
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = tuple(
            f.name for f in dataclasses.fields(kind) if not _SKIP_FIELD.match(f.name)
        )
        _FIELDS[kind] = fields
    return fields


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
        for fname in _child_fields(kind):
            value = getattr(node, fname)
            vkind = type(value)
            if vkind is tuple or vkind is list:
                for item in value:
                    if is_node_type(type(item)):
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


_NODE_TYPES: dict[type, bool] = {}


def is_node_type(kind: type) -> bool:
    """``issubclass(kind, cst.CSTNode)``, memoized per type: ``isinstance`` against LibCST's
    abstract base class goes through ``ABCMeta.__instancecheck__``, most of a walk's own cost."""
    found = _NODE_TYPES.get(kind)
    if found is None:
        found = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return found


def applicable_rules(rules: Iterable[type[Rule]], source: str, document: Optional[str] = None) -> list[type[Rule]]:
    """Rules whose cheap text pre-filters match: ``Rule.needs_text`` in ``source`` (this pass's
    text), ``Rule.needs_document`` in ``document`` (the text the run began with; by default
    ``source``)."""
    document = source if document is None else document
    return [r for r in rules if (not r.needs_text or any(w in source for w in r.needs_text))
            and (not getattr(r, "needs_document", ()) or any(w in document for w in r.needs_document))]


def run_rules(module: cst.Module, rules: Sequence[type[Rule]], path: str = "<string>",
              ctx: Optional[FileContext] = None) -> list[Finding]:
    """Every rule of ``rules`` over ``module`` in one walk. ``ctx``: a fresh FileContext of
    this module to use (porter.incremental shares the module facts it computed with it)."""
    if not rules:
        return []
    if ctx is None:
        ctx = FileContext(module, path)
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
    for rule in instances:
        crash = dispatcher.crashed.get(id(rule))
        findings.extend([crash] if crash is not None else rule.findings)
    return findings


class _PositionSink:
    """Where LibCST's position-tracking codegen writes each node's range (the attribute
    PositionProvider itself offers it)."""

    def __init__(self) -> None:
        self._computed: dict = {}


def node_positions(module: cst.Module) -> dict:
    """node -> CodeRange for every node, from one position-tracking codegen of the module.

    This is what ``MetadataWrapper(module).resolve(PositionProvider)`` computes, without the
    wrapper's extra full-tree visit (measured: 0.32 s -> 0.07 s a file on torch's sources).
    LibCST is pinned (1.9.0); tests/test_engine.py checks the two agree."""
    sink = _PositionSink()
    state = PositionProvidingCodegenState(
        default_indent=module.default_indent, default_newline=module.default_newline, provider=sink
    )
    module._codegen(state)
    return sink._computed


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
    sink = _PositionSink()
    state = PositionProvidingCodegenState(
        default_indent=module.default_indent, default_newline=module.default_newline, provider=sink
    )
    last = max(need, default=-1)
    plain = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    for h in module.header:
        h._codegen(plain)
    for at, stmt in enumerate(module.body[: last + 1]):
        if at in need:
            _advance(state, plain.tokens)
            plain.tokens.clear()
            stmt._codegen(state)
        else:
            stmt._codegen(plain)
    return sink._computed


def _advance(state: PositionProvidingCodegenState, tokens: list[str]) -> None:
    """Move ``state``'s line and column past ``tokens`` (the code before the next statement
    it generates), as generating them would."""
    text = "".join(tokens)
    if "\r" in text:  # a token ending in \r and one beginning with \n count as two line breaks
        for token in tokens:
            state.add_token(token)
    elif text:
        state.add_token(text)


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
    return CheckResult(drop_suppressed(source, findings), module)


# --------------------------------------------------------------------------------------
# Fixing
# --------------------------------------------------------------------------------------
class _ApplyEdits(cst.CSTTransformer):
    """Puts the edits in place. ``module``: the tree the edits' targets belong to; the walk
    then enters only the nodes that contain a target, and every other subtree (most of a
    module, for a few edits), a target without targets inside it included, is kept as it is,
    unvisited: a callable replacement receives such a target itself, which is what a rebuilt
    copy would be, node for node."""

    def __init__(self, edits: Sequence[Edit], module: Optional[cst.Module] = None) -> None:
        super().__init__()
        self.edits: dict[int, list[Edit]] = {}
        for e in edits:
            self.edits.setdefault(id(e.target), []).append(e)
        self.applied = 0
        self.parents: list[cst.CSTNode] = []  # the original nodes around the one visited
        self.failures: list[tuple[Edit, Exception]] = []  # callable replacements that raised
        # ids of the nodes that contain a target (None: enter everything)
        self.around: Optional[set[int]] = None if module is None else _ancestors_of(module, set(self.edits))

    def on_visit(self, node) -> bool:  # type: ignore[override]
        return self.around is None or id(node) in self.around

    def on_visit_attribute(self, node, attribute) -> None:  # type: ignore[override]
        self.parents.append(node)

    def on_leave_attribute(self, original_node, attribute) -> None:  # type: ignore[override]
        self.parents.pop()

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        edits = self.edits.get(id(original_node))
        if not edits:
            return updated_node
        result: Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel] = updated_node
        for edit in edits:
            if isinstance(result, (cst.RemovalSentinel, cst.FlattenSentinel)):
                break  # a removal/flatten wins; the other edits are found again next pass
            rep = edit.replacement
            before = result
            if callable(rep) and not isinstance(rep, cst.CSTNode):
                try:
                    result = rep(result)
                except (RecursionError, MemoryError):
                    raise
                except Exception as exc:  # NeedsHuman, or a bug in the rule: this edit is left out
                    self.failures.append((edit, exc))
                    result = before
                    continue
            else:
                result = rep
            parent = self.parents[-1] if self.parents else None
            result = keep_boundary(before, result, lambda side: _word_beside(self.parents, original_node, side),
                                   lambda after: binds_looser(after, original_node, parent))
            self.applied += 1
        return result


_WORD_CHAR = re.compile(r"\w")
_EMPTY_MODULE = cst.Module([])


def keep_boundary(before: cst.CSTNode, after, word_beside: Callable[[int], Optional[bool]] = lambda side: None,
                  binds_looser: Callable[[cst.BaseExpression], bool] = lambda after: False):
    """``after`` (an edit's replacement of the expression ``before``) with what the code
    around it relies on: ``before``'s parentheses when ``after`` has none, and parentheses
    when ``after`` would begin (end) with a word character where ``before`` did not and the
    code before (after) it is a word character too.

    ``return(x.cuda())``, ``if(torch.device('cuda')):``, ``x in[...]``, ``lambda:'s'``: the
    keyword is followed by no space, legal only because the expression begins with a
    bracket or a quote. A replacement built without the original's parentheses (or of
    another kind: a call for a list) would glue itself to the keyword, which LibCST refuses
    (``CSTValidationError: Must have at least one space after 'return'``) or which reads as
    another name. Done here, where every rule's replacement is put in place, so that no rule
    has to think of it. ``word_beside(side)``: whether the character just before (side -1)
    or after (side 1) the original node is a word character (None: not known, assume so).

    ``binds_looser(after)``: whether ``after`` would bind looser than the code around it
    (:func:`binds_looser`): a lambda or a conditional expression put where it would (an
    operand of ``or``, ``+``, ``not``, a comparison, ``await``; the object of an attribute, a
    call or a subscript; the condition or the first branch of a conditional) gets parentheses: ``norm or nn.Identity`` ->
    ``norm or (lambda x: x)``, not ``norm or lambda x: x`` (a syntax error) nor, first,
    ``lambda x: x or norm`` (another function)."""
    if not isinstance(after, cst.BaseExpression) or not isinstance(before, cst.BaseExpression) or after is before:
        return after
    if after.lpar or after.rpar:
        return after
    if before.lpar and len(before.lpar) == len(before.rpar):
        return _parenthesized(after, before.lpar, before.rpar)
    if binds_looser(after):
        return _parenthesized(after, (cst.LeftParen(),), (cst.RightParen(),))
    old, new = _edge_chars(before), _edge_chars(after)
    if old is None or new is None:
        return after
    for side, at in ((-1, 0), (1, 1)):
        if not _WORD_CHAR.match(old[at]) and _WORD_CHAR.match(new[at]) and word_beside(side) is not False:
            return _parenthesized(after, (cst.LeftParen(),), (cst.RightParen(),))
    return after


_OPERATOR_PARENTS = (cst.BooleanOperation, cst.BinaryOperation, cst.UnaryOperation, cst.Comparison,
                     cst.ComparisonTarget, cst.Await)


def binds_looser(after: cst.BaseExpression, before: cst.CSTNode, parent: Optional[cst.CSTNode]) -> bool:
    """Whether ``after`` (a lambda or a conditional expression), put where the node ``before``
    is in ``parent`` (the original nodes), needs parentheses to stay one operand."""
    if parent is None or not isinstance(after, (cst.Lambda, cst.IfExp)):
        return False
    if isinstance(parent, _OPERATOR_PARENTS):
        return True
    if isinstance(parent, (cst.Attribute, cst.Subscript)):
        return parent.value is before
    if isinstance(parent, cst.Call):
        return parent.func is before
    if isinstance(parent, cst.IfExp):
        return parent.orelse is not before
    return False


def _parenthesized(node: cst.BaseExpression, lpar, rpar):
    try:
        return node.with_changes(lpar=tuple(lpar), rpar=tuple(rpar))
    except (TypeError, cst.CSTValidationError):  # a node kind that takes no parentheses
        return node


def _edge_chars(node: cst.CSTNode) -> Optional[tuple[str, str]]:
    """The first and last characters of ``node``'s code (None when it has none)."""
    code = _EMPTY_MODULE.code_for_node(node).strip()
    return (code[0], code[-1]) if code else None


def _word_beside(parents: Sequence[cst.CSTNode], node: cst.CSTNode, side: int) -> Optional[bool]:
    """Whether the character just before (``side`` -1) or after (1) ``node`` in the code of
    its ancestors ``parents`` (outermost first) is a word character; None when not found.
    Each ancestor's code is generated with positions until one has code on that side of the
    node (usually the parent: a keyword, an operator)."""
    child = node
    for parent in reversed(parents):
        sink = _PositionSink()
        state = PositionProvidingCodegenState(default_indent="    ", default_newline="\n", provider=sink)
        parent._codegen(state)
        rng = sink._computed.get(child)
        if rng is None:
            return None
        lines = "".join(state.tokens).split("\n")
        if side < 0:
            line, col = rng.start.line, rng.start.column
            if line == 1 and col == 0:
                child = parent
                continue
            text = lines[line - 1][:col]
            return bool(text) and bool(_WORD_CHAR.match(text[-1]))
        line, col = rng.end.line, rng.end.column
        rest = lines[line - 1][col:] if line <= len(lines) else ""
        if line == len(lines) and not rest:
            child = parent
            continue
        return bool(rest) and bool(_WORD_CHAR.match(rest[0]))
    return False  # the node begins (ends) the module


def _ancestors_of(module: cst.Module, targets: set[int]) -> Optional[set[int]]:
    """The ids of the nodes of ``module`` that contain one of ``targets`` (ids), from a walk of
    the fields that can hold code; None when a target is not found that way (one in a
    whitespace or punctuation field, or not in the tree): the caller then enters everything."""
    around: set[int] = set()
    found: set[int] = set()
    path: list[cst.CSTNode] = []
    stack: list[tuple[cst.CSTNode, int]] = [(module, 0)]
    while stack:
        node, depth = stack.pop()
        del path[depth:]
        key = id(node)
        if key in targets:
            found.add(key)
            around.update(id(p) for p in path)
        path.append(node)
        kind = type(node)
        for fname in _child_fields(kind):
            value = getattr(node, fname)
            vkind = type(value)
            if vkind is tuple or vkind is list:
                for item in reversed(value):
                    if is_node_type(type(item)):
                        stack.append((item, depth + 1))
            elif is_node_type(vkind):
                stack.append((value, depth + 1))
    return around if len(found) == len(targets) else None


class FixFailed(Exception):
    """A fix's callable replacement raised (``exc``); its edit was left out."""

    def __init__(self, failures: list[tuple[Edit, Exception]]) -> None:
        super().__init__(describe_exception(failures[0][1]))
        self.failures = failures


def apply_fixes(module: cst.Module, fixes: Sequence[Fix], ctx: Optional[FileContext] = None) -> cst.Module:
    """Apply the edits of ``fixes``, add the imports they need and remove the ones they
    left unused. Pure. Raises :class:`FixFailed` when a callable replacement raised."""
    edits = [e for fix in fixes for e in fix.edits]
    transformer = _ApplyEdits(edits, module)
    new = module.visit(transformer)
    if transformer.failures:
        raise FixFailed(transformer.failures)
    assert isinstance(new, cst.Module)
    modules = sorted({m for fix in fixes for m in fix.imports})
    if modules:
        new = add_imports(new, modules, ctx or FileContext(module))
    removals = sorted({r for fix in fixes for r in fix.remove_imports}, key=lambda r: (r[0], r[1] or ""))
    if removals:
        new = remove_imports(new, removals)
    return new


def add_imports(module: cst.Module, modules: Sequence[str], ctx: FileContext) -> cst.Module:
    """Add ``import a.b as x`` (porter's preferred alias) or ``import a.b`` for each module the
    file does not import yet, through LibCST's AddImportsVisitor: after the leading imports
    (and the docstring), never twice.

    A module in ``ctx.module_names`` is skipped: the file imports it under its own name and
    the rule wrote that name.

    The visitor reads and changes only the module's head (docstring, the leading run of import
    lines, the blank line before the first other statement), but walks the whole tree: on a
    5,000-line file that is most of a migrate's time. So it runs, as a plain transformer (it
    needs no metadata), on a module made of the head and a one-line stand-in for the first
    other statement; the rest of the body is joined back unchanged, and the stand-in's
    leading lines (where the visitor puts its blank line) go to the statement it stood for.
    """
    items = []
    for mod in modules:
        if mod in ctx.module_names:
            continue  # already imported; the rule used the file's own name for it
        alias = PREFERRED_ALIASES.get(mod)
        items.append(ImportItem(mod, None, alias) if alias else ImportItem(mod))
    if not items:
        return module
    body = list(module.body)
    k = _head_length(body)
    rest = body[k:]
    head = body[:k]
    if rest:
        head.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=rest[0].leading_lines))
    new = module.with_changes(body=head).visit(AddImportsVisitor(CodemodContext(), items))
    assert isinstance(new, cst.Module)
    new_body = list(new.body)
    if rest:
        stand_in = new_body.pop()
        rest[0] = rest[0].with_changes(leading_lines=stand_in.leading_lines)
    return module.with_changes(body=[*new_body, *rest])


def _head_length(body: Sequence[cst.BaseStatement]) -> int:
    """How many statements AddImportsVisitor reads: a docstring or ``__strict__ = ...``
    first, then the run of one-import lines (LibCST's ``_split_module`` rule)."""
    at = 1 if body and (_is_docstring(body[0]) or _is_strict(body[0])) else 0
    while at < len(body) and _is_single_import_line(body[at]):
        at += 1
    return at


def _is_single_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.SimpleString)
    )


def _is_strict(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
        and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].targets[0].target, cst.Name)
        and stmt.body[0].targets[0].target.value == "__strict__"
    )


def remove_imports(module: cst.Module, removals: Sequence[tuple[str, Optional[str]]]) -> cst.Module:
    """Remove the imports named by ``removals`` ((module, None) for ``import module [as x]``,
    (module, name) for ``from module import name [as x]``) that nothing in ``module`` uses,
    through LibCST's RemoveImportsVisitor (scope analysis: a name still read anywhere, listed
    in ``__all__`` or used in a string annotation keeps its import). Only called when a fix
    asked for a removal: the scope metadata costs about a parse."""
    wanted_modules = {m for m, n in removals if n is None}
    wanted_names = {(m, n) for m, n in removals if n is not None}
    items: list[tuple[str, Optional[str], Optional[str]]] = []
    for node in _import_statements(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                if alias.evaluated_name in wanted_modules:
                    items.append((alias.evaluated_name, None, alias.evaluated_alias))
        elif not node.relative and node.module is not None and not isinstance(node.names, cst.ImportStar):
            mod = _dotted(node.module)
            for alias in node.names:
                if (mod, alias.evaluated_name) in wanted_names:
                    items.append((mod, alias.evaluated_name, alias.evaluated_alias))
    items = [item for item in items if not _surely_read(module, _bound_name(item))]
    if not items:
        return module
    return _remove_in_statements(module, items)


_KEPT = "__porter_kept_statements_"


def _remove_in_statements(module: cst.Module, items: list[tuple[str, Optional[str], Optional[str]]]) -> cst.Module:
    """RemoveImportsVisitor(items) over ``module``, run on the top-level statements whose code
    mentions a name the imports of ``items`` bind (the head of a dotted ``import a.b``), as a
    whole word (not inside another identifier): only
    such a statement can read the name, rebind it, export it in ``__all__``, use it in a string
    annotation, or hold one of the imports, so the visitor's scope analysis decides every item
    the same way without the others. Each run of the other statements stands in the module as
    one line of a name of porter's own and is put back unchanged afterwards."""
    heads = {(alias or name or mod).split(".")[0] for mod, name, alias in items}
    # a name in code is a whole word: `nn` in `nnx.Linear`, `F` in `False` is no mention
    mention = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, sorted(heads))) + r")(?!\w)")
    body = list(module.body)
    kept: list[cst.BaseStatement] = []
    runs: list[list[cst.BaseStatement]] = []
    for stmt in body:
        text = module.code_for_node(stmt)
        if mention.search(text):
            kept.append(stmt)
        else:
            if not kept or not _is_stand_in(kept[-1]):
                runs.append([])
                kept.append(cst.SimpleStatementLine([cst.Expr(cst.Name(f"{_KEPT}{len(runs) - 1}"))]))
            runs[-1].append(stmt)
    if not runs:
        return RemoveImportsVisitor(CodemodContext(), items).transform_module(module)
    reduced = module.with_changes(body=kept)
    done = RemoveImportsVisitor(CodemodContext(), items).transform_module(reduced)
    out: list[cst.BaseStatement] = []
    for stmt in done.body:
        run = _stand_in_run(stmt)
        out.extend(runs[run] if run is not None else (stmt,))
    return module.with_changes(body=out)


def _is_stand_in(stmt: cst.CSTNode) -> bool:
    return _stand_in_run(stmt) is not None


def _stand_in_run(stmt: cst.CSTNode) -> Optional[int]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        value = stmt.body[0].value
        if isinstance(value, cst.Name) and value.value.startswith(_KEPT):
            return int(value.value[len(_KEPT):])
    return None


def _bound_name(item: tuple[str, Optional[str], Optional[str]]) -> Optional[str]:
    """The one plain name an import binds (``import a.b`` binds a dotted name: None)."""
    mod, name, alias = item
    bound = alias or name or mod
    return bound if "." not in bound else None


_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def _surely_read(module: cst.Module, name: Optional[str]) -> bool:
    """True when the module-level import of ``name`` is certainly in use, so that
    RemoveImportsVisitor's scope analysis (the cost of several parses on a large file) would keep
    it: ``name.attr`` is read inside a function, and neither that function nor any enclosing
    function, lambda or class mentions ``name`` any other way (a parameter, an assignment, a
    local import...), the module does not mention it outside its module-level imports (no
    rebinding, no ``global``), and no function or class imports it. Anything less certain goes
    to the scope analysis."""
    if name is None:
        return False
    reads: list[tuple[int, ...]] = []  # the enclosing scopes of each name.attr read in a function
    mentioned: set[int] = set()  # scopes that mention the name other than as name.attr
    stack: list[tuple[cst.CSTNode, tuple[int, ...], bool, bool]] = [(module, (), False, False)]
    while stack:
        node, scopes, in_function, in_import = stack.pop()
        kind = type(node)
        if kind is cst.Attribute and not in_import and type(node.value) is cst.Name and node.value.value == name:  # type: ignore[attr-defined]
            if in_function:
                reads.append(scopes)
            continue
        outer = scopes
        if kind is cst.FunctionDef or kind is cst.Lambda or kind is cst.ClassDef:
            scopes = (*scopes, id(node))
            in_function = in_function or kind is not cst.ClassDef
        elif kind is cst.Import or kind is cst.ImportFrom:
            in_import = True
        for fname in _child_fields(kind):
            if fname == "attr" and kind is cst.Attribute or fname == "keyword" and kind is cst.Arg:
                continue  # an attribute's or a keyword argument's name is no variable
            value = getattr(node, fname)
            vkind = type(value)
            for item in (value if vkind is tuple or vkind is list else (value,)):
                if type(item) is cst.Name:
                    if item.value != name:
                        continue
                    where = outer if fname == "name" and kind in (cst.FunctionDef, cst.ClassDef) else scopes
                    if in_import:
                        if where:
                            return False  # imported again in a function or class
                        continue  # a module-level import binding it
                    if not where or kind is cst.NameItem:
                        return False  # rebound at module level, or declared global/nonlocal
                    mentioned.update(where)
                elif is_node_type(type(item)):
                    stack.append((item, scopes, in_function, in_import))
    return any(not mentioned.intersection(scopes) for scopes in reads)


def _dotted(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _import_statements(module: cst.Module) -> Iterable[Union[cst.Import, cst.ImportFrom]]:
    """Every import statement of ``module``, at any depth of statements (expressions are not
    entered: imports are statements)."""
    stack: list[cst.CSTNode] = list(reversed(module.body))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    yield small
            continue
        for name in ("body", "orelse", "handlers", "finalbody", "cases"):
            part = getattr(stmt, name, None)
            if part is None:
                continue
            if isinstance(part, (tuple, list)):
                stack.extend(reversed(part))
            elif isinstance(part, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                stack.extend(reversed(part.body) if isinstance(part, cst.IndentedBlock) else [part])
            elif isinstance(part, cst.CSTNode):
                stack.append(part)


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
    module = parse(source)
    counts: dict[str, int] = {}
    current = source
    settled: Optional[list[Finding]] = None  # findings of a pass that changed nothing
    problems: list[Finding] = []  # fixes left out (NeedsHuman, a rule's bug), with positions then
    rules = list(options.rules)
    suppressions = False  # whether the text has `# porter: ignore` comments (positions needed)
    for _ in range(MAX_PASSES):
        # the text pre-filter reads this pass's text: a rule may act on another rule's output;
        # the document gate (Rule.needs_document) reads the text the migrate began with
        findings = run_rules(module, applicable_rules(rules, current, source), path)
        suppressions = _SUPPRESS.search(current) is not None  # (not "porter: manual" marks)
        if suppressions:
            attach_positions(module, findings)
            findings = drop_suppressed(current, findings)
        chosen = _first_stage([f for f in findings if f.fix is not None and (options.unsafe_fixes or f.fix.safety is Safety.SAFE)], options)
        if not chosen:
            settled = findings
            break
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
    seen = {id(f) for f in remaining}
    return FixResult(current, current != source, counts, remaining + [f for f in problems if id(f) not in seen])
