"""Incremental checking for ``porter lsp``: after an edit, parse and check again only the
top-level statements that changed, and reuse the rest, with a result equal to
``engine.check`` of the new text (the same findings: codes, messages, positions, severities,
fixes, in the same order, suppressions honoured).

A document is kept as its module split into top-level statements (each with its text, the
length of its leading comment/blank lines, its line count, the imports it holds).

Parsing. An edit (found by diffing the old and the new text: common prefix and suffix) is
widened to whole statements: from the first line of code (a decorator or the statement's
first line, after its leading lines) of a statement that begins before the edit, to the first
line of code of a statement after it, or the end of the file. Both ends are a line that
starts at column 0 with code, so the tokenizer is in the same state there as in a full
parse. That region alone is parsed, followed by a stand-in ``pass`` statement: the lines
before the stand-in become the leading lines of the statement that follows (exactly as a full
parse splits them), and a region whose statements would not stand alone (an ``else:``, a
decorator left without its function, an open bracket) fails to parse and falls back to a full
parse. The region's statements replace the old ones in the module; every other statement is
the same object as before. Anything that could make the region's parse differ from a full one
falls back to a full parse: an edit in the first statement or the first two lines (the
module's header, newline style, encoding), a different line ending or indentation than the
module's default where that decides how LibCST stores the nodes.

Rules. A rule runs in one of two ways:

- module-wide (the default, and every rule not declared ``local``): run over the whole new
  tree after every change, exactly as ``engine.run_rules`` runs it;
- per statement, for rules that declare ``local = True`` and behave so on this document: the
  rule runs on each top-level statement by itself, with a fresh instance and a context whose
  imports are those the full traversal would have at that statement (``FileContext``'s
  aliases from the module's imports, then every import met earlier in the walk). Its findings
  for a statement are cached per (statement object, import state) and reused while both are
  unchanged. The declaration is checked on every run: reading ``ctx.module`` or anything of
  the module node (the first ancestor) stops the rule at once; so does keeping state from one
  statement to the next (the instance's attributes must be back to their initial values,
  compared as plain data, after each statement), a ``visit_Module``/``leave_Module`` method, a
  finding or edit on the module node, or an exception. A statement where the rule stopped is
  run again with the module (``ctx.module`` and the module node as the first ancestor, as
  the full walk has them), on every version as a module-wide rule is, while the rule's
  findings elsewhere stay cached; where that run too does not keep to the statement, the rule
  is run module-wide for that version.

Module facts. A local rule may read facts of the whole module through
``porter.rules.module_fact`` (the training-loop rules' index of assignments and calls, the
module's top-level classes and functions...). Per statement, the fact is the one of the whole
current module, computed once per version in the context the module-wide rules use too, and
handed to the rule as a view that records every lookup (a dictionary's ``get``/``[]``/``in``,
a set's ``in``/``&``, a field read; any other use stops the rule) with its answer (plain data,
nodes by identity). The statement's findings are reused in a later version only while every
recorded lookup, asked again of that version's fact, gives the same answer: the rule is a
deterministic function of its statement, the imports there and these answers. Facts are
offered only where the imports are the same at every statement and at the end (the full walk
computes a fact when first asked, with the imports it has then); elsewhere reading one makes
the rule module-wide for that version.

Positions are computed per statement (LibCST's position-tracking code generation of that
statement alone, lines counted from its first line) and shifted by the lines above it; only
statements that are new or hold findings are generated.

The proof that all this equals ``engine.check`` is tests/test_incremental.py: random and
adversarial edits to the fixtures and the benchmark document, both targets, and after every
edit the spliced module is compared with a fresh parse (``deep_equals``) and the findings
with a fresh ``engine.check``.
"""
from __future__ import annotations

import bisect
import copy
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import libcst as cst
from libcst.metadata import CodePosition, CodeRange

from porter import _libcst_compat as _compat
from porter import engine
from porter._libcst_compat import child_fields, is_node_type
from porter.context import FileContext
from porter.rules import Finding, Position, Rule
from porter.rules import StatementFact, computed_module_fact

_BREAK = re.compile(r"\r\n?|\n")  # LibCST's line breaks (position_provider.NEWLINE_RE)
_MISSING = object()
_WITH_MODULE = object()  # a statement's result for a rule that reads the module there: run again each version


class _NotLocal(BaseException):
    """Raised when a rule run per statement reads the module: the rule is module-wide.
    A BaseException, so that a rule's ``except Exception`` does not swallow it."""


