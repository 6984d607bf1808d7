from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import arg, method_name
from porter.rules import Example, Rule, Severity

from ._host_sync import imports_torch, mask_of

_NONZERO = (
    "a data-dependent shape: use torch.nonzero_static(x, size=N, fill_value=-1) with an upper "
    "bound N (it works on the XLA device), or avoid indices altogether with torch.where(cond, a, b) or a mask"
)
_ADVICE = {
    "nonzero": _NONZERO,
    "argwhere": _NONZERO,
    "where": _NONZERO.replace("use torch.nonzero_static", "use torch.where(cond, a, b) with three "
                              "arguments, or torch.nonzero_static"),
    "unique": "a data-dependent shape: keep a fixed-size result (one_hot(x, K).sum(0) or "
              "scatter_add_ into a tensor of K counts), or call it on the host after the loop",
    "unique_consecutive": "a data-dependent shape: keep a fixed-size result, or call it on the host after the loop",
    "masked_select": "a data-dependent shape: keep the full shape with torch.where(mask, x, fill) "
                     "(and reduce that), or torch.nonzero_static for indices",
    "bincount": "a data-dependent shape (its length is max(x) + 1): use "
                "one_hot(x, K).sum(0) or zeros(K).scatter_add_(0, x, ones) with a fixed K",
}
_METHODS = ("nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "bincount")
# a PackedSequence: its batch_sizes follow the lengths of the batch's sequences; an error, since the
# RNNs reject it on XLA (torch_xla replaces nn.GRU with its scan GRU, which asserts "PackedSequence
# is not supported"; the scan LSTM fails on its data)
_PACKED = "a PackedSequence"
_PACKING = ("torch.nn.utils.rnn.pack_padded_sequence", "torch.nn.utils.rnn.pack_sequence")
_ADVICE[_PACKED] = (
    "a data-dependent shape (its batch_sizes follow the lengths of each batch), and the RNNs reject it on XLA "
    "(torch_xla's nn.GRU asserts 'PackedSequence is not supported'; an LSTM fails on it): run the RNN on the "
    "padded batch of a fixed length and take each sequence's output at its own last step "
    "(out[torch.arange(B), lengths - 1]), or mask the padded steps")


class DynamicShapeOp(Rule):
    """
    ## What it does
    Reports the operations whose output shape depends on tensor values: `torch.nonzero(x)` /
    `x.nonzero()`, `torch.argwhere`, one-argument `torch.where(cond)`, `torch.unique` /
    `x.unique()`, `torch.unique_consecutive`, `torch.masked_select` (unless only summed or
    averaged: TX501 rewrites that) and `torch.bincount`, with the static alternative for
    each; and, as an error, the packing of a batch into a PackedSequence
    (`pack_padded_sequence`, `pack_sequence`), which XLA's RNNs reject.

    ## Why
    XLA compiles one graph per set of shapes. An op whose output size depends on the data
    cannot be compiled ahead: on torch_xla 2.9 (measured on the CPU backend) `torch.nonzero`
    runs as a CPU fallback (`aten::nonzero`) with a device-to-host transfer on every call,
    and everything downstream recompiles for each new size.
    `torch.nonzero_static(x, size=N, fill_value=-1)` works on the XLA device with one compile.

    ## Fix safety
    No automatic fix: the upper bound N (or the number of classes K) is a property of the
    data that porter cannot know, and the padded entries (`fill_value`) must be handled by the
    code that uses the result.
    """

    code = "TX502"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "dynamic-shape-op"
    target = "torch-xla"
    summary = "nonzero/unique/masked_select/where(cond)/bincount: data-dependent shapes, reported with static alternatives"
    severity = Severity.WARNING
    needs_text = _METHODS + ("where", "pack_")
    examples = [
        Example(
            """
            import torch

            def positives(x):
                idx = torch.nonzero(x > 0)
                rows, cols = torch.where(x > 0)
                return idx, rows, cols, x.unique()
            """,
            None,
        ),
    ]
    valid = [
        "import torch\ny = torch.where(x > 0, x, 0)\nidx = torch.nonzero_static(x, size=8, fill_value=-1)\n",
        "import torch\ns = torch.masked_select(x, m).sum()\nt = x.masked_select(x > 0).mean()\n",  # TX501
        "import numpy as np\nidx = np.nonzero(a)\nu = np.unique(a)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if (self.ctx.qualname(node.func) or "") in _PACKING:
            self.report(node, f"{_PACKED} has {_ADVICE[_PACKED]}", severity=Severity.ERROR)
            return
        op = self._op(node)
        if op is None or not imports_torch(self.ctx):
            return
        if op == "masked_select" and self._rewritten_by_tx501(node):
            return
        self.report(node, f"`{op}` has {_ADVICE[op]}")

    def _op(self, node: cst.Call) -> Optional[str]:
        q = self.ctx.qualname(node.func) or ""
        if q.startswith("torch."):
            name = q[len("torch."):]
            if name == "where":
                positional = [a for a in node.args if a.keyword is None]
                return "where" if len(positional) == 1 and arg(node, "other") is None else None
            return name if name in _METHODS else None
        if q:
            return None  # numpy, another library
        m = method_name(node)
        return m if m in _METHODS else None

    def _rewritten_by_tx501(self, node: cst.Call) -> bool:
        """``masked_select(x, m).sum()``, or ``.mean()`` with a mask built from ``x``."""
        stack = self.ctx.ancestors
        if len(stack) < 3:
            return False
        attr, call = stack[-2], stack[-3]
        if not (isinstance(attr, cst.Attribute) and isinstance(call, cst.Call) and call.func is attr and not call.args):
            return False
        if attr.attr.value == "sum":
            return True
        if attr.attr.value != "mean":
            return False
        if method_name(node) == "masked_select" and len(node.args) == 1:
            x, mask = node.func.value, node.args[0].value  # type: ignore[attr-defined]
        elif len(node.args) == 2:
            x, mask = node.args[0].value, node.args[1].value
        else:
            return False
        return mask_of(mask, x, self.ctx)
