from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _nnx

_CONTAINERS = {
    "torch.nn.Sequential": "Sequential",
    "torch.nn.ModuleList": "List",
    "torch.nn.ModuleDict": "Dict",
    "torch.nn.ParameterList": "List",
    "torch.nn.ParameterDict": "Dict",
}


class NnxContainers(Rule):
    """
    ## What it does
    `nn.Sequential(a, b, c)` -> `nnx.Sequential(a, b, c)`, `nn.ModuleList(...)` /
    `nn.ParameterList(...)` -> `nnx.List(...)`, `nn.ModuleDict(...)` / `nn.ParameterDict(...)` ->
    `nnx.Dict(...)` (an empty constructor gets an empty list / dict).

    Every element is kept at its index (activations, which hold no parameters, included), so
    torch's names `features.3.weight` and `blocks.0.fc.weight` still name the same layers:
    the weight converter (JX010) reads `features.layers.3` of an `nnx.Sequential` as torch's
    `features.3`. A Sequential built from an `OrderedDict` (named children) is reported by
    JX090 and left alone.

    ## Why
    Flax NNX 0.12 rejects plain Python lists and dicts of modules as module attributes
    ("Found data on value of type list assigned to static attribute"); `nnx.List` and
    `nnx.Dict` are its containers. `nnx.Sequential` calls its layers in order like torch's.

    ## Fix safety
    Safe for single-input Sequentials. (A layer of an `nnx.Sequential` returning a tuple has
    it unpacked into the next layer's arguments; torch passes the tuple as one argument.)
    """

    code = "JX004"
    name = "nnx-containers"
    target = "jax"
    summary = "nn.Sequential / ModuleList / ModuleDict -> nnx.Sequential / nnx.List / nnx.Dict"
    severity = Severity.ERROR
    needs_text = ("Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict")
    examples = [
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self, widths):
                    super().__init__()
                    self.blocks = nn.ModuleList([Block(w) for w in widths])
                    self.heads = nn.ModuleDict({"cls": Head(10), "box": Head(4)})
                    self.extra = nn.ModuleList()
                    self.features = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            """,
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nn.Module):
                def __init__(self, widths):
                    super().__init__()
                    self.blocks = nnx.List([Block(w) for w in widths])
                    self.heads = nnx.Dict({"cls": Head(10), "box": Head(4)})
                    self.extra = nnx.List([])
                    self.features = nnx.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            """,
        ),
    ]
    valid = [
        "from flax import nnx\nseq = nnx.Sequential(nnx.relu)\n",
        "import collections, torch.nn as nn\nseq = nn.Sequential(collections.OrderedDict([('fc', nn.Linear(2, 2))]))\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        kind = _CONTAINERS.get(qual or "")
        if kind is None:
            return
        if kind == "Sequential" and _layers.has_ordered_dict(node, self.ctx):
            return  # JX090
        if _layers.inside_manual_construct(self.ctx):
            return
        nnx = _nnx.nnx_name(self.ctx)
        new = node.with_changes(func=cst.parse_expression(f"{nnx}.{kind}"))
        if kind != "Sequential" and not node.args:
            new = new.with_changes(args=[cst.Arg(cst.List([]) if kind == "List" else cst.Dict([]))])
        self.report(
            node,
            f"{_nnx.code(node.func)}(...) -> {nnx}.{kind}(...): NNX's container keeps the torch indices/keys",
            Fix((self.replace(node, new),), imports=("flax.nnx",),
                remove_imports=(("torch.nn", None), ("torch", "nn"), ("torch", None))),
        )


