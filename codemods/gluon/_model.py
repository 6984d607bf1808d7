"""Shared facts of the Gluon model rules (GL1xx): which names are Gluon blocks and layers,
what a layer's output size is (so the next layer's lazy input size can be resolved from the
code), the local name torch's ``nn`` has in the file, the emitted helper code
(templates/gluon_layers.py.j2), and the ``# porter: manual`` marking.

Everything is decided on the Gluon code of the first pass: the rules of one pass see the
same tree, so a BatchNorm after a Conv2D reads the Conv2D's ``channels`` before either is
rewritten.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import jinja2
import libcst as cst

from porter import astutil
from porter.astutil import NOT_LITERAL as NOT_LITERAL
from porter.astutil import code as code
from porter.astutil import report_manual as report_manual
from porter._layout import templates_dir
from porter.context import FileContext
from porter.rules import Edit

GLUON_NN = "mxnet.gluon.nn"
GLUON_RNN = "mxnet.gluon.rnn"
BLOCK_BASES = frozenset({
    "mxnet.gluon.Block", "mxnet.gluon.HybridBlock", "mxnet.gluon.nn.Block", "mxnet.gluon.nn.HybridBlock",
    "mxnet.gluon.block.Block", "mxnet.gluon.block.HybridBlock",
})
SEQUENTIALS = frozenset({"Sequential", "HybridSequential"})
# mxnet.gluon.contrib.nn's containers that feed one input to every child and concatenate the outputs
CONCURRENTS = frozenset({"Concurrent", "HybridConcurrent"})
GLUON_CONTRIB_NN = "mxnet.gluon.contrib.nn"
# Gluon layer names torch.nn does not have (a Gluon layer left as it was, once `nn` is torch's)
GLUON_ONLY = frozenset({
    "Dense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose", "BatchNorm",
    "InstanceNorm", "Activation", "MaxPool1D", "MaxPool2D", "MaxPool3D", "AvgPool1D", "AvgPool2D", "AvgPool3D",
    "GlobalAvgPool1D", "GlobalAvgPool2D", "GlobalAvgPool3D", "GlobalMaxPool1D", "GlobalMaxPool2D",
    "GlobalMaxPool3D", "HybridSequential", "HybridBlock", "Block", "SymbolBlock", "Lambda", "HybridLambda", "Swish",
    "ReflectionPad2D", "PixelShuffle1D", "PixelShuffle2D", "PixelShuffle3D", "Concatenate", "HybridConcatenate",
    "BatchNormReLU", "SequentialRNNCell", "HybridSequentialRNNCell", "DropoutCell", "ZoneoutCell", "ResidualCell",
    "BidirectionalCell", "VariationalDropoutCell", "LSTMPCell", "HybridRecurrentCell", "RecurrentCell",
})

def gluon_layer(node: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """``nn.Dense`` / ``gluon.nn.Dense`` / ``mx.gluon.rnn.LSTM`` (through the imports) ->
    "Dense" / "LSTM"; anything else None."""
    q = ctx.qualname(node)
    if not q:
        return None
    for prefix in (GLUON_NN + ".", GLUON_RNN + ".", "mxnet.gluon.nn.basic_layers.", "mxnet.gluon.nn.conv_layers.",
                   "mxnet.gluon.rnn.rnn_layer.", GLUON_CONTRIB_NN + ".", GLUON_CONTRIB_NN + ".basic_layers."):
        if q.startswith(prefix) and "." not in q[len(prefix):]:
            return q[len(prefix):]
    return None


def is_block_class(cls: cst.ClassDef, ctx: FileContext) -> bool:
    return any(ctx.qualname(b.value) in BLOCK_BASES for b in cls.bases)


def torch_nn(ctx: FileContext) -> tuple[str, tuple[str, ...]]:
    """The expression for torch.nn in this file once GL100 has rewritten the Gluon imports,
    and the imports a fix needs for it."""
    if GLUON_NN in ctx.module_names and "." not in ctx.module_names[GLUON_NN]:
        return ctx.module_names[GLUON_NN], ()  # `from mxnet.gluon import nn` becomes `from torch import nn`
    if "torch.nn" in ctx.module_names:
        return ctx.module_names["torch.nn"], ()
    if GLUON_RNN in ctx.module_names and "." not in ctx.module_names[GLUON_RNN]:
        return ctx.module_names[GLUON_RNN], ()  # `from mxnet.gluon import rnn` -> `from torch import nn as rnn`
    return "torch.nn", ("torch.nn",)


def torch_name(ctx: FileContext) -> tuple[str, tuple[str, ...]]:
    if "torch" in ctx.module_names:
        return ctx.module_names["torch"], ()
    return "torch", ("torch",)


# --------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------
# astutil.literal as the Gluon rules read arguments: a list is a tuple (shapes and axes are
# written either way), `+1` is not a literal
literal = functools.partial(astutil.literal, lists_as_tuples=True, unary_plus=False)


@dataclass
class Bound:
    """A Gluon call's arguments bound by the Gluon signature: name -> expression node."""

    args: dict
    unknown: list  # keywords the signature does not have, or *args/**kwargs

    def get(self, name: str) -> Optional[cst.BaseExpression]:
        return self.args.get(name)

    def text(self, name: str, default: Optional[str] = None) -> Optional[str]:
        node = self.args.get(name)
        return code(node) if node is not None else default

    def lit(self, name: str, default=None):
        node = self.args.get(name)
        if node is None:
            return default
        return literal(node)


