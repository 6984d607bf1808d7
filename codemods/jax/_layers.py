"""The layer table: each torch.nn layer porter translates, its torch signature, and how the
NNX construction is written (JX002), or why it is left for a manual port (JX090).

Three kinds of translation:
- ``nnx``: an NNX layer whose semantics are torch's once its arguments are written out
  (``nn.Linear(a, b, bias=False)`` -> ``nnx.Linear(a, b, use_bias=False, rngs=rngs)``,
  LayerNorm's epsilon 1e-5, Dropout's rate).
- ``helper``: a small class emitted into the port (templates/jax_layers.py.j2, JX011) that
  takes torch's arguments and keeps torch's layout and semantics where NNX differs:
  channels-first convolutions and pooling, BatchNorm's unbiased running variance, LSTM/GRU
  and MultiheadAttention with torch's parameter layout. The call keeps its arguments; only
  the class changes (``nn.Conv2d(3, 8, 3)`` -> ``TorchConv2d(3, 8, 3, rngs=rngs)``).
- ``function``: a stateless layer becomes a function value (``nn.ReLU()`` -> ``nnx.relu``,
  ``nn.GELU()`` -> ``functools.partial(nnx.gelu, approximate=False)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import libcst as cst

from porter import astutil
from porter.context import FileContext

from ._nnx import NOT_LITERAL, code, kwarg, literal, with_rngs


class Manual(Exception):
    """The construction cannot be translated with the same semantics; the message says why."""


@dataclass(frozen=True)
class Plan:
    new: cst.BaseExpression  # the replacement expression
    imports: tuple[str, ...]
    helper: Optional[str] = None  # the emitted class it uses
    rngs: bool = False  # the new code refers to `rngs`


Bound = dict  # torch parameter name -> cst.Arg


@dataclass(frozen=True)
class Layer:
    torch: str  # class name under torch.nn
    params: tuple[str, ...]  # torch's signature, in order
    kind: str  # "nnx", "helper", "function"
    rngs: bool = False  # the NNX construction takes rngs
    helper: Optional[str] = None  # emitted class (kind "helper")
    # parameters the port accepts only at these literal values (dropped from the call):
    # name -> (allowed values, why other values are not translated)
    only: dict = field(default_factory=dict)
    # parameters the port does not accept at these literal values: name -> (values, why)
    forbid: dict = field(default_factory=dict)
    # `only` parameters kept in the call (the emitted class reads them)
    keep: tuple[str, ...] = ()
    # parameters accepted and dropped (no meaning in JAX): device placement
    drop: tuple[str, ...] = ("device",)
    build: Optional[Callable[[Bound, FileContext], tuple[str, tuple[str, ...]]]] = None


def passes_star(layer: Layer) -> bool:
    """Whether ``*args`` / ``**kwargs`` of a construction can go to the emitted class as they are:
    it takes torch's signature, and every parameter porter accepts only at some values is one
    the class receives and checks at run time (`keep`; an unknown padding mode or
    ``return_indices=True`` raises there)."""
    return layer.kind == "helper" and set(layer.only) | set(layer.forbid) <= set(layer.keep)


def bind(call: cst.Call, layer: Layer) -> Bound:
    bound: Bound = {}
    positional = 0
    for a in call.args:
        if a.star:
            if passes_star(layer):
                bound[f"{a.star}{code(a.value)}"] = a
                continue
            raise Manual(f"nn.{layer.torch} called with {a.star}args: porter cannot see its arguments")
        if a.keyword is None:
            if positional >= len(layer.params):
                raise Manual(f"nn.{layer.torch}: too many positional arguments")
            bound[layer.params[positional]] = a
            positional += 1
        else:
            name = a.keyword.value
            if name not in layer.params:
                raise Manual(f"nn.{layer.torch} has no parameter {name!r} porter knows")
            bound[name] = a
    return bound


def plan(call: cst.Call, qual: str, ctx: FileContext) -> Optional[Union[Plan, Manual]]:
    """The translation of a torch.nn layer construction, a Manual with the reason, or None when
    ``qual`` is not a torch.nn layer."""
    if qual in LIBRARY_LAYERS:
        short, layer = LIBRARY_LAYERS[qual].torch, LIBRARY_LAYERS[qual]
    elif not qual.startswith("torch.nn."):
        return None
    else:
        short = qual[len("torch.nn."):]
        layer = LAYERS.get(short)
    if layer is None:
        if short in MANUAL_LAYERS:
            return Manual(f"nn.{short}: {MANUAL_LAYERS[short]}")
        if "." not in short and short[:1].isupper() and short not in NOT_LAYERS and not short.endswith("Loss"):
            return Manual(f"nn.{short} has no Flax NNX translation in porter: port it by hand")
        return None
    try:
        bound = bind(call, layer)
        if "dtype" in bound:
            raise Manual(f"nn.{layer.torch}(dtype=...): set param_dtype on the NNX layer by hand")
        for name, (allowed, why) in layer.only.items():
            if name in bound:
                value = literal(bound[name].value)
                if value is NOT_LITERAL or value not in allowed:
                    raise Manual(f"nn.{layer.torch}({name}={code(bound[name].value)}): {why}")
        for name, (values, why) in layer.forbid.items():
            if name in bound and literal(bound[name].value) in values:
                raise Manual(f"nn.{layer.torch}({name}={code(bound[name].value)}): {why}")
        for name in (*layer.only, *layer.drop):
            if name not in layer.keep:
                bound.pop(name, None)
        if layer.kind == "helper":
            return _helper_plan(call, layer, bound)
        assert layer.build is not None
        text, imports = layer.build(bound, ctx)
        return Plan(astutil.parse_expression(text), imports, rngs=layer.rngs)
    except Manual as exc:
        return exc


def _helper_plan(call: cst.Call, layer: Layer, bound: Bound) -> Plan:
    """The same call (arguments and their layout kept, those without meaning in JAX dropped)
    of the emitted class, with rngs=rngs when the layer has parameters or randomness."""
    helper = layer.helper or f"Torch{layer.torch}"
    kept = [a for a in call.args if any(a is b for b in bound.values())]
    if kept and len(kept) < len(call.args) and call.args[-1] is not kept[-1]:
        # the last argument was dropped: the new last one takes its comma (trailing or none)
        kept[-1] = kept[-1].with_changes(comma=call.args[-1].comma)
    new = call.with_changes(func=cst.Name(helper), args=kept)
    if layer.rngs:
        new = with_rngs(new)
    return Plan(new, (), helper=helper, rngs=layer.rngs)


def _commas(args: list[cst.Arg]) -> list[cst.Arg]:
    return [
        a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if i < len(args) - 1 else cst.MaybeSentinel.DEFAULT)
        for i, a in enumerate(args)
    ]


# --------------------------------------------------------------------------------------
# Builders for the "nnx" and "function" kinds
# --------------------------------------------------------------------------------------
def _v(bound: Bound, name: str) -> Optional[str]:
    a = bound.get(name)
    return code(a.value) if a is not None else None


def _flag(bound: Bound, name: str, default: bool):
    """A boolean argument: its literal value, its code when not a literal, default if absent."""
    a = bound.get(name)
    if a is None:
        return default
    value = literal(a.value)
    return code(a.value) if value is NOT_LITERAL else bool(value)


def _nnx(ctx: FileContext) -> str:
    return ctx.module_alias("flax.nnx")


_NNX = ("flax.nnx",)


def _linear(b: Bound, ctx: FileContext):
    args = [_v(b, "in_features"), _v(b, "out_features")]
    bias = _flag(b, "bias", True)
    if bias is not True:
        args.append(f"use_bias={bias}")
    return f"{_nnx(ctx)}.Linear({', '.join(args)}, rngs=rngs)", _NNX


def _layer_norm(b: Bound, ctx: FileContext):
    shape = b["normalized_shape"].value if "normalized_shape" in b else None
    if shape is None:
        raise Manual("nn.LayerNorm without normalized_shape")
    value = literal(shape)
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise Manual("nn.LayerNorm over several trailing dimensions: give nnx.LayerNorm reduction_axes and feature_axes by hand")
        features = str(value[0])
    elif isinstance(shape, (cst.Tuple, cst.List)):
        if len(shape.elements) != 1:
            raise Manual("nn.LayerNorm over several trailing dimensions: give nnx.LayerNorm reduction_axes and feature_axes by hand")
        features = code(shape.elements[0].value)
    else:
        features = code(shape)
    eps = _v(b, "eps") or "1e-5"
    args = [features, f"epsilon={eps}"]
    affine = _flag(b, "elementwise_affine", True)
    bias = _flag(b, "bias", True)
    if affine is not True:
        args.append(f"use_scale={affine}")
    use_bias = affine if bias is True else (bias if affine is True else f"{affine} and {bias}")
    if use_bias is not True:
        args.append(f"use_bias={use_bias}")
    return f"{_nnx(ctx)}.LayerNorm({', '.join(args)}, rngs=rngs)", _NNX


def _embedding(b: Bound, ctx: FileContext):
    for name, why in (("max_norm", "renormalizes looked-up rows in place"),
                      ("scale_grad_by_freq", "scales gradients by word frequency in the batch"),
                      ("_weight", "an initial weight tensor"), ("_freeze", "a frozen weight")):
        if name in b and literal(b[name].value) not in (None, False):
            raise Manual(f"nn.Embedding({name}=...): {why}; not translated")
    b.pop("sparse", None)  # JAX gradients are dense: same values
    args = [_v(b, "num_embeddings"), _v(b, "embedding_dim")]
    pad = b.get("padding_idx")
    if pad is not None and literal(pad.value) is not None:
        return f"TorchEmbedding({args[0]}, {args[1]}, padding_idx={code(pad.value)}, rngs=rngs)", ()
    return f"{_nnx(ctx)}.Embed({', '.join(args)}, rngs=rngs)", _NNX


def _dropout(spatial: int):
    def build(b: Bound, ctx: FileContext):
        rate = _v(b, "p") or "0.5"
        if spatial:  # whole channels, on whatever rank the input has (TorchDropoutNd)
            return f"TorchDropoutNd({rate}, {spatial}, rngs=rngs)", ()
        return f"{_nnx(ctx)}.Dropout({rate}, rngs=rngs)", _NNX
    return build


def _fn(name: str, **defaults):
    """A stateless layer -> ``nnx.<name>``, or functools.partial(nnx.<name>, kw=...) for each
    argument given with a value other than its default. ``defaults``: torch name -> (jax name,
    default value)."""

    def build(b: Bound, ctx: FileContext):
        kws = []
        for torch_name, (jax_name, default) in defaults.items():
            if torch_name in b:
                value = literal(b[torch_name].value)
                if value is NOT_LITERAL or value != default:
                    kws.append(f"{jax_name}={code(b[torch_name].value)}")
        target = f"{_nnx(ctx)}.{name}"
        if kws:
            return f"functools.partial({target}, {', '.join(kws)})", ("functools", "flax.nnx")
        return target, _NNX

    return build


def _gelu(b: Bound, ctx: FileContext):
    approx = literal(b["approximate"].value) if "approximate" in b else "none"
    if approx not in ("none", "tanh"):
        raise Manual("nn.GELU(approximate=...) must be 'none' or 'tanh' (a literal) to be translated")
    flag = "True" if approx == "tanh" else "False"
    return f"functools.partial({_nnx(ctx)}.gelu, approximate={flag})", ("functools", "flax.nnx")


def _softmax(name: str):
    def build(b: Bound, ctx: FileContext):
        dim = b.get("dim")
        if dim is None or literal(dim.value) is None:
            raise Manual(f"nn.{'Softmax' if name == 'softmax' else 'LogSoftmax'}() without dim: torch picks the dimension implicitly; give dim")
        return f"functools.partial({_nnx(ctx)}.{name}, axis={code(dim.value)})", ("functools", "flax.nnx")
    return build


def _flatten(b: Bound, ctx: FileContext):
    start = literal(b["start_dim"].value) if "start_dim" in b else 1
    end = literal(b["end_dim"].value) if "end_dim" in b else -1
    if not isinstance(start, int) or not isinstance(end, int):
        raise Manual("nn.Flatten with non-literal dimensions")
    if end == -1 and start == 1:
        return "lambda x: x.reshape(x.shape[0], -1)", ()
    if end == -1 and start == 0:
        return "lambda x: x.reshape(-1)", ()
    if start < 0 or end < -1:
        raise Manual("nn.Flatten with negative start_dim or end_dim below -1")
    stop = "" if end == -1 else f", stop_dimension={end + 1}"
    return f"functools.partial(jax.lax.collapse, start_dimension={start}{stop})", ("functools", "jax")


def _identity(b: Bound, ctx: FileContext):
    return "lambda x: x", ()


_INPLACE = {"inplace": ((False, True), "")}

LAYERS: dict[str, Layer] = {
    layer.torch: layer
    for layer in [
        Layer("Linear", ("in_features", "out_features", "bias", "device", "dtype"), "nnx", True, build=_linear),
        Layer("LayerNorm", ("normalized_shape", "eps", "elementwise_affine", "bias", "device", "dtype"), "nnx", True, build=_layer_norm),
        Layer("Embedding", ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "norm_type",
                            "scale_grad_by_freq", "sparse", "_weight", "_freeze", "device", "dtype"),
              "nnx", True, drop=("device", "norm_type"), build=_embedding),
        Layer("Dropout", ("p", "inplace"), "nnx", True, only=_INPLACE, build=_dropout(0)),
        Layer("Dropout1d", ("p", "inplace"), "nnx", True, only=_INPLACE, build=_dropout(1)),
        Layer("Dropout2d", ("p", "inplace"), "nnx", True, only=_INPLACE, build=_dropout(2)),
        Layer("Dropout3d", ("p", "inplace"), "nnx", True, only=_INPLACE, build=_dropout(3)),
        # channels-first layers with torch's arguments (emitted classes)
        *[
            Layer(f"Conv{n}d", ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
                                "groups", "bias", "padding_mode", "device", "dtype"), "helper", True, keep=("padding_mode",),
                  only={"padding_mode": (("zeros", "reflect", "replicate", "circular"), "a literal padding mode is needed")})
            for n in (1, 2, 3)
        ],
        *[
            Layer(f"ConvTranspose{n}d", ("in_channels", "out_channels", "kernel_size", "stride", "padding",
                                         "output_padding", "groups", "bias", "dilation", "padding_mode", "device", "dtype"),
                  "helper", True,
                  only={"groups": ((1,), "nnx.ConvTranspose has no feature groups"),
                        "padding_mode": (("zeros",), "only zero padding")})
            for n in (1, 2, 3)
        ],
        # torch's lazy layers: the input size comes from the first input (emitted _TorchLazy classes)
        Layer("LazyLinear", ("out_features", "bias", "device", "dtype"), "helper", True, helper="TorchLazyLinear"),
        *[
            Layer(f"LazyConv{n}d", ("out_channels", "kernel_size", "stride", "padding", "dilation",
                                    "groups", "bias", "padding_mode", "device", "dtype"), "helper", True,
                  helper=f"TorchLazyConv{n}d", keep=("padding_mode",),
                  only={"padding_mode": (("zeros", "reflect", "replicate", "circular"), "a literal padding mode is needed")})
            for n in (1, 2, 3)
        ],
        *[
            Layer(f"LazyConvTranspose{n}d", ("out_channels", "kernel_size", "stride", "padding", "output_padding",
                                             "groups", "bias", "dilation", "padding_mode", "device", "dtype"),
                  "helper", True, helper=f"TorchLazyConvTranspose{n}d",
                  only={"groups": ((1,), "nnx.ConvTranspose has no feature groups"),
                        "padding_mode": (("zeros",), "only zero padding")})
            for n in (1, 2, 3)
        ],
        *[
            Layer(f"LazyBatchNorm{n}d", ("eps", "momentum", "affine", "track_running_stats", "device", "dtype"),
                  "helper", True, helper="TorchLazyBatchNorm",
                  forbid={"momentum": ((None,), "a cumulative moving average is not translated: give a momentum")})
            for n in (1, 2, 3)
        ],
        *[
            Layer(f"BatchNorm{n}d", ("num_features", "eps", "momentum", "affine", "track_running_stats", "device", "dtype"),
                  "helper", True, helper="TorchBatchNorm",
                  forbid={"momentum": ((None,), "a cumulative moving average is not translated: give a momentum")})
            for n in (1, 2, 3)
        ],
        Layer("GroupNorm", ("num_groups", "num_channels", "eps", "affine", "device", "dtype"), "helper", True),
        # pooling on channels-first input with torch's output sizes (ceil_mode) and divisors
        *[
            Layer(f"MaxPool{n}d", ("kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode"), "helper",
                  keep=("return_indices",), only={"return_indices": ((False,), "the indices output is not translated")})
            for n in (1, 2, 3)
        ],
        Layer("AvgPool1d", ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"), "helper"),
        *[
            Layer(f"AvgPool{n}d", ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"), "helper")
            for n in (2, 3)
        ],
        *[Layer(f"AdaptiveAvgPool{n}d", ("output_size",), "helper") for n in (1, 2, 3)],
        *[
            Layer(f"AdaptiveMaxPool{n}d", ("output_size", "return_indices"), "helper", keep=("return_indices",),
                  only={"return_indices": ((False,), "the indices output is not translated")})
            for n in (1, 2, 3)
        ],
        Layer("LSTM", ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional",
                       "proj_size", "device", "dtype"), "helper", True,
              only={"proj_size": ((0,), "LSTM projections are not translated")}),
        Layer("GRU", ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional",
                      "device", "dtype"), "helper", True,
              only={"bidirectional": ((False,), "bidirectional GRUs are not translated")}),
        Layer("MultiheadAttention", ("embed_dim", "num_heads", "dropout", "bias", "add_bias_kv", "add_zero_attn",
                                     "kdim", "vdim", "batch_first", "device", "dtype"), "helper", True,
              only={"add_bias_kv": ((False,), "extra key/value biases are not translated"),
                    "add_zero_attn": ((False,), "a zero attention row is not translated"),
                    "kdim": ((None,), "separate key/value projections (kdim/vdim) are not translated"),
                    "vdim": ((None,), "separate key/value projections (kdim/vdim) are not translated")}),
        Layer("TransformerEncoderLayer", ("d_model", "nhead", "dim_feedforward", "dropout", "activation",
                                          "layer_norm_eps", "batch_first", "norm_first", "bias", "device", "dtype"),
              "helper", True, keep=("activation",),
              only={"activation": (("relu", "gelu"), "a callable activation is not translated: give \"relu\" or \"gelu\"")}),
        Layer("TransformerEncoder", ("encoder_layer", "num_layers", "norm", "enable_nested_tensor", "mask_check"),
              "helper", drop=("enable_nested_tensor", "mask_check")),
        # stateless layers: function values
        Layer("ReLU", ("inplace",), "function", only=_INPLACE, build=_fn("relu")),
        Layer("ReLU6", ("inplace",), "function", only=_INPLACE, build=_fn("relu6")),
        Layer("SiLU", ("inplace",), "function", only=_INPLACE, build=_fn("silu")),
        Layer("Tanh", (), "function", build=_fn("tanh")),
        Layer("Sigmoid", (), "function", build=_fn("sigmoid")),
        Layer("Hardswish", ("inplace",), "function", only=_INPLACE, build=_fn("hard_swish")),
        Layer("Hardsigmoid", ("inplace",), "function", only=_INPLACE, build=_fn("hard_sigmoid")),
        Layer("GELU", ("approximate",), "function", build=_gelu),
        Layer("LeakyReLU", ("negative_slope", "inplace"), "function", only=_INPLACE,
              build=_fn("leaky_relu", negative_slope=("negative_slope", 0.01))),
        Layer("ELU", ("alpha", "inplace"), "function", only=_INPLACE, build=_fn("elu", alpha=("alpha", 1.0))),
        Layer("Softmax", ("dim",), "function", build=_softmax("softmax")),
        Layer("LogSoftmax", ("dim",), "function", build=_softmax("log_softmax")),
        Layer("Flatten", ("start_dim", "end_dim"), "function", build=_flatten),
        Layer("Identity", (), "function", build=_identity),
    ]
}
# Identity takes and ignores any arguments in torch
LAYERS["Identity"] = Layer("Identity", ("args", "kwargs"), "function", build=_identity)

# layers of libraries built on torch, by qualified name (the layer's own name and where the
# library exports it)
_STOCHASTIC_DEPTH = Layer("StochasticDepth", ("p", "mode"), "helper", rngs=True, helper="TorchStochasticDepth")
LIBRARY_LAYERS: dict[str, Layer] = {
    "torchvision.ops.StochasticDepth": _STOCHASTIC_DEPTH,
    "torchvision.ops.stochastic_depth.StochasticDepth": _STOCHASTIC_DEPTH,
}


def layer_of(qual: str) -> Optional[Layer]:
    """The table entry of a torch.nn layer (``torch.nn.Conv2d``) or a library layer
    (``torchvision.ops.StochasticDepth``) by qualified name."""
    if qual.startswith("torch.nn."):
        return LAYERS.get(qual[len("torch.nn."):])
    return LIBRARY_LAYERS.get(qual)


# torch.nn classes that are not layers (or are handled by other rules; losses, `...Loss`, are the
# op rules')
NOT_LAYERS = frozenset({
    "Module", "Parameter", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    "DataParallel", "Buffer",
})

# layers known to need a hand port, with the reason
MANUAL_LAYERS = {
    "RNN": "Elman RNNs are not translated (LSTM and GRU are)",
    "Transformer": "not translated: build it from MultiheadAttention, Linear and LayerNorm",
    "TransformerDecoderLayer": "not translated: write the block with nn.MultiheadAttention, Linear, LayerNorm and Dropout (those are)",
    "TransformerDecoder": "not translated: stack explicit decoder blocks in an nn.ModuleList",
    "EmbeddingBag": "not translated",
    "InstanceNorm2d": "not translated",
    "Upsample": "not translated: use jax.image.resize with the matching method by hand (align_corners differs)",
    "PixelShuffle": "not translated",
    "SyncBatchNorm": "not translated: use BatchNorm with an axis_name under jax.pmap/shard_map",
    "Bilinear": "not translated",
    "PReLU": "not translated (nnx.PReLU has one shared slope and another parameter name)",
    "Unflatten": "not translated",
}


# emitted classes of layers without parameters that still accept `rngs=` (ignored), so that a
# layer factory holding one (pool_layer=nn.MaxPool2d, JX017) is called like any other
TAKES_RNGS = frozenset(f"Torch{kind}Pool{n}d" for kind in ("Max", "Avg", "AdaptiveAvg", "AdaptiveMax") for n in (1, 2, 3))
# what the port names a torch layer class used as a value (JX017): emitted classes and factories
VALUE_NAMES = frozenset({
    *TAKES_RNGS, *(f"Torch{n}" for n in ("Linear", "LayerNorm", "Dropout", "ReLU", "ReLU6", "SiLU", "Hardswish", "Hardsigmoid", "Tanh",
                                         "Sigmoid", "GELU", "LeakyReLU", "ELU", "Identity")),
    *((layer.helper or f"Torch{layer.torch}") for layer in LAYERS.values() if layer.kind == "helper" and layer.rngs),
})


# what an annotation naming a torch layer class becomes in the port
_NNX_CLASSES = {"Linear": "Linear", "LayerNorm": "LayerNorm", "Embedding": "Embed", "Dropout": "Dropout"}


# the containers JX004 writes (nn.Sequential(...) -> nnx.Sequential(...))
_NNX_CONTAINERS = {"Sequential": "Sequential", "ModuleList": "List", "ModuleDict": "Dict"}


def annotation_for(short: str, nnx: str) -> Optional[str]:
    """`nn.Conv2d` in an annotation -> "TorchConv2d", `nn.Linear` -> "nnx.Linear",
    `nn.Sequential` -> "nnx.Sequential"; None for layers that become functions or are not
    translated."""
    if short in _NNX_CONTAINERS:
        return f"{nnx}.{_NNX_CONTAINERS[short]}"
    layer = LAYERS.get(short)
    if layer is None:
        return None
    if layer.kind == "helper":
        return layer.helper or f"Torch{layer.torch}"
    if short in _NNX_CLASSES:
        return f"{nnx}.{_NNX_CLASSES[short]}"
    return None


def inside_manual_construct(ctx: FileContext) -> bool:
    """The current node is an argument of a torch.nn construction left for a manual port
    (``nn.Sequential(OrderedDict(...))``, an untranslated layer): it stays as written too."""
    for anc in ctx.ancestors[:-1]:
        if isinstance(anc, cst.Call):
            qual = ctx.qualname(anc.func) or ""
            if not qual.startswith("torch.nn."):
                continue
            if isinstance(plan(anc, qual, ctx), Manual):
                return True
    return False


def has_ordered_dict(call: cst.Call, ctx: FileContext) -> bool:
    """`nn.Sequential(OrderedDict(...))` / `nn.Sequential({...})`, or of a local name bound to
    one in the same function (`layers = OrderedDict(); layers["conv"] = ...;
    nn.Sequential(layers)`: vit's encoder, maxvit's MBConv)."""
    if len(call.args) != 1 or call.args[0].star:
        return False
    value = call.args[0].value
    if isinstance(value, cst.Name):
        scope = next((a for a in reversed(ctx.ancestors[:-1]) if isinstance(a, cst.FunctionDef)), None)
        return scope is not None and any(
            _is_dict_value(v, ctx) for v in _values_bound(scope, value.value))
    return _is_dict_value(value, ctx)


def _is_dict_value(value: Optional[cst.BaseExpression], ctx: FileContext) -> bool:
    return isinstance(value, cst.Dict) or (
        isinstance(value, cst.Call) and (ctx.qualname(value.func) or "").endswith("OrderedDict")
    )


def _values_bound(func: cst.FunctionDef, name: str) -> list:
    """The values a plain `name = value` / `name: T = value` assigns in ``func``'s body."""
    out = []
    for node in astutil.walk(func.body):
        if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets):
            out.append(node.value)
        elif isinstance(node, cst.AnnAssign) and isinstance(node.target, cst.Name) and node.target.value == name:
            out.append(node.value)
    return out
