from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

_MAP = {
    "torch.distributed.get_rank": "global_ordinal",
    "torch.distributed.distributed_c10d.get_rank": "global_ordinal",
    "torch.distributed.get_world_size": "world_size",
    "torch.distributed.distributed_c10d.get_world_size": "world_size",
    "torch.distributed.get_node_local_rank": "local_ordinal",
}


class XlaRank(Rule):
    """
    ## What it does
    Rewrites `dist.get_rank()` to `xr.global_ordinal()`, `dist.get_world_size()` to
    `xr.world_size()` and `dist.get_node_local_rank()` to `xr.local_ordinal()`
    (`import torch_xla.runtime as xr`). Calls with a `group` are reported.

    ## Why
    The PJRT runtime knows the rank and world size of every XLA process, with or without a
    process group; `dist.get_rank()` raises unless `init_process_group` ran first, and code
    that only needs the rank (logging, `if rank == 0:` saving, samplers) need not create
    one on TPU.

    ## Fix safety
    Safe. Under `torch_xla.launch` and the `xla://` process group (TX701, TX702) the
    default group's rank and size are the runtime's global ordinal and world size; without
    a process group the runtime answers (rank 0 of 1 in one process) where `dist` raised.
    For a sub-group the answer differs, so calls with a group are only reported. The `xr`
    functions start the XLA runtime: called in a parent process before `torch_xla.launch`
    they make it fail ("Runtime is already initialized"), where `dist.get_rank()` there
    raised anyway for lack of a process group.
    """

    code = "TX705"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-rank"
    target = "torch-xla"
    summary = "dist.get_rank() / get_world_size() -> xr.global_ordinal() / xr.world_size()"
    severity = Severity.WARNING
    needs_text = ("get_rank", "get_world_size", "get_node_local_rank")
    examples = [
        Example(
            """
            import torch.distributed as dist

            rank = dist.get_rank()
            sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=rank)
            """,
            """
            import torch_xla.runtime as xr

            rank = xr.global_ordinal()
            sampler = DistributedSampler(ds, num_replicas=xr.world_size(), rank=rank)
            """,
        ),
        Example(
            """
            import torch.distributed as dist

            r = dist.get_rank(group=sub_group)
            """,
            None,
            title="a sub-group is reported",
        ),
    ]
    valid = [
        "import torch_xla.runtime as xr\nr = xr.global_ordinal()\n",
        "get_rank()\n",
        "import torch\nr = comm.get_rank()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = self._target(node)
        if func is None:
            return
        if node.args:
            self.report(
                node,
                f"rank/world size of a process group: on XLA the runtime's xr.{func}() gives the default "
                "group's; check the group you pass",
            )
            return
        xr = self.ctx.module_alias("torch_xla.runtime")
        new = cst.parse_expression(f"{xr}.{func}()")
        self.report(
            node,
            f"use xr.{func}() (torch_xla.runtime) on XLA: the PJRT runtime knows each process's place",
            Fix((self.replace(node, new),), imports=("torch_xla.runtime",)),
        )

    def _target(self, node: cst.Call):
        return _MAP.get(self.ctx.qualname(node.func) or "")
