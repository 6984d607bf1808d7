"""The MXNet op table: ``F.<op>`` (inside ``hybrid_forward(self, F, ...)``), ``mx.nd.<op>`` /
``nd.<op>`` and ``mx.sym.<op>`` calls (``OPS``), ``mx.np.<op>`` (``NP_OPS``, NumPy semantics)
and ``mx.npx.<op>`` (``NPX_OPS``) with their torch counterparts, as data (rule GL201).

Each :class:`Op` names one MXNet operator (mxnet 1.9.1), its signature as MXNet binds it
(positional order, defaults), and a builder that writes the torch expression from the bound
arguments. A builder raises :class:`Manual` when a call cannot be written with the same
semantics (an argument whose meaning torch does not have, a reshape special code...); the
rule then marks the line ``# porter: manual`` instead of guessing.

Semantics kept, as measured in mxnet 1.9.1 (tests/test_gluon_ops.py runs every case below in
the MXNet venv and its translation in torch and compares values, shapes and dtypes):

- full reductions (``axis=None``) of the NDArray API return shape ``(1,)``, not a 0-d array:
  the port reshapes torch's 0-d result to ``(1,)``;
- ``argmax``/``argmin`` return the indices in the input's float dtype;
- ``concat``'s default axis is 1 (``dim=1``), ``stack``'s 0;
- ``maximum``/``minimum`` take a scalar operand (torch.clamp then);
- ``where``'s condition is numeric (non-zero is true).

Array creation (``zeros``, ``ones``, ``array``, ``arange``, ``random.*``), which takes a
context, is not here: the script rules (GL0xx) translate it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import libcst as cst

from porter.rules import NeedsHuman

from ._model import NOT_LITERAL, Bound, bind, code, literal


class Manual(NeedsHuman):
    """This call cannot be translated with the same semantics; the message says why."""


_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.SimpleString,
          cst.List, cst.Tuple)


def atom(node: cst.CSTNode) -> str:
    text = code(node)
    if isinstance(node, _ATOMS) or getattr(node, "lpar", None):
        return text
    return f"({text})"


@dataclass(frozen=True)
class Case:
    """One numerical test: the MXNet call (``OP`` stands for the spelled op, the inputs are
    a, b, c) and the inputs' shapes (``int:`` for integer arrays in [0, 5))."""

    expr: str
    inputs: dict
    rtol: float = 1e-5


@dataclass(frozen=True)
class Op:
    name: str
    params: tuple[str, ...]
    build: Callable[[Bound, str], str]  # (bound arguments, torch module name) -> code
    cases: tuple[Case, ...] = ()
    variadic: bool = False  # concat(*data, dim=1): the positional arguments are the data
    doc: str = ""


OPS: dict[str, Op] = {}


def _add(name, params, build, cases=(), variadic=False, doc="", aliases=()):
    op = Op(name, tuple(params), build, tuple(cases), variadic, doc)
    for n in (name, *aliases):
        OPS[n] = op


def _x(b: Bound, name: str = "data") -> str:
    node = b.get(name)
    if node is None:
        raise Manual(f"missing argument {name!r}")
    return code(node)


def _no(b: Bound, **defaults) -> None:
    """Arguments torch has no counterpart for: accepted only at their default."""
    for name, default in defaults.items():
        v = b.lit(name, default)
        if v != default:
            raise Manual(f"{name}={code(b.get(name)) if b.get(name) is not None else v} has no torch counterpart here")


def _unknown(b: Bound) -> None:
    if b.unknown:
        raise Manual(f"arguments not in the MXNet signature or not literal: {', '.join(map(str, b.unknown))}")


# ----------------------------------------------------------------------------------------
# Elementwise
# ----------------------------------------------------------------------------------------
_UNARY = {
    "relu": "{t}.relu", "sigmoid": "{t}.sigmoid", "tanh": "{t}.tanh", "exp": "{t}.exp", "log": "{t}.log",
    "sqrt": "{t}.sqrt", "rsqrt": "{t}.rsqrt", "abs": "{t}.abs", "square": "{t}.square", "negative": "{t}.neg",
    "sin": "{t}.sin", "cos": "{t}.cos", "floor": "{t}.floor", "ceil": "{t}.ceil", "sign": "{t}.sign",
    "log1p": "{t}.log1p", "expm1": "{t}.expm1", "reciprocal": "{t}.reciprocal", "erf": "{t}.erf",
    "softsign": "{t}.nn.functional.softsign",
    "log2": "{t}.log2", "log10": "{t}.log10", "arcsin": "{t}.asin", "arccos": "{t}.acos", "arctan": "{t}.atan",
    "sinh": "{t}.sinh", "cosh": "{t}.cosh", "trunc": "{t}.trunc", "fix": "{t}.trunc",
}
_POSITIVE = {"log", "sqrt", "rsqrt", "reciprocal", "log1p", "log2", "log10"}
_UNIT = {"arcsin", "arccos"}  # inputs in (-1, 1)


