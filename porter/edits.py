"""How a fix becomes code: its edits put in place in the tree (with the imports it needs added
and the ones it leaves unused removed), and the same fix as minimal text edits on the text it
was found in.

Tree. :func:`apply_fixes` is what the engine applies in each pass of ``porter migrate``:
:class:`ApplyEdits` puts each edit's replacement in place of its target, by node identity,
with the parentheses the code around it relies on (:func:`keep_boundary`);
:func:`add_imports` adds the modules the fixes need (LibCST's ``AddImportsVisitor``, run on the
module's head only) and :func:`remove_imports` removes the imports they leave unused
(``RemoveImportsVisitor``, run on the statements that can use them only).

Text. :class:`FixEditor` turns one fix of a checked text (the tree parsed from that text, and
its nodes' positions) into :class:`TextEdit` s: the smallest changes of the text that give
what :func:`apply_fixes` of that fix alone gives, byte for byte. It tries the cheapest exact
way first and checks each against the text: the replacement written in place of its target
on its line; the fix applied to the innermost statement holding every target; the fix applied
to the top-level statements it touches; and last the whole module, diffed
(:func:`text_edits`). The imports a fix needs come from :func:`add_imports` on the module's head
alone (the stand-in-head trick below), the same for every fix of every document with that
head. ``porter lsp``'s quick-fixes, its "fix all" and porter.incremental's results use this;
nothing else turns a fix into text.

Positions are 0-based lines and columns in code points (LibCST's); lines end at ``\\n``,
``\\r\\n`` or ``\\r`` only (:func:`split_lines`), as in LibCST and the LSP.
"""
from __future__ import annotations

import ast
import bisect
import dataclasses
import difflib
import io
import re
import tokenize
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, Union, cast

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem, RemoveImportsVisitor

from porter import _libcst_compat as _compat
from porter.astutil import walk
from porter._libcst_compat import child_fields, is_node_type
from porter.context import PREFERRED_ALIASES, FileContext
from porter.rules import Edit, Fix

__all__ = [
    "ApplyEdits", "FixEditor", "FixFailed", "TextEdit", "add_imports", "apply_fixes", "apply_text_edits",
    "binds_looser", "head_length", "is_docstring", "keep_boundary", "remove_imports", "split_lines", "text_edits",
]


# --------------------------------------------------------------------------------------
# A fix put in place in the tree
# --------------------------------------------------------------------------------------
class ApplyEdits(cst.CSTTransformer):
    """Puts the edits in place. ``module``: the tree the edits' targets belong to; the walk
    then enters only the nodes that contain a target, and every other subtree (most of a
    module, for a few edits), a target without targets inside it included, is kept as it is,
    unvisited: a callable replacement receives such a target itself, which is what a rebuilt
    copy would be, node for node. ``enter``: instead of ``module``, which nodes to enter (a
    predicate of the original node)."""

    def __init__(self, edits: Sequence[Edit], module: Optional[cst.Module] = None,
                 enter: Optional[Callable[[cst.CSTNode], bool]] = None) -> None:
        super().__init__()
        self.edits: dict[int, list[Edit]] = {}
        for e in edits:
            self.edits.setdefault(id(e.target), []).append(e)
        self.applied = 0
        self.parents: list[cst.CSTNode] = []  # the original nodes around the one visited
        self.failures: list[tuple[Edit, Exception]] = []  # callable replacements that raised
        # ids of the nodes that contain a target (None: enter everything)
        self.around: Optional[set[int]] = None if module is None else _ancestors_of(module, set(self.edits))
        self.enter = enter

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.enter is not None:
            return self.enter(node)
        return self.around is None or id(node) in self.around

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.parents.append(node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        self.parents.pop()

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
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
        gen = _compat.PositionCodegen()
        gen.add(parent)
        rng = gen.positions.get(child)
        if rng is None:
            return None
        lines = gen.code().split("\n")
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
        for fname in child_fields(kind):
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
        first = failures[0][1]
        super().__init__(f"{type(first).__name__}: {' '.join(str(first).split())}")
        self.failures = failures


def apply_fixes(module: cst.Module, fixes: Sequence[Fix], ctx: Optional[FileContext] = None) -> cst.Module:
    """Apply the edits of ``fixes``, add the imports they need and remove the ones they
    left unused. Pure. Raises :class:`FixFailed` when a callable replacement raised."""
    edits = [e for fix in fixes for e in fix.edits]
    transformer = ApplyEdits(edits, module)
    new = module.visit(transformer)
    if transformer.failures:
        raise FixFailed(transformer.failures)
    assert isinstance(new, cst.Module)
    modules = sorted({m for fix in fixes for m in fix.imports})
    if modules:
        new = add_imports(new, modules, ctx or FileContext(module))
    removals = sorted({r for fix in fixes for r in fix.remove_imports}, key=lambda r: (r[0], r[1] or ""))
    if removals:
        new = without_leading_blank_lines(new, remove_imports(new, removals))
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
    k = head_length(body)
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


def head_length(body: Sequence[cst.BaseStatement]) -> int:
    """How many statements AddImportsVisitor reads: a docstring or ``__strict__ = ...``
    first, then the run of one-import lines (LibCST's ``_split_module`` rule)."""
    at = 1 if body and (is_docstring(body[0]) or _is_strict(body[0])) else 0
    while at < len(body) and _is_single_import_line(body[at]):
        at += 1
    return at


def _is_single_import_line(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))