class _WatchedModule(cst.Module):
    """The module as the first ancestor of a per-statement run: a Module to ``isinstance``,
    and any read of its fields (or methods) stops the rule."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__") and name != "__dict__":
            return object.__getattribute__(self, name)
        raise _NotLocal(name)

    def __repr__(self) -> str:
        return "<module>"


_WATCHED = object.__new__(_WatchedModule)


class _LocalContext(FileContext):
    """A FileContext for one statement: imports as the full walk has them there, a fresh
    cache, and no module; module facts (porter.rules.module_fact) of the whole current module
    through recording views, when the document has them (``facts``)."""

    def __init__(self, path: str, aliases: dict, module_names: dict, ancestors: list,
                 facts: Optional["_Facts"] = None, reads: Optional[list] = None,
                 module: Optional[cst.Module] = None) -> None:  # noqa: D401
        self.path = path
        self.aliases = aliases
        self.module_names = module_names
        self.ancestors = ancestors
        self.cache = {}
        self.facts = facts
        self.reads = reads if reads is not None else []
        self._module = module

    @property
    def module(self):
        if self._module is None:
            raise _NotLocal("module")
        return self._module

    def provide_fact(self, compute):
        if self.facts is None:
            raise _NotLocal("module fact")
        if self._module is not None:  # run with the module: nothing to record
            return self.facts.value(compute)
        return _view(self.facts.value(compute), compute, (), self.reads)


# --------------------------------------------------------------------------------------
# Module facts read one statement at a time
# --------------------------------------------------------------------------------------
class _Facts:
    """The module facts of one version, computed on demand with the context the module-wide
    rules then use too (the fact is computed once per version). A fact built statement by
    statement (porter.rules.StatementFact) reuses each statement's part while the statement,
    the imports (``state``) and the fact's ``pre`` value are the same."""

    def __init__(self, ctx: FileContext, stmts: Optional[list] = None, state: Any = None) -> None:
        self.ctx = ctx
        self.stmts = stmts
        self.state = state

    def value(self, compute):
        if isinstance(compute, StatementFact) and self.stmts is not None:
            key = ("module_fact", compute)
            cached = self.ctx.cache.get(key)
            if cached is not None and cached[0] is self.ctx.module:
                return cached[1]
            pre = None if compute.pre_fact is None else self.value(compute.pre_fact)
            parts = []
            for s in self.stmts:
                got = s.fact_parts.get(compute)
                if got is None or got[0] != self.state or got[1] != pre:
                    got = s.fact_parts[compute] = (self.state, pre, compute.part(self.ctx, s.node, pre))
                parts.append(got[2])
            value = compute.combine(self.ctx, parts, pre)
            self.ctx.cache[key] = (self.ctx.module, value)
            return value
        return computed_module_fact(self.ctx, compute)


class _SharedContext(FileContext):
    """The module-wide rules' context of a version whose module facts come from _Facts (the
    parts of unchanged statements reused), the same values the per-statement runs read."""

    facts: Optional[_Facts] = None

    def provide_fact(self, compute):
        if self.facts is None:
            return computed_module_fact(self, compute)
        return self.facts.value(compute)


class _Same:
    """A node in a recorded answer: equal to the same node object only."""

    __slots__ = ("node",)

    def __init__(self, node) -> None:
        self.node = node

    def __eq__(self, other) -> bool:
        return type(other) is _Same and other.node is self.node

    def __hash__(self) -> int:
        return id(self.node)


def _answer(value: Any, depth: int = 0) -> Any:
    """A fact's answer as comparable data (nodes by identity); anything else stops the rule."""
    if value is None or type(value) in (bool, int, float, str, bytes) or value is _MISSING:
        return value
    if isinstance(value, cst.CSTNode):
        return _Same(value)
    if depth > 30:
        raise _NotLocal("deep fact")
    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(_answer(v, depth + 1) for v in value))
    if type(value) in (set, frozenset):
        return (type(value).__name__, frozenset(_answer(v, depth + 1) for v in value))
    if type(value) is dict:
        return ("dict", tuple((_answer(k, depth + 1), _answer(v, depth + 1)) for k, v in value.items()))
    raise _NotLocal(f"fact value of type {type(value).__name__}")


# what a rule may do with a view: anything else stops it (a BaseException, never swallowed)
def _refuse(self, *args, **kwargs):
    raise _NotLocal("fact operation")


