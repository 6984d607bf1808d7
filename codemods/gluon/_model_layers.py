"""How each Gluon layer is written in torch (rule GL105): one builder per layer kind, from the
arguments bound by Gluon's signature (``_model.SIGNATURES``) and the input size the code
shows (``_model.input_size``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from porter.context import FileContext
from porter.rules import NeedsHuman

from . import _model
from ._model import NOT_LITERAL, Bound, Size, code


class Manual(NeedsHuman):
    """This layer cannot be written in torch with the same semantics; the message says why
    (a NeedsHuman: one that escapes the rule becomes a finding at the node)."""


@dataclass
class Plan:
    """What the rule writes: ``known`` (a format string with ``{in}`` for the input size) or
    only ``lazy`` (the input size comes from the first input), the helpers it needs, and a
    note for the finding."""

    known: Optional[str]
    lazy: Optional[str]
    helpers: list = field(default_factory=list)
    note: str = ""
    in_arg: Optional[str] = None  # the Gluon argument naming the input size
    accepts: tuple = ()  # the kinds of input (_model.Size.kind) whose features are this layer's input size
    rank: Optional[int] = None  # BatchNorm: the 1/2/3 of torch's BatchNormNd, as decided where the layer is


def _lit(b: Bound, name: str, default):
    v = b.lit(name, default)
    if v is NOT_LITERAL:
        raise Manual(f"{name}={b.text(name)} is not a literal")
    return v


def _kw(parts: list, name: str, b: Bound, arg: str, default) -> None:
    node = b.get(arg)
    if node is None:
        return
    v = _model.literal(node)
    if v is not NOT_LITERAL and v == default:
        return
    parts.append(f"{name}={code(node)}")


def _bias(parts: list, b: Bound) -> None:
    node = b.get("use_bias")
    if node is None:
        return
    v = _model.literal(node)
    if v is True:
        return
    parts.append(f"bias={code(node)}")


def shared_reason(b: Bound, kind: str) -> Optional[str]:
    """Why a layer's arguments keep it from translating (parameters shared with another block,
    arguments porter does not know, a dtype), or None."""
    try:
        _common(b, kind)
    except Manual as exc:
        return str(exc)
    return None


def _common(b: Bound, kind: str) -> None:
    if b.get("params") is not None:
        raise Manual(f"{kind}(params=...) shares parameters with another block: tie the torch modules by hand")
    if b.unknown:
        raise Manual(f"{kind} arguments porter does not know: {', '.join(map(str, b.unknown))}")
    dtype = b.lit("dtype", None)
    if dtype not in (None, "float32"):
        raise Manual(f"{kind}(dtype={b.text('dtype')})")


_ACTIVATIONS = {"relu": "ReLU()", "sigmoid": "Sigmoid()", "tanh": "Tanh()", "softrelu": "Softplus()",
                "softsign": "Softsign()"}


def plan(kind: str, b: Bound, size: Size, nn: str, ctx: FileContext, call: cst.Call,
         rank: Optional[int] = None) -> Plan:
    """The torch layer for one Gluon layer call; ``Manual`` when there is none.

    ``rank``: BatchNorm's input rank as a first plan decided it. That decision reads the
    enclosing class or function (``ctx.ancestors``), which only the rule's visit sees: a plan
    made again when the fix is applied (the call's arguments may have been rewritten) passes
    the first plan's ``rank`` instead of deciding again.
    """
    _common(b, kind)
    dims = _model._conv_dims(kind)
    if kind == "Dense":
        act = _lit(b, "activation", None)
        if act is not None and act not in _ACTIVATIONS:
            raise Manual(f"Dense activation {act!r}")
        flatten = _lit(b, "flatten", True)
        units = b.text("units")
        extra = []
        _bias(extra, b)
        plain = act is None and (flatten is False or size.kind == "dense")  # a flatten of (N, C) changes nothing
        helper_extra = list(extra)
        if flatten is False:
            helper_extra.append("flatten=False")
        if act is not None:
            helper_extra.append(f"activation={act!r}".replace("'", '"'))
        tail = "".join(", " + e for e in extra)
        htail = "".join(", " + e for e in helper_extra)
        if plain:
            known = f"{nn}.Linear({{in}}, {units}{tail})"
            helpers = []
        else:
            known = f"Dense({{in}}, {units}{htail})"
            helpers = ["Dense"]
        if act is None and flatten is False:
            lazy, lazy_helpers = f"{nn}.LazyLinear({units}{tail})", []
        else:
            lazy, lazy_helpers = f"LazyDense({units}{htail})", ["LazyDense"]
        # flatten=True flattens all but the first axis: the size is known only for (N, C) rows;
        # flatten=False works on the last axis
        return Plan(known, lazy, helpers + lazy_helpers, in_arg="in_units",
                    accepts=("dense",) if flatten is not False else ("dense", "last"))
    if dims and "Transpose" not in kind:
        return _conv(kind, b, nn, dims, transpose=False)
    if dims:
        return _conv(kind, b, nn, dims, transpose=True)
    if kind == "BatchNorm":
        axis = _lit(b, "axis", 1)
        if axis != 1:
            raise Manual(f"BatchNorm(axis={axis}): torch normalizes over axis 1")
        if _lit(b, "center", True) not in (True, False) or _lit(b, "scale", True) not in (True, False):
            raise Manual("BatchNorm center/scale that are not literals")
        if _lit(b, "use_global_stats", False) is not False:
            raise Manual("BatchNorm(use_global_stats=True): always the running statistics (torch: eval mode "
                         "for this layer, or track_running_stats with a fixed momentum)")
        for init in ("beta_initializer", "gamma_initializer", "running_mean_initializer", "running_variance_initializer"):
            if b.get(init) is not None:
                raise Manual(f"BatchNorm({init}=...)")
        extra = []
        m = b.get("momentum")
        if m is not None:
            mv = _model.literal(m)
            if mv is NOT_LITERAL:
                extra.append(f"momentum=1 - {_atom(m)}")
            elif round(1 - mv, 12) != 0.1:
                extra.append(f"momentum={round(1 - mv, 12)!r}")
        e = b.get("epsilon")
        if e is not None and _model.literal(e) != 1e-5:
            extra.append(f"eps={code(e)}")
        n = rank if rank is not None else _bn_dims(size, ctx, call)
        tail = "".join(", " + x for x in extra)
        lazy_tail = ", ".join(extra)
        return Plan(f"{nn}.BatchNorm{n}d({{in}}{tail})", f"{nn}.LazyBatchNorm{n}d({lazy_tail})", in_arg="in_channels",
                    accepts=("dense", "conv1d", "conv2d", "conv3d"), rank=n)
    if kind == "Identity":
        return Plan(f"{nn}.Identity()", None)
    if kind == "Dropout":
        if _lit(b, "axes", ()) not in ((), None):
            raise Manual("Dropout(axes=...) drops whole axes (torch's Dropout1d/2d/3d drop channels only)")
        rate = b.text("rate", "0.5")
        return Plan(f"{nn}.Dropout({rate})", None)
    if kind == "Activation":
        act = _lit(b, "activation", None)
        if act not in _ACTIVATIONS:
            raise Manual(f"Activation({act!r})")
        return Plan(f"{nn}.{_ACTIVATIONS[act]}", None)
    if kind == "LeakyReLU":
        return Plan(f"{nn}.LeakyReLU({b.text('alpha')})", None)
    if kind == "Flatten":
        return Plan(f"{nn}.Flatten()", None)
    if kind.startswith(("MaxPool", "AvgPool")):
        n = kind[-2]
        layout = _lit(b, "layout", None)
        if layout not in (None, "NCW", "NCHW", "NCDHW"):
            raise Manual(f"{kind}(layout={layout!r}): torch pools channels-first")
        parts = [b.text("pool_size", "2")]
        _kw(parts, "stride", b, "strides", None)
        _kw(parts, "padding", b, "padding", 0)
        _kw(parts, "ceil_mode", b, "ceil_mode", False)
        if kind.startswith("AvgPool"):
            _kw(parts, "count_include_pad", b, "count_include_pad", True)
        return Plan(f"{nn}.{kind[:3]}Pool{n}d({', '.join(parts)})", None)
    if kind.startswith("Global"):
        n = kind[-2]
        layout = _lit(b, "layout", None)
        if layout not in (None, "NCW", "NCHW", "NCDHW"):
            raise Manual(f"{kind}(layout={layout!r})")
        which = "Avg" if "Avg" in kind else "Max"
        return Plan(f"{nn}.Adaptive{which}Pool{n}d(1)", None)
    if kind == "Embedding":
        parts = [b.text("input_dim"), b.text("output_dim")]
        if _lit(b, "sparse_grad", False):
            parts.append("sparse=True")
        text = f"{nn}.Embedding({', '.join(parts)})"
        return Plan(text, None)
    if kind in ("LSTM", "GRU"):
        for unsupported in ("projection_size", "state_clip_min", "state_clip_max", "i2h_weight_initializer",
                            "h2h_weight_initializer", "i2h_bias_initializer", "h2h_bias_initializer", "h2r_weight_initializer"):
            if b.get(unsupported) is not None and _model.literal(b.get(unsupported)) is not None:
                raise Manual(f"rnn.{kind}({unsupported}=...)")
        layout = _lit(b, "layout", "TNC")
        if layout not in ("TNC", "NTC"):
            raise Manual(f"rnn.{kind}(layout={layout!r})")
        inp = b.get("input_size")
        if inp is None or _model.literal(inp) == 0:
            raise Manual(f"rnn.{kind} without input_size: torch has no lazy {kind}; give input_size=")
        parts = [code(inp), b.text("hidden_size")]
        nl = b.get("num_layers")
        if nl is not None:
            parts.append(code(nl))
        _kw(parts, "dropout", b, "dropout", 0)
        _kw(parts, "bidirectional", b, "bidirectional", False)
        if layout == "NTC":
            parts.append("batch_first=True")
        return Plan(f"{nn}.{kind}({', '.join(parts)})", None)
    if kind == "LayerNorm":
        if _lit(b, "axis", -1) != -1:
            raise Manual("LayerNorm over an axis other than the last")
        if _lit(b, "center", True) is not True or _lit(b, "scale", True) is not True:
            raise Manual("LayerNorm without center or scale: torch's elementwise_affine=False drops both")
        for init in ("beta_initializer", "gamma_initializer"):
            if b.get(init) is not None and _model.literal(b.get(init)) not in ("zeros", "ones"):
                raise Manual(f"LayerNorm({init}=...)")
        extra = []
        e = b.get("epsilon")
        if e is not None and _model.literal(e) != 1e-5:
            extra.append(f"eps={code(e)}")
        tail = "".join(", " + x for x in extra)
        return Plan(f"{nn}.LayerNorm({{in}}{tail})", None, in_arg="in_channels", accepts=("dense", "last"))
    if kind == "PReLU":
        init = b.get("alpha_initializer")
        parts = []
        n = b.get("in_channels")
        if n is not None and _model.literal(n) != 1:
            parts.append(f"num_parameters={code(n)}")
        if init is not None:
            if not (isinstance(init, cst.Call) and init.args and (_model.code(init.func).endswith("init.Constant")
                                                                  or _model.code(init.func) == "init_constant")):
                raise Manual("PReLU(alpha_initializer=...) other than mx.init.Constant(value)")
            parts.append(f"init={code(init.args[0].value)}")
        return Plan(f"{nn}.PReLU({', '.join(parts)})", None)
    if kind == "ELU":
        alpha = b.get("alpha")
        return Plan(f"{nn}.ELU({code(alpha) if alpha is not None else ''})", None)
    if kind == "SELU":
        return Plan(f"{nn}.SELU()", None)
    if kind == "GELU":
        return Plan(f"{nn}.GELU()", None)  # MXNet's GELU is the erf form, torch's default
    if kind == "Swish":
        if _lit(b, "beta", 1.0) != 1.0:
            raise Manual("Swish with beta other than 1 (torch's SiLU is beta 1)")
        return Plan(f"{nn}.SiLU()", None)
    raise Manual(f"Gluon layer {kind} has no translation")


def _atom(node) -> str:
    text = code(node)
    return text if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)) else f"({text})"


def _conv(kind: str, b: Bound, nn: str, dims: int, transpose: bool) -> Plan:
    layout = _lit(b, "layout", None)
    if layout not in (None, "NCW", "NCHW", "NCDHW"):
        raise Manual(f"{kind}(layout={layout!r}): torch convolves channels-first")
    act = _lit(b, "activation", None)
    if act is not None and act not in _ACTIVATIONS:
        raise Manual(f"{kind}(activation={act!r})")
    parts = [b.text("channels"), b.text("kernel_size")]
    _kw(parts, "stride", b, "strides", 1)
    _kw(parts, "padding", b, "padding", 0)
    if transpose:
        _kw(parts, "output_padding", b, "output_padding", 0)
    _kw(parts, "dilation", b, "dilation", 1)
    _kw(parts, "groups", b, "groups", 1)
    _bias(parts, b)
    torch_kind = f"ConvTranspose{dims}d" if transpose else f"Conv{dims}d"
    args = ", ".join(parts)
    known, lazy = f"{nn}.{torch_kind}({{in}}, {args})", f"{nn}.Lazy{torch_kind}({args})"
    if act is not None:
        known, lazy = f'with_activation({known}, "{act}")', f'with_activation({lazy}, "{act}")'
    return Plan(known, lazy, ["with_activation"] if act is not None else [], in_arg="in_channels",
                accepts=("conv1d", "conv2d", "conv3d"))


def _bn_dims(size: Size, ctx: FileContext, call: cst.Call) -> int:
    if size.kind and size.kind.startswith("conv"):
        return int(size.kind[4])
    if size.kind == "dense":
        return 1
    # the rank of the input is not shown: the convolutions of the enclosing functions and classes
    # tell, innermost first; in each, first those added to the same container as the BatchNorm
    owner = _container(ctx, call)
    scopes = [a for a in reversed(ctx.ancestors) if isinstance(a, (cst.ClassDef, cst.FunctionDef))] + [ctx.module]
    for scope in scopes:
        everything = _layer_dims(scope, ctx, None)
        for found in ((_layer_dims(scope, ctx, owner),) if owner else ()) + (everything,):
            if len(found) == 1 and 0 not in found:
                return next(iter(found))
    raise Manual("BatchNorm: the rank of its input is not shown by the code (torch has BatchNorm1d/2d/3d)")


def _container(ctx: FileContext, call: cst.Call) -> Optional[str]:
    """``X`` when the BatchNorm is the argument of ``X.add(...)`` / ``X.append(...)``."""
    anc = ctx.ancestors
    for i in range(len(anc) - 1, 0, -1):
        if anc[i] is call:
            if i >= 2 and isinstance(anc[i - 1], cst.Arg) and isinstance(anc[i - 2], cst.Call):
                outer = anc[i - 2]
                if isinstance(outer.func, cst.Attribute) and outer.func.attr.value in ("add", "append"):
                    return code(outer.func.value)
            return None
    return None


def _layer_dims(scope: cst.CSTNode, ctx: FileContext, owner: Optional[str]) -> set:
    """The convolution ranks (1/2/3; 0 for Dense and Embedding) of the Gluon layers made in
    ``scope`` (only those added to ``owner`` when given: ``owner.add(layer)``)."""
    from porter import astutil

    found = set()
    for node in astutil.walk(scope, into_functions=True):
        if not isinstance(node, cst.Call):
            continue
        if owner is not None:
            if not (isinstance(node.func, cst.Attribute) and node.func.attr.value in ("add", "append")
                    and code(node.func.value) == owner and node.args and isinstance(node.args[0].value, cst.Call)):
                continue
            node = node.args[0].value
        kind = _model.gluon_layer(node.func, ctx)
        if kind is None:
            helper = _model.helper_function(node, ctx)
            kind = _model.gluon_layer(helper[1].func, ctx) if helper else None
        d = _model._conv_dims(kind or "")
        if d:
            found.add(d)
        elif kind in ("Dense", "Embedding"):
            found.add(0)
    return found
