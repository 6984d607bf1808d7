import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from . import _training as tr


class DistributedSampler(tr.LoaderUsage, Rule):
    """
    ## What it does
    In a multi-process script (it calls `torch_xla.launch`, `xmp.spawn`, `mp.spawn`,
    `dist.init_process_group` or wraps a model in `DistributedDataParallel`), gives a
    training DataLoader that has no sampler a
    `DistributedSampler(dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=...)`,
    with the loader's own `shuffle` moved into the sampler (DataLoader rejects both).

    A `DistributedSampler(...)` that names neither `num_replicas` nor `rank`, in a script
    that never calls `dist.init_process_group`, gets `num_replicas=xr.world_size(),
    rank=xr.global_ordinal()`: its defaults ask `torch.distributed`, which has no process
    group there. Samplers given `num_replicas=`/`rank=` from `torch.distributed` calls are
    left to the distributed rules, which map those calls.

    Reported without a fix: a dataset given as an expression that would be evaluated twice
    (bind it to a name first), `shuffle` passed positionally or through `**kwargs`.

    ## Why
    `pl.MpDeviceLoader` does not shard data: without a distributed sampler every replica
    trains on the whole dataset, in the same order when the seeds agree, so N replicas do
    the work of one and each epoch counts N times.

    ## Fix safety
    Unsafe for the added sampler: each replica then sees `1/world_size` of the data per
    epoch, and a shuffling `DistributedSampler` draws its order from its own seed and the
    epoch given by `sampler.set_epoch(epoch)` (TX305 reports a missing call), not from
    torch's global generator, so the order differs from the original even on one replica.
    Safe for `num_replicas=`/`rank=` on an existing sampler: they are the values its
    defaults meant.
    """

    code = "TX304"
    name = "xla-distributed-sampler"
    target = "torch-xla"
    summary = "multi-process training DataLoader without a DistributedSampler: every replica sees all the data"
    severity = Severity.WARNING
    needs_text = ("DataLoader", "DistributedSampler")
    examples = [
        Example(
            """
            import torch
            import torch_xla

            def _mp_fn(index):
                train_loader = torch.utils.data.DataLoader(train_set, batch_size=32, shuffle=True)
                for x, y in train_loader:
                    model(x, y).backward()

            torch_xla.launch(_mp_fn)
            """,
            """
            import torch
            import torch_xla
            import torch.utils.data.distributed
            import torch_xla.runtime as xr

            def _mp_fn(index):
                train_loader = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=True))
                for x, y in train_loader:
                    model(x, y).backward()

            torch_xla.launch(_mp_fn)
            """,
            unsafe=True,
            title="a shuffling training loader in a launched script",
        ),
        Example(
            """
            import torch
            import torch.multiprocessing as mp
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler

            def worker(rank):
                sampler = DistributedSampler(train_set)
                loader = DataLoader(train_set, batch_size=32, sampler=sampler)

            mp.spawn(worker, nprocs=8)
            """,
            """
            import torch
            import torch.multiprocessing as mp
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            import torch_xla.runtime as xr

            def worker(rank):
                sampler = DistributedSampler(train_set, num_replicas=xr.world_size(), rank=xr.global_ordinal())
                loader = DataLoader(train_set, batch_size=32, sampler=sampler)

            mp.spawn(worker, nprocs=8)
            """,
            title="a sampler relying on a process group that is never created",
        ),
        Example(
            """
            import torch
            import torch_xla

            def _mp_fn(index):
                loader = torch.utils.data.DataLoader(make_dataset(), batch_size=8, shuffle=True)

            torch_xla.launch(_mp_fn)
            """,
            None,
            title="a dataset expression: reported",
        ),
    ]
    valid = [
        # single process
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)\n",
        # the sampler's values come from torch.distributed: the distributed rules map them
        """
        import torch
        import torch.distributed as dist
        from torch.utils.data.distributed import DistributedSampler
        dist.init_process_group("nccl")
        sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())
        loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler)
        """,
        # an evaluation loader
        """
        import torch
        import torch_xla
        def _mp_fn(i):
            loader = torch.utils.data.DataLoader(ds, batch_size=8)
            with torch.no_grad():
                for x in loader:
                    model(x)
        torch_xla.launch(_mp_fn)
        """,
    ]

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        if self.ctx.qualname(node.func) not in tr.DISTRIBUTED_SAMPLER_NAMES:
            return
        if astutil.arg(node, "num_replicas", 1) is not None or astutil.arg(node, "rank", 2) is not None:
            return
        if any(a.star for a in node.args):
            return
        calls = tr.index(self.ctx).calls
        if "torch.distributed.init_process_group" in calls or not tr.multiprocess(self.ctx):
            return
        xr = self.ctx.module_alias("torch_xla.runtime")
        edit = tr.compose(
            tr.append_kwarg("num_replicas", f"{xr}.world_size()"),
            tr.append_kwarg("rank", f"{xr}.global_ordinal()"),
        )
        self.report(
            node,
            "DistributedSampler without num_replicas/rank asks torch.distributed, which has no "
            "process group in this script: pass num_replicas=xr.world_size(), rank=xr.global_ordinal()",
            Fix((Edit(node, edit),), imports=("torch_xla.runtime",)),
        )

    def check_loaders(self, loaders: list) -> None:
        if not tr.multiprocess(self.ctx):
            return
        for lc in loaders:
            call = lc.call
            if lc.role != "train":
                continue
            if astutil.arg(call, "sampler", 3) is not None or astutil.arg(call, "batch_sampler", 4) is not None:
                continue
            why = "in this multi-process script every replica iterates the whole dataset; "
            what = ("give it sampler=DistributedSampler(dataset, num_replicas=xr.world_size(), "
                    "rank=xr.global_ordinal(), shuffle=...) and call sampler.set_epoch(epoch) each epoch")
            dataset = astutil.arg(call, "dataset", 0)
            positional = [a for a in call.args if a.keyword is None and not a.star]
            keys = tr.kwargs_keys(call, self.ctx)
            problem = None
            if dataset is None:
                problem = "porter cannot find its dataset argument"
            elif not isinstance(dataset.value, (cst.Name, cst.Attribute)):
                problem = "its dataset is an expression: bind it to a name first"
            elif len(positional) > 2:
                problem = "its arguments after batch_size are positional"
            elif keys is None:
                problem = "porter cannot read its **kwargs"
            elif "shuffle" in keys and astutil.arg(call, "shuffle") is None:
                problem = "its shuffle comes through **kwargs"
            elif "sampler" in keys:
                problem = "its **kwargs may hold a sampler"
            if problem is not None:
                self.report(call, f"{why}{what} ({problem})")
                continue
            shuffle = astutil.arg(call, "shuffle")
            shuffle_code = "False" if shuffle is None else cst.Module([]).code_for_node(shuffle.value)
            sampler_name, imports = tr.distributed_sampler_name(self.ctx)
            xr = self.ctx.module_alias("torch_xla.runtime")
            ds_code = cst.Module([]).code_for_node(dataset.value)
            sampler = (f"{sampler_name}({ds_code}, num_replicas={xr}.world_size(), "
                       f"rank={xr}.global_ordinal(), shuffle={shuffle_code})")
            edit = tr.compose(tr.remove_kwarg("shuffle"), tr.append_kwarg("sampler", sampler))
            self.report(
                call,
                f"{why}{what}. The fix adds the sampler (unsafe: each replica then sees its share of "
                "the data, in the sampler's own order)"
                + ("" if tr.index(self.ctx).set_epoch_called or shuffle_code == "False"
                   else "; this file never calls set_epoch: without it every epoch repeats one order"),
                Fix((Edit(call, edit),), Safety.UNSAFE, imports=(*imports, "torch_xla.runtime")),
            )
