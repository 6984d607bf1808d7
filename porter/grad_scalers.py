"""torch's GradScaler in a file: where each scaler variable is made and every use of it, and
the unwinding of its calls for a target without loss scaling (`scaler.scale(loss).backward()`
-> `loss.backward()`, `scaler.step(opt)` -> the target's step, `update()`/`unscale_()`
removed). Shared by the torch-xla (TX602) and JAX (JX320) rules, with the tree-with-parents
and statement-removal helpers they use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import libcst as cst

from porter import astutil
from porter.astutil import children as _children
from porter.astutil import is_string, parenthesized, positional, target_names
from porter.context import FileContext
from porter.rules import Edit


# --------------------------------------------------------------------------------------
# Tree with parents (for the rules that must see a whole scope before reporting)
# --------------------------------------------------------------------------------------
class Parents:
    """Parent links of every node below ``root`` (LibCST nodes have none)."""

    def __init__(self, root: cst.CSTNode) -> None:
        self.parent: dict[int, cst.CSTNode] = {}
        self.nodes: list[cst.CSTNode] = []
        stack = [root]
        while stack:
            node = stack.pop()
            self.nodes.append(node)
            for child in _children(node):
                self.parent[id(child)] = node
                stack.append(child)

    def of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.parent.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        p = self.of(node)
        while p is not None:
            yield p
            p = self.of(p)

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost function, class or module around ``node``."""
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Module, cst.Lambda)):
                return anc
        raise ValueError("node outside the tree")


def walk_scope(scope: cst.CSTNode, skip: Iterable[cst.CSTNode] = ()) -> Iterator[cst.CSTNode]:
    """Nodes of a scope, descending into nested scopes except those in ``skip``."""
    skipped = {id(s) for s in skip}
    stack = [scope]
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(_children(node)):
            if id(child) not in skipped:
                stack.append(child)


def binds_locally(fn: Union[cst.FunctionDef, cst.Lambda], name: str) -> bool:
    """Whether a function/lambda binds ``name`` locally (a parameter or an assignment)."""
    if any(p.name.value == name for p in astutil.params(fn.params)):
        return True
    if isinstance(fn, cst.Lambda):
        return False
    for node in walk_scope(fn.body):
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node.name.value == name:
            return True
        if isinstance(node, cst.AssignTarget) and name in target_names(node.target):
            return True
        if isinstance(node, (cst.AugAssign, cst.AnnAssign)) and name in target_names(node.target):
            return True
        if isinstance(node, (cst.For, cst.CompFor)) and name in target_names(node.target):
            return True
        if isinstance(node, cst.AsName) and name in target_names(node.name):
            return True
        if isinstance(node, cst.Global) and any(n.name.value == name for n in node.names):
            return False
    return False


# --------------------------------------------------------------------------------------
# Statement removal that keeps blocks non-empty
# --------------------------------------------------------------------------------------
def removal_edits(parents: Parents, smalls: Sequence[cst.BaseSmallStatement]) -> list[Edit]:
    """Edits removing the small statements ``smalls`` (e.g. ``Expr`` / ``Assign``).

    A line whose statements all go is removed whole; a block (or one-line suite) that would
    be left empty keeps a ``pass`` in the place of its first removed statement.
    """
    gone = {id(s) for s in smalls}
    edits: list[Edit] = []
    removed_lines: dict[int, list[cst.SimpleStatementLine]] = {}
    block_of: dict[int, cst.CSTNode] = {}
    for line_or_suite in _unique(parents.of(s) for s in smalls):
        body = line_or_suite.body  # type: ignore[attr-defined]
        remaining = [s for s in body if id(s) not in gone]
        if isinstance(line_or_suite, cst.SimpleStatementSuite):
            if remaining:
                drop = {i for i, s in enumerate(body) if id(s) in gone}
                edits.append(Edit(line_or_suite, _drop_small(drop)))
            else:
                edits.append(Edit(line_or_suite, line_or_suite.with_changes(body=[cst.Pass()])))
            continue
        if remaining:
            drop = {i for i, s in enumerate(body) if id(s) in gone}
            edits.append(Edit(line_or_suite, _drop_small(drop)))
            continue
        block = parents.of(line_or_suite)
        assert block is not None
        block_of[id(block)] = block
        removed_lines.setdefault(id(block), []).append(line_or_suite)  # type: ignore[arg-type]
    for key, lines in removed_lines.items():
        block = block_of[key]
        body = block.body  # type: ignore[attr-defined]
        whole = {id(line) for line in lines}
        emptied = isinstance(block, cst.IndentedBlock) and all(id(s) in whole for s in body)
        for i, line in enumerate(lines):
            if emptied and i == 0:
                edits.append(Edit(line, line.with_changes(body=[cst.Pass()], trailing_whitespace=line.trailing_whitespace)))
            else:
                edits.append(Edit(line, cst.RemoveFromParent()))
    return edits