def bind(call: cst.Call, params: Sequence[str]) -> Bound:
    args: dict = {}
    unknown: list = []
    pos = 0
    for a in call.args:
        if a.star:
            unknown.append(a.star)
        elif a.keyword is None:
            if pos < len(params):
                args[params[pos]] = a.value
            else:
                unknown.append(f"argument {pos + 1}")
            pos += 1
        elif a.keyword.value in params:
            args[a.keyword.value] = a.value
        else:
            unknown.append(a.keyword.value)
    return Bound(args, unknown)


# Gluon signatures (mxnet 1.9.1), positional order
SIGNATURES = {
    "Dense": ("units", "activation", "use_bias", "flatten", "dtype", "weight_initializer", "bias_initializer",
              "in_units", "prefix", "params"),
    "Conv1D": ("channels", "kernel_size", "strides", "padding", "dilation", "groups", "layout", "activation",
               "use_bias", "weight_initializer", "bias_initializer", "in_channels", "prefix", "params"),
    "Conv2D": ("channels", "kernel_size", "strides", "padding", "dilation", "groups", "layout", "activation",
               "use_bias", "weight_initializer", "bias_initializer", "in_channels", "prefix", "params"),
    "Conv3D": ("channels", "kernel_size", "strides", "padding", "dilation", "groups", "layout", "activation",
               "use_bias", "weight_initializer", "bias_initializer", "in_channels", "prefix", "params"),
    "Conv1DTranspose": ("channels", "kernel_size", "strides", "padding", "output_padding", "dilation", "groups",
                        "layout", "activation", "use_bias", "weight_initializer", "bias_initializer",
                        "in_channels", "prefix", "params"),
    "Conv2DTranspose": ("channels", "kernel_size", "strides", "padding", "output_padding", "dilation", "groups",
                        "layout", "activation", "use_bias", "weight_initializer", "bias_initializer",
                        "in_channels", "prefix", "params"),
    "Conv3DTranspose": ("channels", "kernel_size", "strides", "padding", "output_padding", "dilation", "groups",
                        "layout", "activation", "use_bias", "weight_initializer", "bias_initializer",
                        "in_channels", "prefix", "params"),
    "BatchNorm": ("axis", "momentum", "epsilon", "center", "scale", "use_global_stats", "beta_initializer",
                  "gamma_initializer", "running_mean_initializer", "running_variance_initializer",
                  "in_channels", "prefix", "params"),
    "Dropout": ("rate", "axes", "prefix", "params"),
    "Activation": ("activation", "prefix", "params"),
    "LeakyReLU": ("alpha", "prefix", "params"),
    "Flatten": ("prefix", "params"),
    "MaxPool1D": ("pool_size", "strides", "padding", "layout", "ceil_mode", "prefix", "params"),
    "MaxPool2D": ("pool_size", "strides", "padding", "layout", "ceil_mode", "prefix", "params"),
    "MaxPool3D": ("pool_size", "strides", "padding", "layout", "ceil_mode", "prefix", "params"),
    "AvgPool1D": ("pool_size", "strides", "padding", "layout", "ceil_mode", "count_include_pad", "prefix", "params"),
    "AvgPool2D": ("pool_size", "strides", "padding", "layout", "ceil_mode", "count_include_pad", "prefix", "params"),
    "AvgPool3D": ("pool_size", "strides", "padding", "layout", "ceil_mode", "count_include_pad", "prefix", "params"),
    "GlobalAvgPool1D": ("layout", "prefix", "params"),
    "GlobalAvgPool2D": ("layout", "prefix", "params"),
    "GlobalAvgPool3D": ("layout", "prefix", "params"),
    "GlobalMaxPool1D": ("layout", "prefix", "params"),
    "GlobalMaxPool2D": ("layout", "prefix", "params"),
    "GlobalMaxPool3D": ("layout", "prefix", "params"),
    "Embedding": ("input_dim", "output_dim", "dtype", "weight_initializer", "sparse_grad", "prefix", "params"),
    "LSTM": ("hidden_size", "num_layers", "layout", "dropout", "bidirectional", "input_size",
             "i2h_weight_initializer", "h2h_weight_initializer", "i2h_bias_initializer", "h2h_bias_initializer",
             "projection_size", "h2r_weight_initializer", "state_clip_min", "state_clip_max", "state_clip_nan",
             "dtype", "prefix", "params"),
    "GRU": ("hidden_size", "num_layers", "layout", "dropout", "bidirectional", "input_size",
            "i2h_weight_initializer", "h2h_weight_initializer", "i2h_bias_initializer", "h2h_bias_initializer",
            "dtype", "prefix", "params"),
    "Sequential": ("prefix", "params"),
    "HybridSequential": ("prefix", "params"),
    "Concurrent": ("axis", "prefix", "params"),
    "HybridConcurrent": ("axis", "prefix", "params"),
    "Identity": ("prefix", "params"),
    "LayerNorm": ("axis", "epsilon", "center", "scale", "beta_initializer", "gamma_initializer", "in_channels",
                  "prefix", "params"),
    "PReLU": ("alpha_initializer", "in_channels", "prefix", "params"),
    "ELU": ("alpha", "prefix", "params"),
    "SELU": ("prefix", "params"),
    "GELU": ("prefix", "params"),
    "Swish": ("beta", "prefix", "params"),
}