class _View:
    __slots__ = ("_value", "_compute", "_path", "_reads")

    def __init__(self, value, compute, path, reads) -> None:
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_compute", compute)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)

    def _record(self, op: str, arg: Any, result: Any) -> None:
        self._reads.append((self._compute, self._path, op, arg, _answer(result)))

    def _whole(self):
        self._record("all", None, self._value)
        return self._value

    def __iter__(self):
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())

    def __bool__(self) -> bool:
        return bool(self._whole())

    def __contains__(self, key) -> bool:
        found = key in self._value
        self._record("in", _answer(key), found)
        return found

    __setattr__ = __delattr__ = __setitem__ = __delitem__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
    __or__ = __ror__ = __sub__ = __rsub__ = __xor__ = __rxor__ = __rand__ = _refuse
    __add__ = __radd__ = __mul__ = __rmul__ = __reduce__ = __reduce_ex__ = __copy__ = __deepcopy__ = _refuse

    def __getattr__(self, name):
        raise _NotLocal(f"fact attribute {name}")


class _DictView(_View):
    """A dictionary of a fact: a lookup is recorded with its answer; a dictionary found is
    itself a view (its own lookups recorded), so that an answer is as narrow as the lookup."""

    __slots__ = ()

    def _lookup(self, key):
        found = self._value.get(key, _MISSING)
        self._reads.append((self._compute, self._path, "get", _answer(key), _found(found)))
        if type(found) is dict:
            return _DictView(found, self._compute, self._path + (("key", key),), self._reads)
        return found

    def get(self, key, default=None):
        found = self._lookup(key)
        return default if found is _MISSING else found

    def __getitem__(self, key):
        found = self._lookup(key)
        if found is _MISSING:
            raise KeyError(key)
        return found

    def keys(self):
        return self._whole().keys()

    def values(self):
        return self._whole().values()

    def items(self):
        return self._whole().items()


class _SetView(_View):
    __slots__ = ()

    def __and__(self, other):
        if type(other) not in (set, frozenset):
            raise _NotLocal("fact operation")
        found = self._value & other
        self._record("and", frozenset(other), found)
        return found


class _ObjView(_View):
    """A dataclass fact (an index of the module): each field read is a view of that field."""

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("_") or not any(f.name == name for f in dataclasses.fields(self._value)):
            raise _NotLocal(f"fact attribute {name}")
        return _view(getattr(self._value, name), self._compute, self._path + (name,), self._reads)


def _view(value, compute, path: tuple, reads: list):
    if type(value) is dict:
        return _DictView(value, compute, path, reads)
    if type(value) in (set, frozenset):
        return _SetView(value, compute, path, reads)
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, cst.CSTNode)):
        return _ObjView(value, compute, path, reads)
    reads.append((compute, path, "value", None, _answer(value)))
    return value


_A_DICT = ("a dictionary",)  # the answer of a lookup that finds a dictionary (read further by its own lookups)


def _found(value) -> Any:
    return _A_DICT if type(value) is dict else _answer(value)


def _still(record: tuple, facts: "_Facts") -> bool:
    """Whether a recorded read of a module fact gives the same answer in this version."""
    compute, path, op, arg, answer = record
    try:
        value = facts.value(compute)
        for step in path:
            value = getattr(value, step) if type(step) is str else value[step[1]]
        if op == "get":
            got = _found(value.get(_unanswer(arg), _MISSING))
        elif op == "in":
            got = _unanswer(arg) in value
        elif op == "and":
            got = _answer(value & arg)
        else:  # "all", "value"
            got = _answer(value)
    except Exception:
        return False
    return got == answer


def _unanswer(key):
    """A recorded key back to the key looked up (keys are plain data: str, int, tuples...)."""
    if isinstance(key, _Same):
        return key.node
    if type(key) is tuple and len(key) == 2 and key[0] in ("tuple", "list"):
        items = tuple(_unanswer(k) for k in key[1])
        return items if key[0] == "tuple" else list(items)
    if type(key) is tuple and len(key) == 2 and key[0] == "frozenset":
        return frozenset(_unanswer(k) for k in key[1])
    return key


class _Unfreezable(Exception):
    pass


