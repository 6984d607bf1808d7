"""What the port's device-availability tests answer, and the folding of the conditions that
hold them (shared by the device-placement rules).

In the port the accelerator is the XLA device, and importing torch_xla always selects one
(TPU, NEURON or, failing those, CPU), so "is CUDA there" is True, "is MPS there" is False, and a
process owns one device (``torch.cuda.device_count()`` compared with a literal reads as 1). A
condition made of those calls, ``not``/``and``/``or`` and the user's own flags folds to a
constant or to the user's flags alone: ``not args.no_cuda and torch.cuda.is_available()`` ->
``not args.no_cuda``; ``args.cuda and not torch.cuda.is_available()`` -> False.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst

from porter.context import FileContext

from ._devices import bindings
from ._tables import cuda_qualname, side_effect_free

# availability call -> its answer in the port
ANSWERS = {
    "torch.cuda.is_available": True,
    "torch.accelerator.is_available": True,
    "torch.backends.mps.is_available": False,
    "torch.backends.mps.is_built": False,
}
DEVICE_COUNT = "torch.cuda.device_count"
PORT_DEVICE_COUNT = 1  # one XLA device per process (PJRT; torch_xla.launch starts the processes)

_COMPARE = {
    cst.GreaterThan: operator.gt, cst.GreaterThanEqual: operator.ge, cst.LessThan: operator.lt,
    cst.LessThanEqual: operator.le, cst.Equal: operator.eq, cst.NotEqual: operator.ne,
}


def answer(node: cst.CSTNode, ctx: FileContext) -> Optional[bool]:
    """The port's answer of an availability call without arguments, else None."""
    if isinstance(node, cst.Call) and not node.args:
        return ANSWERS.get(cuda_qualname(node.func, ctx) or "")
    return None


def is_count(node: cst.CSTNode, ctx: FileContext) -> bool:
    return isinstance(node, cst.Call) and not node.args and cuda_qualname(node.func, ctx) == DEVICE_COUNT


Folded = Union[bool, cst.BaseExpression, None]
"""A folded condition: a constant, the simplified expression, or None (nothing to fold)."""


@dataclass(frozen=True)
class _Fold:
    value: Optional[bool]  # the constant the condition has in the port, if any
    expr: cst.BaseExpression  # the simplified condition (meaningful when value is None)
    changed: bool


def _int(node: cst.CSTNode) -> Optional[int]:
    if isinstance(node, cst.Integer) and not node.lpar:
        return int(node.value)
    return None


def flag_answer(node: cst.CSTNode, ctx: FileContext) -> Optional[bool]:
    """A plain name every binding of which in the file is a condition that folds to the same
    constant (``use_mps = not args.no_mps and torch.backends.mps.is_available()``: False)."""
    if not isinstance(node, cst.Name):
        return None
    values = bindings(ctx, node.value, scoped=True)
    if not values or any(v is None for v in values):
        return None
    answers = {_fold(v, ctx, names=False).value for v in values if v is not None}
    return answers.pop() if len(answers) == 1 and None not in answers else None


def _fold(node: cst.BaseExpression, ctx: FileContext, names: bool = True) -> _Fold:
    value = answer(node, ctx)
    if value is None and names:
        value = flag_answer(node, ctx)
    if value is not None:
        return _Fold(value, node, True)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _fold(node.expression, ctx, names)
        if inner.value is not None:
            return _Fold(not inner.value, node, True)
        if inner.changed:
            return _Fold(None, node.with_changes(expression=_keep_parens(node.expression, inner.expr)), True)
        return _Fold(None, node, False)
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        comp = node.comparisons[0]
        op = _COMPARE.get(type(comp.operator))
        if op is not None:
            if is_count(node.left, ctx) and _int(comp.comparator) is not None:
                return _Fold(op(PORT_DEVICE_COUNT, _int(comp.comparator)), node, True)
            if is_count(comp.comparator, ctx) and _int(node.left) is not None:
                return _Fold(op(_int(node.left), PORT_DEVICE_COUNT), node, True)
        return _Fold(None, node, False)
    if isinstance(node, cst.BooleanOperation):
        left, right = _fold(node.left, ctx, names), _fold(node.right, ctx, names)
        if not (left.changed or right.changed):
            return _Fold(None, node, False)
        is_and = isinstance(node.operator, cst.And)
        absorbing = not is_and  # False absorbs an `and`, True an `or`
        if left.value is not None:
            if left.value is absorbing:
                return _Fold(absorbing, node, True)  # short-circuits: the right side never ran
            return _Fold(right.value, _with_parens(node, right.expr), True)
        if right.value is not None:
            if right.value is absorbing:
                if side_effect_free(node.left, ctx):
                    return _Fold(absorbing, node, True)
                return _Fold(None, node, False)  # the left side must still run: left for a person
            return _Fold(None, _with_parens(node, left.expr), True)
        return _Fold(None, node.with_changes(left=left.expr, right=right.expr), True)
    return _Fold(None, node, False)


def fold(node: cst.BaseExpression, ctx: FileContext) -> Folded:
    """``node`` with the port's availability answers put in and simplified: True/False when it
    becomes a constant, the simplified expression, or None when there is nothing to fold."""
    result = _fold(node, ctx)
    if not result.changed:
        return None
    return result.value if result.value is not None else result.expr


def foldable(node: cst.CSTNode, ctx: FileContext) -> bool:
    """``node`` (an availability call, or a count compared with a literal) is part of a
    condition :func:`fold` reads."""
    if answer(node, ctx) is not None or flag_answer(node, ctx) is not None:
        return True
    return isinstance(node, cst.Comparison) and fold(node, ctx) is not None


def condition_top(ctx: FileContext, index: int = -1) -> int:
    """The ancestor index of the outermost not/and/or/comparison holding the current node."""
    anc = ctx.ancestors
    at = len(anc) + index if index < 0 else index
    while at > 0:
        parent = anc[at - 1]
        if isinstance(parent, cst.BooleanOperation) or (
                isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)):
            at -= 1
        elif isinstance(parent, (cst.Comparison, cst.ComparisonTarget)):
            at -= 1
        else:
            break
    return at


def _with_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``new`` standing where the boolean operation ``old`` stood: its parentheses kept when
    ``new`` is not an atom."""
    if old.lpar and not new.lpar and not isinstance(new, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    return new


def _keep_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(new, cst.BooleanOperation) and not new.lpar:
        return new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return new