# --------------------------------------------------------------------------------------
# Output sizes: what the next layer's lazy input size is
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Size:
    """What flows out of a layer: its feature/channel count as code (None: unknown) and the
    kind of tensor ("dense": (N, C) rows of a flattening Dense, "last": C on the last axis of
    a tensor of unknown rank (an Embedding, a Dense with flatten=False), "conv1d"/"conv2d"/
    "conv3d": channels-first feature maps, None: unknown)."""

    features: Optional[str]
    kind: Optional[str]


UNKNOWN = Size(None, None)
_PASS_THROUGH = frozenset({"Identity", "BatchNorm", "Dropout", "Activation", "LeakyReLU", "MaxPool1D", "MaxPool2D", "MaxPool3D",
                           "AvgPool1D", "AvgPool2D", "AvgPool3D", "GlobalAvgPool1D", "GlobalAvgPool2D",
                           "GlobalAvgPool3D", "GlobalMaxPool1D", "GlobalMaxPool2D", "GlobalMaxPool3D",
                           "LayerNorm", "PReLU", "ELU", "SELU", "GELU", "Swish"})


def _conv_dims(name: str) -> Optional[int]:
    if name.startswith("Conv") and name[4:6] in ("1D", "2D", "3D"):
        return int(name[4])
    return None


def helper_function(call: cst.Call, ctx: FileContext) -> Optional[tuple[cst.FunctionDef, cst.Call]]:
    """``conv3x3(channels, stride, in_channels)`` where the file defines ``def conv3x3(...)``
    as a single ``return nn.Conv2D(...)``: the function and the Gluon call it returns."""
    if not isinstance(call.func, cst.Name):
        return None
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == call.func.value:
            body = [s for s in stmt.body.body if not _is_docstring(s)] if isinstance(stmt.body, cst.IndentedBlock) else []
            if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1:
                ret = body[0].body[0]
                if isinstance(ret, cst.Return) and isinstance(ret.value, cst.Call) and gluon_layer(ret.value.func, ctx):
                    return stmt, ret.value
    return None


