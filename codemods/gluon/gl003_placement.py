from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _arrays
from . import _script as sc

_SPLIT = ("mxnet.gluon.utils.split_and_load",)


class MxnetPlacement(Rule):
    """
    ## What it does
    Translates where NDArrays live into torch device placement:

    | MXNet | PyTorch |
    | --- | --- |
    | `x.as_in_context(device)`, `x.as_in_ctx(device)` (MXNet 2's spelling), `context=` / `ctx=` given by keyword | `x.to(device)` |
    | `x.copyto(device)` (a new copy on a context) | `x.to(device, copy=True)` |
    | `x.copyto(y)` (into an existing array, which it returns) | `y.copy_(x)` |
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
    summary = ("x.as_in_context(ctx) -> x.to(ctx); x.copyto(ctx) -> x.to(ctx, copy=True); x.context -> x.device; "
               "split_and_load(x, ctx) -> [x.to(ctx[0])]")
    severity = Severity.ERROR
    needs_text = ("as_in_context", "as_in_ctx", "copyto", ".context", "split_and_load")
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
            import mxnet as mx
            from mxnet import nd

            ctx = mx.gpu()

            def step(net, data, label):
                x = data.as_in_context(context=ctx)
                y = label.copyto(ctx)
                kept = nd.zeros((2, 4))
                net(x).copyto(kept)
                return x, y, kept
            """,
            """
            import mxnet as mx
            from mxnet import nd

            ctx = mx.gpu()

            def step(net, data, label):
                x = data.to(ctx)
                y = label.to(ctx, copy=True)
                kept = nd.zeros((2, 4))
                kept.copy_(net(x))
                return x, y, kept
            """,
            title="the context by keyword; copyto onto a context, and into an array",
        ),
        Example(
            """
            import mxnet as mx

            def keep(x, where):
                return x.copyto(where)
            """,
            None,
            title="copyto of an argument porter cannot tell a context from an array: reported",
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
        if (isinstance(func, cst.Attribute) and func.attr.value in ("as_in_context", "as_in_ctx", "copyto")
                and len(node.args) == 1 and not node.args[0].star
                and (node.args[0].keyword is None or node.args[0].keyword.value in ("context", "ctx", "other"))):
            if sc.qualname(self.ctx, func.value) is not None:
                return  # a module's function of that name
            if func.attr.value != "copyto":
                self.report(node, f"x.{func.attr.value}(ctx) -> x.to(device)", Fix((self.replace(node, _to),)))
            else:
                self._copyto(node)
            return
        if sc.call_name(self.ctx, node) in _SPLIT:
            self._split(node)

    def _copyto(self, node: cst.Call) -> None:
        """``x.copyto(other)``: a copy on a context, or into an array (MXNet returns ``other``)."""
        other = node.args[0].value
        if _is_context(self.ctx, other):
            self.report(node, "x.copyto(ctx) -> x.to(device, copy=True) (a new copy, as MXNet's)",
                        Fix((self.replace(node, lambda u: _to(u, copy=True)),)))
        elif _arrays.kind(self.ctx, other) == _arrays.ARRAY:
            def build(u: cst.Call) -> cst.Call:
                source = u.func.value  # an argument now: the parentheses of a receiver are not needed
                if source.lpar and not isinstance(source, (cst.Tuple, cst.GeneratorExp)):
                    source = source.with_changes(lpar=[], rpar=[])
                return cst.Call(cst.Attribute(astutil.parenthesized(u.args[0].value), cst.Name("copy_")),
                                [cst.Arg(source)])
            self.report(node, "x.copyto(y) (into an array) -> y.copy_(x)", Fix((self.replace(node, build),)))
        else:
            self.report(node, "x.copyto(...) of a value porter cannot tell a context from an array: a context -> "
                              "x.to(device, copy=True); an array y -> y.copy_(x)")

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


def _to(call: cst.Call, copy: bool = False) -> cst.Call:
    """``x.<method>(ctx)`` -> ``x.to(ctx[, copy=True])`` (the context given by keyword or not)."""
    args = [call.args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)]
    if copy:
        args.append(astutil.kwarg("copy", cst.Name("True")))
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("to")), args=args)


def _is_context(ctx, node: cst.BaseExpression) -> bool:
    """A context: ``mx.gpu()`` / ``mx.cpu()`` (or a choice of them), a name the file assigns
    only contexts (``ctx = mx.gpu() if ... else mx.cpu()``), or an element of a context list
    (``ctx[0]``)."""
    if sc.is_context(node, ctx):
        return True
    if isinstance(node, cst.Subscript):
        return dotted_name(node.value) in sc.context_list_names(ctx)
    name = dotted_name(node)
    if name is None:
        return False
    values = [value for bound, value, _ in sc.assignments(ctx) if bound == name]
    return bool(values) and all(sc.is_context(v, ctx) for v in values)
