from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._amp_dist import quote_like

_BARRIER = ("torch.distributed.barrier", "torch.distributed.distributed_c10d.barrier")


class XlaRendezvous(Rule):
    """
    ## What it does
    Rewrites `dist.barrier()` to `xm.rendezvous('<tag>')`. The tag names the place: the
    enclosing function (`'main_worker'`), numbered when a function has several barriers
    (`'main_worker_2'`), or `'module'` at module level, so every process passes the same
    tag at the same barrier. A barrier with a group, `device_ids` or `async_op` is
    reported.

    ## Why
    `xm.rendezvous` is PyTorch/XLA's barrier: it first flushes the pending graph
    (`torch_xla.sync()`) and then meets every replica through an XLA collective, so a
    barrier does not leave device work queued behind it; it needs no process group. The tag
    shows up in logs and in the error when replicas disagree.

    ## Fix safety
    Safe: both block until every process of the job arrives; `xm.rendezvous` additionally
    executes the device work traced so far, which a barrier is meant to order anyway.
    """

    code = "TX706"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-rendezvous"
    target = "torch-xla"
    summary = "dist.barrier() -> xm.rendezvous('<function>')"
    severity = Severity.WARNING
    needs_text = ("barrier",)
    examples = [
        Example(
            """
            import torch.distributed as dist

            def prepare(rank):
                if rank == 0:
                    download()
                dist.barrier()
                load()
                dist.barrier()

            dist.barrier()
            """,
            """
            import torch_xla.core.xla_model as xm

            def prepare(rank):
                if rank == 0:
                    download()
                xm.rendezvous('prepare')
                load()
                xm.rendezvous('prepare_2')

            xm.rendezvous('module')
            """,
        ),
        Example(
            """
            import torch.distributed as dist

            dist.barrier(group=pg)
            """,
            None,
            title="a sub-group barrier is reported",
        ),
    ]
    valid = [
        "import torch_xla.core.xla_model as xm\nxm.rendezvous('x')\n",
        "import threading\nb = threading.Barrier(2)\nb.wait()\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.counts: dict[str, int] = {}

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _BARRIER:
            return
        if node.args:
            self.report(
                node,
                "dist.barrier with arguments: on XLA, xm.rendezvous(tag) waits for every replica (no sub-groups)",
            )
            return
        where = "module"
        for anc in reversed(self.ctx.ancestors[:-1]):
            if isinstance(anc, cst.FunctionDef):
                where = anc.name.value
                break
        n = self.counts[where] = self.counts.get(where, 0) + 1
        tag = where if n == 1 else f"{where}_{n}"
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        new = cst.parse_expression(f"{xm}.rendezvous(_)").with_changes(args=[cst.Arg(quote_like(None, tag))])
        self.report(
            node,
            f"dist.barrier() on XLA: use xm.rendezvous({tag!r}), which also flushes pending device work",
            Fix((self.replace(node, new),), imports=("torch_xla.core.xla_model",)),
        )