def _is_docstring(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _substitute(expr: cst.BaseExpression, fn: cst.FunctionDef, call: cst.Call) -> Optional[str]:
    """``expr`` (code inside helper ``fn``) with fn's parameters replaced by ``call``'s
    arguments; None when it reads anything else of fn's scope."""
    params = [p.name.value for p in fn.params.params]
    values: dict[str, str] = {}
    for i, a in enumerate(call.args):
        if a.star:
            return None
        if a.keyword is None and i < len(params):
            values[params[i]] = code(a.value)
        elif a.keyword is not None:
            values[a.keyword.value] = code(a.value)
    for p in fn.params.params:
        if p.name.value not in values and p.default is not None:
            values[p.name.value] = code(p.default)
    names = [n for n in astutil.walk(expr) if isinstance(n, cst.Name)]
    if isinstance(expr, cst.Name):
        return values.get(expr.value)
    if any(n.value not in values for n in names):
        return None
    out = code(expr)
    if len(names) == 1:
        return out.replace(names[0].value, f"({values[names[0].value]})")
    return None


def output_size(expr: cst.BaseExpression, ctx: FileContext, before: Size = UNKNOWN) -> Size:
    """The Size a layer expression (a Gluon layer call, a helper returning one) puts out,
    given what flows into it."""
    if not isinstance(expr, cst.Call):
        return UNKNOWN
    name = gluon_layer(expr.func, ctx)
    helper = None
    call = expr
    if name is None:
        found = helper_function(expr, ctx)
        if found is None:
            return UNKNOWN
        helper, call = found
        name = gluon_layer(call.func, ctx)
    sig = SIGNATURES.get(name or "")
    if sig is None:
        return UNKNOWN
    b = bind(call, sig)

    def text(arg: str) -> Optional[str]:
        node = b.get(arg)
        if node is None:
            return None
        return _substitute(node, helper, expr) if helper is not None else code(node)

    if name == "Dense":
        # flatten=True gives (N, units) rows; flatten=False keeps the leading axes (units on the last one)
        flatten = literal(b.get("flatten")) if b.get("flatten") is not None else True
        return Size(text("units"), {True: "dense", False: "last"}.get(flatten) if isinstance(flatten, bool) else None)
    dims = _conv_dims(name)
    if dims:
        return Size(text("channels"), f"conv{dims}d")
    if name == "Embedding":
        return Size(text("output_dim"), "last")  # (..., output_dim): the indices' axes, then the vector
    if name in _PASS_THROUGH:
        return before
    return UNKNOWN


# --------------------------------------------------------------------------------------
# Where a layer's input comes from
# --------------------------------------------------------------------------------------
def sequential_inputs(ctx: FileContext) -> dict:
    """id(layer call) -> Size flowing into it, for the layers added to a Sequential one
    after another (``net.add(a)``, ``net.add(b)`` in one statement list, also inside a
    ``with net.name_scope():``), and for the calls in one ``add(a, b, c)``."""
    memo = ctx.cache.get(("gluon-seq-inputs", None))
    if memo is not None:
        return memo
    out: dict = {}

    def visit_body(stmts: Sequence[cst.CSTNode]) -> None:
        last: dict[str, Size] = {}  # container code -> Size after its last add
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    call = small.value if isinstance(small, cst.Expr) else None
                    if isinstance(call, cst.Call) and astutil.method_name(call) == "add":
                        owner = code(call.func.value)
                        size = last.get(owner, UNKNOWN)
                        for a in call.args:
                            if isinstance(a.value, cst.Call):
                                out[id(a.value)] = size
                                inner = a.value
                                if not gluon_layer(inner.func, ctx) and not helper_function(inner, ctx):
                                    size = UNKNOWN
                                else:
                                    size = output_size(inner, ctx, size)
                            else:
                                size = UNKNOWN
                        last[owner] = size
                    elif isinstance(small, (cst.Assign, cst.AnnAssign)):
                        for t in getattr(small, "targets", ()) or [small]:
                            tgt = t.target
                            last.pop(code(tgt), None)
            elif isinstance(stmt, cst.With) and _name_scope_with(stmt):
                inner_stmts = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else ()
                # a name_scope block continues the enclosing statement list
                visit_inline(inner_stmts, last)
                visit_nested(inner_stmts)
            else:
                last.clear()  # loops and branches: what was added last is not known statically
                visit_nested([stmt])

    def visit_inline(stmts, last) -> None:
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    call = small.value if isinstance(small, cst.Expr) else None
                    if isinstance(call, cst.Call) and astutil.method_name(call) == "add":
                        owner = code(call.func.value)
                        size = last.get(owner, UNKNOWN)
                        for a in call.args:
                            if isinstance(a.value, cst.Call):
                                out[id(a.value)] = size
                                size = output_size(a.value, ctx, size)
                            else:
                                size = UNKNOWN
                        last[owner] = size
            else:
                last.clear()

    def visit_nested(stmts) -> None:
        for stmt in stmts:
            for node in astutil.walk(stmt, into_functions=True):
                if node is not stmt and isinstance(node, (cst.IndentedBlock,)) and node not in seen:
                    seen.add(node)
                    visit_body(node.body)

    seen: set = set()
    visit_body(ctx.module.body)
    ctx.cache[("gluon-seq-inputs", None)] = out
    return out


def _name_scope_with(stmt: cst.With) -> bool:
    return (len(stmt.items) == 1 and isinstance(stmt.items[0].item, cst.Call)
            and astutil.method_name(stmt.items[0].item) == "name_scope" and not stmt.items[0].item.args
            and stmt.items[0].asname is None)


def class_inputs(ctx: FileContext) -> dict:
    """id(layer call in __init__) -> Size flowing into it, from the data flow of the block's
    ``forward``/``hybrid_forward``: ``self.bn1(self.conv1(x))`` makes conv1's output bn1's
    input; ``x = self.pool(...)`` carries it through the name."""
    memo = ctx.cache.get(("gluon-class-inputs", None))
    if memo is not None:
        return memo
    out: dict = {}
    for cls in ctx.module.body:
        if isinstance(cls, cst.ClassDef) and is_block_class(cls, ctx):
            _class_flow(cls, ctx, out)
    ctx.cache[("gluon-class-inputs", None)] = out
    return out


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}


