from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _nnx

_CONTAINERS = {
    "torch.nn.Sequential": "Sequential",
    "torch.nn.ModuleList": "List",
    "torch.nn.ModuleDict": "Dict",
    "torch.nn.ParameterList": "List",
    "torch.nn.ParameterDict": "Dict",
}


_SEQUENTIALS = ("torch.nn.Sequential", "flax.nnx.Sequential")
_GROWING = ("append", "extend", "insert")
_ITERATING = ("len", "enumerate", "list", "tuple", "reversed", "iter", "zip", "sum", "any", "all")


def _sequential_target(receiver: cst.BaseExpression, ctx) -> bool:
    """`receiver` (a name, or `self.x`) is assigned a Sequential in its function (for `self.x`:
    in any method of its class)."""
    if isinstance(receiver, cst.Attribute):
        scope = ctx.enclosing(cst.ClassDef)
    else:
        scope = ctx.enclosing(cst.FunctionDef)
    if scope is None:
        scope = ctx.module
    key = ("jx004.sequential_targets", id(scope))
    targets = ctx.cache.get(key)
    if targets is None:  # the code of every target assigned a Sequential in the scope
        targets = ctx.cache[key] = set()
        for node in astutil.walk(scope, into_functions=True):
            if isinstance(node, (cst.Assign, cst.AnnAssign)) and isinstance(node.value, cst.Call) \
                    and (ctx.qualname(node.value.func) or "") in _SEQUENTIALS:
                assigned = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                targets.update(_nnx.code(t) for t in assigned)
    return _nnx.code(receiver) in targets


class NnxContainers(Rule):
    """
    ## What it does
    `nn.Sequential(a, b, c)` -> `nnx.Sequential(a, b, c)`, `nn.ModuleList(...)` /
    `nn.ParameterList(...)` -> `nnx.List(...)`, `nn.ModuleDict(...)` / `nn.ParameterDict(...)` ->
    `nnx.Dict(...)` (an empty constructor gets an empty list / dict). A Sequential grown
    after its construction (`seq.append(layer)`, `self.features.extend(...)`, `insert`) grows
    its `layers` list (`seq.layers.append(layer)`): nnx.Sequential has no append. Reads of it
    as a sequence go through `layers` too: `seq[i]` -> `seq.layers[i]` (also as an assignment
    target), `seq[a:b]` -> `nnx.Sequential(*seq.layers[a:b])` (torch's slice is a
    Sequential), `for m in seq`, `enumerate(seq)`, `len(seq)`, `list(seq)` ->
    `seq.layers`: nnx.Sequential is neither subscriptable nor iterable.

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
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
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
                    self.head = nn.Sequential()
                    self.head.append(nn.Linear(2, 2))
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
                    self.head = nnx.Sequential()
                    self.head.layers.append(nn.Linear(2, 2))
            """,
        ),
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.features = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
                    nn.init.zeros_(self.features[0].bias)

                def forward(self, x, upto=None):
                    if upto is not None:
                        return self.features[:upto](x)
                    for i, layer in enumerate(self.features):
                        x = layer(x)
                    return x
            """,
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.features = nnx.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
                    nn.init.zeros_(self.features.layers[0].bias)

                def forward(self, x, upto=None):
                    if upto is not None:
                        return nnx.Sequential(*self.features.layers[:upto])(x)
                    for i, layer in enumerate(self.features.layers):
                        x = layer(x)
                    return x
            """,
            title="a Sequential read as a sequence: an index, a slice (a Sequential again), iteration",
        ),
    ]
    valid = [
        "from flax import nnx\nseq = nnx.Sequential(nnx.relu)\n",
        
    ]

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not _sequential_target(node.value, self.ctx):
            return
        layers = cst.Attribute(node.value, cst.Name("layers"))
        sliced = any(isinstance(e.slice, cst.Slice) for e in node.slice)
        new: cst.BaseExpression = node.with_changes(value=layers)
        if sliced:  # torch's slice of a Sequential is a Sequential of those layers
            new = cst.parse_expression(f"{_nnx.nnx_name(self.ctx)}.Sequential(*{_nnx.code(new)})")
        self.report(node, f"{_nnx.code(node)}: nnx.Sequential is not subscriptable: its layers are `.layers` (an nnx.List)",
                    Fix((self.replace(node, new),), imports=("flax.nnx",) if sliced else ()))

    def visit_For(self, node: cst.For) -> None:
        if _sequential_target(node.iter, self.ctx):
            self._layers_of(node.iter, "iterates over")

    def _layers_of(self, seq: cst.BaseExpression, what: str) -> None:
        self.report(seq, f"{what} {_nnx.code(seq)}: nnx.Sequential is not iterable: its layers are `.layers` (an nnx.List)",
                    Fix((self.replace(seq, cst.Attribute(seq, cst.Name("layers"))),)))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) and func.value in _ITERATING and self.ctx.qualname(func) in (
                None, func.value, f"builtins.{func.value}") and node.args:
            first = node.args[0].value
            if node.args[0].star == "" and _sequential_target(first, self.ctx):
                self._layers_of(first, f"{func.value}() of")
        if isinstance(func, cst.Attribute) and func.attr.value in _GROWING \
                and _sequential_target(func.value, self.ctx):
            new = node.with_changes(func=func.with_changes(
                value=cst.Attribute(func.value, cst.Name("layers"))))
            self.report(
                node,
                f"{_nnx.code(func)}(...): nnx.Sequential keeps its layers in `.layers` (an nnx.List)",
                Fix((self.replace(node, new),)),
            )
            return
        qual = self.ctx.qualname(func)
        kind = _CONTAINERS.get(qual or "")
        if kind is None:
            return
        if _layers.inside_manual_construct(self.ctx):
            return
        nnx = _nnx.nnx_name(self.ctx)
        if kind == "Sequential" and _layers.has_ordered_dict(node, self.ctx):
            # named children: the emitted TorchSequential keeps torch's names (JX011)
            self.report(node, f"{_nnx.code(node.func)}(OrderedDict(...)) -> TorchSequential(...): named children, "
                              "called in order, under torch's names",
                        Fix((self.replace(node, node.with_changes(func=cst.Name("TorchSequential"))),),
                            remove_imports=(("torch.nn", None), ("torch", "nn"), ("torch", None))))
            return
        new = node.with_changes(func=cst.parse_expression(f"{nnx}.{kind}"))
        if kind != "Sequential" and not node.args:
            new = new.with_changes(args=[cst.Arg(cst.List([]) if kind == "List" else cst.Dict([]))])
        self.report(
            node,
            f"{_nnx.code(node.func)}(...) -> {nnx}.{kind}(...): NNX's container keeps the torch indices/keys",
            Fix((self.replace(node, new),), imports=("flax.nnx",),
                remove_imports=(("torch.nn", None), ("torch", "nn"), ("torch", None))),
        )