def _freeze(value: Any, depth: int = 0) -> Any:
    """A rule instance's attribute as plain comparable data, or _Unfreezable. A helper object
    the rule keeps (a plain instance, not a node, class or function) is its attributes; the
    file's context is the same context."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if depth > 20:
        raise _Unfreezable
    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(_freeze(v, depth + 1) for v in value))
    if type(value) in (set, frozenset):
        return (type(value).__name__, frozenset(_freeze(v, depth + 1) for v in value))
    if type(value) is dict:
        return ("dict", tuple((_freeze(k, depth + 1), _freeze(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, FileContext):
        return ("ctx",)
    if isinstance(value, (cst.CSTNode, type)) or callable(value) or not hasattr(value, "__dict__") or hasattr(type(value), "__slots__"):
        raise _Unfreezable
    return ("object", type(value), _freeze(vars(value), depth + 1))


def _state(rule: Rule) -> Any:
    return _freeze({k: v for k, v in vars(rule).items() if k not in ("ctx", "findings")})


_HANDLERS: dict[type, tuple[tuple[str, str], ...]] = {}


def _handlers(rule: type[Rule]) -> tuple[tuple[str, str], ...]:
    """(visit|leave, method name) of a rule class, as engine._Dispatcher finds them."""
    found = _HANDLERS.get(rule)
    if found is None:
        found = tuple(
            ("visit" if a.startswith("visit_") else "leave", a) for a in dir(rule) if a.startswith(("visit_", "leave_"))
        )
        _HANDLERS[rule] = found
    return found


def _module_handlers(rule: type[Rule]) -> bool:
    return any(name in ("visit_Module", "leave_Module") for _, name in _handlers(rule))


def run_statement(stmt: cst.BaseStatement, rules: Sequence[type[Rule]], aliases: dict, module_names: dict,
                  path: str, facts: Optional[_Facts] = None, reads: Optional[dict] = None,
                  module: Optional[cst.Module] = None) -> dict:
    """Each rule run on ``stmt`` alone (see the module docstring): rule -> its findings, or
    None when the rule did not keep to the statement. With ``facts`` (the module facts of the
    version) a rule may read module facts; ``reads`` then receives, for each rule that kept
    to the statement, the lookups it made in them (see _still). With ``module`` (the version's
    module, whose statement ``stmt`` is) the rule may read the module too, as the full walk's
    rule at that statement does."""
    ancestors: list = [_WATCHED if module is None else module]
    aliases, module_names = dict(aliases), dict(module_names)
    out: dict = {}
    live: dict[int, tuple[type[Rule], Rule, Any, list]] = {}
    visit: dict[str, list] = {}
    leave: dict[str, list] = {}
    for k, rule in enumerate(rules):
        if _module_handlers(rule):
            out[rule] = None
            continue
        log: list = []
        try:
            inst = rule(_LocalContext(path, aliases, module_names, ancestors, facts, log, module))
            snapshot = _state(inst)
        except (_NotLocal, Exception):
            out[rule] = None
            continue
        live[k] = (rule, inst, snapshot, log)
        for kind, name in _handlers(rule):
            (visit if kind == "visit" else leave).setdefault(name[6:], []).append((k, getattr(inst, name)))
    dead: set[int] = set()
    importer = _LocalContext(path, aliases, module_names, ancestors)
    fields_of, node_type = child_fields, is_node_type  # (locals of the walk below: it is hot)

    def call(handlers, node) -> None:
        for k, handler in handlers:
            if k in dead:
                continue
            try:
                handler(node)
            except (_NotLocal, Exception):
                dead.add(k)


    def walk(node: cst.CSTNode) -> None:
        kind = type(node)
        name = kind.__name__
        ancestors.append(node)
        if (kind is cst.Import or kind is cst.ImportFrom) and len(ancestors) > 2:
            importer.add_import(node)
        handlers = visit.get(name)
        if handlers:
            call(handlers, node)
        for fname in fields_of(kind):
            value = getattr(node, fname)
            vkind = type(value)
            if vkind is tuple or vkind is list:
                for item in value:
                    if node_type(type(item)):
                        walk(item)
            elif node_type(vkind):
                walk(value)
        handlers = leave.get(name)
        if handlers:
            call(handlers, node)
        ancestors.pop()

    if live:
        walk(stmt)
    for k, (rule, inst, snapshot, log) in live.items():
        if k in dead:
            out[rule] = None
            continue
        try:
            same = _state(inst) == snapshot
        except (_Unfreezable, _NotLocal, Exception):
            same = False
        if not same or any(_touches_module(f, ancestors[0]) for f in inst.findings):
            out[rule] = None
        else:
            out[rule] = list(inst.findings)
            if log and reads is not None:
                reads[rule] = tuple(log)
    return out


def _touches_module(f: Finding, module: cst.CSTNode) -> bool:
    if f.node is module:
        return True
    return f.fix is not None and any(e.target is module for e in f.fix.edits)


# --------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------
def _imports_in(node: cst.CSTNode, out: list) -> list:
    """Every import of ``node`` in the order the engine's walk meets them (expressions hold
    no statements and are not entered)."""
    if isinstance(node, (cst.Import, cst.ImportFrom)):
        out.append(node)
        return out
    for fname in child_fields(type(node)):
        value = getattr(node, fname)
        if isinstance(value, cst.CSTNode):
            if not isinstance(value, cst.BaseExpression):
                _imports_in(value, out)
        elif isinstance(value, (tuple, list)):
            for item in value:
                if isinstance(item, cst.CSTNode) and not isinstance(item, cst.BaseExpression):
                    _imports_in(item, out)
    return out


def _has_indent(node: cst.CSTNode) -> bool:
    """Whether the statement's text holds an INDENT token (the first one in a file decides
    LibCST's ``default_indent``): an indented block or a match statement."""
    if isinstance(node, (cst.IndentedBlock, cst.Match)):
        return True
    if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite, cst.BaseExpression)):
        return False
    for fname in child_fields(type(node)):
        value = getattr(node, fname)
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, cst.CSTNode) and not isinstance(item, cst.BaseExpression) and _has_indent(item):
                return True
    return False