def is_docstring(stmt: cst.CSTNode) -> bool:
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


def without_leading_blank_lines(before: cst.Module, after: cst.Module) -> cst.Module:
    """``after`` (``before`` with statements removed) without the blank lines that would start
    the file where its first statement went (those that separated it from the next)."""
    if not after.body or not before.body or after.body[0] is before.body[0] or after.header:
        return after
    first = after.body[0]
    kept = list(first.leading_lines)
    while kept and kept[0].comment is None:
        kept.pop(0)
    return after.with_changes(body=[first.with_changes(leading_lines=kept), *after.body[1:]])


def without_emptied_ifs(before: cst.Module, after: cst.Module) -> cst.Module:
    """``after`` (a port of ``before``) without the `if flag: pass` statements the port left
    (its fixes removed every statement of the block: `if distributed: model = DDP(model)`),
    where each arm (`elif`, `else` too) is `pass` alone, no test calls anything, the original
    has an `if` of the same test and no comment is on it or in it; a block left empty gets
    `pass`. Such a statement ``before`` has itself stays."""
    candidates = _empty_ifs(after)
    if not candidates:  # (the usual case: the original is not read)
        return after
    own = {_statement_code(s) for s in _empty_ifs(before)}
    tests = {_statement_code(n.test) for n in walk(before, into_functions=True) if isinstance(n, cst.If)}
    gone = {id(s) for s in candidates if _statement_code(s) not in own and _statement_code(s.test) in tests}
    return after.visit(_DropStatements(gone)) if gone else after


def _empty_ifs(module: cst.Module) -> list[cst.If]:
    out = []
    elifs: set[int] = set()
    for node in walk(module, into_functions=True):
        if isinstance(node, cst.If):
            if isinstance(node.orelse, cst.If):
                elifs.add(id(node.orelse))
            if id(node) in elifs or node.leading_lines and any(line.comment for line in node.leading_lines):
                continue
            arms: list = []
            arm: object = node
            while isinstance(arm, cst.If):
                arms.append((arm.test, arm.body))
                arm = arm.orelse
            if isinstance(arm, cst.Else):
                arms.append((None, arm.body))
            if all(_passes_only(body) and (test is None or not any(
                    isinstance(n, (cst.Call, cst.Await, cst.NamedExpr, cst.Yield)) for n in walk(test)))
                   for test, body in arms):
                out.append(node)
    return out


def _passes_only(body: cst.BaseSuite) -> bool:
    """An indented block of `pass` lines with no comment."""
    return isinstance(body, cst.IndentedBlock) and body.header.comment is None and not body.footer and all(
        isinstance(b, cst.SimpleStatementLine) and not _has_comment(b) and all(isinstance(x, cst.Pass) for x in b.body)
        for b in body.body)


def _statement_code(node: cst.CSTNode) -> str:
    if hasattr(node, "leading_lines"):
        node = node.with_changes(leading_lines=[])
    return cst.Module([]).code_for_node(node).strip()


def without_identical_arms(before: cst.Module, after: cst.Module) -> cst.Module:
    """``after`` (a port of ``before``) without the arms its fixes made the same: an `elif c:`
    whose block is now the `else` block's code goes (`if a: X elif c: Y else: Y` -> `if a: X
    else: Y`), an `if` whose arms all became one block is that block, and `e if c else e` is
    `e`; only where the dropped tests call nothing (evaluating them did nothing else), no
    comment is lost, and the original had no arms of the same test already the same (the user's
    own are the user's)."""
    nodes = list(walk(after, into_functions=True))
    elifs = {id(n.orelse) for n in nodes if isinstance(n, cst.If) and isinstance(n.orelse, cst.If)}
    candidates = [n for n in nodes if id(n) not in elifs and _same_arms(n)]  # (an `elif`: with its `if`)
    if not candidates:  # (the usual case: the original is not read)
        return after
    # the tests of the arms the original already had the same as the next (the user's own)
    own = {_statement_code(_merged_test(n)) for n in walk(before, into_functions=True) if _same_arms(n)}
    mine = {id(n) for n in candidates if _statement_code(_merged_test(n)) not in own}
    return after.visit(_MergeArms(mine)) if mine else after


