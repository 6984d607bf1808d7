from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

_ARRAY_DATASET = ("mxnet.gluon.data.ArrayDataset", "mxnet.gluon.data.dataset.ArrayDataset")
_LOADER = ("mxnet.gluon.data.DataLoader", "mxnet.gluon.data.dataloader.DataLoader")
_LOADER_KEEP = ("batch_size", "shuffle", "num_workers", "pin_memory", "sampler", "batch_sampler")


class GluonData(Rule):
    """
    ## What it does
    Translates Gluon's in-memory datasets and its data loader:

    | Gluon | PyTorch |
    | --- | --- |
    | `gluon.data.ArrayDataset(x, y)` | `torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))` |
    | `gluon.data.DataLoader(ds, batch_size=b, shuffle=s)` | `torch.utils.data.DataLoader(ds, batch_size=b, shuffle=s)` |
    | `last_batch="keep"` (the default) | nothing: torch keeps the last, smaller batch |
    | `last_batch="discard"` | `drop_last=True` |

    `num_workers`, `pin_memory`, `sampler` and `batch_sampler` carry over. The arrays keep
    their dtypes (MXNet's default batchify keeps a numpy array's dtype too), so float class
    labels stay float until the loss (GL301) makes them `long`.

    Reported: `last_batch="rollover"` (torch has no equivalent), `batchify_fn`,
    `thread_pool`, `prefetch`, `timeout`, and `ArrayDataset` of anything but arrays
    (a list of records).

    Shuffling draws from torch's generator (`torch.manual_seed`), not numpy's: the batches
    of a port come in another order than the original's (model-level verification compares
    with the same weights and inputs, not the same data order).

    ## Why
    The torch-xla rules wrap a `torch.utils.data.DataLoader` in `MpDeviceLoader` and make the
    last batch static (`drop_last`); the JAX rules feed its numpy batches to the jitted step.

    ## Fix safety
    Safe: the same samples in batches of the same sizes.
    """

    code = "GL401"
    name = "gluon-data"
    target = "torch"
    summary = "gluon.data.ArrayDataset / DataLoader -> torch.utils.data.TensorDataset / DataLoader (last_batch -> drop_last)"
    severity = Severity.ERROR
    needs_text = ("DataLoader", "ArrayDataset")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            train_data = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=32, shuffle=True,
                                               last_batch="discard")
            """,
            """
            import torch
            import torch.utils.data

            train_data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)), batch_size=32, shuffle=True,
                                               drop_last=True)
            """,
        ),
        Example(
            """
            from mxnet import gluon

            loader = gluon.data.DataLoader(ds, batch_size=32, last_batch="rollover")
            """,
            None,
            title="rollover: reported",
        ),
    ]
    valid = ["import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=4)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        if name in _ARRAY_DATASET:
            if any(a.keyword is not None or a.star for a in node.args) or not node.args:
                self.report(node, "ArrayDataset with keyword or starred arguments: translate by hand")
                return
            torch = sc.torch_name(self.ctx)
            data = self.ctx.module_alias("torch.utils.data")

            def build(u: cst.Call) -> cst.Call:
                args = [a.with_changes(value=cst.Call(sc.expr(f"{torch}.as_tensor"), [cst.Arg(a.value)])) for a in u.args]
                return u.with_changes(func=sc.expr(f"{data}.TensorDataset"), args=args)

            self.report(node, "gluon.data.ArrayDataset -> torch.utils.data.TensorDataset",
                        Fix((self.replace(node, build),), imports=("torch", "torch.utils.data")))
            return
        if name not in _LOADER:
            return
        last = astutil.arg(node, "last_batch", 4)
        last_value = "keep" if last is None else astutil.string_value(last.value)
        if last_value not in ("keep", "discard"):
            self.report(node, f"DataLoader(last_batch={sc.code(last.value)}): torch's DataLoader keeps or drops the last "
                        "batch (drop_last); rollover has no equivalent: translate by hand")
            return
        for a in node.args:
            if a.keyword is not None and a.keyword.value not in (*_LOADER_KEEP, "dataset", "last_batch"):
                self.report(node, f"DataLoader({a.keyword.value}=...): no torch equivalent porter writes; translate by hand")
                return
        if len([a for a in node.args if a.keyword is None]) > 3:
            self.report(node, "DataLoader with many positional arguments: use keywords")
            return
        data = self.ctx.module_alias("torch.utils.data")

        def build2(u: cst.Call) -> cst.Call:
            args = []
            for i, a in enumerate(u.args):
                if a.keyword is None and i == 4 or (a.keyword is not None and a.keyword.value == "last_batch"):
                    if last_value == "discard":
                        args.append(a.with_changes(keyword=cst.Name("drop_last"), value=cst.Name("True"),
                                                   equal=a.equal if a.keyword is not None else cst.AssignEqual(
                                                       cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
                    continue
                args.append(a)
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return u.with_changes(func=sc.expr(f"{data}.DataLoader"), args=args)

        self.report(node, "gluon.data.DataLoader -> torch.utils.data.DataLoader",
                    Fix((self.replace(node, build2),), imports=("torch.utils.data",)))