def _class_flow(cls: cst.ClassDef, ctx: FileContext, out: dict) -> None:
    methods = _methods(cls)
    init = methods.get("__init__")
    fwd = methods.get("hybrid_forward") or methods.get("forward")
    if init is None or fwd is None:
        return
    # self.<attr> = <layer call>, assigned once, at the top level of __init__ (name_scope included)
    layers: dict[str, cst.Call] = {}
    counts: dict[str, int] = {}
    for node in astutil.walk(init.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            t = node.targets[0].target
            if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self":
                counts[t.attr.value] = counts.get(t.attr.value, 0) + 1
                if isinstance(node.value, cst.Call):
                    layers[t.attr.value] = node.value
    layers = {k: v for k, v in layers.items() if counts[k] == 1}
    inputs: dict[str, Optional[Size]] = {}
    env: dict[str, Size] = {}

    def flow(expr: cst.CSTNode) -> Size:
        if isinstance(expr, cst.Name):
            return env.get(expr.value, UNKNOWN)
        if isinstance(expr, cst.Call):
            f = expr.func
            if (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self"
                    and f.attr.value in layers):
                arg = expr.args[0].value if expr.args and not expr.args[0].star and expr.args[0].keyword is None else None
                size_in = flow(arg) if arg is not None else UNKNOWN
                for a in expr.args[1:]:
                    flow(a.value)
                attr = f.attr.value
                inputs[attr] = size_in if attr not in inputs or inputs[attr] == size_in else UNKNOWN
                return output_size(layers[attr], ctx, size_in)
            # elementwise activations keep the size: F.relu(x), F.Activation(x, ...), torch.relu(x)
            if isinstance(f, cst.Attribute) and f.attr.value in _SIZE_KEEPING and expr.args:
                first = flow(expr.args[0].value)
                for a in expr.args[1:]:
                    flow(a.value)
                return first
            for a in expr.args:
                flow(a.value)
            return UNKNOWN
        if isinstance(expr, cst.BinaryOperation):
            left, right = flow(expr.left), flow(expr.right)
            return left if left == right else UNKNOWN
        for child in astutil.children(expr):
            flow(child)
        return UNKNOWN

    for stmt in fwd.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            for node in astutil.walk(stmt):
                if isinstance(node, cst.Call):
                    flow(node)
            env.clear()
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                size = flow(small.value)
                for t in small.targets:
                    if isinstance(t.target, cst.Name):
                        env[t.target.value] = size
                    else:
                        for n in astutil.target_names(t.target):
                            env.pop(n, None)
            elif isinstance(small, (cst.Return, cst.Expr)) and small.value is not None:
                flow(small.value)
    for attr, size in inputs.items():
        if size is not None:
            out[id(layers[attr])] = size


_SIZE_KEEPING = frozenset({"relu", "sigmoid", "tanh", "Activation", "LeakyReLU", "softrelu", "softsign",
                           "Dropout", "leaky_relu", "elu", "selu", "gelu"})


def input_size(call: cst.Call, ctx: FileContext) -> Size:
    """What flows into the layer built by ``call``, as far as the code shows."""
    size = sequential_inputs(ctx).get(id(call))
    if size is not None and size != UNKNOWN:
        return size
    size = class_inputs(ctx).get(id(call))
    return size if size is not None else UNKNOWN


# --------------------------------------------------------------------------------------
# Emitted code and manual marks
# --------------------------------------------------------------------------------------
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(templates_dir())), keep_trailing_newline=True,
    autoescape=False, trim_blocks=True, lstrip_blocks=True,
)
HELPERS = ("Dense", "LazyDense", "begin_state", "initialize", "initializers")
HELPER_MARK = "Gluon's"  # every emitted helper's docstring starts with it