def _drop_small(drop: set[int]):
    """A replacement callable for a line (or one-line suite): its small statements at the
    indices ``drop`` removed, without a dangling semicolon."""

    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        body = [s for i, s in enumerate(updated.body) if i not in drop]  # type: ignore[attr-defined]
        body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(body=body)

    return apply


def _unique(nodes: Iterable[Optional[cst.CSTNode]]) -> list[cst.CSTNode]:
    seen: dict[int, cst.CSTNode] = {}
    for n in nodes:
        if n is not None and id(n) not in seen:
            seen[id(n)] = n
    return list(seen.values())


def expression_statement(parents: Parents, call: cst.Call) -> Optional[cst.Expr]:
    """The ``Expr`` small statement when ``call`` is a statement of its own, else None."""
    p = parents.of(call)
    if isinstance(p, cst.Expr) and p.value is call:
        return p
    return None


# --------------------------------------------------------------------------------------
# GradScaler tracking
# --------------------------------------------------------------------------------------
GRAD_SCALERS = (
    "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
)


def is_grad_scaler_call(ctx: FileContext, node: cst.CSTNode) -> bool:
    if not (isinstance(node, cst.Call) and ctx.qualname(node.func) in GRAD_SCALERS):
        return False
    if ctx.qualname(node.func).startswith("torch.amp."):  # type: ignore[union-attr]
        device = _arg(node, "device", 0)
        if device is not None and is_string(device.value) and not is_string(device.value, "cuda"):
            return False  # a scaler for another device ("cpu") is not a CUDA idiom
    return True


_arg = astutil.arg


@dataclass
class ScalerUse:
    node: cst.CSTNode  # the Name / self.attr expression
    call: Optional[cst.Call] = None  # scaler.<method>(...) when it is one
    method: Optional[str] = None


@dataclass
class Scaler:
    """One GradScaler variable: where it is made and every place it is used."""

    label: str  # "scaler" or "self.scaler"
    statement: cst.BaseSmallStatement  # the Assign / AnnAssign making it
    construction: cst.Call
    uses: list[ScalerUse] = field(default_factory=list)
    ambiguous: str = ""  # why the variable cannot be followed (another binding...)


def find_scalers(ctx: FileContext, parents: Parents) -> tuple[list[Scaler], list[cst.Call]]:
    """GradScaler variables bound by a plain assignment, with their uses; and the other
    GradScaler constructions (passed directly, conditional...) that cannot be followed."""
    scalers: list[Scaler] = []
    followed: set[int] = set()
    for node in parents.nodes:
        if not isinstance(node, (cst.Assign, cst.AnnAssign)):
            continue
        value = node.value
        if value is None or not is_grad_scaler_call(ctx, value):
            continue
        if isinstance(node, cst.Assign):
            if len(node.targets) != 1:
                continue
            target = node.targets[0].target
        else:
            target = node.target
        scaler = _follow(ctx, parents, node, target, value)
        if scaler is not None:
            scalers.append(scaler)
            followed.add(id(value))
    others = [
        n for n in parents.nodes
        if isinstance(n, cst.Call) and id(n) not in followed and is_grad_scaler_call(ctx, n)
    ]
    return scalers, others


def _follow(ctx: FileContext, parents: Parents, stmt, target, value) -> Optional[Scaler]:
    if isinstance(target, cst.Name):
        return _follow_name(parents, stmt, target.value, value)
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
        return _follow_attribute(parents, stmt, target, value)
    return None


def _follow_name(parents: Parents, stmt, name: str, value: cst.Call) -> Scaler:
    scope = parents.scope_of(stmt)
    scaler = Scaler(name, stmt, value)
    if isinstance(scope, cst.ClassDef):
        scaler.ambiguous = "it is a class attribute"
        return scaler
    # Nested functions that bind the name themselves are other variables.
    shadowing = [
        n for n in walk_scope(scope)
        if n is not scope and isinstance(n, (cst.FunctionDef, cst.Lambda)) and binds_locally(n, name)
    ]
    others = 0
    for node in walk_scope(scope.body if isinstance(scope, cst.FunctionDef) else scope, shadowing):
        if isinstance(node, cst.AssignTarget) and name in target_names(node.target) and node not in getattr(stmt, "targets", ()):
            others += 1
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)) and node is not stmt and name in target_names(node.target):
            others += 1
        elif isinstance(node, cst.Name) and node.value == name:
            use = _use_of(parents, node, stmt)
            if use is not None:
                scaler.uses.append(use)
    if others:
        scaler.ambiguous = f"`{name}` is also assigned elsewhere"
    return scaler


