from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

_SPLIT = ("mxnet.gluon.utils.split_and_load",)


class MxnetPlacement(Rule):
    """
    ## What it does
    Translates where NDArrays live into torch device placement:

    | MXNet | PyTorch |
    | --- | --- |
    | `x.as_in_context(device)`, `x.as_in_ctx(device)` (MXNet 2's spelling) | `x.to(device)` |
    | `x.context` (an NDArray's context) | `x.device` |
    | `gluon.utils.split_and_load(x, [device])` (one context) | `[x.to(device)]` |
    | `gluon.utils.split_and_load(x, ctx_list=ctx, batch_axis=0, even_split=False)` (a context list) | `[x.to(ctx[0])]` |

    `split_and_load` over a context list is Gluon's single-process data parallelism: one
    shard of the batch per context. The port keeps one device per process (GL002 makes the
    list a list of that one device): the whole batch is the one shard, on that device, and the
    loops over the shards (forward, loss, `backward` per shard) run once. With
    `trainer.step(batch_size)` (GL303) the gradients are the ones Gluon sums over its shards.
    A literal list of several contexts puts the batch on the first.

    ## Why
    PyTorch moves tensors with `.to(device)`; the torch-xla and JAX rules take it from there
    (`MpDeviceLoader`, or no move at all under `jit`).

    ## Fix safety
    Safe: the same copy to the same device; over a context list, the whole batch on the
    process's one device (the same summed gradients; BatchNorm's batch statistics over the
    whole batch, as Gluon's on one context).
    """

    code = "GL003"
    name = "gluon-placement"
    target = "torch"
    summary = "x.as_in_context(ctx) -> x.to(ctx); x.context -> x.device; split_and_load(x, ctx) -> [x.to(ctx[0])]"
    severity = Severity.ERROR
    needs_text = ("as_in_context", "as_in_ctx", ".context", "split_and_load")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            def step(net, data, label, device):
                data = data.as_in_context(device)
                label = label.as_in_context(data.context)
                return net(data), label
            """,
            """
            import mxnet as mx

            def step(net, data, label, device):
                data = data.to(device)
                label = label.to(data.device)
                return net(data), label
            """,
        ),
        Example(
            """
            from mxnet import gluon

            parts = gluon.utils.split_and_load(batch, [device])
            """,
            """
            parts = [batch.to(device)]
            """,
        ),
        Example(
            """
            import mxnet as mx
            from mxnet import gluon

            ctx = [mx.gpu(i) for i in range(mx.num_gpus())]

            def shards(batch, ctx):
                data = gluon.utils.split_and_load(batch[0], ctx_list=ctx, batch_axis=0)
                label = gluon.utils.split_and_load(batch[1], ctx, even_split=False)
                pair = gluon.utils.split_and_load(batch[2], [mx.gpu(0), mx.gpu(1)])
                return data, label, pair
            """,
            """
            import mxnet as mx

            ctx = [mx.gpu(i) for i in range(mx.num_gpus())]

            def shards(batch, ctx):
                data = [batch[0].to(ctx[0])]
                label = [batch[1].to(ctx[0])]
                pair = [batch[2].to(mx.gpu(0))]
                return data, label, pair
            """,
            title="a context list (data parallelism): the whole batch on the one device (GL002 makes the list)",
        ),
        Example(
            """
            from mxnet import gluon

            parts = gluon.utils.split_and_load(*batch)
            """,
            None,
            title="arguments not read statically: reported",
        ),
    ]
    valid = [
        "import mxnet as mx\nn = mx.context.num_gpus()\n",
        "import torch\nx = y.to(device)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("as_in_context", "as_in_ctx") and len(node.args) == 1:
            if sc.qualname(self.ctx, func.value) is not None:
                return
            self.report(node, f"x.{func.attr.value}(ctx) -> x.to(device)",
                        Fix((self.replace(node, lambda u: u.with_changes(func=u.func.with_changes(attr=cst.Name("to")))),)))
            return
        if sc.call_name(self.ctx, node) in _SPLIT:
            self._split(node)

    def _split(self, node: cst.Call) -> None:
        data = astutil.arg(node, "data", 0)
        contexts = astutil.arg(node, "ctx_list", 1)
        known = {"data", "ctx_list", "batch_axis", "even_split"}
        if (data is None or contexts is None or any(a.star for a in node.args)
                or any(a.keyword is not None and a.keyword.value not in known for a in node.args)):
            self.report(node, "this split_and_load (its arguments are not read statically): put the batch on the "
                        "process's device by hand, [x.to(device)]")
            return
        one = isinstance(contexts.value, cst.List) and len(contexts.value.elements) == 1

        def build(u: cst.Call) -> cst.BaseExpression:
            d = astutil.arg(u, "data", 0).value
            device = sc.one_device(self.ctx, astutil.arg(u, "ctx_list", 1).value)
            return cst.List([cst.Element(cst.Call(cst.Attribute(d, cst.Name("to")), [cst.Arg(device)]))])

        if sc.one_device(self.ctx, contexts.value) is None:
            self.report(node, "split_and_load over this context list: put the batch on the process's device by hand")
            return
        what = "onto one context -> [x.to(device)]" if one else \
            "over a context list (data parallelism) -> the whole batch on the process's one device, [x.to(ctx[0])]"
        self.report(node, f"split_and_load {what}", Fix((self.replace(node, build),)))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "context":
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # mx.context.num_gpus
        if sc.qualname(self.ctx, node) is not None or sc.qualname(self.ctx, node.value) is not None:
            return  # a module attribute (mx.context)
        if isinstance(node.value, cst.Name) and node.value.value == "self":
            return
        self.report(node, "an NDArray's .context -> the tensor's .device",
                    Fix((self.replace(node, lambda u: u.with_changes(attr=cst.Name("device"))),)))
