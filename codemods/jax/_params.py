"""Code that walks a model's parameters one by one (rule JX205, and JX104 that leaves these
loops to it).

- **Averaging loops**: ``for s, p in zip(ema.parameters(), model.parameters()):`` whose body
  updates one of the pair in place from both (``s.mul_(d).add_(p, alpha=1 - d)``,
  ``s.data.copy_(d * s.data + (1 - d) * p.data)``, ``s.data = ...``, ``s.lerp_(p, w)``): an
  exponential moving average of the weights, a target network's soft update. The port
  computes the new value of every parameter at once over the two models' NNX states:
  ``nnx.update(ema, jax.tree.map(lambda s, p: ..., nnx.state(ema, nnx.Param), nnx.state(model,
  nnx.Param)))`` (``.buffers()`` pairs: ``nnx.BatchStat``).
- **Freezing loops** of a model that nothing optimizes (``for p in ema.parameters():
  p.requires_grad_(False)``): JAX differentiates only what ``nnx.value_and_grad`` is given.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.astutil import code
from porter.context import FileContext

from . import _ops_table as ops

# what a torch model method walks -> the NNX variable type of the same arrays
_WALKS = {"parameters": "Param", "buffers": "BatchStat"}


def _walked(call: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, str]]:
    """``model.parameters()`` -> (``model``, "Param"); ``m.buffers()`` -> (``m``, "BatchStat")."""
    if (isinstance(call, cst.Call) and not call.args and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in _WALKS):
        return call.func.value, _WALKS[call.func.attr.value]
    return None


class _Bare(cst.CSTTransformer):
    """``x.data`` / ``x.detach()`` -> ``x`` for the loop's own names: the arrays themselves."""

    def __init__(self, names: set[str]):
        self.names = names

    def leave_Attribute(self, original, updated):
        if updated.attr.value == "data" and isinstance(updated.value, cst.Name) and updated.value.value in self.names:
            return updated.value
        return updated

    def leave_Call(self, original, updated):
        f = updated.func
        if (isinstance(f, cst.Attribute) and f.attr.value == "detach" and not updated.args
                and isinstance(f.value, cst.Name) and f.value.value in self.names):
            return f.value
        return updated


def _chain(expr: cst.BaseExpression) -> tuple[Optional[str], list[cst.Call]]:
    """``s.mul_(d).add_(p)`` -> ("s", [mul_ call, add_ call]) (innermost first); (None, [])
    when ``expr`` is not a chain of in-place calls on a plain name."""
    calls: list[cst.Call] = []
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ops.INPLACE:
        calls.append(expr)
        expr = expr.func.value
    if isinstance(expr, cst.Name) and calls:
        return expr.value, calls[::-1]
    return None, []


def average_update(loop: cst.For, ctx: FileContext) -> Optional[tuple[str, set[str]]]:
    """For an averaging loop (see the module's docstring): (the statement that replaces it,
    modules it uses), else None."""
    it, target = loop.iter, loop.target
    if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "zip" and len(it.args) == 2
            and isinstance(target, cst.Tuple) and len(target.elements) == 2 and loop.orelse is None
            and all(isinstance(e.value, cst.Name) for e in target.elements)):
        return None
    walked = [_walked(a.value) for a in it.args]
    if any(w is None for w in walked) or walked[0][1] != walked[1][1] or any(a.star for a in it.args):  # type: ignore[index]
        return None
    names = [e.value.value for e in target.elements]  # type: ignore[attr-defined]
    if names[0] == names[1] or not isinstance(loop.body, cst.IndentedBlock):
        return None
    bare = _Bare(set(names))
    updated: Optional[str] = None
    value: Optional[cst.BaseExpression] = None
    used: set[str] = set()
    for stmt in loop.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        original = stmt.body[0]
        small = original.visit(bare)
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            written = original.targets[0].target  # type: ignore[attr-defined]
            if not (isinstance(written, cst.Attribute) and written.attr.value == "data"):
                return None  # `s = expr` rebinds the loop's name: the model is unchanged
            name = small.targets[0].target.value  # `s.data = expr` (bared): expr reads the value so far
            if name not in names or (updated is not None and name != updated):
                return None
            new = small.value if value is None else _substitute(small.value, name, value)
        elif isinstance(small, cst.Expr):
            chained, calls = _chain(small.value)
            if chained is None or chained not in names or (updated is not None and chained != updated):
                return None
            name, new = chained, value if value is not None else cst.Name(chained)
            for call in calls:  # innermost first, each on the value so far
                try:
                    text, more = ops.build(ops.INPLACE[call.func.attr.value], call, ctx, new)  # type: ignore[attr-defined]
                except (ops.Manual, ops.NotMine):
                    return None
                if not isinstance(text, str):
                    return None
                used |= set(more)
                new = astutil.parse_expression(ops.atom(astutil.parse_expression(text)))
        else:
            return None
        updated, value = name, new
    if updated is None or value is None:
        return None
    kind = walked[0][1]  # type: ignore[index]
    target_model = code(walked[names.index(updated)][0])  # type: ignore[index]
    nnx, jax = ctx.module_alias("flax.nnx"), ctx.module_alias("jax")
    states = ", ".join(f"{nnx}.state({code(w[0])}, {nnx}.{kind})" for w in walked)  # type: ignore[index]
    body = code(value.with_changes(lpar=[], rpar=[]))
    text = (f"{nnx}.update({target_model}, {jax}.tree.map(lambda {names[0]}, {names[1]}: {body}, "
            f"{states}))")
    return text, used | {"flax.nnx", "jax"}


def _substitute(expr: cst.BaseExpression, name: str, value: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` with the reads of ``name`` replaced by ``value`` (an earlier statement's result)."""
    wrapped = astutil.parse_expression(ops.atom(value))

    class Swap(cst.CSTTransformer):
        def leave_Name(self, original, updated):
            return wrapped if updated.value == name else updated

    return expr.visit(Swap())


def in_average_loop(ctx: FileContext) -> bool:
    """The node visited now is in the body of an averaging loop that JX205 rewrites whole."""
    loop = ctx.enclosing(cst.For)
    return isinstance(loop, cst.For) and any(a is loop.body for a in ctx.ancestors) and \
        average_update(loop, ctx) is not None


def freezing_loop(loop: cst.For, ctx: FileContext) -> Optional[str]:
    """``for p in m.parameters(): p.requires_grad_(False)`` (or ``p.requires_grad = False``) of a
    model ``m`` that no optimizer of the file is built over: ``m``'s code, else None."""
    walked = _walked(loop.iter)
    if walked is None or walked[1] != "Param" or not isinstance(loop.target, cst.Name) or loop.orelse is not None:
        return None
    if not isinstance(loop.body, cst.IndentedBlock):
        return None
    p = loop.target.value
    for stmt in loop.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        small = stmt.body[0]
        frozen = (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and code(small.value.func) == f"{p}.requires_grad_"
                  and [code(a.value) for a in small.value.args] == ["False"]) or (
            isinstance(small, cst.Assign) and len(small.targets) == 1 and code(small.targets[0].target) == f"{p}.requires_grad"
            and code(small.value) == "False")
        if not frozen:
            return None
    model = code(walked[0])
    last = model.rsplit(".", 1)[-1]
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Call) and ((ctx.qualname(n.func) or "") == "flax.nnx.Optimizer"
                                        or (ctx.qualname(n.func) or "").startswith("torch.optim.")):
            if any(isinstance(m, cst.Name) and m.value == last or isinstance(m, cst.Attribute) and m.attr.value == last
                   for a in n.args for m in astutil.walk(a.value)):
                return None
    return model