def _merged_test(node: cst.CSTNode) -> cst.CSTNode:
    """The test of the arm :func:`_same_arms` found the same as the one after it."""
    return node.test if isinstance(node, cst.IfExp) else _arms(node)[0][-1].test  # type: ignore[arg-type]


def _same_arms(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.IfExp):
        return _pure(node.test) and _statement_code(node.body) == _statement_code(node.orelse)
    if not isinstance(node, cst.If) or not isinstance(node.orelse, (cst.If, cst.Else)):
        return False
    arms, last = _arms(node)
    return last is not None and _statement_code(arms[-1].body) == _statement_code(last.body) and _pure(arms[-1].test) \
        and not _arm_comment(arms[-1])


def _arms(node: cst.If) -> tuple[list[cst.If], Optional[cst.Else]]:
    arms = [node]
    while isinstance(arms[-1].orelse, cst.If):
        arms.append(arms[-1].orelse)
    last = arms[-1].orelse
    return arms, last if isinstance(last, cst.Else) else None


def _arm_comment(arm: cst.If) -> bool:
    """A comment on the arm's `if` / `elif` line or above it (the blocks' own comments are the
    same code in the arm kept)."""
    body = arm.body
    header = body.header if isinstance(body, cst.IndentedBlock) else cast(cst.SimpleStatementSuite, body).trailing_whitespace
    return header.comment is not None or any(line.comment for line in arm.leading_lines)


def _pure(test: cst.CSTNode) -> bool:
    return not any(isinstance(n, (cst.Call, cst.Await, cst.Yield, cst.NamedExpr)) for n in walk(test, into_functions=True))


class _MergeArms(cst.CSTTransformer):
    def __init__(self, ids: set[int]) -> None:
        super().__init__()
        self.ids = ids

    def leave_IfExp(self, original, updated):
        if id(original) not in self.ids:
            return updated
        return updated.body.with_changes(lpar=updated.lpar or updated.body.lpar, rpar=updated.rpar or updated.body.rpar) \
            if updated.lpar else updated.body

    def leave_If(self, original, updated):
        if id(original) not in self.ids:
            return updated
        arms, last = _arms(updated)
        assert last is not None
        while arms and _statement_code(arms[-1].body) == _statement_code(last.body) and _pure(arms[-1].test) \
                and not _arm_comment(arms[-1]):
            arms.pop()
        if not arms:  # every arm the same block: the block, where the `if` was
            kept = list(last.body.body) if isinstance(last.body, cst.IndentedBlock) else [cst.SimpleStatementLine(
                list(last.body.body))]
            kept[0] = kept[0].with_changes(leading_lines=[*updated.leading_lines, *kept[0].leading_lines])
            return cst.FlattenSentinel(kept)
        chain: Union[cst.If, cst.Else] = last
        for arm in reversed(arms):
            chain = arm.with_changes(orelse=chain)
        return chain


class _DropStatements(cst.CSTTransformer):
    def __init__(self, gone: set[int]) -> None:
        super().__init__()
        self.gone = gone

    def leave_If(self, original, updated):
        return cst.RemoveFromParent() if id(original) in self.gone else updated

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated


def orphaned_imports(before: cst.Module, after: cst.Module) -> list[tuple[str, Optional[str]]]:
    """The module-level imports of ``after`` (a port of ``before``) whose name ``before`` used and
    ``after`` no longer mentions outside its import lines, as :func:`remove_imports` pairs: the
    imports a port left unused (``import torch.multiprocessing as mp`` once ``mp.spawn`` became
    ``torch_xla.launch``). An import ``before`` did not use stays as the user had it; the scope
    analysis of remove_imports makes the final decision."""
    items: list[tuple[str, Optional[str], str]] = []
    for stmt in after.body:
        if not isinstance(stmt, cst.SimpleStatementLine) or _has_comment(stmt):
            continue  # a comment on or above the import is the user's: the line stays
        for small in stmt.body:
            if isinstance(small, cst.Import):
                items += [(a.evaluated_name, None, (a.evaluated_alias or a.evaluated_name).split(".")[0])
                          for a in small.names]
            elif (isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None
                  and not isinstance(small.names, cst.ImportStar) and _dotted(small.module) != "__future__"):
                items += [(_dotted(small.module), a.evaluated_name, a.evaluated_alias or a.evaluated_name)
                          for a in small.names]
    if not items:
        return []
    # the port first: only the heads it no longer mentions are looked for in the original (most
    # of a port's imports are used, or new: the original's statements are then not read at all)
    heads = sorted({head for _, _, head in items})
    used_after = _mentioned(after, _words(heads), heads)
    unused = [head for head in heads if head not in used_after]
    if not unused:
        return []
    used_before = _mentioned(before, _words(unused), unused)
    return [(mod, name) for mod, name, head in items if head in used_before and head not in used_after]