def _code(module: cst.Module, nodes: Sequence[cst.CSTNode]) -> str:
    return _compat.code_of(module, nodes)


Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]  # a module's body item


@dataclass(eq=False)
class _Stmt:
    node: Statement
    text: str  # its code, leading lines included
    lead: int  # characters of its leading lines
    lines: int  # line breaks in text
    imports: tuple
    indent: bool
    results: dict = field(default_factory=dict)  # import-state id -> {rule: findings | None}
    reads: dict = field(default_factory=dict)  # import-state id -> {rule: its lookups in module facts}
    fact_parts: dict = field(default_factory=dict)  # StatementFact -> (import state, pre value, its part)
    positions: Optional[dict] = None  # node -> CodeRange, lines counted from the statement's first line
    strings: Optional[list] = None  # (first, last) relative lines of strings spanning lines

    @classmethod
    def of(cls, module: cst.Module, node: Statement) -> "_Stmt":
        text = _code(module, [node])
        lead = len(_code(module, node.leading_lines)) if node.leading_lines else 0
        return cls(node, text, lead, len(_BREAK.findall(text)), tuple(_imports_in(node, [])), _has_indent(node))

    def relative_positions(self, module: cst.Module) -> dict:
        if self.positions is None:
            self.positions = _compat.relative_positions(module, self.node)
        return self.positions


class Positions:
    """node -> CodeRange of a checked version, as ``engine.node_positions`` gives it,
    computed per statement on demand."""

    def __init__(self, module: cst.Module, stmts: list[_Stmt], first_lines: list[int],
                 text: Optional[str] = None) -> None:
        self.module = module
        self.text = text  # the document's text (the module's code), for the module node's range
        self.stmts = stmts
        self.first_lines = first_lines  # 0-based line where each statement's text begins
        self._full: Optional[dict] = None
        self._hint: dict[int, int] = {}

    def _shift(self, rng: CodeRange, k: int) -> CodeRange:
        off = self.first_lines[k]
        if not off:
            return rng
        return CodeRange(CodePosition(rng.start.line + off, rng.start.column), CodePosition(rng.end.line + off, rng.end.column))

    def in_statement(self, node: cst.CSTNode, k: int) -> Optional[CodeRange]:
        rng = self.stmts[k].relative_positions(self.module).get(node)
        return None if rng is None else self._shift(rng, k)

    def get(self, node: cst.CSTNode, default=None):
        if node is self.module and self.stmts and self.text is not None:
            return self._module_range()
        k = self._hint.get(id(node))
        if k is not None:
            rng = self.in_statement(node, k)
            if rng is not None:
                return rng
        # statements whose positions are already generated first, then the others in order
        order = [i for i, s in enumerate(self.stmts) if s.positions is not None]
        order += [i for i, s in enumerate(self.stmts) if s.positions is None]
        for i in order:
            rng = self.in_statement(node, i)
            if rng is not None:
                self._hint[id(node)] = i
                return rng
        if self._full is None:  # the module node, its header/footer lines, or not in the tree
            self._full = engine.node_positions(self.module)
        return self._full.get(node, default)

    def _module_range(self) -> CodeRange:
        """The module node's range without generating its code: from the start to the end of
        its code, the line break LibCST leaves out of a text without a last one counted (its
        codegen adds the break, then takes it off the text, not off the position)."""
        code = self.text or ""
        if not self.module.has_trailing_newline:
            code += self.module.default_newline
        breaks = _BREAK.findall(code)
        last = max(code.rfind("\n"), code.rfind("\r"))
        return CodeRange(CodePosition(1, 0), CodePosition(1 + len(breaks), len(code) - last - 1))

    def statement_of_line(self, line: int) -> int:
        """Index of the statement whose text holds 1-based ``line`` (-1: the header)."""
        return bisect.bisect_right(self.first_lines, line - 1) - 1

    def inside_string(self, line: int) -> bool:
        """Whether 1-based ``line`` is a line of a string that spans lines, other than its
        last (a comment cannot be added there)."""
        if not self.stmts:
            if self._full is None:
                self._full = engine.node_positions(self.module)
            return any(r.start.line <= line < r.end.line for n, r in self._full.items()
                       if isinstance(n, (cst.SimpleString, cst.FormattedString)))
        k = self.statement_of_line(line)
        if k < 0:
            return False
        st = self.stmts[k]
        if st.strings is None:
            st.strings = [(r.start.line, r.end.line) for n, r in st.relative_positions(self.module).items()
                          if r.start.line != r.end.line and isinstance(n, (cst.SimpleString, cst.FormattedString))]
        rel = line - self.first_lines[k]
        return any(first <= rel < last for first, last in st.strings)