def _follow_attribute(parents: Parents, stmt, target: cst.Attribute, value: cst.Call) -> Optional[Scaler]:
    owner = target.value.value  # type: ignore[attr-defined]
    attr = target.attr.value
    method = parents.scope_of(stmt)
    if not isinstance(method, cst.FunctionDef):
        return None
    cls = parents.scope_of(method)
    if not isinstance(cls, cst.ClassDef):
        return None
    label = f"{owner}.{attr}"
    scaler = Scaler(label, stmt, value)
    others = 0
    for node in walk_scope(cls.body):
        if not (isinstance(node, cst.Attribute) and node.attr.value == attr and isinstance(node.value, cst.Name)):
            continue
        if node.value.value != _self_name(parents, node):
            continue
        p = parents.of(node)
        if node is target:
            continue
        if isinstance(p, cst.AssignTarget) or (isinstance(p, (cst.AugAssign, cst.AnnAssign)) and p.target is node):
            others += 1
            continue
        use = _use_of(parents, node, stmt)
        if use is not None:
            scaler.uses.append(use)
    if others:
        scaler.ambiguous = f"`{label}` is also assigned elsewhere"
    return scaler


def _self_name(parents: Parents, node: cst.CSTNode) -> Optional[str]:
    """The first parameter name of the method around ``node`` (``self`` by convention)."""
    for anc in parents.ancestors(node):
        if isinstance(anc, cst.FunctionDef):
            ps = [*anc.params.posonly_params, *anc.params.params]
            return ps[0].name.value if ps else None
    return None


def _use_of(parents: Parents, node: cst.CSTNode, stmt) -> Optional[ScalerUse]:
    p = parents.of(node)
    if p is None or p is stmt:
        return None
    if isinstance(p, cst.AssignTarget):
        return None  # a binding, counted by the caller
    if isinstance(p, cst.Attribute) and p.value is node:
        call = parents.of(p)
        if isinstance(call, cst.Call) and call.func is p:
            return ScalerUse(node, call, p.attr.value)
        return ScalerUse(node, None, p.attr.value)
    if isinstance(p, cst.Attribute) and p.attr is node:
        return None  # `obj.scaler` where `scaler` is only the attribute name
    if isinstance(p, cst.Arg) and p.keyword is node:
        return None  # `f(scaler=...)`: the keyword, not the variable
    if isinstance(p, cst.Param):
        return None
    return ScalerUse(node)


# --------------------------------------------------------------------------------------
# Unwinding a scaler's calls
# --------------------------------------------------------------------------------------
def unwind(parents: Parents, uses: Sequence[ScalerUse],
           step: Callable[[cst.BaseExpression], cst.BaseExpression]):
    """The edits that unwind `scaler.scale/step/update/unscale_` calls (`scaler.step(opt)`
    becomes ``step(opt)``), the small statements to remove, and the uses left (kept)."""
    edits: list[Edit] = []
    removed: list[cst.BaseSmallStatement] = []
    kept: list[ScalerUse] = []
    for use in uses:
        call, method = use.call, use.method
        if call is None or len(call.args) != len(positional(call)):
            kept.append(use)
            continue
        n = len(call.args)
        stmt = expression_statement(parents, call)
        if method == "scale" and n == 1:
            value = call.args[0].value
            receiver = parents.of(call)
            if isinstance(receiver, cst.Attribute) and receiver.value is call:
                value = parenthesized(value)
            if _self_assignment(parents, call, value):
                removed.append(parents.of(call))  # `loss = scaler.scale(loss)` goes
            else:
                edits.append(Edit(call, value))
        elif method == "step" and n == 1:
            edits.append(Edit(call, step(call.args[0].value)))
        elif method in ("update", "unscale_") and n <= 1 and stmt is not None:
            removed.append(stmt)
        else:
            kept.append(use)
    return edits, removed, kept


def _self_assignment(parents: Parents, call: cst.Call, value: cst.BaseExpression) -> bool:
    """``name = scaler.scale(name)``: unwound, it would read ``name = name``."""
    assign = parents.of(call)
    return (
        isinstance(assign, cst.Assign)
        and assign.value is call
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and isinstance(value, cst.Name)
        and assign.targets[0].target.value == value.value
    )