def _words(names: Sequence[str]) -> re.Pattern:
    """Any of ``names`` as a whole word."""
    return re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, names)) + r")(?!\w)")


def _has_comment(stmt: cst.SimpleStatementLine) -> bool:
    return stmt.trailing_whitespace.comment is not None or any(line.comment for line in stmt.leading_lines)


def _mentioned(module: cst.Module, mention: re.Pattern, heads: Sequence[str]) -> set[str]:
    """Which of ``heads`` the module's statements other than its plain import lines mention in
    code (comments and docstrings are no mention)."""
    found: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body):
            continue
        text = module.code_for_node(stmt)
        candidates = {m.group(0) for m in mention.finditer(text)} - found
        if candidates:
            found |= _names_in_code(text, candidates)
        if len(found) == len(heads):
            break
    return found


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
        if mention.search(text) and _mentions_in_code(text, mention):
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


_LINE_START = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def _mentions_in_code(text: str, mention: re.Pattern) -> bool:
    """Whether ``text`` (a top-level statement whose text matches ``mention``) mentions the name
    where Python or the scope analysis can read it: as a name, or inside a string that could be
    a string annotation or an ``__all__`` entry. A comment, or a string that is a statement of
    its own (a docstring), reads nothing: the helpers a port emits name ``torch`` in their
    docstrings and comments, and the scope analysis of them was most of a JAX port's time on a
    small module. Text that does not tokenize counts as a mention."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return True
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME:
            if mention.fullmatch(tok.string):
                return True
        elif tok.type == tokenize.STRING and mention.search(_read_in_string(tokens, i)):
            return True
    return False


def _read_in_string(tokens: list, i: int) -> str:
    """What the STRING token ``tokens[i]`` can make the scope analysis read (_readable_text): nothing
    of a plain string that is a statement of its own (a docstring is no annotation); an
    f-string's fields are evaluated wherever it stands."""
    literal = tokens[i].string
    text = _readable_text(literal)
    if text and "f" not in _prefix(literal):
        before = tokens[i - 1].type if i else tokenize.NEWLINE
        after = tokens[i + 1].type if i + 1 < len(tokens) else tokenize.NEWLINE
        if before in _LINE_START and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
            return ""
    return text


def _readable_text(literal: str) -> str:
    """The part of a string literal's token in which the scope analysis could read a name: an
    f-string's replacement fields (code), all of a plain string whose text parses as Python (a
    string annotation, or an ``__all__`` entry, which is the name itself), nothing of bytes or
    of a string that does not parse. A message such as f"missing key in the torch state dict:
    {key!r}" reads ``key`` only: the helpers a JAX port emits have such messages, and their
    scope analysis was half of a small module's port."""
    prefix = _prefix(literal)
    if "b" in prefix:
        return ""
    if "f" in prefix:
        return " ".join(_replacement_fields(literal[len(prefix):]))
    try:
        ast.parse(ast.literal_eval(literal))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return ""
    return literal


def _prefix(literal: str) -> str:
    """A string literal's prefix, lower-cased (``rb``, ``f``, ``''``)."""
    return literal[:len(literal) - len(literal.lstrip("rRbBuUfF"))].lower()


def _replacement_fields(body: str) -> list[str]:
    """The text inside the top-level braces of an f-string's quoted body (``{{`` and ``}}`` are
    literal braces; a field's format spec, itself with fields, stays in it)."""
    fields: list[str] = []
    depth, start, i = 0, 0, 0
    while i < len(body):
        ch = body[i]
        if depth == 0 and ch in "{}" and body[i:i + 2] in ("{{", "}}"):
            i += 2
            continue
        if ch == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                fields.append(body[start:i])
        i += 1
    return fields


