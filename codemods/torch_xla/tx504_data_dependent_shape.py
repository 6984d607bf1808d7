from __future__ import annotations

import libcst as cst

from porter.astutil import method_name
from porter.rules import Example, Rule, Severity

from ._host_sync import data_dependent, imports_torch

_FACTORIES = tuple(f"torch.{f}" for f in (
    "arange", "range", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
    "linspace", "logspace", "eye", "tril_indices", "triu_indices",
))
_SHAPE_METHODS = (
    "view", "reshape", "expand", "repeat", "tile", "new_zeros", "new_ones", "new_empty", "new_full",
    "narrow", "split", "unflatten", "resize_",
)
_NOT_SIZES = ("dtype", "device", "requires_grad", "generator", "layout", "out", "pin_memory", "memory_format", "dim", "fill_value")


class DataDependentShape(Rule):
    """
    ## What it does
    Reports shapes computed from tensor values: a size argument of a factory
    (`torch.arange(n.item())`, `torch.zeros(lengths.max(), d)`), of a shape method
    (`x.view(-1, lengths.max())`, `x.new_zeros(mask.sum())`), or a slice bound
    (`x[:, :lengths.max()]`) that holds `.item()`, `.tolist()` or a data reduction
    (`.max()`, `.sum()`, `.argmax()`, ...). It checks the whole file, not only the training
    loop: a model's `forward` runs in the step too.

    ## Why
    The value must be copied to the host before the shape is known (a graph execution and a
    transfer), and every new value is a new shape: a new XLA compilation. Static
    alternatives: pad to a fixed maximum (`max_len` from the data set or config) and carry a
    mask; bucket lengths to a few sizes; or compute the size on the host before the step
    (e.g. in the data loader).

    ## Fix safety
    No automatic fix: the fixed size to pad to is a property of the data.
    """

    code = "TX504"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "data-dependent-shape"
    target = "torch-xla"
    summary = "shapes from tensor values (arange(n.item()), view(-1, lengths.max()), x[:, :l.max()]): reported"
    severity = Severity.WARNING
    needs_text = ("torch",)
    examples = [
        Example(
            """
            import torch

            def pad(seqs, lengths):
                positions = torch.arange(lengths.max().item())
                out = seqs.view(len(lengths), lengths.max())
                return positions, out[:, :lengths.max()]
            """,
            None,
        ),
    ]
    valid = [
        "import torch\ny = x.view(-1, x.size(1))\nz = torch.zeros(x.shape[0], 4, dtype=x.dtype)\nw = x[:, : x.size(1) // 2]\n",
        "import torch\ns = x.sum(dim=1)\nm = x.max(dim=0)\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.enabled = imports_torch(ctx)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.enabled:
            return
        shaped = (self.ctx.qualname(node.func) or "") in _FACTORIES or (
            method_name(node) in _SHAPE_METHODS and not self.ctx.qualname(node.func)
        )
        if not shaped:
            return
        for a in node.args:
            if a.keyword is not None and a.keyword.value in _NOT_SIZES:
                continue
            culprit = data_dependent(a.value)
            if culprit is not None:
                self._report(culprit)
                return

    def visit_Slice(self, node: cst.Slice) -> None:
        if not self.enabled:
            return
        for bound in (node.lower, node.upper):
            culprit = data_dependent(bound) if bound is not None else None
            if culprit is not None:
                self._report(culprit)
                return

    def _report(self, culprit: cst.Call) -> None:
        self.report(
            culprit,
            f"a shape from tensor values (`.{method_name(culprit)}()`): a host transfer, and a new "
            "XLA compilation for every new value; pad to a fixed size (and carry a mask) or bucket the sizes",
        )
