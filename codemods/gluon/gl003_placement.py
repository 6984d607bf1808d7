from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

_SPLIT = ("mxnet.gluon.utils.split_and_load",)


class MxnetPlacement(Rule):
    """
    ## What it does
    Translates where NDArrays live into torch device placement:

    | MXNet | PyTorch |
    | --- | --- |
    | `x.as_in_context(device)` | `x.to(device)` |
    | `x.context` (an NDArray's context) | `x.device` |
    | `gluon.utils.split_and_load(x, [device])` (one context) | `[x.to(device)]` |

    `split_and_load` over several contexts (Gluon's single-process data parallelism) is
    reported: the XLA and JAX ports spread a batch over devices differently (torch_xla's
    `MpDeviceLoader` per process, `jax.sharding`), which is a decision for the author.

    ## Why
    PyTorch moves tensors with `.to(device)`; the torch-xla and JAX rules take it from there
    (`MpDeviceLoader`, or no move at all under `jit`).

    ## Fix safety
    Safe: the same copy to the same device.
    """

    code = "GL003"
    name = "gluon-placement"
    target = "torch"
    summary = "x.as_in_context(ctx) -> x.to(ctx); x.context -> x.device; split_and_load on one context"
    severity = Severity.ERROR
    needs_text = ("as_in_context", ".context", "split_and_load")
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
            from mxnet import gluon

            parts = [batch.to(device)]
            """,
        ),
        Example(
            """
            from mxnet import gluon

            parts = gluon.utils.split_and_load(batch, devices)
            """,
            None,
            title="several contexts: reported",
        ),
    ]
    valid = [
        "import mxnet as mx\nn = mx.context.num_gpus()\n",
        "import torch\nx = y.to(device)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "as_in_context" and len(node.args) == 1:
            if sc.qualname(self.ctx, func.value) is not None:
                return
            self.report(node, "x.as_in_context(ctx) -> x.to(device)",
                        Fix((self.replace(node, lambda u: u.with_changes(func=u.func.with_changes(attr=cst.Name("to")))),)))
            return
        if sc.call_name(self.ctx, node) in _SPLIT:
            data = node.args[0] if node.args and node.args[0].keyword is None else None
            contexts = node.args[1] if len(node.args) > 1 and node.args[1].keyword is None else None
            if data is not None and contexts is not None and isinstance(contexts.value, cst.List) and len(contexts.value.elements) == 1:

                def build(u: cst.Call) -> cst.BaseExpression:
                    d, c = u.args[0].value, u.args[1].value.elements[0].value
                    move = cst.Call(cst.Attribute(d, cst.Name("to")), [cst.Arg(c)])
                    return cst.List([cst.Element(move)])

                self.report(node, "split_and_load onto one context -> [x.to(device)]", Fix((self.replace(node, build),)))
                return
            self.report(node, "split_and_load over several contexts (single-process data parallelism) has no direct "
                        "PyTorch form: use torch_xla's per-process data parallelism or jax.sharding (manual)")

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