def _names_in_code(text: str, names: set[str]) -> set[str]:
    """The ``names`` that ``text`` mentions in code: for each name, what
    ``_mentions_in_code(text, <the name as a whole word>)`` says, from one tokenization of the
    text (a statement mentioning ten imported names was tokenized ten times)."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type != tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return set(names)
    words = _words(sorted(names))
    found: set[str] = set()
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME:
            if tok.string in names:
                found.add(tok.string)
        elif tok.type == tokenize.STRING:
            found |= {m.group(0) for m in words.finditer(_read_in_string(tokens, i))}
        else:
            continue
        if len(found) == len(names):
            break
    return found


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
        if kind is cst.Attribute and not in_import and _is_name(getattr(node, "value"), name):
            if in_function:
                reads.append(scopes)
            continue
        outer = scopes
        if kind is cst.FunctionDef or kind is cst.Lambda or kind is cst.ClassDef:
            scopes = (*scopes, id(node))
            in_function = in_function or kind is not cst.ClassDef
        elif kind is cst.Import or kind is cst.ImportFrom:
            in_import = True
        for fname in child_fields(kind):
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


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return type(node) is cst.Name and node.value == name


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



# --------------------------------------------------------------------------------------
# Text edits
# --------------------------------------------------------------------------------------
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class TextEdit:
    """Replace the text between two (line, column) positions, 0-based, columns in code points."""

    start: tuple[int, int]
    end: tuple[int, int]
    text: str


def split_lines(text: str) -> list[str]:
    """The text's lines, ends kept: only ``\\n``, ``\\r\\n`` and ``\\r`` end a line
    (``str.splitlines`` also splits at form feeds, U+2028...), as in LibCST and the LSP."""
    return _LINE.findall(text)


def _body(line: str) -> str:
    return line.rstrip("\r\n")


def apply_text_edits(text: str, edits: Sequence[TextEdit]) -> str:
    """``text`` with ``edits`` (positions in ``text``, not overlapping) made."""
    lines = split_lines(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        line, col = pos
        if line >= len(lines):
            return len(text)
        return starts[line] + min(col, len(_body(lines[line])))

    out = text
    for e in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        out = out[:offset(e.start)] + e.text + out[offset(e.end):]
    return out


def text_edits(old: str, new: str, first_line: int = 0) -> list[TextEdit]:
    """The smallest edits that turn ``old`` into ``new``: changed line ranges (difflib), each
    trimmed to its differing characters. Positions are relative to ``old``, whose first line
    is line ``first_line`` of the document."""
    a, b = split_lines(old), split_lines(new)
    out: list[TextEdit] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        old_block, new_block = "".join(a[i1:i2]), "".join(b[j1:j2])
        p = _common_prefix(old_block, new_block)
        s = _common_suffix(old_block[p:], new_block[p:])
        start = _locate(a, i1, p)
        end = _locate(a, i1, len(old_block) - s)
        out.append(TextEdit((first_line + i1 + start[0], start[1]), (first_line + i1 + end[0], end[1]),
                            new_block[p:len(new_block) - s]))
    return out


def _common_prefix(x: str, y: str) -> int:
    n = 0
    limit = min(len(x), len(y))
    while n < limit and x[n] == y[n]:
        n += 1
    if 0 < n < len(x) and x[n - 1] == "\r" and x[n] == "\n":
        n -= 1  # never between the two characters of a CRLF
    return n


def _common_suffix(x: str, y: str) -> int:
    n = 0
    limit = min(len(x), len(y))
    while n < limit and x[len(x) - 1 - n] == y[len(y) - 1 - n]:
        n += 1
    if 0 < n < len(x) and x[len(x) - n] == "\n" and x[len(x) - n - 1] == "\r":
        n -= 1
    return n


def _locate(lines: Sequence[str], first: int, offset: int) -> tuple[int, int]:
    """(line, column) of character ``offset`` of the text starting at ``lines[first]``."""
    i = first
    while i < len(lines) and offset >= len(lines[i]) and (offset > len(lines[i]) or lines[i].endswith(("\n", "\r"))):
        offset -= len(lines[i])
        i += 1
    return i - first, offset


def joined(edits: Iterable[TextEdit]) -> list[TextEdit]:
    """In document order, and an edit that ends where the next one starts merged with it
    (an import inserted right before an edited line): the LSP wants edits that never
    overlap, and clients differ on edits that share a position. Overlapping edits are a bug
    in porter (ValueError)."""
    out: list[TextEdit] = []
    for c in sorted(edits, key=lambda c: (c.start, c.end)):
        if out and out[-1].end == c.start:
            out[-1] = TextEdit(out[-1].start, c.end, out[-1].text + c.text)
        elif out and out[-1].end > c.start:
            raise ValueError(f"overlapping edits {out[-1]} and {c}")
        else:
            out.append(c)
    return out


def _word_beside_on_line(text: str, start: int, end: int) -> Callable[[int], Optional[bool]]:
    """keep_boundary's ``word_beside`` for a target at columns [start, end) of the line ``text``."""
    def beside(side: int) -> Optional[bool]:
        ch = text[start - 1] if side < 0 and start > 0 else text[end] if side > 0 and end < len(text) else " "
        return bool(_WORD_CHAR.match(ch))
    return beside


