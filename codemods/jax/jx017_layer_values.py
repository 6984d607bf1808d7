from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _layers

# stateless and NNX-kind layers whose class, used as a value, becomes an emitted factory
# (templates/jax_layers.py.j2) taking torch's arguments
FACTORIES = frozenset({
    "Linear", "LayerNorm", "Dropout", "ReLU", "ReLU6", "SiLU", "Hardswish", "Hardsigmoid", "Tanh", "Sigmoid", "GELU",
    "LeakyReLU", "ELU", "Identity",
})


def value_for(short: str) -> Optional[str]:
    """What `nn.<short>` used as a value becomes: the emitted class of a helper layer
    (`nn.BatchNorm2d` -> `TorchBatchNorm`), a factory for the others (`nn.ReLU` -> `TorchReLU`);
    None where the port has neither."""
    layer = _layers.LAYERS.get(short)
    if layer is None:
        return None
    if layer.kind == "helper":
        name = layer.helper or f"Torch{layer.torch}"
        return name if layer.rngs or name in _layers.TAKES_RNGS else None
    return f"Torch{short}" if short in FACTORIES else None


class NnxLayerValues(Rule):
    """
    ## What it does
    A torch.nn layer class used as a value rather than called where it is named: a layer
    factory in a parameter's default (`norm_layer=nn.BatchNorm2d`), assigned
    (`norm_layer = nn.BatchNorm2d`, `self.act = nn.ReLU`), wrapped (`partial(nn.BatchNorm2d,
    eps=1e-3)`, `partial(nn.LayerNorm, eps=1e-6)`) or passed (`Block(..., nn.SiLU)`), becomes
    the port's class or factory for that layer: the emitted class of a layer JX002 ports to
    one (`TorchBatchNorm`, `TorchConv2d`, `TorchMaxPool2d`...), or an emitted factory with
    torch's arguments (`TorchLayerNorm(normalized_shape, eps=1e-5, ...)` gives the
    `nnx.LayerNorm` JX002 would build, `TorchReLU(inplace=False)` gives `nnx.relu`). JX011
    emits them. Every factory takes `rngs` (unused where the layer has no parameters), so a
    call of the factory (`norm_layer(planes)`) gets the caller's `rngs=rngs` (JX001) whatever
    layer it holds.

    Annotations (JX001) and `isinstance` tests (JX012) are left to their rules. A layer class
    without such a counterpart used as a value (`nn.Softmax`, `nn.Flatten`, `nn.Embedding`) is
    reported.

    ## Why
    Model families take their norm and activation layers as arguments (ResNet's `norm_layer`,
    MobileNet's `activation_layer`); a factory left as torch's class builds torch layers inside
    the NNX model, which the weight converter cannot see.

    ## Fix safety
    Safe: each factory builds what JX002 builds for a call of the layer with the same
    arguments.
    """

    code = "JX017"
    name = "nnx-layer-values"
    target = "jax"
    summary = "a torch.nn layer class used as a value (norm_layer=nn.BatchNorm2d) -> the port's class or factory"
    severity = Severity.ERROR
    needs_text = ("nn",)
    examples = [
        Example(
            """
            from functools import partial
            import torch.nn as nn

            class Block(nn.Module):
                def __init__(self, c, norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU):
                    super().__init__()
                    if norm_layer is None:
                        norm_layer = partial(nn.GroupNorm, 8)
                    self.norm = norm_layer(c)
                    self.act = activation_layer(inplace=True)
            """,
            """
            from functools import partial
            import torch.nn as nn

            class Block(nn.Module):
                def __init__(self, c, norm_layer=TorchBatchNorm, activation_layer=TorchReLU):
                    super().__init__()
                    if norm_layer is None:
                        norm_layer = partial(TorchGroupNorm, 8)
                    self.norm = norm_layer(c)
                    self.act = activation_layer(inplace=True)
            """,
        ),
        Example(
            """
            import torch.nn as nn

            def head(c, n, act=nn.Softmax):
                return nn.Sequential(nn.Linear(c, n), act(dim=1))
            """,
            None,
            title="a layer without a class or factory in the port: reported",
        ),
    ]
    valid = [
        "import torch.nn as nn\nx = nn.BatchNorm2d(3)\n",
        "import torch.nn as nn\ndef f(m) -> nn.Conv2d:\n    return isinstance(m, nn.Conv2d)\n",
        "from torch.nn import BatchNorm2d\n",
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._value(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._value(node)

    def _value(self, node: cst.BaseExpression) -> None:
        qual = self.ctx.qualname(node) or ""
        if not qual.startswith("torch.nn.") or "." in qual[len("torch.nn."):]:
            return
        short = qual[len("torch.nn."):]
        if short not in _layers.LAYERS and short not in _layers.MANUAL_LAYERS:
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Call) and parent.func is node:
            return  # a construction: JX002
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # nn.Conv2d.__name__
        if isinstance(parent, (cst.ImportAlias, cst.ImportFrom)) or self.ctx.inside(cst.Annotation, cst.Import, cst.ImportFrom):
            return
        if isinstance(node, cst.Name) and isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        if isinstance(node, cst.Name) and isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param)):
            return
        if isinstance(parent, cst.Arg) and len(self.ctx.ancestors) > 2 and isinstance(self.ctx.ancestors[-3], cst.ClassDef) \
                and any(a is parent for a in self.ctx.ancestors[-3].bases):
            return  # a base class: JX001 (the layers with an emitted base class) or JX090 (the others)
        call = self.ctx.enclosing(cst.Call)
        if call is not None and isinstance(call.func, cst.Name) and call.func.value in ("isinstance", "issubclass"):
            return  # JX012
        if _layers.inside_manual_construct(self.ctx):
            return
        new = value_for(short)
        if new is None:
            self.report(node, f"nn.{short} used as a value (a layer factory): the port has no class or factory for it; "
                              "port by hand")
            return
        self.report(
            node,
            f"nn.{short} used as a value (a layer factory) -> {new}: called with torch's arguments and rngs, "
            "it builds what the port builds for the layer",
            Fix((self.replace(node, cst.Name(new)),),
                remove_imports=(("torch.nn", None), ("torch", "nn"), ("torch", None))),
        )