def render(names: Sequence[str], torch: str, nn: str) -> list[cst.BaseStatement]:
    text = _ENV.get_template("gluon_layers.py.j2").render(names=set(names), torch=torch, nn=nn)
    return list(cst.parse_module(text).body)


def defined_names(module: cst.Module) -> set[str]:
    return {s.name.value for s in module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))}


def enclosing_forward(ctx: FileContext) -> Optional[cst.FunctionDef]:
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.FunctionDef):
            return anc
    return None


def hybrid_f_name(ctx: FileContext) -> Optional[str]:
    """The name of ``F`` in the enclosing ``hybrid_forward(self, F, ...)``, if any."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.FunctionDef) and anc.name.value == "hybrid_forward":
            params = anc.params.params
            if len(params) >= 2:
                return params[1].name.value
            return None
    return None


def iter_statements(body) -> Iterator[cst.CSTNode]:
    yield from body


def is_gluon_file(ctx: FileContext) -> bool:
    """The file imports something of MXNet (the Gluon rules leave other files alone)."""
    return any(v == "mxnet" or v.startswith("mxnet.") for v in ctx.aliases.values())


def helpers_edit(ctx: FileContext, names: Sequence[str]) -> tuple[Edit, tuple[str, ...]]:
    """An Edit of the module that inserts the emitted helpers ``names`` (those the module
    does not define yet) before its first class or function, and the imports they need."""
    torch, t_imports = torch_name(ctx)
    nn, n_imports = torch_nn(ctx)
    wanted = tuple(names)

    def insert(module: cst.Module) -> cst.Module:
        have = defined_names(module)
        missing = [n for n in wanted if n not in have]
        if not missing:
            return module
        statements = [s for s in render(missing, torch, nn) if not (
            isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value in have)]
        body = list(module.body)
        emitted = _emitted_names()
        at = next((i for i, s in enumerate(body) if isinstance(s, (cst.ClassDef, cst.FunctionDef))), None)
        while at is not None and at < len(body) and isinstance(body[at], (cst.ClassDef, cst.FunctionDef)) \
                and body[at].name.value in emitted:
            at += 1  # after the helpers emitted before, in the template's order
        if at is None:
            at = len(body)
            while at > 0 and not _is_import_line(body[at - 1]):
                at -= 1
            at = max(at, 0)
        statements = [s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for s in statements]
        if at < len(body):
            body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(),
                                                            *[l for l in body[at].leading_lines if l.comment]])
        return module.with_changes(body=[*body[:at], *statements, *body[at:]])

    return Edit(ctx.module, insert), (*t_imports, *n_imports)


_ALL = ("Concurrent", "gluon_conv", "frozen", "gluon_data_dir", "get_model_file", "Dense", "LazyDense", "init_xavier", "init_normal", "init_uniform", "init_constant", "init_zero",
        "init_one", "with_init", "initialize", "begin_state", "gluon_reshape", "with_activation",
        "gluon_imresize", "GluonVisionDataset")


def _emitted_names() -> frozenset:
    memo = ctx_free_cache.get("names")
    if memo is None:
        memo = frozenset(defined_names(cst.Module(render(_ALL, "torch", "nn"))))
        ctx_free_cache["names"] = memo
    return memo


ctx_free_cache: dict = {}


def _is_import_line(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)