class PositionLookup(Protocol):
    """Where the nodes of a tree are: ``engine.node_positions``'s dict, or
    ``porter.incremental.Positions``."""

    def get(self, node: cst.CSTNode, default: Any = None) -> Any: ...


# the text edits of add_imports for (the module's head with a stand-in after it, the modules):
# the same in every version of every document (add_imports reads nothing else)
_IMPORTS: dict[tuple[str, tuple[str, ...]], list[TextEdit]] = {}
_IMPORTS_KEPT = 256


class FixEditor:
    """The fixes of one checked text as minimal text edits on that text.

    ``module``: the tree parsed from ``text`` (the fixes' targets are its nodes);
    ``positions``: node -> CodeRange of its nodes (anything with ``get``, as
    ``engine.node_positions`` or ``porter.incremental.Positions``; computed when needed if
    not given); ``statement_starts``: the 0-based line where each top-level statement's text
    begins, its leading lines included (computed from the positions if not given). The edits
    of each fix are kept: asking again costs nothing."""

    def __init__(self, text: str, module: cst.Module, positions: Optional[PositionLookup] = None,
                 statement_starts: Optional[list[int]] = None, lines: Optional[list[str]] = None) -> None:
        self.text = text
        self.module = module
        self.lines = lines if lines is not None else split_lines(text)
        self._positions = positions
        self._starts = statement_starts
        self._done: dict[int, tuple[Fix, list[TextEdit]]] = {}
        self._imports: dict[tuple[str, ...], Optional[tuple[int, list[TextEdit]]]] = {}
        self._names: Optional[dict] = None

    @property
    def positions(self) -> PositionLookup:
        if self._positions is None:
            self._positions = _compat.node_positions(self.module)
        return self._positions

    def statement_starts(self) -> list[int]:
        """0-based line where each top-level statement's text begins, its leading
        blank/comment lines included (statement 0: the document's start); -1 where not known.
        Checked against the text before use."""
        if self._starts is None:
            self._starts = [self._chunk_start(i) for i in range(len(self.module.body))]
        return self._starts

    def _chunk_start(self, i: int) -> int:
        if i == 0:
            return 0
        stmt = self.module.body[i]
        first = self._first_line(stmt)
        return -1 if first < 0 else first - len(stmt.leading_lines)

    def _first_line(self, stmt: cst.CSTNode) -> int:
        """0-based line of a statement's own first line (its first decorator), or -1."""
        decorators = getattr(stmt, "decorators", ())
        rng = self.positions.get(decorators[0] if decorators else stmt)
        return rng.start.line - 1 if rng is not None else -1

    def _module_names(self) -> dict:
        if self._names is None:
            self._names = FileContext(self.module).module_names
        return self._names

    # -- the public side ----------------------------------------------------------------
    def known(self, fix: Fix) -> Optional[list[TextEdit]]:
        """The edits of ``fix`` if already computed (or remembered), else None."""
        done = self._done.get(id(fix))
        return done[1] if done is not None and done[0] is fix else None

    def remember(self, fix: Fix, edits: Sequence[TextEdit]) -> list[TextEdit]:
        """Keep ``edits`` (computed elsewhere: another process) as the edits of ``fix``."""
        out = joined(edits)
        self._done[id(fix)] = (fix, out)
        return out

    @staticmethod
    def needs_whole_module(fix: Fix) -> bool:
        """Whether the edits of ``fix`` take the whole module's fix (a removal of imports needs
        the scope of every name: seconds on a large file)."""
        return bool(fix.remove_imports)

    def edits(self, fix: Fix) -> list[TextEdit]:
        """Exactly ``fix`` (its edits and the imports it needs: ``apply_fixes(module, [fix])``)
        as text edits of ``text``: in document order, never overlapping. Raises
        :class:`FixFailed` where ``apply_fixes`` does."""
        got = self.known(fix)
        if got is None:
            got = self.remember(fix, self._edits(fix))
        return got

    def _edits(self, fix: Fix) -> list[TextEdit]:
        changes = None
        if not fix.remove_imports:
            # the cheapest exact way first; each one checks itself against the text and the
            # next one takes over where it cannot be sure
            changes = self._node_edits(fix)
            if changes is None:
                changes = self._block_edits(fix)
            if changes is None:
                changes = self._span_edits(fix)
        if changes is None:  # the whole module
            changes = text_edits(self.text, apply_fixes(self.module, [fix], FileContext(self.module)).code)
        return changes

    # -- the ways, cheapest first ---------------------------------------------------------
    def _missing(self, fix: Fix) -> tuple[str, ...]:
        names = self._module_names()
        return tuple(sorted({m for m in fix.imports if m not in names}))

    def _node_edits(self, fix: Fix) -> Optional[list[TextEdit]]:
        """Each edit's replacement written in place of its target, when every target and
        replacement is one line of code (no indentation is involved) and no target holds
        another; plus the imports the fix needs (``_import_edits``). None otherwise."""
        module = self.module
        spans = []
        for edit in fix.edits:
            rng = self.positions.get(edit.target)
            if rng is None or rng.start.line != rng.end.line:
                return None
            rep = edit.replacement
            if callable(rep) and not isinstance(rep, cst.CSTNode):
                try:
                    new_node = rep(edit.target)
                except (RecursionError, MemoryError):
                    raise
                except Exception as exc:  # NeedsHuman, or a bug in the rule: as apply_fixes says it
                    raise FixFailed([(edit, exc)]) from None
            else:
                new_node = rep
            if not isinstance(new_node, cst.CSTNode):
                return None  # a removal or statements around the target: the parent is needed
            line = rng.start.line - 1
            text = _body(self.lines[line])
            # the parentheses ApplyEdits keeps or adds (keep_boundary), judged on this line
            new_node = keep_boundary(edit.target, new_node, _word_beside_on_line(text, rng.start.column, rng.end.column))
            old, new = module.code_for_node(edit.target), module.code_for_node(new_node)
            if "\n" in new or "\r" in new:
                return None
            if text[rng.start.column:rng.end.column] != old:
                return None
            spans.append((line, rng.start.column, rng.end.column, old, new))
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            if (a[0], a[2]) > (b[0], b[1]):
                return None  # nested or overlapping targets: the edits compose in the tree
        changes = []
        for line, start, end, old, new in spans:
            p = _common_prefix(old, new)
            q = _common_suffix(old[p:], new[p:])
            changes.append(TextEdit((line, start + p), (line, end - q), new[p:len(new) - q]))
        missing = self._missing(fix)
        if missing:
            imports = self._import_edits(missing)
            if imports is None:
                return None
            boundary = imports[0]
            if spans and spans[0][0] < boundary:
                return None  # an edit in the module's head: the imports are added after it
            changes = imports[1] + changes
        return changes

    def _block_edits(self, fix: Fix) -> Optional[list[TextEdit]]:
        """The fix applied to the innermost statement holding all its targets, written out
        inside stand-in blocks with the indentation of its real ones (so LibCST writes every
        line as it stands in the file); plus the imports the fix needs. None when the targets
        lie in different top-level statements, or anything does not match the text."""
        module = self.module
        body = module.body
        starts = self.statement_starts()
        if not body or any(s < 0 for s in starts):
            return None
        tops = set()
        for edit in fix.edits:
            rng = self.positions.get(edit.target)
            if rng is None or edit.target is module:
                return None
            tops.add(bisect.bisect_right(starts, rng.start.line - 1) - 1)
        if len(tops) != 1 or min(tops) < 0:
            return None
        top = body[tops.pop()]
        parents: dict[int, cst.CSTNode] = {}
        stack: list[cst.CSTNode] = [top]
        while stack:
            node = stack.pop()
            for child in _compat.children(node):
                parents[id(child)] = node
                stack.append(child)
        chains = []
        for edit in fix.edits:
            chain = [edit.target]
            while chain[-1] is not top:
                parent = parents.get(id(chain[-1]))
                if parent is None:
                    return None
                chain.append(parent)
            chains.append(chain[::-1])  # top ... target
        common = 0
        while all(len(c) > common + 1 for c in chains) and len({id(c[common + 1]) for c in chains}) == 1:
            common += 1
        path = chains[0][: common + 1]  # top ... deepest node holding every target

        def block_statement(i: int) -> bool:
            return i == 0 or (isinstance(path[i], cst.BaseStatement) and isinstance(path[i - 1], cst.IndentedBlock))

        # the innermost statement of a block on that path, above every target
        at = max((i for i in range(len(path)) if block_statement(i)), default=0)
        if any(len(c) == at + 1 for c in chains) and at > 0:
            at = max(i for i in range(at) if block_statement(i))
        stmt = path[at]
        if not isinstance(stmt, cst.BaseStatement):
            return None
        blocks = [n for n in path[:at] if isinstance(n, cst.IndentedBlock)]
        wrapped: cst.BaseStatement = stmt
        for block in reversed(blocks):
            wrapped = cst.If(test=cst.Name("_"), body=cst.IndentedBlock(body=[wrapped], indent=block.indent))
        span = module.with_changes(body=[wrapped], header=(), footer=(), has_trailing_newline=True)
        old = span.code
        old_lines = split_lines(old)
        n = len(blocks)
        first = self._first_line(stmt) - len(getattr(stmt, "leading_lines", ()))
        if first < 0 or "".join(self.lines[first:first + len(old_lines) - n]) != "".join(old_lines[n:]):
            return None
        missing = self._missing(fix)
        imports: tuple[int, list[TextEdit]] = (0, [])
        if missing:
            found = self._import_edits(missing)
            if found is None or first < found[0]:
                return None
            imports = found
        on_path = {id(n) for c in chains for n in c}
        pruned = ApplyEdits(list(fix.edits), enter=lambda node: id(node) not in parents or id(node) in on_path)
        new_node = span.visit(pruned)
        if not isinstance(new_node, cst.Module) or pruned.applied != len(fix.edits):
            return None
        new_lines = split_lines(new_node.code)
        if new_lines[:n] != old_lines[:n]:
            return None
        return imports[1] + text_edits("".join(old_lines[n:]), "".join(new_lines[n:]), first)

    def _import_edits(self, modules: tuple[str, ...]) -> Optional[tuple[int, list[TextEdit]]]:
        """The text edits of ``add_imports`` for ``modules`` and the line where the statement
        after the module's head begins (nothing at or after it changes). Computed as
        add_imports does, on the head and a stand-in for that statement."""
        if modules in self._imports:
            return self._imports[modules]
        module = self.module
        body = list(module.body)
        k = head_length(body)
        result = None
        if k < len(body):
            boundary = self._first_line(body[k])
            stand_in = cst.SimpleStatementLine([cst.Pass()], leading_lines=body[k].leading_lines)
            span = module.with_changes(body=[*body[:k], stand_in], footer=(), has_trailing_newline=True)
            tail = "pass" + module.default_newline
            old = span.code
            if boundary >= 0 and old.endswith(tail) and "".join(self.lines[:boundary]) + tail == old[: len(old) - len(tail)] + tail:
                changes = _IMPORTS.get((old, modules))
                if changes is None:
                    new = add_imports(span, list(modules), FileContext(module)).code
                    if new.endswith(tail):
                        changes = text_edits(old[: -len(tail)], new[: -len(tail)])
                        if len(_IMPORTS) >= _IMPORTS_KEPT:
                            _IMPORTS.pop(next(iter(_IMPORTS)))
                        _IMPORTS[(old, modules)] = changes
                if changes is not None:
                    result = (boundary, changes)
        self._imports[modules] = result
        return result

    def _span_edits(self, fix: Fix) -> Optional[list[TextEdit]]:
        """The fix applied to the top-level statements it touches only (the nodes are the same
        objects as in the whole tree, so the same edits apply), or None when that cannot be
        done exactly (then the whole module is fixed).

        The touched statements are grouped in runs of adjacent statements; when the fix needs
        an import the file lacks, the module's head (docstring, leading imports and the
        statement after them, all that AddImportsVisitor reads and changes) is one run and
        gets the imports."""
        module = self.module
        body = module.body
        if not body:
            return None
        starts = self.statement_starts()
        if any(s < 0 for s in starts) or starts != sorted(starts):
            return None
        touched: set[int] = set()
        for edit in fix.edits:
            rng = self.positions.get(edit.target)
            if rng is None or edit.target is module:
                return None
            i = bisect.bisect_right(starts, rng.start.line - 1) - 1
            if i < 0:
                return None
            touched.add(i)
        ctx = FileContext(module)
        head = -1
        if any(m not in ctx.module_names for m in fix.imports):
            head = min(head_length(list(body)) + 1, len(body))  # statements [0, head)
            touched.update(range(head))
        runs: list[list[int]] = []
        for i in sorted(touched):
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        edits_only = dataclasses.replace(fix, imports=(), remove_imports=())
        out: list[TextEdit] = []
        for run in runs:
            lo, hi = run[0], run[-1]
            last = hi == len(body) - 1
            span = module.with_changes(
                body=body[lo:hi + 1],
                header=module.header if lo == 0 else (),
                footer=module.footer if last else (),
                has_trailing_newline=module.has_trailing_newline if last else True,
            )
            first_line = starts[lo]
            end_line = len(self.lines) if last else starts[hi + 1]
            old = span.code
            if "".join(self.lines[first_line:end_line]) != old:
                return None
            new = apply_fixes(span, [fix if lo == 0 and head > 0 else edits_only], ctx).code
            out.extend(text_edits(old, new, first_line))
        return out
