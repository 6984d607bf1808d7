import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._imports import import_pairs
from ._tables import PL, tidy_args

_PARALLEL_LOADER = f"{PL}.ParallelLoader"


class ParallelLoaderPerDevice(Rule):
    """
    ## What it does
    Rewrites `pl.ParallelLoader(loader, [device]).per_device_loader(device)` to
    `pl.MpDeviceLoader(loader, device)`, keeping ParallelLoader's keyword arguments. A
    `ParallelLoader` whose `per_device_loader` is taken elsewhere is reported.

    ## Why
    `MpDeviceLoader` is the current API for feeding one process's device (torch_xla 2.9
    source: its `__iter__` builds `ParallelLoader(loader, [device], **kwargs)` and iterates
    its `per_device_loader(device)`), and it can be iterated once per epoch, where a
    `per_device_loader` is exhausted after one pass. Measured on 2.9: both yield the same
    batches on `xla:0` with the same `len()`.

    ## Fix safety
    Safe: the same loader, built lazily at each iteration. `from
    torch_xla.distributed.parallel_loader import ParallelLoader` goes once nothing uses it.
    """

    code = "TX003"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-parallel-loader"
    target = "torch-xla"
    summary = "pl.ParallelLoader(loader, devices).per_device_loader(d) -> pl.MpDeviceLoader(loader, d)"
    severity = Severity.INFO
    needs_text = ("ParallelLoader",)
    examples = [
        Example(
            """
            import torch_xla.distributed.parallel_loader as pl

            for epoch in range(epochs):
                para_loader = pl.ParallelLoader(train_loader, [device], fixed_batch_size=True)
                train_loop_fn(para_loader.per_device_loader(device))
            """,
            None,
            title="a separate per_device_loader is reported",
        ),
        Example(
            """
            import torch_xla.distributed.parallel_loader as pl

            loader = pl.ParallelLoader(train_loader, [device], loader_prefetch_size=8).per_device_loader(device)
            """,
            """
            import torch_xla.distributed.parallel_loader as pl

            loader = pl.MpDeviceLoader(train_loader, device, loader_prefetch_size=8)
            """,
        ),
        Example(
            """
            from torch_xla.distributed.parallel_loader import ParallelLoader

            for x, y in ParallelLoader(test_loader, [dev]).per_device_loader(dev):
                evaluate(x, y)
            """,
            """
            import torch_xla.distributed.parallel_loader as pl

            for x, y in pl.MpDeviceLoader(test_loader, dev):
                evaluate(x, y)
            """,
        ),
    ]
    valid = ["import torch_xla.distributed.parallel_loader as pl\nloader = pl.MpDeviceLoader(train_loader, device)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "per_device_loader" and isinstance(func.value, cst.Call):
            inner = func.value
            if self.ctx.qualname(inner.func) == _PARALLEL_LOADER:
                self._chained(node, inner)
            return
        if self.ctx.qualname(func) != _PARALLEL_LOADER:
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Attribute) and parent.attr.value == "per_device_loader":
            return  # the chained form, handled from the outer call
        self.report(node, "pl.ParallelLoader(loader, [device]) + per_device_loader(device): use pl.MpDeviceLoader(loader, device), "
                          "which can be iterated every epoch")

    def _chained(self, outer: cst.Call, inner: cst.Call) -> None:
        loader = arg(inner, "loader", 0)
        devices = arg(inner, "devices", 1)
        device = arg(outer, "device", 0)
        positional = [a for a in inner.args if a.keyword is None]
        ok = (
            loader is not None and devices is not None and device is not None
            and not any(a.star for a in (*inner.args, *outer.args))
            and len(positional) <= 2 and len(outer.args) == 1
            and isinstance(devices.value, cst.List) and len(devices.value.elements) == 1
            and not isinstance(devices.value.elements[0], cst.StarredElement)
            and _same(devices.value.elements[0].value, device.value)
        )
        if not ok:
            self.report(outer, "pl.ParallelLoader(...).per_device_loader(device): use pl.MpDeviceLoader(loader, device)")
            return
        kwargs = [a for a in inner.args if a.keyword is not None and a.keyword.value not in ("loader", "devices")]
        mp = cst.Attribute(value=inner.func.value, attr=cst.Name("MpDeviceLoader")) if isinstance(inner.func, cst.Attribute) \
            else cst.parse_expression(f"{self.ctx.module_alias(PL)}.MpDeviceLoader")
        new = cst.Call(func=mp, args=tidy_args([cst.Arg(loader.value), cst.Arg(device.value), *kwargs]))
        imports = () if isinstance(inner.func, cst.Attribute) else (PL,)
        self.report(outer, "pl.ParallelLoader(loader, [device]).per_device_loader(device) is pl.MpDeviceLoader(loader, device)",
                    Fix((self.replace(outer, new),), imports=imports, remove_imports=import_pairs(self.ctx, inner.func)))


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return a.deep_equals(b)
