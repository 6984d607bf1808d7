import libcst as cst

from porter import astutil
from porter.rules import Example, Rule, Severity

from . import _training as tr


class SamplerSetEpoch(Rule):
    """
    ## What it does
    Reports a shuffling `DistributedSampler` in a file that never calls `.set_epoch(...)`.

    ## Why
    A `DistributedSampler` draws its permutation from `seed + epoch`, and the epoch only
    changes through `sampler.set_epoch(epoch)`: without the call every epoch visits the
    samples in the same order, unlike a `shuffle=True` DataLoader. Where the call goes (the
    start of each epoch, before iterating the loader, also through `pl.MpDeviceLoader`:
    `loader.sampler.set_epoch(epoch)`) is the user's decision, so there is no automatic fix.
    """

    code = "TX305"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-sampler-set-epoch"
    target = "torch-xla"
    summary = "shuffling DistributedSampler and no set_epoch() call: every epoch has the same order"
    severity = Severity.INFO
    needs_text = ("DistributedSampler",)
    examples = [
        Example(
            """
            import torch
            from torch.utils.data.distributed import DistributedSampler

            sampler = DistributedSampler(ds, num_replicas=n, rank=r)
            loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler)
            for epoch in range(10):
                train(loader)
            """,
            None,
        ),
    ]
    valid = [
        """
        import torch
        from torch.utils.data.distributed import DistributedSampler
        sampler = DistributedSampler(ds, num_replicas=n, rank=r)
        loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler)
        for epoch in range(10):
            loader.sampler.set_epoch(epoch)
            train(loader)
        """,
        """
        import torch
        from torch.utils.data.distributed import DistributedSampler
        sampler = DistributedSampler(ds, num_replicas=n, rank=r, shuffle=False)
        """,
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in tr.DISTRIBUTED_SAMPLER_NAMES:
            return
        shuffle = astutil.arg(node, "shuffle", 3)
        if shuffle is not None and tr.is_false(shuffle.value):
            return
        if tr.index(self.ctx).set_epoch_called:
            return
        self.report(
            node,
            "this DistributedSampler shuffles, but the file never calls set_epoch: every epoch "
            "then visits the samples in the same order; call sampler.set_epoch(epoch) at the "
            "start of each epoch",
        )