@dataclass
class Checked:
    """One checked version of a document."""

    text: str
    module: cst.Module
    findings: list[Finding]
    positions: Positions
    statement_starts: Optional[list[int]]  # 0-based line where each top-level statement's text begins
    reparsed: Optional[int] = None  # statements parsed again (None: the whole file)
    rules_local: int = 0  # rules run per statement on this version
    rules_module_wide: int = 0  # rules run over the whole tree
    statements_run: int = 0  # statements whose per-statement rules ran (not cached)


@dataclass
class _Version:
    text: str
    module: cst.Module
    stmts: list[_Stmt]
    header: int  # characters before the first statement
    header_lines: int


class Document:
    """The incremental checker of one document. ``check(text)`` returns what
    ``engine.check(text, Options(rules), path)`` returns, as a :class:`Checked`; it raises
    ``engine.PorterError`` where ``engine.check`` does (a syntax error), and a rule's
    exception as ``engine.check`` would."""

    def __init__(self, rules: Sequence[type[Rule]], path: str = "<string>") -> None:
        self.rules = tuple(rules)
        self.path = path
        self.last: Optional[_Version] = None
        self._alias_ids: dict = {}
        self.stats = {"incremental": 0, "full": 0}
        self._reparsed: Optional[int] = None

    # -- parsing ---------------------------------------------------------------------
    def _full(self, text: str) -> _Version:
        module = engine.parse(text)
        stmts = [_Stmt.of(module, s) for s in module.body]
        header = _code(module, module.header)
        return _Version(text, module, stmts, len(header), len(_BREAK.findall(header)))

    def _consistent(self, v: _Version) -> bool:
        """The statements' texts put together give the document's text (the splice is
        checked against the text every time, and the first parse too)."""
        m = v.module
        joined = _code(m, m.header) + "".join(s.text for s in v.stmts) + _code(m, m.footer)
        if m.has_trailing_newline:
            return joined == v.text or (not joined and v.text == m.default_newline)
        return joined.startswith(v.text) and _BREAK.fullmatch(joined[len(v.text):]) is not None

    def _splice(self, text: str) -> Optional[_Version]:
        old = self.last
        if old is None or not old.stmts:
            return None
        a, b = old.text, text
        n = min(len(a), len(b))
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        p = lo
        lo, hi = 0, n - p
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[len(a) - mid:] == b[len(b) - mid:]:
                lo = mid
            else:
                hi = mid - 1
        old_end = len(a) - lo
        # the first two lines decide the newline style and the encoding: a full parse there
        line3 = 0
        for _ in range(2):
            m = _BREAK.search(a, line3)
            if m is None:
                return None
            line3 = m.end()
        if p <= line3:
            return None
        own: list[int] = []
        at = old.header
        for s in old.stmts:
            own.append(at + s.lead)
            at += len(s.text)
        count = len(own)
        i = bisect.bisect_left(own, p) - 1  # the last statement whose code begins before the edit
        if i < 1:
            return None
        # the first statement whose code begins after the edit (text inserted right before a
        # statement, a decorator say, is parsed with that statement)
        j = bisect.bisect_right(own, old_end)
        delta = len(b) - len(a)
        module = old.module
        tries = 0
        while True:
            if j < count:
                region = b[own[i]:own[j] + delta]
                if not region.endswith(("\n", "\r")):
                    j += 1
                    continue
            else:
                region = b[own[i]:]
            eof = j >= count
            engine.precheck(region)  # past porter's limits: LibCST's parser must not see it (the full check says so)
            try:
                chunk = cst.parse_module(region if eof else region + "pass" + module.default_newline)
                break
            except cst.ParserSyntaxError:
                # the region's end may need the next statement (a decorator typed above a
                # function): one or two more; then the full parse decides (a syntax error)
                tries += 1
                if eof or tries > 2:
                    return None
                j += 1
        if chunk.header or chunk.default_newline != module.default_newline:
            return None
        body = list(chunk.body)
        if not eof:
            sentinel = body.pop() if body else None
            if (not isinstance(sentinel, cst.SimpleStatementLine) or len(sentinel.body) != 1
                    or not isinstance(sentinel.body[0], cst.Pass) or chunk.footer or not chunk.has_trailing_newline
                    or sentinel.trailing_whitespace.comment is not None):
                return None
        if not body or body[0].leading_lines:
            return None
        first_indent = next((k for k, s in enumerate(old.stmts) if s.indent), None)
        chunk_indent = any(_has_indent(s) for s in body)
        if chunk_indent and chunk.default_indent != module.default_indent:
            return None
        if not chunk_indent and first_indent is not None and i <= first_indent < j:
            return None  # the block that set the indentation is gone: a full parse decides
        body[0] = body[0].with_changes(leading_lines=old.stmts[i].node.leading_lines)
        new_stmts = old.stmts[:i] + [_Stmt.of(module, s) for s in body]
        changes: dict = {}
        if eof:
            changes = {"footer": chunk.footer, "has_trailing_newline": chunk.has_trailing_newline}
        else:
            assert sentinel is not None
            nxt = old.stmts[j]
            if nxt.node.leading_lines == sentinel.leading_lines or (
                    len(nxt.node.leading_lines) == len(sentinel.leading_lines)
                    and all(x.deep_equals(y) for x, y in zip(nxt.node.leading_lines, sentinel.leading_lines))):
                new_stmts.append(nxt)
            else:
                new_stmts.append(_Stmt.of(module, nxt.node.with_changes(leading_lines=sentinel.leading_lines)))
            new_stmts.extend(old.stmts[j + 1:])
        new_module = module.with_changes(body=tuple(s.node for s in new_stmts), **changes)
        version = _Version(text, new_module, new_stmts, old.header, old.header_lines)
        if not self._consistent(version):
            return None
        self._reparsed = len(body) + (0 if eof else 1)
        return version

    # -- checking --------------------------------------------------------------------
    def check(self, text: str) -> Checked:
        self._reparsed = None
        version = None
        if self.last is not None:
            try:
                version = self._splice(text)
            except Exception:
                version = None
        if version is None:
            version = self._full(text)
            if not self._consistent(version):
                version.stmts = []  # never spliced; checked as a whole below
        self.stats["full" if self._reparsed is None else "incremental"] += 1
        try:
            result = self._check(version)
        except Exception:
            # a rule failed: what engine.check does with this text (raise the same, or not)
            self.last = None
            version.stmts = []
            result = self._check(version)
        self.last = version if version.stmts else None
        result.reparsed = self._reparsed
        return result

    def _check(self, v: _Version) -> Checked:
        module, text, stmts = v.module, v.text, v.stmts
        rules = engine.applicable_rules(self.rules, text)
        first_lines = []
        line = v.header_lines
        for s in stmts:
            first_lines.append(line)
            line += s.lines
        positions = Positions(module, stmts, first_lines, text)
        if not stmts:  # a document that cannot be split: the engine as it is
            whole = engine.run_rules(module, rules, self.path)
            self._position(whole, positions, None)
            return Checked(text, module, engine.drop_yielding(engine.drop_suppressed(text, whole)), positions, None, None, 0, len(rules))
        # the imports as the full walk has them at each statement
        ctx = FileContext(module, self.path)
        states: list[tuple[int, dict, dict]] = []
        current = None
        for s in stmts:
            if current is None:
                key = (tuple(ctx.aliases.items()), tuple(ctx.module_names.items()))
                current = (self._alias_ids.setdefault(key, len(self._alias_ids)), dict(ctx.aliases), dict(ctx.module_names))
            states.append(current)
            if s.imports:
                for node in s.imports:
                    ctx.add_import(node)
                current = None
        # Module facts (porter.rules.module_fact) are computed by the full walk when first
        # asked for, with the imports it has then: per statement only where the imports are
        # the same all along (then any moment gives the same fact), in a context shared with
        # the module-wide rules below (one computation per version).
        end_key = (tuple(ctx.aliases.items()), tuple(ctx.module_names.items()))
        uniform = len({st[0] for st in states}) == 1 and self._alias_ids.get(end_key) == states[0][0]
        shared = _SharedContext(module, self.path)
        facts = shared.facts = _Facts(shared, stmts, states[0][0]) if uniform else None
        local = [r for r in rules if getattr(r, "local", False)]
        wide = {r for r in rules if not getattr(r, "local", False)}
        for k, s in enumerate(stmts):
            state = states[k][0]
            got = s.results.get(state)
            if not got:
                continue
            reads = s.reads.get(state)
            if reads:  # findings that read module facts: kept while every lookup answers the same
                for r, recorded in list(reads.items()):
                    if facts is None or not all(_still(rec, facts) for rec in recorded):
                        got.pop(r, None)
                        del reads[r]
            wide.update(r for r in local if got.get(r, _MISSING) is None)  # a rule known not to keep to it
        local = [r for r in local if r not in wide]
        runs = 0
        with_module: dict[int, dict] = {}
        for k, s in enumerate(stmts):
            if not local:
                break
            got = s.results.get(states[k][0])
            if got is None:
                if len(s.results) >= 2:  # the results under the import state before the last
                    old_state = next(iter(s.results))
                    s.results.pop(old_state)
                    s.reads.pop(old_state, None)
                got = s.results[states[k][0]] = {}
            missing = [r for r in local if r not in got]
            if missing:
                runs += 1
                got.update(run_statement(s.node, missing, states[k][1], states[k][2], self.path, facts,
                                         s.reads.setdefault(states[k][0], {})))
                for r in missing:
                    if got[r] is None:
                        got[r] = _WITH_MODULE
            again = [r for r in local if got[r] is _WITH_MODULE]
            if again:
                # rules that read the module at this statement: run there with the module, on
                # every version (as module-wide rules are), and per statement everywhere else
                ran = run_statement(s.node, again, states[k][1], states[k][2], self.path, facts, None, module)
                dropped = [r for r in again if ran[r] is None]
                if dropped:
                    for r in dropped:
                        got[r] = None
                    wide.update(dropped)
                    local = [r for r in local if r not in wide]
                with_module[k] = {r: found for r, found in ran.items() if found is not None}
        by_code: dict[str, list[Finding]] = {}
        wide_rules = [r for r in rules if r in wide]
        for f in engine.run_rules(module, wide_rules, self.path, shared):
            by_code.setdefault(f.code, []).append(f)
        findings: list[Finding] = []
        where: list[Optional[int]] = []
        for r in rules:
            if r in wide:
                got_wide = by_code.get(r.code, [])
                findings.extend(got_wide)
                where.extend([None] * len(got_wide))
            else:
                for k, s in enumerate(stmts):
                    got = s.results[states[k][0]][r]
                    for f in with_module[k][r] if got is _WITH_MODULE else got:
                        findings.append(copy.copy(f))
                        where.append(k)
        self._position(findings, positions, where)
        starts = [0] + first_lines[1:]
        return Checked(text, module, engine.drop_yielding(engine.drop_suppressed(text, findings)), positions, starts, None,
                       len(rules) - len(wide_rules), len(wide_rules), runs)

    @staticmethod
    def _position(findings: list[Finding], positions: Positions, where: Optional[list]) -> None:
        """engine.attach_positions, with the positions of each finding's statement."""
        if not findings:
            return
        for n, f in enumerate(findings):
            k = where[n] if where is not None else None
            rng = positions.in_statement(f.node, k) if k is not None else None
            if rng is None:
                rng = positions.get(f.node)
            f.position = None if rng is None else Position(rng.start.line, rng.start.column, rng.end.line, rng.end.column)
        findings.sort(key=lambda f: (f.position.line, f.position.column, f.code) if f.position else (0, 0, f.code))
