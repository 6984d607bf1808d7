from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._amp_dist import has_star, keyword, with_args

_DDP = ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel")
# DistributedDataParallel(module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True, ...)
_POSITIONS = (
    "module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync", "process_group",
    "bucket_cap_mb", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view", "static_graph",
)
_DROPPED = {"device_ids", "output_device"}


class XlaDDP(Rule):
    """
    ## What it does
    Rewrites `DistributedDataParallel(model, device_ids=[gpu], output_device=gpu)` to
    `DistributedDataParallel(model, gradient_as_bucket_view=True)`: the CUDA device arguments
    go, `gradient_as_bucket_view=True` is added unless the call sets it. Positional
    arguments after the dropped ones become keywords.

    ## Why
    `device_ids` / `output_device` name CUDA devices; a module on an XLA device is
    replicated by the process layout (one process per device, TX702), not by device ids.
    PyTorch/XLA's DDP guide uses `gradient_as_bucket_view=True`: gradients are views into
    the all-reduce buckets instead of copies, which saves a copy of every gradient per step
    in the traced graph and memory on the device.

    ## Fix safety
    Safe. The device arguments have no meaning for an XLA module, and
    `gradient_as_bucket_view=True` changes where gradients are stored, not their values.
    (With it, `p.grad` is a view into a bucket: code that replaces `p.grad` by another
    tensor or calls `p.grad.detach_()` must not do so; `zero_grad()` is fine.)
    """

    code = "TX703"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-ddp"
    target = "torch-xla"
    summary = "DDP(model, device_ids=[gpu]) -> DDP(model, gradient_as_bucket_view=True)"
    severity = Severity.ERROR
    needs_text = ("DistributedDataParallel",)
    examples = [
        Example(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[gpu], output_device=gpu)
            """,
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, gradient_as_bucket_view=True)
            """,
        ),
        Example(
            """
            import torch

            net = torch.nn.parallel.DistributedDataParallel(net, [rank], rank, 0, False, find_unused_parameters=True)
            """,
            """
            import torch

            net = torch.nn.parallel.DistributedDataParallel(net, dim=0, broadcast_buffers=False, find_unused_parameters=True, gradient_as_bucket_view=True)
            """,
            title="positional arguments after device_ids become keywords",
        ),
        Example(
            """
            import torch.nn as nn

            model = nn.parallel.DistributedDataParallel(model)
            """,
            """
            import torch.nn as nn

            model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
            """,
        ),
    ]
    valid = [
        "from torch.nn.parallel import DistributedDataParallel as DDP\nDDP(m, gradient_as_bucket_view=True)\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\nDDP(m, gradient_as_bucket_view=False)\n",
        "from torch.nn import DataParallel\nDataParallel(m)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _DDP:
            return
        if has_star(node) or not node.args:
            return
        args: list[cst.Arg] = []
        names: set[str] = set()
        for i, a in enumerate(node.args):
            if a.keyword is not None:
                name = a.keyword.value
            elif i < len(_POSITIONS):
                name = _POSITIONS[i]
            else:
                return
            names.add(name)
            if name in _DROPPED:
                continue
            if a.keyword is None and i > 0 and names & _DROPPED:
                a = keyword(name, a.value)
            args.append(a)
        dropped = names & _DROPPED
        if not dropped and "gradient_as_bucket_view" in names:
            return
        if "gradient_as_bucket_view" not in names:
            args.append(keyword("gradient_as_bucket_view", cst.Name("True")))
        new = with_args(node, args)
        what = " and ".join(sorted(dropped))
        message = (
            f"DistributedDataParallel on XLA: drop the CUDA {what}" if dropped else "DistributedDataParallel on XLA"
        ) + "; use gradient_as_bucket_view=True"
        self.report(node, message, Fix((self.replace(node, new),)))
