from __future__ import annotations

import libcst as cst
from libcst.helpers import parse_template_expression

from porter.rules import Example, Fix, Rule, Safety, Severity

from ._host_sync import MaskNames, imports_torch, is_number_literal, mask_of, single_index


class MaskedAssignment(Rule):
    """
    ## What it does
    Rewrites writes through a boolean mask built from the tensor itself into static, in-place
    operations:

        x[x > 0] = 0.5            ->  x.masked_fill_(x > 0, 0.5)
        x[mask] = y[mask]         ->  x.copy_(torch.where(mask, y, x))   (mask built from x)

    Other masked writes (`x[mask] = v` with an unrelated mask, a tensor value, `x[mask] += v`)
    are reported with the same advice.

    ## Why
    On torch_xla 2.9 (measured on the CPU backend) `x[x > 0] = 0.5` is an `index_put_` that
    runs `aten::nonzero` as a CPU fallback: a device-to-host transfer at every call and a new
    compilation for every new count of `True`s (5 compilations in 4 steps). `masked_fill_`
    compiled once, with no transfer and no fallback.

    ## Fix safety
    `masked_fill_` is safe: it writes the same number into the same elements of the same
    tensor, in place, so views of `x` see the change as before; the mask is built from `x`
    and so has its shape. The `copy_(torch.where(...))` form is unsafe: the values are the
    same, but `y` is read in full (not only where the mask is true), and with autograd the
    in-place copy records a different operation.
    """

    code = "TX503"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "masked-assignment"
    target = "torch-xla"
    summary = "x[mask] = v -> x.masked_fill_(mask, v) / x.copy_(torch.where(mask, y, x))"
    severity = Severity.WARNING
    needs_text = ("] =", "] +=", "] -=", "] *=")
    examples = [
        Example(
            """
            import torch

            def clamp_scores(scores):
                scores[scores < 0] = 0
                scores[torch.isnan(scores)] = -float('inf')
                return scores
            """,
            """
            import torch

            def clamp_scores(scores):
                scores.masked_fill_(scores < 0, 0)
                scores.masked_fill_(torch.isnan(scores), -float('inf'))
                return scores
            """,
        ),
        Example(
            """
            import torch

            def merge(x, y):
                x[x > 1] = y[x > 1]
                return x
            """,
            """
            import torch

            def merge(x, y):
                x.copy_(torch.where(x > 1, y, x))
                return x
            """,
            unsafe=True,
        ),
        Example(
            """
            import torch

            def pad_out(tokens, pad_mask, fill):
                tokens[pad_mask] = fill
                tokens[tokens > 5] += 1
            """,
            None,
            title="a mask of unknown shape, a value of unknown type, an in-place update",
        ),
    ]
    valid = [
        "import torch\nx[0] = 1\nx[:, idx] = y\nx.masked_fill_(x > 0, 0)\n",
        "d = {}\nd[a > b] = 1\n",  # no torch import
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.masks = MaskNames(ctx)
        self.enabled = imports_torch(ctx)

    def _masked(self, target: cst.CSTNode):
        if not (self.enabled and isinstance(target, cst.Subscript)):
            return None
        mask = single_index(target)
        if mask is None or not self.masks.is_mask(mask):
            return None
        return target.value, mask

    def visit_Assign(self, node: cst.Assign) -> None:
        if self.enabled:
            self.masks.record(node)
        if len(node.targets) != 1:
            return
        found = self._masked(node.targets[0].target)
        if found is None:
            return
        x, mask = found
        message = "`x[mask] = v` runs nonzero on XLA (a transfer and a compilation per new count)"
        if mask_of(mask, x, self.ctx):
            torch = cst.parse_expression(self.ctx.module_alias("torch"))
            if is_number_literal(node.value, self.ctx):
                new = parse_template_expression("{x}.masked_fill_({mask}, {v})", x=x, mask=mask, v=node.value)
                self.report(node, f"{message}: use x.masked_fill_(mask, v)", Fix((self.replace(node, cst.Expr(new)),)))
                return
            value = node.value
            if isinstance(value, cst.Subscript) and single_index(value) is not None and single_index(value).deep_equals(mask):
                new = parse_template_expression("{x}.copy_({torch}.where({mask}, {y}, {x}))", x=x, mask=mask, y=value.value, torch=torch)
                self.report(node, f"{message}: use x.copy_(torch.where(mask, y, x))",
                            Fix((self.replace(node, cst.Expr(new)),), Safety.UNSAFE))
                return
        self.report(node, f"{message}: with a mask of x's shape use x.masked_fill_(mask, number) or "
                          "x.copy_(torch.where(mask, values_like_x, x))")

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.masks.leave_function(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if self._masked(node.target) is not None:
            self.report(node, "`x[mask] op= v` runs nonzero on XLA (a transfer and a compilation per new count): "
                              "update the full tensor, e.g. x += torch.where(mask, v, 0)")
