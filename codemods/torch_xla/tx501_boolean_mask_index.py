from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.helpers import parse_template_expression

from porter.astutil import method_name
from porter.rules import Example, Fix, Rule, Safety, Severity

from ._host_sync import MaskNames, imports_torch, mask_of, single_index


class BooleanMaskIndex(Rule):
    """
    ## What it does
    Reports reads through a boolean mask, `x[mask]` (the mask a comparison, a predicate such
    as `torch.isfinite(x)`, or a variable bound to one), whose result has as many elements as
    the mask has `True`s. When the selection is only summed or averaged, it offers a rewrite
    that keeps every shape static:

        x[x > 0].sum()                  ->  torch.where(x > 0, x, 0).sum()
        x[mask].mean()  (mask from x)   ->  (torch.where(mask, x, 0).sum() / mask.sum())
        torch.masked_select(x, m).sum() ->  torch.where(m, x, 0).sum()

    The rewrite is offered only when the mask is built from `x` itself (`x > 0`,
    `~torch.isnan(x)`, `(x > a) & (x < b)`), so it has `x`'s shape; `masked_select`
    broadcasts `x` and the mask like `torch.where` does, so `.sum()` of it is rewritten for any
    mask (`.mean()` only for a mask built from `x`). Other reads are reported with the advice
    to keep the full shape (`torch.where(mask, x, fill)`, `x * mask`), or to use
    `torch.nonzero_static(mask, size=N, fill_value=-1)` when indices are really needed.

    ## Why
    The shape of `x[mask]` depends on the data. On XLA (torch_xla 2.9, measured on the CPU
    backend) `x[x > 0].sum()` runs `aten::nonzero` as a CPU fallback: a device-to-host
    transfer every call and a new compilation for every new count of selected elements
    (3 compilations and 4 transfers in 4 steps); `torch.where(x > 0, x, 0).sum()` compiled
    once, with no transfer.

    ## Fix safety
    Unsafe: the same elements are summed, but in a different order and with zeros in
    between, so a float result can differ in its last bits (measured: 3e-5 on a sum of 1000
    values near 400). The mean divides by `mask.sum()` and is NaN for an empty mask, like
    the original.
    """

    code = "TX501"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "boolean-mask-index"
    target = "torch-xla"
    summary = "x[mask] has a data-dependent shape; masked sums/means -> torch.where(mask, x, 0)"
    severity = Severity.WARNING
    needs_text = ("[", "masked_select")
    examples = [
        Example(
            """
            import torch

            def positive_sum(x):
                return x[x > 0].sum()
            """,
            """
            import torch

            def positive_sum(x):
                return torch.where(x > 0, x, 0).sum()
            """,
            unsafe=True,
        ),
        Example(
            """
            import torch

            def masked_loss(loss, valid):
                return torch.masked_select(loss, valid).sum() + loss[~torch.isnan(loss)].mean() * 2
            """,
            """
            import torch

            def masked_loss(loss, valid):
                return torch.where(valid, loss, 0).sum() + (torch.where(~torch.isnan(loss), loss, 0).sum() / (~torch.isnan(loss)).sum()) * 2
            """,
            unsafe=True,
        ),
        Example(
            """
            import torch

            def select(scores, labels):
                keep = scores > 0.5
                return scores[keep], labels[keep]
            """,
            None,
            title="selections whose size is used: reported only",
        ),
    ]
    valid = [
        "import torch\ny = x[idx]\nz = x[:, 0]\nw = x[x.size(0) - 1]\n",
        "import torch\ny = torch.where(x > 0, x, 0).sum()\n",
        "d = {}\nv = d[a > b]\n",  # no torch import
        "import torch\nx[x > 0] = 0\n",  # an assignment: TX503
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.masks = MaskNames(ctx)
        self.enabled = imports_torch(ctx)

    def visit_Assign(self, node: cst.Assign) -> None:
        if self.enabled:
            self.masks.record(node)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.masks.leave_function(node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self.enabled:
            return
        mask = single_index(node)
        if mask is None or not self.masks.is_mask(mask):
            return
        parent = self.ctx.parent
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return  # writes through a mask: TX503
        x = node.value
        reduced = self._reduction()
        message = (
            "`x[mask]` has a data-dependent shape (nonzero on the host, a transfer and a "
            "compilation per new count on XLA)"
        )
        if reduced is not None and mask_of(mask, x, self.ctx):
            call = reduced[1]
            self.report(node, f"{message}: reduce over the full shape with torch.where",
                        Fix((self.replace(call, self._where(reduced[0], x, mask, call)),), Safety.UNSAFE))
            return
        self.report(node, f"{message}: keep the full shape (torch.where(mask, x, fill), x * mask) "
                          "or use torch.nonzero_static(mask, size=N, fill_value=-1)")

    def visit_Call(self, node: cst.Call) -> None:
        if not self.enabled or method_name(node) not in ("sum", "mean") or node.args:
            return
        inner = node.func.value  # type: ignore[attr-defined]
        if not isinstance(inner, cst.Call):
            return
        operands = self._masked_select(inner)
        if operands is None:
            return
        x, mask = operands
        kind = method_name(node)
        if kind == "mean" and not mask_of(mask, x, self.ctx):
            return  # reported by TX502 (the mean's divisor would need the broadcast count)
        self.report(inner, "masked_select has a data-dependent shape: reduce over the full shape with torch.where",
                    Fix((self.replace(node, self._where(kind, x, mask, node)),), Safety.UNSAFE))

    def _masked_select(self, call: cst.Call):
        if self.ctx.qualname(call.func) == "torch.masked_select" and len(call.args) == 2 and all(a.keyword is None for a in call.args):
            return call.args[0].value, call.args[1].value
        if method_name(call) == "masked_select" and len(call.args) == 1 and call.args[0].keyword is None:
            return call.func.value, call.args[0].value  # type: ignore[attr-defined]
        return None

    def _reduction(self) -> Optional[tuple[str, cst.Call]]:
        """``x[mask].sum()`` / ``.mean()`` around the current subscript: (kind, call)."""
        stack = self.ctx.ancestors
        if len(stack) < 3:
            return None
        attr, call = stack[-2], stack[-3]
        if isinstance(attr, cst.Attribute) and attr.value is stack[-1] and isinstance(call, cst.Call) and call.func is attr:
            if attr.attr.value in ("sum", "mean") and not call.args:
                return attr.attr.value, call
        return None

    def _where(self, kind: str, x: cst.BaseExpression, mask: cst.BaseExpression, original: cst.Call) -> cst.BaseExpression:
        torch = self.ctx.module_alias("torch")
        parts = {"torch": cst.parse_expression(torch), "x": _bare(x), "mask": _bare(mask)}
        if kind == "sum":
            new = parse_template_expression("{torch}.where({mask}, {x}, 0).sum()", **parts)
        else:
            counted = parts["mask"]
            if not isinstance(counted, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                counted = counted.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            new = parse_template_expression("({torch}.where({mask}, {x}, 0).sum() / {counted}.sum())", counted=counted, **parts)
        return new.with_changes(lpar=original.lpar, rpar=original.rpar) if original.lpar else new


def _bare(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` without its own parentheses (the template supplies what it needs)."""
    if getattr(expr, "lpar", None):
        return expr.with_changes(lpar=[], rpar=[])
    return expr