def _unary(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        return f"{fn.format(t=t)}({_x(b)})"
    return build


def _unary_input(name: str) -> str:
    if name in _POSITIVE:
        return "a * a + 0.5"
    if name in _UNIT:
        return "a / (a * a + 1.5)"
    return "a"


for _name, _fn in _UNARY.items():
    _add(_name, ("data",), _unary(_fn), [Case(f"OP({_unary_input(_name)})", {"a": (3, 4)})])

_ACT = {"relu": "{t}.relu({x})", "sigmoid": "{t}.sigmoid({x})", "tanh": "{t}.tanh({x})",
        "softrelu": "{t}.nn.functional.softplus({x})", "softsign": "{t}.nn.functional.softsign({x})"}


def _activation(b: Bound, t: str) -> str:
    _unknown(b)
    act = b.lit("act_type")
    if act not in _ACT:
        raise Manual(f"act_type {code(b.get('act_type')) if b.get('act_type') is not None else act!r} "
                     "is not one of relu, sigmoid, tanh, softrelu, softsign (as a literal)")
    return _ACT[act].format(t=t, x=_x(b))


_add("Activation", ("data", "act_type"), _activation,
     [Case(f"OP(a, act_type={a!r})", {"a": (3, 4)}) for a in _ACT])


def _leaky(b: Bound, t: str) -> str:
    _unknown(b)
    kind = b.lit("act_type", "leaky")
    slope = b.text("slope", "0.25")
    if kind == "leaky":
        return f"{t}.nn.functional.leaky_relu({_x(b)}, {slope})"
    if kind == "elu":
        return f"{t}.nn.functional.elu({_x(b)}, alpha={slope})"
    if kind == "selu":
        return f"{t}.selu({_x(b)})"
    if kind == "gelu":
        return f"{t}.nn.functional.gelu({_x(b)})"
    raise Manual(f"LeakyReLU act_type {kind!r} (prelu/rrelu have parameters or randomness of their own)")


_add("LeakyReLU", ("data", "gamma", "act_type", "slope", "lower_bound", "upper_bound"), _leaky,
     [Case("OP(a, slope=0.2)", {"a": (3, 4)}), Case("OP(a)", {"a": (3, 4)}),
      Case("OP(a, act_type='elu', slope=0.5)", {"a": (3, 4)}), Case("OP(a, act_type='selu')", {"a": (3, 4)}),
      Case("OP(a, act_type='gelu')", {"a": (3, 4)})])


def _softmax(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, length=None, use_length=False, dtype=None)
        x = _x(b)
        temp = b.get("temperature")
        if temp is not None and literal(temp) is not None:
            x = f"{atom(b.get('data'))} / {atom(temp)}"
        return f"{t}.{fn}({x}, dim={b.text('axis', '-1')})"
    return build


_add("softmax", ("data", "length", "axis", "temperature", "dtype", "use_length"), _softmax("softmax"),
     [Case("OP(a)", {"a": (3, 4)}), Case("OP(a, axis=0)", {"a": (3, 4)}),
      Case("OP(a, temperature=2.0)", {"a": (3, 4)})])
_add("log_softmax", ("data", "axis", "temperature", "dtype", "use_length"), _softmax("log_softmax"),
     [Case("OP(a)", {"a": (3, 4)}), Case("OP(a, axis=1)", {"a": (2, 3, 4)})])


def _softmax_activation(b: Bound, t: str) -> str:
    """The legacy SoftmaxActivation: mode="instance" (the default) is a softmax over the last
    axis (measured in MXNet 1.9.1 on 3-D input too), mode="channel" over axis 1."""
    _unknown(b)
    mode = b.lit("mode", "instance")
    if mode not in ("instance", "channel"):
        raise Manual(f"mode={code(b.get('mode'))} is not a literal 'instance' or 'channel'")
    return f"{t}.softmax({_x(b)}, dim={-1 if mode == 'instance' else 1})"


_add("SoftmaxActivation", ("data", "mode"), _softmax_activation,
     [Case("OP(a)", {"a": (3, 4)}), Case("OP(a)", {"a": (2, 3, 4)}), Case("OP(a, mode='channel')", {"a": (2, 3, 4)}),
      Case("OP(data=a, mode='instance')", {"a": (2, 5)})])


def _binary(op: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        return f"{atom(b.get('lhs'))} {op} {atom(b.get('rhs'))}"
    return build


for _name, _op in (("broadcast_add", "+"), ("broadcast_sub", "-"), ("broadcast_mul", "*"), ("broadcast_div", "/"),
                   ("elemwise_add", "+"), ("elemwise_sub", "-"), ("elemwise_mul", "*"), ("elemwise_div", "/"),
                   ("broadcast_plus", "+"), ("broadcast_minus", "-")):
    shapes = {"a": (3, 4), "b": (1, 4)} if _name.startswith("broadcast") else {"a": (3, 4), "b": (3, 4)}
    _add(_name, ("lhs", "rhs"), _binary(_op),
         [Case("OP(a, b + 2.0)" if _op == "/" else "OP(a, b)", shapes)])


def _power(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.pow({code(b.get('base'))}, {code(b.get('exp'))})"


_add("power", ("base", "exp"), _power, [Case("OP(a + 2.0, b)", {"a": (3, 4), "b": (3, 4)})])
_add("broadcast_power", ("base", "exp"), _power, [Case("OP(a + 2.0, b)", {"a": (3, 4), "b": (1, 4)})])


def _extremum(fn: str, clamp: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        lhs, rhs = b.get("lhs"), b.get("rhs")
        if lhs is None or rhs is None:
            raise Manual("two operands")
        lv, rv = literal(lhs), literal(rhs)
        if isinstance(rv, (int, float)) and not isinstance(rv, bool):
            return f"{t}.clamp({code(lhs)}, {clamp}={code(rhs)})"
        if isinstance(lv, (int, float)) and not isinstance(lv, bool):
            return f"{t}.clamp({code(rhs)}, {clamp}={code(lhs)})"
        return f"{t}.{fn}({code(lhs)}, {code(rhs)})"
    return build


for _name, _fn, _cl in (("maximum", "maximum", "min"), ("minimum", "minimum", "max"),
                        ("broadcast_maximum", "maximum", "min"), ("broadcast_minimum", "minimum", "max")):
    _add(_name, ("lhs", "rhs"), _extremum(_fn, _cl),
         [Case("OP(a, b)", {"a": (3, 4), "b": (3, 4)})] + ([Case("OP(a, 0.25)", {"a": (3, 4)})]
                                                           if not _name.startswith("broadcast") else []))


def _clip(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.clamp({_x(b)}, {b.text('a_min')}, {b.text('a_max')})"


_add("clip", ("data", "a_min", "a_max"), _clip, [Case("OP(a, -0.5, 0.5)", {"a": (3, 4)})])


def _where(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.where({atom(b.get('condition'))} != 0, {code(b.get('x'))}, {code(b.get('y'))})"


_add("where", ("condition", "x", "y"), _where, [Case("OP(a > 0, b, c)", {"a": (3, 4), "b": (3, 4), "c": (3, 4)})])


def _like(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        return f"{t}.{fn}({_x(b)})"
    return build


_add("zeros_like", ("data",), _like("zeros_like"), [Case("OP(a)", {"a": (3, 4)})])
_add("ones_like", ("data",), _like("ones_like"), [Case("OP(a)", {"a": (3, 4)})])


# ----------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------
def _axis_text(b: Bound) -> Optional[str]:
    node = b.get("axis")
    if node is None:
        return None
    v = literal(node)
    if v is None or v == ():
        return None
    if v is NOT_LITERAL:
        raise Manual("axis is not a literal (None means every axis in MXNet, and the result shape differs)")
    return code(node)


def _reduce(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, exclude=False)
        keep = b.lit("keepdims", False)
        if keep is NOT_LITERAL:
            raise Manual("keepdims is not a literal")
        axis = _axis_text(b)
        if axis is None:
            # the NDArray API has no 0-d arrays: a full reduction has shape (1,) (or all ones)
            if keep:
                return f"{t}.{fn}({_x(b)}).reshape([1] * {atom(b.get('data'))}.dim())"
            return f"{t}.{fn}({_x(b)}).reshape(1)"
        return f"{t}.{fn}({_x(b)}, dim={axis}" + (", keepdim=True)" if keep else ")")
    return build


for _name, _fn in (("sum", "sum"), ("mean", "mean"), ("prod", "prod"), ("max", "amax"), ("min", "amin")):
    cases = [Case("OP(a)", {"a": (3, 4)}), Case("OP(a, axis=1)", {"a": (3, 4)}),
             Case("OP(a, axis=0, keepdims=True)", {"a": (3, 4)}), Case("OP(a, keepdims=True)", {"a": (3, 4)})]
    if _name != "prod":
        cases.append(Case("OP(a, axis=(1, 2))", {"a": (2, 3, 4)}))
    _add(_name, ("data", "axis", "keepdims", "exclude"), _reduce(_fn), cases,
         aliases=("sum_axis",) if _name == "sum" else ())


def _arg(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        keep = b.lit("keepdims", False)
        axis = b.get("axis")
        if axis is None or literal(axis) is None:
            raise Manual(f"{fn} over every axis (axis=None): MXNet's flat index; write it explicitly")
        data = b.get("data")
        dtype = f"{atom(data)}.dtype" if isinstance(data, (cst.Name, cst.Attribute)) else f"{t}.float32"
        return f"{t}.{fn}({code(data)}, dim={code(axis)}" + (", keepdim=True)" if keep else ")") + f".to({dtype})"
    return build


_add("argmax", ("data", "axis", "keepdims"), _arg("argmax"),
     [Case("OP(a, axis=1)", {"a": (3, 4)}), Case("OP(a, axis=0, keepdims=True)", {"a": (3, 4)})])
_add("argmin", ("data", "axis", "keepdims"), _arg("argmin"), [Case("OP(a, axis=1)", {"a": (3, 4)})])


def _norm(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, out_dtype=None)
    ord_ = b.lit("ord", 2)
    if ord_ not in (1, 2):
        raise Manual("norm ord other than 1 or 2")
    keep = b.lit("keepdims", False)
    axis = _axis_text(b)
    if axis is None:
        if keep:
            raise Manual("norm over every axis with keepdims")
        return f"{t}.linalg.vector_norm({_x(b)}, {ord_}).reshape(1)"
    return f"{t}.linalg.vector_norm({_x(b)}, {ord_}, dim={axis}" + (", keepdim=True)" if keep else ")")


_add("norm", ("data", "ord", "axis", "out_dtype", "keepdims"), _norm,
     [Case("OP(a)", {"a": (3, 4)}), Case("OP(a, axis=1)", {"a": (3, 4)}), Case("OP(a, ord=1, axis=0)", {"a": (3, 4)})])


# ----------------------------------------------------------------------------------------
# Shapes, joins, products
# ----------------------------------------------------------------------------------------
def _join(fn: str, dim_name: str, default: str):
    def build(b: Bound, t: str) -> str:
        data = b.args.get("*data") or []
        if b.unknown or not data:
            raise Manual("the arrays to join must be listed (no *args)")
        return f"{t}.{fn}([{', '.join(code(d) for d in data)}], dim={b.text(dim_name, default)})"
    return build


_add("concat", ("dim", "num_args"), _join("cat", "dim", "1"),
     [Case("OP(a, b)", {"a": (2, 3), "b": (2, 4)}), Case("OP(a, b, dim=0)", {"a": (2, 3), "b": (1, 3)})],
     variadic=True, aliases=("Concat",))
_add("stack", ("axis", "num_args"), _join("stack", "axis", "0"),
     [Case("OP(a, b)", {"a": (2, 3), "b": (2, 3)}), Case("OP(a, b, axis=2)", {"a": (2, 3), "b": (2, 3)})],
     variadic=True)


def _flatten(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.flatten({_x(b)}, 1)"


_add("flatten", ("data",), _flatten, [Case("OP(a)", {"a": (2, 3, 4)}), Case("OP(a)", {"a": (2, 3)})],
     aliases=("Flatten",))


def _reshape(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, reverse=False)
    shape = b.lit("shape")
    if shape is NOT_LITERAL or not isinstance(shape, tuple) or any(not isinstance(s, int) for s in shape):
        raise Manual("reshape with a shape that is not a literal tuple (MXNet's special codes 0, -2, -3, -4 "
                     "cannot be checked)")
    if any(s in (0, -2, -3, -4) for s in shape):
        # MXNet's special codes: the emitted gluon_reshape computes the shape from the input's
        return f"gluon_reshape({_x(b)}, {code(b.get('shape'))})"
    return f"{t}.reshape({_x(b)}, {code(b.get('shape'))})"


_add("reshape", ("data", "shape", "reverse"), _reshape, [Case("OP(a, shape=(4, 3))", {"a": (3, 4)}),
                                                       Case("OP(a, shape=(-1, 2))", {"a": (3, 4)}),
                                                       Case("OP(a, shape=(-3, -1))", {"a": (2, 3, 4)}),
                                                       Case("OP(a, shape=(0, -1))", {"a": (2, 3, 4)}),
                                                       Case("OP(a, shape=(-4, 2, -1, -2))", {"a": (4, 3, 5)}),
                                                       Case("OP(a, shape=(0, -3, 1))", {"a": (2, 3, 4)}),
                                                       Case("OP(a, shape=(-2, 1))", {"a": (2, 3)})],
     aliases=("Reshape",))


def _transpose(b: Bound, t: str) -> str:
    _unknown(b)
    axes = b.lit("axes", ())
    if axes is NOT_LITERAL:
        raise Manual("axes not a literal")
    if not axes:
        data = b.get("data")
        if not isinstance(data, cst.Name):
            raise Manual("transpose without axes of an expression: name it first")
        return f"{t}.permute({data.value}, tuple(range({data.value}.dim() - 1, -1, -1)))"
    return f"{t}.permute({_x(b)}, {code(b.get('axes'))})"


_add("transpose", ("data", "axes"), _transpose,
     [Case("OP(a)", {"a": (2, 3, 4)}), Case("OP(a, axes=(1, 0, 2))", {"a": (2, 3, 4)})])


def _swapaxes(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.transpose({_x(b)}, {b.text('dim1', '0')}, {b.text('dim2', '0')})"


_add("swapaxes", ("data", "dim1", "dim2"), _swapaxes, [Case("OP(a, 0, 2)", {"a": (2, 3, 4)})],
     aliases=("SwapAxis",))


def _expand_dims(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.unsqueeze({_x(b)}, {b.text('axis')})"


_add("expand_dims", ("data", "axis"), _expand_dims, [Case("OP(a, axis=1)", {"a": (3, 4)})])


def _squeeze(b: Bound, t: str) -> str:
    _unknown(b)
    axis = b.lit("axis", None)
    if axis is None:
        return f"{t}.squeeze({_x(b)})"
    return f"{t}.squeeze({_x(b)}, {b.text('axis')})"


_add("squeeze", ("data", "axis"), _squeeze, [Case("OP(a)", {"a": (3, 1, 4)}), Case("OP(a, axis=1)", {"a": (3, 1, 4)})])


def _dot(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, forward_stype=None)
    lhs, rhs = code(b.get("lhs")), code(b.get("rhs"))
    if b.lit("transpose_a", False) is True:
        lhs = f"{atom(b.get('lhs'))}.T"
    if b.lit("transpose_b", False) is True:
        rhs = f"{atom(b.get('rhs'))}.T"
    for name in ("transpose_a", "transpose_b"):
        if b.lit(name, False) not in (True, False):
            raise Manual(f"{name} not a literal")
    return f"{t}.tensordot({lhs}, {rhs}, dims=1)"


_add("dot", ("lhs", "rhs", "transpose_a", "transpose_b", "forward_stype"), _dot,
     [Case("OP(a, b)", {"a": (3, 4), "b": (4, 5)}), Case("OP(a, b, transpose_b=True)", {"a": (3, 4), "b": (5, 4)}),
      Case("OP(a, b)", {"a": (2, 3, 4), "b": (4, 5)})])


def _batch_dot(b: Bound, t: str) -> str:
    _unknown(b)
    lhs, rhs = code(b.get("lhs")), code(b.get("rhs"))
    if b.lit("transpose_a", False) is True:
        lhs = f"{atom(b.get('lhs'))}.transpose(1, 2)"
    if b.lit("transpose_b", False) is True:
        rhs = f"{atom(b.get('rhs'))}.transpose(1, 2)"
    return f"{t}.bmm({lhs}, {rhs})"


_add("batch_dot", ("lhs", "rhs", "transpose_a", "transpose_b"), _batch_dot,
     [Case("OP(a, b)", {"a": (2, 3, 4), "b": (2, 4, 5)}),
      Case("OP(a, b, transpose_a=True)", {"a": (2, 4, 3), "b": (2, 4, 5)})])


def _one_hot(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, on_value=1.0, off_value=0.0, dtype="float32")
    return f"{t}.nn.functional.one_hot({atom(b.get('indices'))}.long(), {b.text('depth')}).float()"


_add("one_hot", ("indices", "depth", "on_value", "off_value", "dtype"), _one_hot,
     [Case("OP(a, 5)", {"a": "int:(4,)"})])


def _take(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, mode="clip")
    idx = b.get("indices")
    axis = b.lit("axis", 0)
    if axis != 0:
        raise Manual("take along an axis other than 0")
    return f"{atom(b.get('a'))}[{atom(idx)}.long()]"


_add("take", ("a", "indices", "axis", "mode"), _take,
     [Case("OP(a, b)", {"a": (5, 3), "b": "int:(2, 4)"})])


def _embedding(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, sparse_grad=False)
    return f"{t}.nn.functional.embedding({atom(b.get('data'))}.long(), {code(b.get('weight'))})"


_add("Embedding", ("data", "weight", "input_dim", "output_dim", "dtype", "sparse_grad"), _embedding,
     [Case("OP(b, a, input_dim=5, output_dim=3)", {"a": (5, 3), "b": "int:(2, 4)"})])


def _slice_axis(b: Bound, t: str) -> str:
    _unknown(b)
    axis, begin, end = b.lit("axis"), b.lit("begin"), b.lit("end")
    if not all(isinstance(v, int) for v in (axis, begin)) or not (end is None or isinstance(end, int)):
        raise Manual("slice_axis with non-literal axis/begin/end")
    if axis < 0:
        raise Manual("slice_axis with a negative axis")
    index = ", ".join([":"] * axis + [f"{begin}:{'' if end is None else end}"])
    return f"{atom(b.get('data'))}[{index}]"


_add("slice_axis", ("data", "axis", "begin", "end"), _slice_axis,
     [Case("OP(a, axis=1, begin=1, end=3)", {"a": (2, 4, 3)}), Case("OP(a, axis=0, begin=1, end=None)", {"a": (3, 2)})])


def _split(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, squeeze_axis=False)
    n = b.lit("num_outputs")
    if not isinstance(n, int) or n < 2:
        raise Manual("split with num_outputs < 2 or not a literal (MXNet returns one array, not a list, for 1)")
    return f"list({t}.chunk({_x(b)}, {n}, dim={b.text('axis', '1')}))"


_add("split", ("data", "num_outputs", "axis", "squeeze_axis"), _split,
     [Case("OP(a, 2)", {"a": (3, 4)}), Case("OP(a, num_outputs=3, axis=0)", {"a": (3, 4)})],
     aliases=("SliceChannel",))


def _tile(b: Bound, t: str) -> str:
    _unknown(b)
    return f"{t}.tile({_x(b)}, {b.text('reps')})"


_add("tile", ("data", "reps"), _tile, [Case("OP(a, reps=(2, 1))", {"a": (2, 3)}), Case("OP(a, (2,))", {"a": (2, 3)})])


def _flipper(every_axis: bool):
    """``flip`` / ``reverse``: axis an int or a tuple of them, required by the NDArray API;
    ``mx.np.flip``'s None (``every_axis``) flips every axis. MXNet 1.9.1 rejects a negative
    axis (``index = -1 must be in range``) and flips a repeated axis once per mention
    (measured): both are left for a person."""
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, out=None)
        axis = b.lit("axis", None)
        if axis is None:
            data = b.get("data")
            if not every_axis:
                raise Manual("flip without axis (MXNet requires it)")
            if not isinstance(data, cst.Name):
                raise Manual("flip of every axis of an expression: name it first")
            return f"{t}.flip({data.value}, dims=tuple(range({data.value}.dim())))"
        axes = axis if isinstance(axis, tuple) else (axis,)
        if axis is NOT_LITERAL or not axes or not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
            raise Manual("axis is not a literal int or tuple of ints")
        if any(a < 0 for a in axes):
            raise Manual("a negative axis: MXNet 1.9.1 rejects it (the original raises here)")
        if len(set(axes)) != len(axes):
            raise Manual("an axis named twice: MXNet flips it once per mention")
        dims = f"({axes[0]},)" if len(axes) == 1 else f"({', '.join(map(str, axes))})"
        return f"{t}.flip({_x(b)}, dims={dims})"
    return build


_add("flip", ("data", "axis"), _flipper(False),
     [Case("OP(a, axis=1)", {"a": (2, 3, 4)}), Case("OP(a, axis=(0, 2))", {"a": (2, 3, 4)}), Case("OP(a, 0)", {"a": (3, 4)}),
      Case("OP(a, axis=[2, 0])", {"a": (2, 3, 4)})],
     aliases=("reverse",))


def _repeat(b: Bound, t: str) -> str:
    _unknown(b)
    axis = b.get("axis")
    if axis is None or literal(axis) is None:
        return f"{t}.repeat_interleave({_x(b)}, {b.text('repeats')})"
    return f"{t}.repeat_interleave({_x(b)}, {b.text('repeats')}, dim={code(axis)})"


_add("repeat", ("data", "repeats", "axis"), _repeat,
     [Case("OP(a, repeats=2, axis=1)", {"a": (2, 3)}), Case("OP(a, 3)", {"a": (2, 3)})])


def _broadcast_to(b: Bound, t: str) -> str:
    _unknown(b)
    shape = b.lit("shape")
    if not isinstance(shape, tuple) or any(not isinstance(s, int) or s == 0 for s in shape):
        raise Manual("broadcast_to with a shape that is not a literal tuple without 0 (0 keeps a dimension in MXNet)")
    return f"{atom(b.get('data'))}.expand({code(b.get('shape'))})"


_add("broadcast_to", ("data", "shape"), _broadcast_to, [Case("OP(a, shape=(3, 4))", {"a": (1, 4)})])


def _broadcast_like(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, lhs_axes=None, rhs_axes=None)
    return f"{atom(b.get('lhs'))}.expand_as({code(b.get('rhs'))})"


_add("broadcast_like", ("lhs", "rhs", "lhs_axes", "rhs_axes"), _broadcast_like,
     [Case("OP(a, b)", {"a": (1, 4), "b": (3, 4)})])


def _pick(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, mode="clip")
    axis = b.lit("axis", -1)
    keep = b.lit("keepdims", False)
    if not isinstance(axis, int) or keep not in (True, False):
        raise Manual("pick with a non-literal axis or keepdims")
    index = f"{atom(b.get('index'))}.long().unsqueeze({axis})"
    picked = f"{t}.gather({_x(b)}, {axis}, {index})"
    return picked if keep else f"{picked}.squeeze({axis})"


_add("pick", ("data", "index", "axis", "mode", "keepdims"), _pick,
     [Case("OP(a, b)", {"a": (3, 5), "b": "int:(3,)"}), Case("OP(a, b, axis=0, keepdims=True)", {"a": (5, 3), "b": "int:(3,)"})])


# ----------------------------------------------------------------------------------------
# mx.np (NumPy semantics: full reductions are 0-d, argmax gives int64) and mx.npx
# ----------------------------------------------------------------------------------------
NP_OPS: dict[str, Op] = {}


def _np_add(name, params, build, cases=(), variadic=False):
    NP_OPS[name] = Op(name, tuple(params), build, tuple(cases), variadic)


for _name in ("exp", "log", "sqrt", "abs", "square", "negative", "sin", "cos", "tanh", "floor", "ceil", "sign",
              "log1p", "expm1", "reciprocal"):
    _np_add(_name, ("data",), _unary(_UNARY[_name]), [Case(f"OP({_unary_input(_name)})", {"a": (3, 4)})])
_np_add("absolute", ("data",), _unary("{t}.abs"), [Case("OP(a)", {"a": (3, 4)})])


def _np_reduce(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, dtype=None, out=None)
        keep = b.lit("keepdims", False)
        if keep is NOT_LITERAL:
            raise Manual("keepdims is not a literal")
        axis = _axis_text(b)
        if axis is None:
            if keep:
                return f"{t}.{fn}({_x(b)}).reshape([1] * {atom(b.get('data'))}.dim())"
            return f"{t}.{fn}({_x(b)})"  # NumPy semantics: a 0-d array
        return f"{t}.{fn}({_x(b)}, dim={axis}" + (", keepdim=True)" if keep else ")")
    return build


for _name, _fn in (("sum", "sum"), ("mean", "mean"), ("prod", "prod"), ("max", "amax"), ("min", "amin"),
                   ("amax", "amax"), ("amin", "amin")):
    _np_add(_name, ("data", "axis", "dtype", "out", "keepdims"), _np_reduce(_fn),
            [Case("OP(a)", {"a": (3, 4)}), Case("OP(a, axis=1)", {"a": (3, 4)}),
             Case("OP(a, axis=0, keepdims=True)", {"a": (3, 4)})])


def _np_arg(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, out=None)
        axis = b.get("axis")
        if axis is None or literal(axis) is None:
            return f"{t}.{fn}({_x(b)})"
        return f"{t}.{fn}({_x(b)}, dim={code(axis)})"
    return build


_np_add("argmax", ("data", "axis", "out"), _np_arg("argmax"), [Case("OP(a)", {"a": (3, 4)}), Case("OP(a, axis=1)", {"a": (3, 4)})])
_np_add("argmin", ("data", "axis", "out"), _np_arg("argmin"), [Case("OP(a, axis=0)", {"a": (3, 4)})])


def _np_join(fn: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, out=None)
        return f"{t}.{fn}({code(b.get('seq'))}, dim={b.text('axis', '0')})"
    return build


_np_add("concatenate", ("seq", "axis", "out"), _np_join("cat"),
        [Case("OP([a, b])", {"a": (2, 3), "b": (1, 3)}), Case("OP((a, b), axis=1)", {"a": (2, 3), "b": (2, 2)})])
_np_add("stack", ("seq", "axis", "out"), _np_join("stack"),
        [Case("OP([a, b])", {"a": (2, 3), "b": (2, 3)}), Case("OP([a, b], axis=1)", {"a": (2, 3), "b": (2, 3)})])


def _np_reshape(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, order="C")
    return f"{t}.reshape({_x(b)}, {b.text('newshape')})"


_np_add("reshape", ("data", "newshape", "order"), _np_reshape, [Case("OP(a, (4, 3))", {"a": (3, 4)}),
                                                            Case("OP(a, (-1,))", {"a": (3, 4)})])


def _np_transpose(b: Bound, t: str) -> str:
    _unknown(b)
    axes = b.lit("axes", None)
    if axes is None:
        data = b.get("data")
        if not isinstance(data, cst.Name):
            raise Manual("transpose without axes of an expression: name it first")
        return f"{t}.permute({data.value}, tuple(range({data.value}.dim() - 1, -1, -1)))"
    return f"{t}.permute({_x(b)}, {b.text('axes')})"


_np_add("transpose", ("data", "axes"), _np_transpose,
        [Case("OP(a)", {"a": (2, 3, 4)}), Case("OP(a, (1, 0, 2))", {"a": (2, 3, 4)})])


def _np_binary(op: str):
    def build(b: Bound, t: str) -> str:
        _unknown(b)
        _no(b, out=None)
        return f"{atom(b.get('lhs'))} {op} {atom(b.get('rhs'))}"
    return build


for _name, _op in (("add", "+"), ("subtract", "-"), ("multiply", "*"), ("divide", "/"), ("true_divide", "/")):
    _np_add(_name, ("lhs", "rhs", "out"), _np_binary(_op),
            [Case("OP(a, b + 3.0)" if _op == "/" else "OP(a, b)", {"a": (3, 4), "b": (1, 4)})])
_np_add("power", ("base", "exp", "out"), _power, [Case("OP(a + 2.0, b)", {"a": (3, 4), "b": (3, 4)})])


def _np_matmul(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, out=None)
    return f"{t}.matmul({code(b.get('lhs'))}, {code(b.get('rhs'))})"


_np_add("matmul", ("lhs", "rhs", "out"), _np_matmul,
        [Case("OP(a, b)", {"a": (3, 4), "b": (4, 5)}), Case("OP(a, b)", {"a": (2, 3, 4), "b": (2, 4, 5)})])
for _name, _fn, _cl in (("maximum", "maximum", "min"), ("minimum", "minimum", "max")):
    _np_add(_name, ("lhs", "rhs", "out"), _extremum(_fn, _cl),
            [Case("OP(a, b)", {"a": (3, 4), "b": (3, 4)}), Case("OP(a, 0.25)", {"a": (3, 4)})])


def _np_clip(b: Bound, t: str) -> str:
    _unknown(b)
    _no(b, out=None)
    return f"{t}.clamp({_x(b)}, {b.text('a_min')}, {b.text('a_max')})"


_np_add("clip", ("data", "a_min", "a_max", "out"), _np_clip, [Case("OP(a, -0.5, 0.5)", {"a": (3, 4)})])
_np_add("where", ("condition", "x", "y"), _where, [Case("OP(a > 0, b, c)", {"a": (3, 4), "b": (3, 4), "c": (3, 4)})])
_np_add("expand_dims", ("data", "axis"), _expand_dims, [Case("OP(a, 1)", {"a": (3, 4)})])
_np_add("squeeze", ("data", "axis"), _squeeze, [Case("OP(a)", {"a": (3, 1, 4)}), Case("OP(a, axis=1)", {"a": (3, 1, 4)})])
_np_add("zeros_like", ("data",), _like("zeros_like"), [Case("OP(a)", {"a": (3, 4)})])
_np_add("flip", ("data", "axis", "out"), _flipper(True), [Case("OP(a)", {"a": (2, 3)}), Case("OP(a, 1)", {"a": (2, 3, 4)}),
                                              Case("OP(a, axis=(0, 1))", {"a": (2, 3, 4)})])
_np_add("ones_like", ("data",), _like("ones_like"), [Case("OP(a)", {"a": (3, 4)})])

# mx.npx: the neural-network operators of the NumPy interface, with the NDArray API's signatures
NPX_OPS: dict[str, Op] = {n: OPS[o] for n, o in (
    ("relu", "relu"), ("sigmoid", "sigmoid"), ("softmax", "softmax"), ("log_softmax", "log_softmax"),
    ("activation", "Activation"), ("leaky_relu", "LeakyReLU"), ("batch_dot", "batch_dot"), ("one_hot", "one_hot"))}


# ----------------------------------------------------------------------------------------
# Lookup
# ----------------------------------------------------------------------------------------
NAMESPACES = ("mxnet.nd", "mxnet.ndarray", "mxnet.sym", "mxnet.symbol")
# calls of those namespaces that are not operators of the table: arrays made and synced by the
# script rules (GL004-GL006, which report what they leave), the array type
NOT_OPS = frozenset({"array", "arange", "ones", "zeros", "full", "empty", "random_normal", "random_uniform",
                     "waitall", "NDArray"})
# submodules of the NDArray API whose calls the script rules translate (GL005: mx.nd.random.*)
_SUBMODULES_ELSEWHERE = ("random",)


def submodule_op(qualname: str) -> Optional[str]:
    """``mxnet.nd.contrib.box_nms`` (an operator of a submodule of the NDArray or Symbol API,
    which the table does not cover) -> its name with the namespace normalised; else None."""
    for ns in NAMESPACES:
        if qualname.startswith(ns + "."):
            parts = qualname[len(ns) + 1:].split(".")
            if len(parts) >= 2 and parts[0] not in _SUBMODULES_ELSEWHERE and parts[-1][:1].isalpha():
                return "mxnet.nd." + ".".join(parts) if ns.startswith("mxnet.nd") else qualname
    return None
TABLES = {"mxnet.nd": OPS, "mxnet.ndarray": OPS, "mxnet.sym": OPS, "mxnet.symbol": OPS,
          "mxnet.np": NP_OPS, "mxnet.numpy": NP_OPS, "mxnet.npx": NPX_OPS, "mxnet.numpy_extension": NPX_OPS}


def _without_name(call: cst.Call) -> cst.Call:
    """Every MXNet operator takes ``name=`` (the symbol's name in a graph): it changes no value."""
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == "name")]
    if len(args) == len(call.args):
        return call
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)


def build(op: Op, call: cst.Call, torch: str) -> str:
    call = _without_name(call)
    if op.variadic:
        data, rest = [], []
        for a in call.args:
            if a.star:
                rest.append(a)
            elif a.keyword is None:
                data.append(a.value)
            else:
                rest.append(a)
        b = bind(call.with_changes(args=[a for a in rest if not a.star]), op.params)
        if any(a.star for a in rest):
            b.unknown.append("*")
        b.args["*data"] = data
        return op.build(b, torch)
    return op.build(bind(call, op.params), torch)


def render_markdown() -> str:
    """The tables as Markdown: each op's first test case and what it becomes."""
    out = []
    for title, prefix, table in (("`F.*` / `mx.nd.*` / `mx.sym.*`", "F", OPS), ("`mx.np.*`", "mx.np", NP_OPS),
                                 ("`mx.npx.*`", "mx.npx", NPX_OPS)):
        out += [f"{title}:", "", "| MXNet | torch |", "| --- | --- |"]
        seen = set()
        for name, op in sorted(table.items()):
            if not op.cases or (id(op), name) in seen:
                continue
            seen.add((id(op), name))
            expr = op.cases[0].expr.replace("OP", f"{prefix}.{name}")
            call = cst.parse_expression(op.cases[0].expr.replace("OP", "F"))
            try:
                torch_text = build(op, call, "torch")
            except Manual as exc:  # pragma: no cover - every first case translates (tests)
                torch_text = f"manual: {exc}"
            out.append(f"| `{expr}` | `{torch_text}` |")
        out.append("")
    return "\n".join(out)


def all_f_calls_translate(fn: cst.FunctionDef) -> bool:
    """Whether every ``F.<op>(...)`` in ``hybrid_forward(self, F, ...)`` has a translation
    (GL101 keeps ``F`` and the Gluon signature otherwise, so the untranslated call stays
    visible and reported)."""
    from porter import astutil

    params = fn.params.params
    if len(params) < 2:
        return True
    f = params[1].name.value
    for node in astutil.walk(fn.body, into_functions=True):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Name) \
                and node.func.value.value == f:
            op = OPS.get(node.func.attr.value)
            if op is None:
                return False
            try:
                build(op, node, "torch")
            except Manual:
                return False
        elif isinstance(node, cst.Name) and node.value == f and not _is_call_receiver(node, fn):
            return False  # F passed on, or an F.<op> that is not called here (`act = F.Activation`)
    return True


def _is_call_receiver(name: cst.Name, fn: cst.FunctionDef) -> bool:
    """``F`` in ``F.<op>(...)``."""
    from porter import astutil

    for node in astutil.walk(fn.body, into_functions=True):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.value is name:
            return True
    return False
