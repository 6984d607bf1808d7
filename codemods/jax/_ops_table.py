"""The torch -> JAX op table: torch functions and tensor methods with their jax.numpy /
jax.nn / jax.lax counterparts, as data.

Each :class:`Op` names one torch construct (``torch.cat``, ``torch.nn.functional.relu``, or a
tensor method ``.view``), the torch signature it is called with (so positional and keyword
arguments bind the same way torch binds them), and a builder that writes the JAX expression
from the bound arguments. Most builders are made by :func:`call` / :func:`method` from a
mapping of argument names (``dim`` -> ``axis``, ``keepdim`` -> ``keepdims``); entries whose
arguments mean something different in JAX (``torch.split`` sizes vs ``jnp.split`` indices,
``F.pad`` last-dimension-first pairs, ``std``'s unbiased default...) carry a small builder
function. A builder raises :class:`Manual` when a call cannot be ported with the same
semantics; the rules then leave it in place with a ``# porter: manual`` comment and a finding.

Every entry carries test cases (``cases``): tests/test_jax_ops_run.py runs each torch
expression and its rewrite on the same random inputs and compares them, so adding an entry
adds a test. docs/jax-ops.md is generated from this table (:func:`render_markdown`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import libcst as cst

from porter import astutil
from porter.astutil import NOT_LITERAL as NOT_LITERAL
from porter.astutil import code as code
from porter.astutil import literal as literal
from porter.context import FileContext
from porter.rules import StatementFact, module_fact

from ._loop import jitted_functions
from ._nnx import RNGS_STREAM, keep_rngs, rngs_scope


class Manual(Exception):
    """This call cannot be ported with the same semantics; the message says why."""


# --------------------------------------------------------------------------------------
# Code helpers
# --------------------------------------------------------------------------------------
_ATOMS = (
    cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float, cst.Imaginary,
    cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.List, cst.Dict, cst.Set,
    cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.Ellipsis,
)


def bare(node: cst.CSTNode) -> str:
    """The node's code without its own parentheses (for an argument position)."""
    if getattr(node, "lpar", None) and not isinstance(node, (cst.Tuple, cst.GeneratorExp, cst.Yield)):
        return code(node.with_changes(lpar=[], rpar=[]))
    return code(node)


def atom(node: cst.CSTNode) -> str:
    """The node's code, parenthesized unless it is an atom (safe as a receiver or operand)."""
    text = code(node)
    if isinstance(node, _ATOMS) or getattr(node, "lpar", None):
        return text
    if isinstance(node, cst.Tuple) and node.lpar:
        return text
    return f"({text})"


# torch dtype -> the JAX dtype the port uses. JAX runs with 64-bit types disabled by default
# (jax_enable_x64 off): torch's int64 ("long", the default integer type) becomes int32, which
# is what JAX would store anyway; float64 stays float64 (JAX warns and stores float32 unless
# jax_enable_x64 is set).
DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int64": "int32", "long": "int32", "int32": "int32", "int": "int32", "int16": "int16",
    "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool_",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
}
_JAX_DTYPE_NAMES = frozenset(DTYPES.values()) | {"int64", "bool"}


def torch_dtype_name(node: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """``torch.float32`` (through the imports) -> "float32"; else None."""
    q = ctx.qualname(node)
    if q and q.startswith("torch.") and q[6:] in DTYPES:
        return q[6:]
    return None


def is_dtype_expr(node: cst.CSTNode, ctx: FileContext) -> bool:
    """A torch dtype, or a jnp/np dtype attribute (a dtype a rule already rewrote)."""
    if torch_dtype_name(node, ctx):
        return True
    q = ctx.qualname(node)
    if q and (q.startswith("jax.numpy.") or q.startswith("numpy.")) and q.rsplit(".", 1)[1] in _JAX_DTYPE_NAMES:
        return True
    if isinstance(node, cst.Attribute):
        # a dtype another rule just wrote (jnp.float32: its import is added after the pass)
        head = code(node.value)
        if node.attr.value in _JAX_DTYPE_NAMES and head in ("jnp", "np", "numpy", "jax.numpy", ctx.module_alias("jax.numpy")):
            return True
    return isinstance(node, cst.Attribute) and node.attr.value == "dtype"


# --------------------------------------------------------------------------------------
# Binding arguments the way torch binds them
# --------------------------------------------------------------------------------------
# Keyword arguments torch accepts and the port drops: placement and autograd bookkeeping.
DROPPED = ("device", "requires_grad", "pin_memory", "layout", "memory_format", "non_blocking")
# numpy-style aliases torch accepts for its own names
KW_ALIASES = {"axis": "dim", "keepdims": "keepdim", "x": "input", "self": "input"}


@dataclass(frozen=True)
class Sig:
    names: tuple[str, ...]  # positional-or-keyword, in order
    varargs: Optional[str] = None  # "*size": the rest of the positionals
    kwonly: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Sig":
        names: list[str] = []
        kwonly: list[str] = []
        varargs = None
        star = False
        for part in [p.strip() for p in text.split(",") if p.strip()]:
            if part == "*":
                star = True
            elif part.startswith("*"):
                varargs = part[1:]
                star = True
            elif star:
                kwonly.append(part)
            else:
                names.append(part)
        return cls(tuple(names), varargs, tuple(kwonly))

    @property
    def all(self) -> tuple[str, ...]:
        return self.names + ((self.varargs,) if self.varargs else ()) + self.kwonly


LOOKUP = object()  # Bound.rngs_scope not read yet


class Bound:
    """The arguments of one torch call, by torch parameter name, plus the JAX names in use."""

    def __init__(self, ctx: FileContext, args: dict[str, cst.BaseExpression], varargs: Optional[list[cst.Arg]] = None,
                 keywords: frozenset = frozenset()) -> None:
        self.ctx = ctx
        self.args = args
        self.keywords = keywords  # the torch names that were passed by keyword
        self.is_method = False
        self.varargs = varargs or []
        self.used: set[str] = set()
        self.float_target = False  # the target is known to be class probabilities (a loss module's calls say so)
        # the (module class, method) whose nnx.Rngs a drawing call uses (_nnx.rngs_scope); LOOKUP:
        # read from ctx when the builder asks (port_call passes the one it read when it rebuilds)
        self.rngs_scope = LOOKUP
        self.needs_rngs = False  # the builder drew from the module's nnx.Rngs (its __init__ must keep them)
        self.dropped: dict[str, cst.BaseExpression] = {}  # the DROPPED keywords passed (device=, requires_grad=)

    # module names, recorded for Fix.imports
    def _mod(self, module: str) -> str:
        self.used.add(module)
        return self.ctx.module_alias(module)

    @property
    def jnp(self) -> str:
        return self._mod("jax.numpy")

    @property
    def jax(self) -> str:
        return self._mod("jax")

    @property
    def np(self) -> str:
        return self._mod("numpy")

    @property
    def optax(self) -> str:
        return self._mod("optax")

    def module_rngs(self, why: str) -> str:
        """`self.rngs`: the nnx.Rngs of the module whose method the call is in, which its
        `__init__` keeps (as for JX107's F.dropout and JX014's draws); Manual outside a module
        method, where the port has no key to draw with."""
        if self.rngs_scope is LOOKUP:
            self.rngs_scope = rngs_scope(self.ctx)
        if self.rngs_scope is None:
            raise Manual(f"{why} needs a PRNG key, and outside a module method there is no nnx.Rngs to draw it from: "
                         "move the call into a module's method (the port keeps the module's rngs) or port it by hand")
        self.needs_rngs = True
        return f"self.{RNGS_STREAM}"

    def has(self, name: str) -> bool:
        return name in self.args

    def node(self, name: str) -> cst.BaseExpression:
        return self.args[name]

    def __getitem__(self, name: str) -> str:
        if name not in self.args:
            raise Manual(f"the call needs its {name!r} argument spelled out")
        node = self.args[name]
        if is_dtype_expr(node, self.ctx):
            return self.dtype(name)
        return bare(node)

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        return self[name] if name in self.args else default

    def atom(self, name: str) -> str:
        if name not in self.args:
            raise Manual(f"the call needs its {name!r} argument spelled out")
        return atom(self.args[name])

    def lit(self, name: str, default=NOT_LITERAL):
        if name not in self.args:
            return default
        return literal(self.args[name])

    def dtype(self, name: str = "dtype") -> str:
        node = self.args[name]
        t = torch_dtype_name(node, self.ctx)
        if t:
            return f"{self.jnp}.{DTYPES[t]}"
        return code(node)

    def shape(self, name: str) -> str:
        """A size argument given as varargs (``zeros(2, 3)``) or as one sequence
        (``zeros((2, 3))``, ``view(shape)``), as one JAX shape expression."""
        if name in self.args:
            return code(self.args[name])
        items = self.varargs
        if not items:
            raise Manual(f"the call needs its {name!r} argument")
        if len(items) == 1:
            a = items[0]
            if a.star == "*":
                return code(a.value)
            v = literal(a.value)
            if isinstance(v, int) and not isinstance(v, bool):
                return f"({code(a.value)},)"
            return code(a.value)
        parts = [("*" if a.star == "*" else "") + code(a.value) for a in items]
        return "(" + ", ".join(parts) + ")"

    def shape_items(self, name: str) -> Optional[list[str]]:
        """The sizes one by one when they are spelled out (varargs or a literal tuple/list)."""
        if name in self.args:
            node = self.args[name]
            if isinstance(node, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement) for e in node.elements):
                return [code(e.value) for e in node.elements]
            return None
        if len(self.varargs) == 1 and isinstance(self.varargs[0].value, (cst.Tuple, cst.List)):
            node = self.varargs[0].value
            if not any(isinstance(e, cst.StarredElement) for e in node.elements):
                return [code(e.value) for e in node.elements]
            return None
        if any(a.star for a in self.varargs):
            return None
        return [code(a.value) for a in self.varargs]


def bind(call: cst.Call, sig: Sig, ctx: FileContext, receiver: Optional[cst.BaseExpression] = None) -> Bound:
    """Bind a call's arguments to torch parameter names (receiver -> the first name)."""
    args: dict[str, cst.BaseExpression] = {}
    names = list(sig.names)
    if receiver is not None:
        if not names:
            raise Manual("internal: a method signature without its tensor")
        args[names.pop(0)] = receiver
    varargs: list[cst.Arg] = []
    positional = [a for a in call.args if a.keyword is None]
    keywords = [a for a in call.args if a.keyword is not None]
    for a in positional:
        if a.star == "**":
            raise Manual("**kwargs cannot be bound to torch's parameters statically")
        if a.star == "*" and not sig.varargs:
            raise Manual("*args cannot be bound to torch's parameters statically")
        if names and not a.star and not varargs:
            args[names.pop(0)] = a.value
        elif sig.varargs:
            varargs.append(a)
        else:
            raise Manual("more positional arguments than torch's signature takes")
    known = set(sig.all)
    passed = set()
    dropped: dict[str, cst.BaseExpression] = {}
    for a in keywords:
        kw = a.keyword.value
        if kw == "out":
            raise Manual("out= writes into an existing tensor; JAX arrays are immutable: assign the result instead")
        if kw in DROPPED:
            dropped[kw] = a.value
            continue
        if kw not in known and KW_ALIASES.get(kw) in known:
            kw = KW_ALIASES[kw]
        if kw == sig.varargs:  # zeros(size=(2, 3))
            args[kw] = a.value
            continue
        if kw not in known:
            raise Manual(f"argument {kw}= has no JAX counterpart in porter's table")
        args[kw] = a.value
        passed.add(kw)
    bound = Bound(ctx, args, varargs, frozenset(passed))
    bound.dropped = dropped
    bound.is_method = receiver is not None
    return bound


# --------------------------------------------------------------------------------------
# The table model
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A numerical test of an entry: a torch expression over named random inputs.

    Input specs: ``f3,4`` float32 normal, ``p3,4`` positive floats, ``u3,4`` uniform in (0, 1),
    ``i3,4:5`` int64 in [0, 5), ``s3,4:5`` int64 in [-5, 5), ``b3,4`` bool; a bare number is
    a Python scalar (``n:2``). For ``manual`` entries the case is a call that must be reported.
    """

    expr: str
    inputs: tuple[tuple[str, str], ...] = ()

    def __init__(self, expr: str, **inputs: str) -> None:
        object.__setattr__(self, "expr", expr)
        object.__setattr__(self, "inputs", tuple(inputs.items()))


Pair = tuple  # (values_code, indices_code) for torch calls that return a (values, indices) pair
Builder = Callable[[Bound], Union[str, "Pair"]]


@dataclass(frozen=True)
class Op:
    name: str  # "torch.cat", "torch.nn.functional.relu", or ".view" for a tensor method
    sig: Sig
    build: Optional[Builder]
    target: str  # what the port writes, for the docs
    note: str = ""  # how the semantics line up (or where they differ), for the docs
    cases: tuple[Case, ...] = ()
    manual: str = ""  # set: never rewritten; the reason, reported at every call
    shared: bool = False  # method name also common on non-tensors: needs evidence of a tensor
    pair: bool = False  # torch returns a (values, indices) named tuple
    arbitrary: bool = False  # torch's values are arbitrary (torch.empty): tests compare shape and dtype only

    @property
    def is_method(self) -> bool:
        return self.name.startswith(".")

    @property
    def torch_display(self) -> str:
        if self.is_method:
            return f"Tensor{self.name}"
        return self.name.replace("torch.nn.functional.", "F.")


TABLE: list[Op] = []


def _add(op: Op) -> None:
    TABLE.append(op)


def _spec(target: str, pos: Sequence[str], kw: dict[str, str]) -> str:
    parts = list(pos) + [f"{k}={v}" for k, v in kw.items()]
    return f"{target}({', '.join(parts)})"


def call(target: str, *pos: str, **kw: str) -> tuple[Builder, str]:
    """A builder for ``target(<pos>..., jaxkw=<torch arg>...)``: positional arguments by torch
    name (an unbound trailing positional stops the list), keywords kept only when given.
    ``target`` starts with jnp./jax./np./optax. (written with the file's own aliases)."""
    head, _, rest = target.partition(".")

    def build(b: Bound) -> str:
        mod = getattr(b, head)
        parts = []
        for p in pos:
            if p.endswith("?"):
                if not b.has(p[:-1]):
                    break
                parts.append(b[p[:-1]])
            else:
                parts.append(b.shape(p) if p.startswith("*") else b[p])
        for jk, tk in kw.items():
            if b.has(tk):
                parts.append(f"{jk}={b[tk]}")
        return f"{mod}.{rest}({', '.join(parts)})"

    return build, _spec(target, [p.lstrip("*") for p in pos], kw)


def method(name: str, *pos: str, **kw: str) -> tuple[Builder, str]:
    """A builder for ``<input>.name(<pos>..., jaxkw=<torch arg>...)`` (a jax.Array method)."""

    def build(b: Bound) -> str:
        parts = []
        for p in pos:
            if p.endswith("?"):
                if not b.has(p[:-1]):
                    break
                parts.append(b[p[:-1]])
            else:
                parts.append(b.shape(p) if p.startswith("*") else b[p])
        for jk, tk in kw.items():
            if b.has(tk):
                parts.append(f"{jk}={b[tk]}")
        return f"{b.atom('input')}.{name}({', '.join(parts)})"

    return build, _spec(f"x.{name}", [p.lstrip("*") for p in pos], kw)


def op(
    names: Union[str, Sequence[str]],
    sig: str,
    spec: Union[tuple[Builder, str], Builder, None],
    target: str = "",
    note: str = "",
    cases: Sequence[Case] = (),
    manual: str = "",
    shared: bool = False,
    pair: bool = False,
    arbitrary: bool = False,
) -> None:
    """Add one entry per name (``torch.x``, ``F.x`` or ``.x``), all sharing the builder.
    Cases are written for the first name with ``{}`` standing for the call's head
    (``torch.exp(a)`` / ``a.exp()``): see :func:`_cases_for`."""
    if isinstance(names, str):
        names = [names]
    if isinstance(spec, tuple):
        build, auto = spec
        target = target or auto
    else:
        build = spec
    parsed = Sig.parse(sig)
    for name in names:
        full = name.replace("F.", "torch.nn.functional.", 1) if name.startswith("F.") else name
        msig = parsed
        _add(Op(full, msig, build, target, note, tuple(_cases_for(full, cases)), manual, shared, pair, arbitrary))


def _cases_for(name: str, cases: Sequence[Case]) -> list[Case]:
    """Cases are written as templates: ``@(a, 1)`` is the call of this entry with the first
    argument as receiver for methods (``a.name(1)``) or as the first argument for functions
    (``torch.name(a, 1)``); a case without ``@`` is used as is."""
    out = []
    for c in cases:
        if "@(" in c.expr:
            out.append(Case(_expand_case(name, c.expr), **dict(c.inputs)))
        elif _spelled(name) in c.expr:  # a literal case belongs to the spelling it uses
            out.append(c)
    return out


def _spelled(name: str) -> str:
    return f"{name}(" if name.startswith(".") else f"{name.replace('torch.nn.functional.', 'F.')}("


def _expand_case(name: str, expr: str) -> str:
    i = expr.index("@(")
    depth = 0
    j = i + 1
    while j < len(expr):
        if expr[j] == "(":
            depth += 1
        elif expr[j] == ")":
            depth -= 1
            if depth == 0:
                break
        j += 1
    inner = expr[i + 2 : j]
    first, _, rest = _split_first(inner)
    if name.startswith("."):
        recv = first if re.fullmatch(r"[A-Za-z_]\w*", first) else f"({first})"
        new = f"{recv}{name}({rest})"
    else:
        short = name.replace("torch.nn.functional.", "F.")
        new = f"{short}({inner})"
    return expr[:i] + new + _expand_rest(name, expr[j + 1 :])


def _expand_rest(name: str, tail: str) -> str:
    return _expand_case(name, tail) if "@(" in tail else tail


def _split_first(inner: str) -> tuple[str, str, str]:
    depth = 0
    for k, ch in enumerate(inner):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return inner[:k].strip(), ",", inner[k + 1 :].strip()
    return inner.strip(), "", ""


# --------------------------------------------------------------------------------------
# Entries
# --------------------------------------------------------------------------------------
F32 = dict(a="f3,4")

# Elementwise unary functions: torch.x(input) and Tensor.x() -> jnp / jax.nn / jax.lax.
_UNARY = [
    ("abs", "jnp.abs", "f3,4"), ("neg", "jnp.negative", "f3,4"), ("negative", "jnp.negative", "f3,4"),
    ("exp", "jnp.exp", "f3,4"), ("exp2", "jnp.exp2", "f3,4"), ("log", "jnp.log", "p3,4"),
    ("log2", "jnp.log2", "p3,4"), ("log10", "jnp.log10", "p3,4"), ("log1p", "jnp.log1p", "p3,4"),
    ("expm1", "jnp.expm1", "f3,4"), ("sqrt", "jnp.sqrt", "p3,4"), ("rsqrt", "jax.lax.rsqrt", "p3,4"),
    ("sin", "jnp.sin", "f3,4"), ("cos", "jnp.cos", "f3,4"), ("tan", "jnp.tan", "u3,4"),
    ("asin", "jnp.arcsin", "u3,4"), ("acos", "jnp.arccos", "u3,4"), ("atan", "jnp.arctan", "f3,4"),
    ("sinh", "jnp.sinh", "f3,4"), ("cosh", "jnp.cosh", "f3,4"), ("tanh", "jnp.tanh", "f3,4"),
    ("asinh", "jnp.arcsinh", "f3,4"), ("atanh", "jnp.arctanh", "u3,4"),
    ("sigmoid", "jax.nn.sigmoid", "f3,4"), ("floor", "jnp.floor", "f3,4"), ("ceil", "jnp.ceil", "f3,4"),
    ("trunc", "jnp.trunc", "f3,4"), ("sign", "jnp.sign", "f3,4"), ("reciprocal", "jnp.reciprocal", "p3,4"),
    ("square", "jnp.square", "f3,4"), ("erf", "jax.scipy.special.erf", "f3,4"),
    ("logical_not", "jnp.logical_not", "b3,4"), ("isnan", "jnp.isnan", "f3,4"),
    ("isinf", "jnp.isinf", "f3,4"), ("isfinite", "jnp.isfinite", "f3,4"), ("relu", "jax.nn.relu", "f3,4"),
    ("frac", None, "f3,4"),
]
for _name, _target, _inp in _UNARY:
    if _name == "frac":
        op(["torch.frac", ".frac"], "input", lambda b: f"{b.jnp}.fmod({b['input']}, 1)", "jnp.fmod(x, 1)",
           "the fractional part with the sign of x, as torch.frac", [Case("@(a)", a=_inp)])
        continue
    _shared = _name in ("abs", "round")
    op([f"torch.{_name}", f".{_name}"], "input", call(_target, "input"), cases=[Case("@(a)", a=_inp)], shared=_shared)

op(["torch.round", ".round"], "input, *, decimals", call("jnp.round", "input", decimals="decimals"),
   note="both round half to even", cases=[Case("@(a)", a="f3,4"), Case("@(a * 10, decimals=1)", a="f3,4")], shared=True)
op("F.relu", "input, inplace", call("jax.nn.relu", "input"),
   note="inplace= has no meaning for immutable arrays and is dropped", cases=[Case("@(a)", a="f3,4")])


def _drop_inplace(b: Bound) -> None:
    if b.has("inplace") and b.lit("inplace") not in (False, True):
        raise Manual("inplace= is not a literal")


def _act(target: str, **kw: str):
    builder, spec = call(target, "input", **kw)

    def build(b: Bound) -> str:
        _drop_inplace(b)
        return builder(b)

    return build, spec


op("F.relu6", "input, inplace", _act("jax.nn.relu6"), cases=[Case("@(a * 4)", a="f3,4")])
op("F.leaky_relu", "input, negative_slope, inplace", _act("jax.nn.leaky_relu", negative_slope="negative_slope"),
   note="same default slope (0.01)", cases=[Case("@(a)", a="f3,4"), Case("@(a, 0.2)", a="f3,4")])
op("F.elu", "input, alpha, inplace", _act("jax.nn.elu", alpha="alpha"), cases=[Case("@(a, alpha=0.5)", a="f3,4")])
op("F.celu", "input, alpha, inplace", _act("jax.nn.celu", alpha="alpha"), cases=[Case("@(a, alpha=0.5)", a="f3,4")])
op(["F.selu", "torch.selu"], "input, inplace", _act("jax.nn.selu"), cases=[Case("@(a)", a="f3,4")])
op("F.silu", "input, inplace", _act("jax.nn.silu"), cases=[Case("@(a)", a="f3,4")])
op(["F.mish"], "input, inplace", _act("jax.nn.mish"), cases=[Case("@(a)", a="f3,4")])
op("F.sigmoid", "input", call("jax.nn.sigmoid", "input"), cases=[Case("@(a)", a="f3,4")])
op(["F.tanh"], "input", call("jnp.tanh", "input"), cases=[Case("@(a)", a="f3,4")])
op(["F.logsigmoid"], "input", call("jax.nn.log_sigmoid", "input"), cases=[Case("@(a)", a="f3,4")])
op(["F.hardswish"], "input, inplace", _act("jax.nn.hard_swish"), cases=[Case("@(a * 4)", a="f3,4")])
op(["F.hardsigmoid"], "input, inplace", _act("jax.nn.hard_sigmoid"), cases=[Case("@(a * 4)", a="f3,4")])
op(["F.softsign"], "input", call("jax.nn.soft_sign", "input"), cases=[Case("@(a)", a="f3,4")])


def _hardtanh(b: Bound) -> str:
    _drop_inplace(b)
    lo = b.get("min_val", "-1.0")
    hi = b.get("max_val", "1.0")
    return f"{b.jnp}.clip({b['input']}, {lo}, {hi})"


op("F.hardtanh", "input, min_val, max_val, inplace", _hardtanh, "jnp.clip(x, min_val, max_val)",
   cases=[Case("@(a * 2)", a="f3,4"), Case("@(a, -0.5, 0.5)", a="f3,4")])


def _gelu(b: Bound) -> str:
    approx = b.lit("approximate", "none")
    if approx not in ("none", "tanh"):
        raise Manual("approximate= is not a literal 'none' or 'tanh'")
    return f"{b.jax}.nn.gelu({b['input']}, approximate={approx == 'tanh'})"


op("F.gelu", "input, approximate", _gelu, "jax.nn.gelu(x, approximate=False|True)",
   "torch's default is the exact erf form; jax.nn.gelu defaults to the tanh approximation, so the port always spells approximate= out",
   [Case("@(a)", a="f3,4"), Case("@(a, approximate='tanh')", a="f3,4")])


def _softplus(b: Bound) -> str:
    beta = b.lit("beta", 1)
    if b.has("threshold") and b.lit("threshold") is NOT_LITERAL:
        raise Manual("threshold= is not a literal")
    x = b["input"]
    if beta == 1:
        return f"{b.jax}.nn.softplus({x})"
    return f"{b.jax}.nn.softplus({b.atom('beta')} * {atom(b.node('input'))}) / {b.atom('beta')}"


op("F.softplus", "input, beta, threshold", _softplus, "jax.nn.softplus(beta * x) / beta",
   "torch switches to the identity above `threshold` (default 20): the two differ by less than exp(-threshold)",
   [Case("@(a)", a="f3,4"), Case("@(a, beta=2.0)", a="f3,4")])


def _softmax(fn: str):
    def build(b: Bound) -> str:
        x = b["input"]
        if b.has("dim"):
            axis = b["dim"]
        elif isinstance(b.node("input"), (cst.Name, cst.Attribute)):
            # torch's deprecated implicit dimension (F.softmax(x)): 0 for a 0-, 1- or 3-D input, else 1
            axis = f"0 if {x}.ndim in (0, 1, 3) else 1"
        else:
            raise Manual("softmax without dim= uses torch's deprecated implicit dimension; write the dim")
        if b.has("dtype"):
            x = f"{atom(b.node('input'))}.astype({b.dtype()})"
        return f"{b.jax}.nn.{fn}({x}, axis={axis})"

    return build


for _fn, _jfn in (("softmax", "softmax"), ("log_softmax", "log_softmax")):
    op([f"torch.{_fn}", f"F.{_fn}", f".{_fn}"], "input, dim, _stacklevel, dtype", _softmax(_jfn), f"jax.nn.{_jfn}(x, axis=dim)",
       "without dim (F.softmax(x), deprecated in torch) the axis is torch's implicit one: 0 for a 0-, 1- or 3-D input, "
       "else 1, written as that conditional on x.ndim",
       cases=[Case("@(a, dim=1)", a="f3,4"), Case("@(a, -1)", a="f2,3,4"), Case("@(a, dim=0, dtype=torch.float32)", a="f3,4"),
              Case(f"F.{_fn}(a)", a="f3,4"), Case(f"F.{_fn}(a)", a="f2,3,4"), Case(f"F.{_fn}(a)", a="f5")])


def _softmin(b: Bound) -> str:
    if not b.has("dim"):
        raise Manual("softmin without dim= uses torch's deprecated implicit dimension; write the dim")
    return f"{b.jax}.nn.softmax(-{atom(b.node('input'))}, axis={b['dim']})"


op("F.softmin", "input, dim, _stacklevel, dtype", _softmin, "jax.nn.softmax(-x, axis=dim)", cases=[Case("@(a, dim=1)", a="f3,4")])
op("F.glu", "input, dim", call("jax.nn.glu", "input", axis="dim"), note="same default dim (-1)",
   cases=[Case("@(a)", a="f3,4"), Case("@(a, dim=0)", a="f4,3")])

# Binary and comparison ops
_BINARY = [
    ("sub", "jnp.subtract"), ("mul", "jnp.multiply"), ("multiply", "jnp.multiply"),
    ("maximum", "jnp.maximum"), ("minimum", "jnp.minimum"), ("fmod", "jnp.fmod"), ("remainder", "jnp.remainder"),
    ("atan2", "jnp.arctan2"), ("pow", "jnp.power"), ("eq", "jnp.equal"), ("ne", "jnp.not_equal"),
    ("lt", "jnp.less"), ("le", "jnp.less_equal"), ("gt", "jnp.greater"), ("ge", "jnp.greater_equal"),
    ("logical_and", "jnp.logical_and"), ("logical_or", "jnp.logical_or"), ("logical_xor", "jnp.logical_xor"),
    ("matmul", "jnp.matmul"), ("mm", "jnp.matmul"), ("bmm", "jnp.matmul"), ("outer", "jnp.outer"),
    ("dot", "jnp.dot"), ("hypot", "jnp.hypot"), ("logaddexp", "jnp.logaddexp"),
]
_BIN_INPUTS = {
    "mm": dict(a="f3,4", b="f4,5"), "matmul": dict(a="f2,3,4", b="f4,5"), "bmm": dict(a="f2,3,4", b="f2,4,5"),
    "outer": dict(a="f3", b="f4"), "dot": dict(a="f4", b="f4"), "fmod": dict(a="f3,4", b="p3,4"),
    "remainder": dict(a="f3,4", b="p3,4"), "pow": dict(a="p3,4", b="f3,4"),
    "logical_and": dict(a="b3,4", b="b3,4"), "logical_or": dict(a="b3,4", b="b3,4"), "logical_xor": dict(a="b3,4", b="b3,4"),
}
for _name, _target in _BINARY:
    _inputs = _BIN_INPUTS.get(_name, dict(a="f3,4", b="f3,4"))
    _cases = [Case("@(a, b)", **_inputs)]
    if _name in ("eq", "ne", "lt", "le", "gt", "ge"):
        _cases.append(Case("@(a, 0.5)", a="f3,4"))
        _cases.append(Case("@(a, b)", a="i3,4:3", b="i3,4:3"))
    if _name == "pow":
        _cases.append(Case("@(a, 2)", a="f3,4"))
    op([f"torch.{_name}", f".{_name}"], "input, other", call(_target, "input", "other"), cases=_cases,
       shared=_name in ("eq", "ne", "lt", "le", "gt", "ge", "dot", "pow", "sub", "mul", "multiply"))  # pandas has these


def _add_sub(sign: str):
    def build(b: Bound) -> str:
        x, y = atom(b.node("input")), atom(b.node("other"))
        if b.has("alpha"):
            return f"{x} {sign} {b.atom('alpha')} * {y}"
        return f"{x} {sign} {y}"

    return build


op(["torch.add", ".add"], "input, other, *, alpha", _add_sub("+"), "x + alpha * other",
   cases=[Case("@(a, b)", a="f3,4", b="f3,4"), Case("@(a, b, alpha=2)", a="f3,4", b="f3,4")], shared=True)
op(["torch.subtract"], "input, other, *, alpha", _add_sub("-"), "x - alpha * other",
   cases=[Case("@(a, b, alpha=0.5)", a="f3,4", b="f3,4")])


def _div(b: Bound) -> str:
    mode = b.lit("rounding_mode", None)
    x, y = b["input"], b["other"]
    if mode is None:
        return f"{b.jnp}.true_divide({x}, {y})"
    if mode == "floor":
        return f"{b.jnp}.floor_divide({x}, {y})"
    raise Manual(f"rounding_mode={b.get('rounding_mode')} (truncation toward zero) has no single jnp function with torch's integer result type")


op(["torch.div", "torch.divide", ".div", ".divide"], "input, other, *, rounding_mode", _div,
   "jnp.true_divide(x, y) / jnp.floor_divide(x, y)", "integer inputs give floats in both (true division)",
   [Case("@(a, b)", a="f3,4", b="p3,4"), Case("@(a, b)", a="i3,4:9", b="i3,4:4", ), Case("@(a, b, rounding_mode='floor')", a="s3,4:9", b="p3,4")],
   shared=True)
op(["torch.true_divide", ".true_divide"], "input, other", call("jnp.true_divide", "input", "other"),
   cases=[Case("@(a, b)", a="f3,4", b="p3,4"), Case("@(a, 2)", a="i3,4:9")])
op(["torch.floor_divide", ".floor_divide"], "input, other", call("jnp.floor_divide", "input", "other"),
   note="torch >= 1.13 floors, as jnp does", cases=[Case("@(a, 3)", a="s3,4:9")])


def _where(b: Bound) -> str:
    if not b.has("input"):
        raise Manual("torch.where(condition) with one argument returns data-dependent indices (dynamic shape)")
    return f"{b.jnp}.where({b['condition']}, {b['input']}, {b['other']})"


op("torch.where", "condition, input, other", _where, "jnp.where(condition, x, y)",
   cases=[Case("torch.where(c, a, b)", c="b3,4", a="f3,4", b="f3,4"), Case("torch.where(a > 0, a, 0.0)", a="f3,4")])
op(".where", "input, condition, other", lambda b: f"{b.jnp}.where({b['condition']}, {b['input']}, {b['other']})",
   "jnp.where(condition, x, other)", cases=[Case("a.where(c, b)", a="f3,4", c="b3,4", b="f3,4")], shared=True)


def _clamp(b: Bound) -> str:
    parts = [b["input"]]
    if b.has("min"):
        parts.append(f"min={b['min']}")
    if b.has("max"):
        parts.append(f"max={b['max']}")
    return f"{b.jnp}.clip({', '.join(parts)})"


op(["torch.clamp", "torch.clip", ".clamp", ".clip"], "input, min, max", _clamp, "jnp.clip(x, min=min, max=max)",
   cases=[Case("@(a, -0.5, 0.5)", a="f3,4"), Case("@(a, min=0)", a="f3,4"), Case("@(a, max=b)", a="f3,4", b="f3,4")],
   shared=True)  # numpy and pandas have .clip
op(["torch.clamp_min", ".clamp_min"], "input, min", call("jnp.maximum", "input", "min"), cases=[Case("@(a, 0.1)", a="f3,4")])
op(["torch.clamp_max", ".clamp_max"], "input, max", call("jnp.minimum", "input", "max"), cases=[Case("@(a, 0.1)", a="f3,4")])
op(["torch.lerp", ".lerp"], "input, end, weight",
   lambda b: f"{atom(b.node('input'))} + {b.atom('weight')} * ({b['end']} - {atom(b.node('input'))})",
   "x + weight * (end - x)", cases=[Case("@(a, b, 0.3)", a="f3,4", b="f3,4")])
op(["torch.isclose", ".isclose"], "input, other, rtol, atol, equal_nan",
   call("jnp.isclose", "input", "other", rtol="rtol", atol="atol", equal_nan="equal_nan"), note="same default tolerances",
   cases=[Case("@(a, a + 1e-6)", a="f3,4")])
op(["torch.allclose", ".allclose"], "input, other, rtol, atol, equal_nan",
   call("jnp.allclose", "input", "other", rtol="rtol", atol="atol", equal_nan="equal_nan"), cases=[Case("@(a, b)", a="f3,4", b="f3,4")])


# Reductions
_ARRAY_METHODS = frozenset({"sum", "mean", "prod", "all", "any", "argmax", "argmin", "max", "min"})


def _reduce(fn: str, method_ok: bool = True):
    def build(b: Bound) -> str:
        if b.is_method and len(b.args) == 1 and fn in _ARRAY_METHODS:  # x.sum(): the same method on a jax.Array
            return f"{b.atom('input')}.{fn}()"
        parts = [b["input"]]
        if b.has("dim"):
            parts.append(f"axis={_axis(b)}")
        if b.has("keepdim"):
            parts.append(f"keepdims={b['keepdim']}")
        if b.has("dtype"):
            parts.append(f"dtype={b.dtype()}")
        return f"{b.jnp}.{fn}({', '.join(parts)})"

    return build


def _axis(b: Bound) -> str:
    node = b.node("dim")
    if isinstance(node, cst.List):  # torch accepts a list of dims; jnp wants a tuple
        return "(" + ", ".join(code(e.value) for e in node.elements) + ("," if len(node.elements) == 1 else "") + ")"
    return b["dim"]


for _fn in ("sum", "mean", "prod", "nansum", "nanmean"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, keepdim, *, dtype", _reduce(_fn), f"jnp.{_fn}(x, axis=dim, keepdims=keepdim, dtype=dtype)",
       cases=[Case("@(a)", a="f3,4"), Case("@(a, dim=1)", a="f3,4"), Case("@(a, 0, keepdim=True)", a="f3,4")]
       + ([Case("@(a, dim=(0, 2))", a="f2,3,4"), Case("@(a, [0, 1])", a="f2,3,4")] if _fn != "prod" else [Case("@(a, 1, dtype=torch.float32)", a="i3,4:4")]),
       shared=_fn in ("sum", "mean", "prod"))
for _fn in ("amax", "amin"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, keepdim", _reduce(_fn[1:]), f"jnp.{_fn[1:]}(x, axis=dim, keepdims=keepdim)",
       cases=[Case("@(a, dim=1)", a="f3,4"), Case("@(a, (0, 1), keepdim=True)", a="f2,3,4")])
for _fn in ("argmax", "argmin"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, keepdim", _reduce(_fn), f"jnp.{_fn}(x, axis=dim, keepdims=keepdim)",
       note="indices are int64 in torch, int32 in JAX",
       cases=[Case("@(a)", a="f3,4"), Case("@(a, dim=1)", a="f3,4"), Case("@(a, 0, keepdim=True)", a="f3,4")], shared=True)
for _fn in ("all", "any"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, keepdim", _reduce(_fn), f"jnp.{_fn}(x, axis=dim, keepdims=keepdim)",
       cases=[Case("@(a)", a="b3,4"), Case("@(a, dim=1)", a="b3,4"), Case("@(a > 0, 0, keepdim=True)", a="f3,4")], shared=True)
op(["torch.logsumexp", ".logsumexp"], "input, dim, keepdim",
   lambda b: f"{b.jax}.nn.logsumexp({b['input']}, axis={_axis(b)}" + (f", keepdims={b['keepdim']}" if b.has("keepdim") else "") + ")",
   "jax.nn.logsumexp(x, axis=dim, keepdims=keepdim)", cases=[Case("@(a, 1)", a="f3,4"), Case("@(a, dim=0, keepdim=True)", a="f3,4")])
op(["torch.count_nonzero", ".count_nonzero"], "input, dim", call("jnp.count_nonzero", "input", axis="dim"),
   cases=[Case("@(a)", a="i3,4:3"), Case("@(a, dim=1)", a="i3,4:3")])


def _std_var(fn: str):
    def build(b: Bound) -> str:
        parts = [b["input"]]
        dim = b.node("dim") if b.has("dim") else None
        ub = b.lit("unbiased", True) if b.has("unbiased") else True
        if dim is not None and isinstance(literal(dim), bool):  # torch.std(x, False): the old unbiased slot
            ub = literal(dim)
            dim = None
        elif dim is not None:
            parts.append(f"axis={_axis(b)}")
        if b.has("correction"):
            parts.append(f"ddof={b['correction']}")
        elif ub is NOT_LITERAL:
            raise Manual("unbiased= is not a literal")
        else:
            parts.append(f"ddof={1 if ub else 0}")
        if b.has("keepdim"):
            parts.append(f"keepdims={b['keepdim']}")
        return f"{b.jnp}.{fn}({', '.join(parts)})"

    return build


for _fn in ("std", "var"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, unbiased, keepdim, *, correction", _std_var(_fn),
       f"jnp.{_fn}(x, axis=dim, ddof=1, keepdims=keepdim)",
       "torch divides by N-1 by default (unbiased / correction=1), jnp by N: the port always spells ddof= out",
       [Case("@(a)", a="f3,4"), Case("@(a, dim=1)", a="f3,4"), Case("@(a, 1, keepdim=True)", a="f3,4"),
        Case("@(a, dim=0, unbiased=False)", a="f3,4"), Case("@(a, correction=0)", a="f3,4"), Case("@(a, False)", a="f3,4")],
       shared=True)


def _minmax(fn: str):
    arg = "arg" + fn

    def build(b: Bound):
        x = b["input"]
        if not b.has("dim"):
            return f"{b.atom('input')}.{fn}()" if b.is_method and len(b.args) == 1 else f"{b.jnp}.{fn}({x})"
        dim = b.node("dim")
        v = literal(dim)
        if (isinstance(v, int) and not isinstance(v, bool)) or "dim" in b.keywords:
            kd = f", keepdims={b['keepdim']}" if b.has("keepdim") else ""
            return (f"{b.jnp}.{fn}({x}, axis={b['dim']}{kd})", f"{b.jnp}.{arg}({x}, axis={b['dim']}{kd})")
        if not b.has("keepdim") and isinstance(dim, cst.Call) and is_tensor(dim, b.ctx):
            # torch.max(a, torch.gt(y, 0.6)): a dim is an int, never a torch op's result: the
            # elementwise maximum (torch.maximum)
            return f"{b.jnp}.{fn}imum({x}, {b['dim']})"
        raise Manual(f"torch.{fn}(x, y) with a non-literal second argument is either a reduction over dim y "
                     f"(values and indices) or the elementwise {fn}imum: write dim= or torch.{fn}imum")

    return build


for _fn in ("max", "min"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, keepdim", _minmax(_fn),
       f"jnp.{_fn}(x) / (jnp.{_fn}(x, axis=dim), jnp.arg{_fn}(x, axis=dim))",
       f"torch.{_fn}(x, dim) returns (values, indices): `.values`/`[0]` become jnp.{_fn}, `.indices`/`[1]` jnp.arg{_fn}, "
       "anything else the pair as a tuple; ties: both pick the first index on CPU",
       [Case("@(a)", a="f3,4"), Case("@(a, 1)", a="f3,4"), Case("@(a, dim=0, keepdim=True)", a="f3,4"),
        Case("@(a, dim=1).values", a="f3,4"), Case("@(a, 1).indices", a="f3,4"), Case("@(a, 1)[0]", a="f3,4"),
        Case("@(a, torch.sigmoid(a))", a="f3,4")],
       shared=True, pair=True)


def _sort(b: Bound):
    x = b["input"]
    axis = f", axis={b['dim']}" if b.has("dim") else ""
    desc = b.lit("descending", False)
    if desc is NOT_LITERAL:
        raise Manual("descending= is not a literal")
    d = ", descending=True" if desc else ""
    if b.has("stable") and b.lit("stable") is not True:
        raise Manual("stable= must be True for a port with the same indices")
    return (f"{b.jnp}.sort({x}{axis}{d})", f"{b.jnp}.argsort({x}{axis}{d})")


op(["torch.sort", ".sort"], "input, dim, descending, *, stable", _sort, "(jnp.sort(x, axis=dim), jnp.argsort(x, axis=dim))",
   "returns (values, indices); JAX sorts stably, torch does not promise an order among equal values",
   [Case("@(a)", a="f3,4"), Case("@(a, dim=0, descending=True)", a="f3,4"), Case("@(a, 1).indices", a="f3,4")], shared=True, pair=True)
op(["torch.argsort", ".argsort"], "input, dim, descending, *, stable", lambda b: _sort(b)[1],
   "jnp.argsort(x, axis=dim, descending=...)", cases=[Case("@(a)", a="f3,4"), Case("@(a, dim=0, descending=True)", a="f3,4")], shared=True)


def _topk(b: Bound):
    largest = b.lit("largest", True)
    if largest is not True:
        raise Manual("largest=False: write jax.lax.top_k(-x, k) and negate the values")
    if b.has("sorted") and b.lit("sorted") is not True:
        raise Manual("sorted=False: jax.lax.top_k always sorts")
    if not b.has("dim") or b.lit("dim") == -1:
        t = f"{b.jax}.lax.top_k({b['input']}, {b['k']})"
        return (f"{t}[0]", f"{t}[1]", t)  # (values, indices, the pair itself)
    # jax.lax.top_k works on the last axis: the axis moves there and back
    d = b["dim"]
    t = f"{b.jax}.lax.top_k({b.jnp}.moveaxis({b['input']}, {d}, -1), {b['k']})"
    return (f"{b.jnp}.moveaxis({t}[0], -1, {d})", f"{b.jnp}.moveaxis({t}[1], -1, {d})",
            f"tuple({b.jnp}.moveaxis(r, -1, {d}) for r in {t})")


op(["torch.topk", ".topk"], "input, k, dim, largest, sorted", _topk, "jax.lax.top_k(x, k)",
   "returns (values, indices); on another axis than the last, jnp.moveaxis moves it there and back",
   [Case("@(a, 2)", a="f3,5"), Case("@(a, k=3, dim=-1).values", a="f3,5"), Case("@(a, 2).indices", a="f3,5"),
    Case("@(a, 2, 1, True, True)", a="f4,5"), Case("@(a, 2, dim=0).indices", a="f4,3"),
    Case("@(a, 2, dim=0)[0]", a="f4,3")], pair=True)


def _cumulative(fn: str):
    def build(b: Bound) -> str:
        parts = [b["input"], f"axis={b['dim']}"]
        if b.has("dtype"):
            parts.append(f"dtype={b.dtype()}")
        return f"{b.jnp}.{fn}({', '.join(parts)})"

    return build


for _fn in ("cumsum", "cumprod"):
    op([f"torch.{_fn}", f".{_fn}"], "input, dim, *, dtype", _cumulative(_fn), f"jnp.{_fn}(x, axis=dim)",
       cases=[Case("@(a, dim=1)", a="f3,4"), Case("@(a, 0)", a="f3,4")], shared=True)


op(["torch.diff", ".diff"], "input, n, dim, prepend, append", call("jnp.diff", "input", n="n", axis="dim", prepend="prepend", append="append"),
   note="torch's defaults: n=1 along the last axis; prepend/append are arrays (torch takes no scalars)",
   cases=[Case("@(a)", a="f3,4"), Case("@(a, dim=0)", a="f3,4"), Case("@(a, 2, 0)", a="f4,3"),
          Case("@(a, prepend=b, dim=1)", a="f3,4", b="f3,2"), Case("torch.diff(i, append=j)", i="i5:9", j="i2:9")],
   shared=True)


def _norm(b: Bound) -> str:
    p = b.lit("p", 2) if b.has("p") else 2
    if b.has("dtype"):
        raise Manual("norm(dtype=) is not ported")
    if not b.has("dim"):
        if b.has("keepdim") or p not in (2, "fro"):
            raise Manual(f"norm with p={b.get('p')} or keepdim over all elements: write jnp.linalg.norm(x.ravel(), ord=p)")
        return f"{b.jnp}.linalg.norm({b.atom('input')}.ravel())"
    parts = [b["input"]]
    if p not in (2, "fro"):
        if not isinstance(p, (int, float)) or isinstance(p, bool):
            raise Manual(f"norm with p={b.get('p')} is not a literal number")
        parts.append(f"ord={b['p']}")
    parts.append(f"axis={_axis(b)}")
    if b.has("keepdim"):
        parts.append(f"keepdims={b['keepdim']}")
    return f"{b.jnp}.linalg.norm({', '.join(parts)})"


op(["torch.norm", ".norm"], "input, p, dim, keepdim, out, dtype", _norm, "jnp.linalg.norm(x, ord=p, axis=dim, keepdims=keepdim)",
   "without dim: the 2-norm of all elements (jnp.linalg.norm of the flattened array)",
   [Case("@(a)", a="f2,3,4"), Case("@(a, dim=1)", a="f3,4"), Case("@(a, p=1, dim=1)", a="f3,4"),
    Case("@(a, 2, 1, True)", a="f3,4")], shared=True)

# Shapes
op(["torch.cat", "torch.concat", "torch.concatenate"], "tensors, dim", call("jnp.concatenate", "tensors", axis="dim"),
   cases=[Case("@([a, b])", a="f3,4", b="f2,4"), Case("@((a, b), dim=1)", a="f3,4", b="f3,2"), Case("@([a, b], -1)", a="f2,3", b="f2,1")])
op("torch.stack", "tensors, dim", call("jnp.stack", "tensors", axis="dim"),
   cases=[Case("torch.stack([a, b])", a="f3,4", b="f3,4"), Case("torch.stack((a, b), dim=1)", a="f3,4", b="f3,4")])
op(["torch.hstack"], "tensors", call("jnp.hstack", "tensors"), cases=[Case("torch.hstack([a, b])", a="f3,4", b="f3,2")])
op(["torch.vstack"], "tensors", call("jnp.vstack", "tensors"), cases=[Case("torch.vstack([a, b])", a="f3,4", b="f2,4")])
op(["torch.reshape"], "input, shape", call("jnp.reshape", "input", "shape"), cases=[Case("torch.reshape(a, (4, 3))", a="f3,4"), Case("torch.reshape(a, (-1,))", a="f3,4")])


def _reshape_method(b: Bound) -> str:
    if b.varargs and len(b.varargs) == 1 and is_dtype_expr(b.varargs[0].value, b.ctx):
        if torch_dtype_name(b.varargs[0].value, b.ctx) is None:
            raise NotMine("a numpy array's view(dtype)")
        raise Manual("view(dtype) reinterprets the bytes: write jax.lax.bitcast_convert_type")
    if b.has("shape"):
        return f"{b.atom('input')}.reshape({b['shape']})"
    return f"{b.atom('input')}.reshape({', '.join(('*' if a.star else '') + code(a.value) for a in b.varargs)})"


op([".view", ".reshape"], "input, *shape", _reshape_method, "x.reshape(shape)", "torch's view needs contiguous memory; JAX arrays have no strides",
   [Case("@(a, 4, 3)", a="f3,4"), Case("@(a, -1)", a="f3,4"), Case("@(a, (2, 6))", a="f3,4"), Case("@(a, a.size(0), -1)", a="f3,4,2"),
    Case("@(a, *b.shape)", a="f12", b="f3,4")], shared=False)
op([".view_as", ".reshape_as"], "input, other", lambda b: f"{b.atom('input')}.reshape({b.atom('other')}.shape)", "x.reshape(other.shape)",
   cases=[Case("@(a, b)", a="f3,4", b="f2,6")])


def _flatten(b: Bound) -> str:
    s = b.lit("start_dim", 0)
    e = b.lit("end_dim", -1)
    x = b.atom("input")
    if s is NOT_LITERAL or e is NOT_LITERAL:
        raise Manual("flatten with non-literal start_dim/end_dim")
    if s == 0 and e == -1:
        return f"{b.jnp}.ravel({b['input']})"
    head = f"{x}.shape[:{s}] + " if s else ""
    tail = "" if e == -1 else f" + {x}.shape[{e + 1}:]" if e != -1 else ""
    if e < -1:
        tail = f" + {x}.shape[{e + 1}:]"
    if s == 1 and e == -1:
        return f"{b.jnp}.reshape({b['input']}, ({x}.shape[0], -1))"
    return f"{b.jnp}.reshape({b['input']}, {head}(-1,){tail})"


op(["torch.flatten", ".flatten"], "input, start_dim, end_dim", _flatten, "jnp.reshape(x, x.shape[:start] + (-1,) + x.shape[end+1:])",
   cases=[Case("@(a)", a="f2,3,4"), Case("@(a, 1)", a="f2,3,4"), Case("@(a, start_dim=1)", a="f2,3,4,5"),
          Case("@(a, 0, 1)", a="f2,3,4"), Case("@(a, 1, 2)", a="f2,3,4,5"), Case("@(a, 2)", a="f2,3,4,5")], shared=True)
op(["torch.unsqueeze", ".unsqueeze"], "input, dim", call("jnp.expand_dims", "input", "dim"),
   cases=[Case("@(a, 0)", a="f3,4"), Case("@(a, dim=-1)", a="f3,4"), Case("@(a, 1)", a="f3,4")])


def _squeeze(b: Bound) -> str:
    if not b.has("dim"):
        return f"{b.jnp}.squeeze({b['input']})"
    return f"{b.jnp}.squeeze({b['input']}, axis={_axis(b)})"


op(["torch.squeeze", ".squeeze"], "input, dim", _squeeze, "jnp.squeeze(x, axis=dim)",
   "torch.squeeze(x, d) is a no-op when size d is not 1; jnp.squeeze raises there (loud, never silently different)",
   [Case("@(a)", a="f3,1,4"), Case("@(a, 1)", a="f3,1,4"), Case("@(a, dim=-1)", a="f3,4,1")], shared=True)


def _permute(b: Bound) -> str:
    return f"{b.jnp}.transpose({b['input']}, {b.shape('dims')})"


op(["torch.permute", ".permute"], "input, *dims", _permute, "jnp.transpose(x, dims)",
   cases=[Case("a.permute(2, 0, 1)", a="f2,3,4"), Case("@(a, (1, 0, 2))", a="f2,3,4")])
op(["torch.transpose", ".transpose", "torch.swapaxes", ".swapaxes"], "input, dim0, dim1",
   call("jnp.swapaxes", "input", "dim0", "dim1"), note="torch's transpose swaps two dims (jnp.transpose permutes all)",
   cases=[Case("@(a, 0, 1)", a="f2,3,4"), Case("@(a, 1, -1)", a="f2,3,4")], shared=True)  # numpy: transpose, swapaxes
op(["torch.movedim", ".movedim", "torch.moveaxis", ".moveaxis"], "input, source, destination",
   call("jnp.moveaxis", "input", "source", "destination"), cases=[Case("@(a, 0, -1)", a="f2,3,4")])
op(["torch.t", ".t"], "input", lambda b: f"{b.atom('input')}.T", "x.T", "x.t() of a 1-D tensor is itself, as x.T is",
   [Case("@(a)", a="f3,4"), Case("@(a)", a="f3")], shared=True)
op(["torch.chunk", ".chunk"], "input, chunks, dim", call("jnp.split", "input", "chunks", axis="dim"),
   note="equal for sizes divisible by chunks; torch makes uneven (and possibly fewer) chunks otherwise, where jnp.split raises",
   cases=[Case("@(a, 2)", a="f4,3"), Case("@(a, 3, dim=1)", a="f2,6"), Case("@(a, 2, -1)[0]", a="f2,6")], shared=True)


def _split(b: Bound) -> str:
    s = b.lit("split_size_or_sections")
    axis = b.get("dim", "0")
    x = b["input"]
    if isinstance(s, int) and not isinstance(s, bool):
        xa = b.atom("input")
        return f"{b.jnp}.split({x}, list(range({s}, {xa}.shape[{axis}], {s})), axis={axis})"
    if isinstance(s, (list, tuple)) and all(isinstance(v, int) for v in s):
        cuts, total = [], 0
        for v in s[:-1]:
            total += v
            cuts.append(str(total))
        return f"{b.jnp}.split({x}, [{', '.join(cuts)}], axis={axis})"
    # sizes known only when the code runs (`x.split(self.n_embd, dim=2)`): the port's torch_split
    # (JX011 emits it) turns them into jnp.split's indices then
    return f"torch_split({x}, {b['split_size_or_sections']}, {axis})"


op(["torch.split", ".split"], "input, split_size_or_sections, dim", _split, "jnp.split(x, indices, axis=dim)",
   "torch.split takes sizes (an int: chunks of that size, the last smaller; a list: the sizes), jnp.split takes cut indices: "
   "the port computes the indices",
   [Case("@(a, 2)", a="f5,3"), Case("@(a, [1, 3], dim=1)", a="f2,4"), Case("@(a, 2, dim=1)[1]", a="f2,4"), Case("@(a, (2, 2, 1))", a="f5,3")],
   shared=True)
op(["torch.unbind", ".unbind"], "input, dim", call("jnp.unstack", "input", axis="dim"),
   cases=[Case("@(a)", a="f3,4"), Case("@(a, dim=1)", a="f3,4")])


def _expand(b: Bound) -> str:
    items = b.shape_items("sizes")
    x = b.atom("input")
    if items is None:
        return f"{b.jnp}.broadcast_to({b['input']}, {b.shape('sizes')})"
    n = len(items)
    fixed = [f"{x}.shape[{i - n}]" if it.replace(" ", "") == "-1" else it for i, it in enumerate(items)]
    return f"{b.jnp}.broadcast_to({b['input']}, ({', '.join(fixed)}{',' if n == 1 else ''}))"


op(".expand", "input, *sizes", _expand, "jnp.broadcast_to(x, sizes)", "a size of -1 keeps that dimension (x.shape[i])",
   [Case("a.expand(3, 4)", a="f1,4"), Case("a.expand(2, -1, 4)", a="f3,1"), Case("a.expand((2, 3, 4))", a="f3,4")])
op(".expand_as", "input, other", lambda b: f"{b.jnp}.broadcast_to({b['input']}, {b.atom('other')}.shape)", "jnp.broadcast_to(x, other.shape)",
   cases=[Case("a.expand_as(b)", a="f1,4", b="f3,4")])
op(["torch.broadcast_to"], "input, size", call("jnp.broadcast_to", "input", "size"), cases=[Case("torch.broadcast_to(a, (3, 4))", a="f1,4")])
op(".repeat", "input, *repeats", lambda b: f"{b.jnp}.tile({b['input']}, {b.shape('repeats')})", "jnp.tile(x, repeats)",
   "torch's repeat tiles the whole tensor (jnp.tile), unlike jnp.repeat", [Case("a.repeat(2, 3)", a="f3,4"), Case("a.repeat(2, 1, 1)", a="f3,4")],
   shared=True)
op(["torch.tile", ".tile"], "input, dims", call("jnp.tile", "input", "dims"), cases=[Case("@(a, (2, 1))", a="f3,4")])
op(["torch.repeat_interleave", ".repeat_interleave"], "input, repeats, dim, *, output_size",
   call("jnp.repeat", "input", "repeats", axis="dim", total_repeat_length="output_size"), note="without dim both flatten first",
   cases=[Case("@(a, 2)", a="f3,4"), Case("@(a, 2, dim=1)", a="f3,4"), Case("@(a, 2, dim=0, output_size=6)", a="f3,4")])
op(["torch.gather", ".gather"], "input, dim, index, *, sparse_grad", call("jnp.take_along_axis", "input", "index", axis="dim"),
   note="same result when index has input's shape outside dim (take_along_axis broadcasts, torch.gather allows a smaller index)",
   cases=[Case("@(a, 1, i)", a="f3,4", i="i3,2:4"), Case("@(a, dim=0, index=i)", a="f3,4", i="i2,4:3")])
op(["torch.index_select", ".index_select"], "input, dim, index", call("jnp.take", "input", "index", axis="dim"),
   cases=[Case("@(a, 0, i)", a="f3,4", i="i5:3"), Case("@(a, dim=1, index=i)", a="f3,4", i="i2:4")])
op([".masked_fill", "torch.masked_fill"], "input, mask, value", lambda b: f"{b.jnp}.where({b['mask']}, {b['value']}, {b['input']})",
   "jnp.where(mask, value, x)", "for a float x (an integer x filled with a float value would be promoted by jnp.where, cast by torch)",
   [Case("@(a, m, -1e9)", a="f3,4", m="b3,4"), Case("@(a, m, float('-inf'))", a="f3,4", m="b3,4"), Case("@(a, a > 0, 0.0)", a="f3,4")])
op(["torch.narrow", ".narrow"], "input, dim, start, length",
   lambda b: f"{b.jax}.lax.slice_in_dim({b['input']}, {b['start']}, {atom(b.node('start'))} + {b.atom('length')}, axis={b['dim']})",
   "jax.lax.slice_in_dim(x, start, start + length, axis=dim)", cases=[Case("@(a, 1, 1, 2)", a="f3,4")])
op(["torch.flip", ".flip"], "input, *dims", lambda b: f"{b.jnp}.flip({b['input']}, axis={b.shape('dims')})", "jnp.flip(x, axis=dims)",
   cases=[Case("a.flip(0)", a="f3,4"), Case("@(a, [0, 1])", a="f3,4"), Case("@(a, dims=(1,))", a="f3,4")])
op(["torch.roll", ".roll"], "input, shifts, dims", call("jnp.roll", "input", "shifts", axis="dims"),
   cases=[Case("@(a, 1)", a="f3,4"), Case("@(a, 2, dims=1)", a="f3,4"), Case("@(a, (1, 2), (0, 1))", a="f3,4")])
for _fn in ("tril", "triu"):
    op([f"torch.{_fn}", f".{_fn}"], "input, diagonal", call(f"jnp.{_fn}", "input", k="diagonal"),
       cases=[Case("@(a)", a="f4,4"), Case("@(a, diagonal=1)", a="f4,4"), Case("@(a, -1)", a="f3,4")])
op(["torch.diagonal", ".diagonal"], "input, offset, dim1, dim2", call("jnp.diagonal", "input", offset="offset", axis1="dim1", axis2="dim2"),
   cases=[Case("@(a)", a="f4,4"), Case("@(a, 1)", a="f3,4"), Case("@(a, dim1=1, dim2=2)", a="f2,3,3")], shared=True)
op(["torch.diag", ".diag"], "input, diagonal", call("jnp.diag", "input", k="diagonal"), cases=[Case("@(a)", a="f4"), Case("@(a, 1)", a="f3,3")])
op(["torch.trace", ".trace"], "input", call("jnp.trace", "input"), cases=[Case("@(a)", a="f4,4")], shared=True)
def _einsum(b: Bound) -> str:
    ops = ", ".join(("*" if a.star else "") + code(a.value) for a in b.varargs)
    if not ops:
        raise Manual("einsum without operands")
    return f"{b.jnp}.einsum({b['equation']}, {ops})"


op(["torch.einsum"], "equation, *operands", _einsum, "jnp.einsum(equation, *operands)",
   note="a list of operands (torch.einsum(eq, [a, b])) is passed as one argument, which jnp.einsum rejects (loud)",
   cases=[Case("torch.einsum('bij,bjk->bik', a, b)", a="f2,3,4", b="f2,4,5"), Case("torch.einsum('ij->j', a)", a="f3,4")])


def _cdist(b: Bound) -> str:
    if b.has("p") and b.lit("p") not in (2, 2.0):
        raise Manual("cdist with p != 2 is not ported")
    j = b.jnp
    x1, x2 = b.atom("x1"), b.atom("x2")
    return f"{j}.sqrt({j}.maximum({j}.sum(({x1}[..., :, None, :] - {x2}[..., None, :, :]) ** 2, axis=-1), 0.0))"


op(["torch.cdist"], "x1, x2, p", _cdist, "jnp.sqrt(jnp.sum((x1[..., :, None, :] - x2[..., None, :, :]) ** 2, axis=-1))", "p=2 only",
   [Case("torch.cdist(a, b)", a="f3,4", b="f5,4")])


# Creation
def _creation(fn: str):
    def build(b: Bound) -> str:
        parts = [b.shape("size")]
        if b.has("dtype"):
            parts.append(f"dtype={b.dtype()}")
        return f"{b.jnp}.{fn}({', '.join(parts)})"

    return build


for _fn, _jfn in (("zeros", "zeros"), ("ones", "ones"), ("empty", "zeros")):
    op(f"torch.{_fn}", "*size, out, dtype, layout, device, requires_grad", _creation(_jfn), f"jnp.{_jfn}(shape, dtype=dtype)",
       "device= and requires_grad= are dropped" + ("; torch.empty's contents are arbitrary, the port's are zeros" if _fn == "empty" else ""),
       [Case(f"torch.{_fn}(2, 3)"), Case(f"torch.{_fn}((2, 3), dtype=torch.int64)"), Case(f"torch.{_fn}(4, device='cpu')"),
        Case(f"torch.{_fn}(a.shape)", a="f3,4"), Case(f"torch.{_fn}(a.size(0), 5)", a="f3,4")], arbitrary=_fn == "empty")


def _full(b: Bound) -> str:
    parts = [b["size"], b["fill_value"]]
    if b.has("dtype"):
        parts.append(f"dtype={b.dtype()}")
    return f"{b.jnp}.full({', '.join(parts)})"


op("torch.full", "size, fill_value, *, out, dtype, layout, device, requires_grad", _full, "jnp.full(shape, fill_value, dtype=dtype)",
   cases=[Case("torch.full((2, 3), 1.5)"), Case("torch.full((2,), 7, dtype=torch.float32)")])
for _fn, _jfn in (("zeros_like", "zeros_like"), ("ones_like", "ones_like"), ("empty_like", "zeros_like")):
    op(f"torch.{_fn}", "input, *, dtype, layout, device, requires_grad, memory_format", call(f"jnp.{_jfn}", "input", dtype="dtype"),
       cases=[Case(f"torch.{_fn}(a)", a="f3,4"), Case(f"torch.{_fn}(a, dtype=torch.int32)", a="f3,4")], arbitrary=_fn == "empty_like")
op("torch.full_like", "input, fill_value, *, dtype, layout, device, requires_grad, memory_format",
   call("jnp.full_like", "input", "fill_value", dtype="dtype"), cases=[Case("torch.full_like(a, 2.5)", a="f3,4")])
for _fn, _jfn in (("new_zeros", "zeros"), ("new_ones", "ones"), ("new_empty", "zeros")):
    op(f".{_fn}", "input, *size, dtype, device, requires_grad, layout, pin_memory",
       lambda b, _jfn=_jfn: f"{b.jnp}.{_jfn}({b.shape('size')}, dtype={b.dtype() if b.has('dtype') else b.atom('input') + '.dtype'})",
       f"jnp.{_jfn}(size, dtype=x.dtype)", cases=[Case(f"a.{_fn}((2, 3))", a="f3,4"), Case(f"a.{_fn}(2, 3)", a="i3,4:3")],
       arbitrary=_fn == "new_empty")
op(".new_full", "input, size, fill_value, *, dtype, device, requires_grad, layout, pin_memory",
   lambda b: f"{b.jnp}.full({b['size']}, {b['fill_value']}, dtype={b.dtype() if b.has('dtype') else b.atom('input') + '.dtype'})",
   "jnp.full(size, fill_value, dtype=x.dtype)", cases=[Case("a.new_full((2, 3), 4)", a="f3,4")])
op(".new_tensor", "input, data, *, dtype, device, requires_grad, layout, pin_memory",
   lambda b: f"{b.jnp}.asarray({b['data']}, dtype={b.dtype() if b.has('dtype') else b.atom('input') + '.dtype'})",
   "jnp.asarray(data, dtype=x.dtype)", cases=[Case("a.new_tensor([1, 2, 3])", a="f3,4")])


def _arange(b: Bound) -> str:
    parts = [b["start"]]
    if b.has("end"):
        parts.append(b["end"])
    if b.has("step"):
        parts.append(b["step"])
    if b.has("dtype"):
        parts.append(f"dtype={b.dtype()}")
    return f"{b.jnp}.arange({', '.join(parts)})"


op("torch.arange", "start, end, step, *, out, dtype, layout, device, requires_grad", _arange, "jnp.arange(start, end, step, dtype=dtype)",
   "integer arguments give int64 in torch, int32 in JAX",
   [Case("torch.arange(5)"), Case("torch.arange(1, 7, 2)"), Case("torch.arange(0, 1, 0.25)"), Case("torch.arange(4, dtype=torch.float32)"),
    Case("torch.arange(a.size(1))", a="f3,4")])
op("torch.linspace", "start, end, steps, *, out, dtype, layout, device, requires_grad", call("jnp.linspace", "start", "end", "steps", dtype="dtype"),
   cases=[Case("torch.linspace(0, 1, 5)"), Case("torch.linspace(-1, 1, steps=4)")])
op("torch.eye", "n, m, *, out, dtype, layout, device, requires_grad", call("jnp.eye", "n", "m?", dtype="dtype"),
   cases=[Case("torch.eye(3)"), Case("torch.eye(2, 4)")])
op(["torch.tensor", "torch.as_tensor"], "data, dtype, device, requires_grad, pin_memory", call("jnp.asarray", "data", dtype="dtype"),
   note="Python ints give int64 in torch, int32 in JAX",
   cases=[Case("@([1.0, 2.0])"), Case("@([[1, 2], [3, 4]])"), Case("@(0.5, dtype=torch.float32)"), Case("torch.as_tensor(a)", a="f3")])
# the legacy typed constructors: a host buffer (``ids = torch.LongTensor(n)`` filled by item
# assignment in a data loader) or data; NumPy keeps both mutable on the host
_LEGACY_TENSORS = {"Tensor": "float32", "FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
                   "LongTensor": "int64", "IntTensor": "int32", "ShortTensor": "int16", "ByteTensor": "uint8",
                   "BoolTensor": "bool_"}


def _legacy_tensor(dtype: str):
    def build(b: Bound) -> str:
        sizes = b.args.get("size")
        if (isinstance(sizes, _SEQUENCES) or _sequence_name(sizes, b.ctx)) and not b.has("more"):
            return f"{b.np}.asarray({b['size']}, dtype={b.np}.{dtype})"
        if b.has("more") or isinstance(sizes, cst.Integer) or _integer_name(sizes, b.ctx):
            parts = [b["size"], *([b["more"]] if b.has("more") else [])]
            return f"{b.np}.zeros(({', '.join(parts)}{',' if len(parts) == 1 else ''}), dtype={b.np}.{dtype})"
        raise Manual("a legacy typed constructor of data or of a size: write np.asarray(data, dtype=...) "
                     "or np.zeros(shape, dtype=...)")

    return build


_SEQUENCES = (cst.List, cst.Tuple, cst.ListComp)


def _sequence_name(node, ctx) -> bool:
    """A name every binding of which in the file is a list or tuple display or a list
    comprehension (``idxs = [to_ix[w] for w in seq]``): no parameter, loop target or other
    value has the name anywhere."""
    if not isinstance(node, cst.Name) or ctx is None:
        return False
    name = node.value
    values = astutil.assigned_values(ctx.module, name)
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.FunctionDef):
            values += astutil.assigned_values(n, name)
            if any(p.name.value == name for p in astutil.params(n.params)):
                return False
        elif isinstance(n, (cst.For, cst.CompFor, cst.AugAssign, cst.NamedExpr)) and name in astutil.target_names(n.target):
            return False
        elif isinstance(n, cst.AsName) and name in astutil.target_names(n.name):
            return False
    return bool(values) and all(isinstance(v, _SEQUENCES) for v in values)


def _integer_name(node, ctx) -> bool:
    """A name the file binds only to integers (``n = 0``, ``n += len(words)``, ``n = len(x)``)."""
    if not isinstance(node, cst.Name) or ctx is None:
        return False
    seen = False
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == node.value for t in n.targets):
            if not (isinstance(n.value, cst.Integer) or (isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Name)
                                                         and n.value.func.value in ("len", "int"))):
                return False
            seen = True
        elif isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Name) and n.target.value == node.value:
            seen = True
    return seen


for _name, _dt in _LEGACY_TENSORS.items():
    op(f"torch.{_name}", "size, more", _legacy_tensor(_dt), f"np.zeros(shape, dtype=np.{_dt}) / np.asarray(data, dtype=np.{_dt})",
       "a host buffer or data, as a NumPy array (mutable, like the torch tensor); torch's contents of a new "
       "buffer are arbitrary, the port's are zeros",
       [Case(f"torch.{_name}(3)"), Case(f"torch.{_name}(2, 3)"), Case(f"torch.{_name}([1, 0, 1])")], arbitrary=True)
op("torch.from_numpy", "ndarray", call("jnp.asarray", "ndarray"), cases=[Case("torch.from_numpy(np.arange(4.0))")])
op("torch.finfo", "type", call("jnp.finfo", "type"), cases=[Case("torch.finfo(torch.float32).eps"), Case("torch.finfo(torch.float32).min")])
op("torch.iinfo", "type", call("jnp.iinfo", "type"), cases=[Case("torch.iinfo(torch.int32).max")])
op("torch.numel", "input", lambda b: f"{b.atom('input')}.size", "x.size", cases=[Case("torch.numel(a)", a="f3,4")])
op("torch.is_tensor", "obj", lambda b: f"isinstance({b['obj']}, {b.jax}.Array)", "isinstance(x, jax.Array)", cases=[Case("torch.is_tensor(a)", a="f3")])

# Tensor attributes and conversions
op(".size", "input, dim", lambda b: f"{b.atom('input')}.shape[{b['dim']}]" if b.has("dim") else f"{b.atom('input')}.shape",
   "x.shape / x.shape[d]", "torch.Size is a tuple; so is x.shape",
   [Case("a.size()", a="f3,4"), Case("a.size(1)", a="f3,4"), Case("a.size(-1)", a="f3,4"), Case("a.size(dim=0)", a="f3,4")], shared=True)
op([".dim", ".ndimension"], "input", lambda b: f"{b.atom('input')}.ndim", "x.ndim", cases=[Case("@(a)", a="f2,3,4")])
op([".numel", ".nelement"], "input", lambda b: f"{b.atom('input')}.size", "x.size", cases=[Case("@(a)", a="f2,3,4")])
op(".element_size", "input", lambda b: f"{b.atom('input')}.dtype.itemsize", "x.dtype.itemsize", cases=[Case("a.element_size()", a="f3")])
op(".is_floating_point", "input", lambda b: f"{b.jnp}.issubdtype({b.atom('input')}.dtype, {b.jnp}.floating)",
   "jnp.issubdtype(x.dtype, jnp.floating)", cases=[Case("a.is_floating_point()", a="f3"), Case("a.is_floating_point()", a="i3:2")])
op(".contiguous", "input, memory_format", lambda b: b["input"], "x", "dropped: JAX arrays have no memory layout to make contiguous",
   [Case("a.contiguous()", a="f3,4")])
op(".clone", "input, *, memory_format", call("jnp.copy", "input"), note="JAX arrays are immutable: a copy is only needed for identity",
   cases=[Case("a.clone()", a="f3,4")])
op(".detach", "input", call("jax.lax.stop_gradient", "input"), cases=[Case("a.detach()", a="f3,4")])
op(["torch.detach"], "input", call("jax.lax.stop_gradient", "input"), cases=[Case("torch.detach(a)", a="f3,4")])


def _variable(b: Bound) -> str:
    grad = b.args.get("requires_grad", b.dropped.get("requires_grad"))
    if grad is not None and literal(grad) is not False:
        raise Manual("Variable(..., requires_grad=...): a leaf the script differentiates by hand; make it an nnx.Param "
                     "of a module (or an argument of the function jax.grad differentiates)")
    return b["data"]


op("torch.autograd.Variable", "data, requires_grad, volatile", _variable, "x",
   "dropped: since torch 0.4 a Variable is its tensor (volatile= is ignored); one that requires grad is reported",
   [Case("torch.autograd.Variable(a)", a="f3,4"), Case("torch.autograd.Variable(a, volatile=True)", a="f3,4")])
op(".cpu", "input, memory_format", lambda b: b["input"], "x",
   "dropped: a host read happens where the value is used (np.asarray, float(), .item())", [Case("a.cpu()", a="f3,4")], shared=True)
op(".numpy", "input, *, force", call("np.asarray", "input"), note="a host read (device-to-host transfer)", cases=[Case("a.numpy()", a="f3,4")],
   shared=True)
op(".tolist", "input", lambda b: f"{b.atom('input')}.tolist()", "x.tolist()", cases=[Case("a.tolist()", a="f3")], shared=True)
op(".item", "input", lambda b: f"{b.atom('input')}.item()", "x.item()",
   "kept: jax.Array.item() exists; it is a host read (a device-to-host transfer), which the loop rules keep out of the jitted step",
   [Case("a.item()", a="f1"), Case("a.sum().item()", a="i3:5")], shared=True)


def _cast(dtype: str):
    def build(b: Bound) -> str:
        return f"{b.atom('input')}.astype({b.jnp}.{dtype})"

    return build


for _m, _dt in (("float", "float32"), ("double", "float64"), ("half", "float16"), ("bfloat16", "bfloat16"),
                ("long", "int32"), ("int", "int32"), ("short", "int16"), ("bool", "bool_"), ("byte", "uint8"), ("char", "int8")):
    op(f".{_m}", "input, memory_format", _cast(_dt), f"x.astype(jnp.{_dt})",
       "64-bit types need jax_enable_x64: long() gives int32" if _m == "long" else "",
       [Case(f"a.{_m}()", a=("f3,4" if _m not in ("byte", "char") else "p3,4") if _m not in ("float", "double", "half", "bfloat16") else "i3,4:9")] if _m != "double" else [Case("a.double().float()", a="f3,4")],
       shared=_m in ("float", "int", "bool"))


def _to(b: Bound) -> str:
    if b.has("dtype"):
        dt = b.node("dtype")
    elif b.has("arg") and is_dtype_expr(b.node("arg"), b.ctx):
        dt = b.node("arg")
    elif b.has("other"):
        return f"{b.atom('input')}.astype({b.atom('other')}.dtype)"
    else:
        raise NotMine("x.to(device) is device placement (the loop rules)")
    t = torch_dtype_name(dt, b.ctx)
    return f"{b.atom('input')}.astype({b.jnp + '.' + DTYPES[t] if t else code(dt)})"


class NotMine(Exception):
    """The call is not this table's business (``x.to(device)``: device placement belongs to
    the loop rules): no finding at all."""


op(".to", "input, arg, dtype, non_blocking, copy, *, other, memory_format, device", _to, "x.astype(dtype)",
   "only dtype conversions; x.to(device) is device placement (the loop rules)",
   [Case("a.to(torch.float32)", a="i3,4:5"), Case("a.to(dtype=torch.int32)", a="f3,4"), Case("a.to('cpu', dtype=torch.float16).float()", a="f3,4")],
   shared=True)


def _type(b: Bound) -> str:
    if not b.has("dtype"):
        raise NotMine("x.type() returns a type name string")
    if not is_dtype_expr(b.node("dtype"), b.ctx):
        raise Manual("x.type(...) with a type string or tensor class: write x.astype(jnp.<dtype>)")
    return f"{b.atom('input')}.astype({b['dtype']})"


op(".type", "input, dtype, non_blocking", _type, "x.astype(dtype)", cases=[Case("a.type(torch.float32)", a="i3:4")], shared=True)
op(".type_as", "input, other", lambda b: f"{b.atom('input')}.astype({b.atom('other')}.dtype)", "x.astype(other.dtype)",
   cases=[Case("a.type_as(b)", a="i3,4:5", b="f2")])

# torch.nn.functional (besides activations and losses)
op("F.linear", "input, weight, bias",
   lambda b: f"{atom(b.node('input'))} @ {b.atom('weight')}.T" + (f" + {b.atom('bias')}" if b.has("bias") and b.lit("bias") is not None else ""),
   "x @ weight.T + bias", "weight in torch's (out, in) layout, as the call passed it",
   [Case("F.linear(a, w, bias)", a="f2,3", w="f4,3", bias="f4"), Case("F.linear(a, w)", a="f2,3", w="f4,3")])


def _normalize(b: Bound) -> str:
    p = b.get("p", "2.0")
    dim = b.get("dim", "1")
    eps = b.get("eps", "1e-12")
    x = atom(b.node("input"))
    return f"{x} / {b.jnp}.maximum({b.jnp}.linalg.norm({b['input']}, ord={p}, axis={dim}, keepdims=True), {eps})"


op("F.normalize", "input, p, dim, eps, out", _normalize, "x / jnp.maximum(jnp.linalg.norm(x, ord=p, axis=dim, keepdims=True), eps)",
   "torch's defaults: p=2, dim=1, eps=1e-12", [Case("F.normalize(a)", a="f3,4"), Case("F.normalize(a, dim=-1)", a="f3,4"),
                                                Case("F.normalize(a, p=1, dim=0)", a="f3,4")])


def _cosine_similarity(b: Bound) -> str:
    dim = b.get("dim", "1")
    eps = b.get("eps", "1e-8")
    x1, x2 = b["x1"], b["x2"]
    j = b.jnp
    return (f"{j}.sum({atom(b.node('x1'))} * {atom(b.node('x2'))}, axis={dim}) / {j}.maximum("
            f"{j}.linalg.norm({x1}, axis={dim}) * {j}.linalg.norm({x2}, axis={dim}), {eps})")


op("F.cosine_similarity", "x1, x2, dim, eps", _cosine_similarity, "sum(x1 * x2, dim) / max(|x1| * |x2|, eps)",
   "torch >= 2 clamps the product of the norms by eps", [Case("F.cosine_similarity(a, b)", a="f3,4", b="f3,4"),
                                                        Case("F.cosine_similarity(a, b, dim=0)", a="f3,4", b="f3,4")])


def _pairwise_distance(b: Bound) -> str:
    p = b.get("p", "2.0")
    eps = b.get("eps", "1e-6")
    keep = b.get("keepdim", "False")
    diff = f"{atom(b.node('x1'))} - {atom(b.node('x2'))} + {eps}"
    return f"{b.jnp}.linalg.norm({diff}, ord={p}, axis=-1, keepdims={keep})"


op("F.pairwise_distance", "x1, x2, p, eps, keepdim", _pairwise_distance, "jnp.linalg.norm(x1 - x2 + eps, ord=p, axis=-1)",
   "torch adds eps (1e-6) to the difference before the norm, over the last dimension",
   [Case("F.pairwise_distance(a, b)", a="f3,4", b="f3,4"), Case("F.pairwise_distance(a, b, p=1.0, keepdim=True)", a="f3,4", b="f3,4")])


def _pad(b: Bound) -> str:
    node = b.node("pad")
    mode = b.lit("mode", "constant")
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise Manual("mode= is not a literal porter knows")
    if not isinstance(node, (cst.Tuple, cst.List)) or any(isinstance(e, cst.StarredElement) for e in node.elements) or len(node.elements) % 2:
        raise Manual("F.pad's pad must be written out as (left, right, top, bottom, ...) pairs for porter to reorder it")
    widths = [bare(e.value) for e in node.elements]
    if any(isinstance(literal(e.value), (int, float)) and literal(e.value) < 0 for e in node.elements):
        raise Manual("negative padding crops in torch; jnp.pad cannot crop")
    pairs = [f"({widths[i]}, {widths[i + 1]})" for i in range(0, len(widths), 2)][::-1]
    k = len(pairs)
    x = atom(b.node("input"))
    spec = f"[(0, 0)] * ({x}.ndim - {k}) + [{', '.join(pairs)}]"
    extra = ""
    if mode == "constant" and b.has("value") and b.lit("value") is not None:
        extra = f", constant_values={b['value']}"
    mode_arg = "" if mode == "constant" else f", mode={modes[mode]!r}"
    return f"{b.jnp}.pad({b['input']}, {spec}{mode_arg}{extra})"


op("F.pad", "input, pad, mode, value", _pad, "jnp.pad(x, [(0, 0)] * (x.ndim - k) + [..., (top, bottom), (left, right)])",
   cases=[Case("F.pad(a, (1, 2))", a="f2,3,4"), Case("F.pad(a, (1, 1, 2, 0), value=-1.0)", a="f2,3,4"),
    Case("F.pad(a, (1, 1, 1, 1), mode='reflect')", a="f1,2,4,4"), Case("F.pad(a, (2, 1), mode='replicate')", a="f2,3,4"),
    Case("F.pad(a, (1, 1), 'circular')", a="f2,3,4"), Case("F.pad(a, (0, a.shape[-1] % 3, 1, a.size(1) // 2))", a="f2,3,4")],
   note="torch's pad tuple starts with the LAST dimension; the port reverses the pairs; replicate -> 'edge', circular -> 'wrap'; "
        "the widths may be expressions (a negative one makes jnp.pad raise where torch would crop)")


def _pool(kind: str, n: int, params: tuple[str, ...]):
    """F.max_poolNd / F.avg_poolNd -> the port's pool_nd (JX011 emits it): torch's padding,
    ceil_mode output size, dilation and divisor, on the original's channels-first layout."""

    def build(b: Bound) -> str:
        if b.has("return_indices") and b.lit("return_indices") is not False:
            raise Manual("return_indices: the indices output is not ported")
        if not b.has("kernel_size"):
            raise Manual("the call needs its 'kernel_size' argument spelled out")
        rest = [f"{name}={b[name]}" for name in params if b.has(name)]
        return f"pool_nd({b['input']}, {kind!r}, {n}, {', '.join(rest)})"

    return build


_MAX = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
_AVG = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
for _n in (1, 2, 3):
    _x = "f2,3" + ",7" * _n
    op(f"F.max_pool{_n}d", "input, kernel_size, stride, padding, dilation, ceil_mode, return_indices", _pool("max", _n, _MAX),
       f"pool_nd(x, 'max', {_n}, kernel_size=..., ...)",
       "channels-first kept (the port keeps the original's layout); -inf padding, torch's ceil_mode output size "
       "(the last window starts inside the input or its left padding), dilation",
       [Case(f"F.max_pool{_n}d(a, 2)", a=_x), Case(f"F.max_pool{_n}d(a, 3, stride=2, padding=1, ceil_mode=True)", a=_x),
        Case(f"F.max_pool{_n}d(a, 2, 1, 0, 2)", a=_x), Case(f"F.max_pool{_n}d(a, 2, 3, 1, ceil_mode=True)", a=_x)])
    # torch's own namespace spells the same op (no return_indices)
    op(f"torch.max_pool{_n}d", "input, kernel_size, stride, padding, dilation, ceil_mode", _pool("max", _n, _MAX),
       f"pool_nd(x, 'max', {_n}, kernel_size=..., ...)", f"as F.max_pool{_n}d",
       [Case(f"torch.max_pool{_n}d(a, 2)", a=_x), Case(f"torch.max_pool{_n}d(a, 3, 2, 1, 1, True)", a=_x)])
    op(f"F.avg_pool{_n}d",
       "input, kernel_size, stride, padding, ceil_mode, count_include_pad" + (", divisor_override" if _n > 1 else ""),
       _pool("avg", _n, _AVG if _n > 1 else _AVG[:-1]), f"pool_nd(x, 'avg', {_n}, kernel_size=..., ...)",
       "zero padding; the divisor counts the window's cells inside the padded input (count_include_pad) or the input, "
       "with ceil_mode's shorter last windows as torch counts them",
       [Case(f"F.avg_pool{_n}d(a, 2)", a=_x), Case(f"F.avg_pool{_n}d(a, 3, 2, 1, True)", a=_x),
        Case(f"F.avg_pool{_n}d(a, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)", a=_x),
        Case(f"F.avg_pool{_n}d(a, 2, 3, 1, True)", a=_x), Case(f"F.avg_pool{_n}d(a, 2, 3, 1, True, False)", a=_x),
        *([Case(f"F.avg_pool{_n}d(a, 2, divisor_override=3)", a=_x)] if _n > 1 else [])])


def _adaptive(kind: str, n: int):
    """F.adaptive_avg_poolNd / F.adaptive_max_poolNd -> the port's adaptive_pool_nd: torch's
    windows floor(i * L / out) .. ceil((i + 1) * L / out), overlapping where out does not divide L."""

    def build(b: Bound) -> str:
        if b.has("return_indices") and b.lit("return_indices") is not False:
            raise Manual("return_indices: the indices output is not ported")
        return f"adaptive_pool_nd({b['input']}, {kind!r}, {n}, {b['output_size']})"

    return build


for _n in (1, 2, 3):
    _x = "f2,3" + ",7" * _n
    op(f"F.adaptive_avg_pool{_n}d", "input, output_size", _adaptive("avg", _n), f"adaptive_pool_nd(x, 'avg', {_n}, output_size)",
       "torch's overlapping windows where the output size does not divide the input's; None keeps an axis",
       [Case(f"F.adaptive_avg_pool{_n}d(a, 1)", a=_x), Case(f"F.adaptive_avg_pool{_n}d(a, 3)", a=_x),
        Case(f"F.adaptive_avg_pool{_n}d(a, 5)", a=_x)])
    op(f"F.adaptive_max_pool{_n}d", "input, output_size, return_indices", _adaptive("max", _n),
       f"adaptive_pool_nd(x, 'max', {_n}, output_size)", "torch's windows; return_indices=True is reported",
       [Case(f"F.adaptive_max_pool{_n}d(a, 1)", a=_x), Case(f"F.adaptive_max_pool{_n}d(a, 3)", a=_x)])


def _layer_norm(b: Bound) -> str:
    """F.layer_norm -> the port's layer_norm_nd (JX011 emits it)."""
    rest = [f"{name}={b[name]}" for name in ("weight", "bias", "eps") if b.has(name)]
    return f"layer_norm_nd({', '.join([b['input'], b['normalized_shape'], *rest])})"


op("F.layer_norm", "input, normalized_shape, weight, bias, eps", _layer_norm,
   "layer_norm_nd(x, normalized_shape, weight=None, bias=None, eps=1e-5)",
   "over the last len(normalized_shape) axes (an int: the last one), biased variance, eps inside the square root, "
   "then weight and bias (None: none)",
   [Case("F.layer_norm(a, (4,))", a="f2,3,4"), Case("F.layer_norm(a, [3, 4], w, bias, 1e-6)", a="f2,3,4", w="f3,4", bias="f3,4"),
    Case("F.layer_norm(a, a.shape[-1:], weight=w, eps=1e-3)", a="f2,3,4", w="f4"), Case("F.layer_norm(a, (4,), None, bias)", a="f2,4", bias="f4")])


op(["torch.jit.is_scripting", "torch.jit.is_tracing"], "", lambda b: "False", "False",
   "a JAX port is never run by TorchScript or torch.jit.trace: the torch-only branch is skipped, as torch's eager run skips it",
   [Case("torch.jit.is_scripting()"), Case("torch.jit.is_tracing()")])


def _one_hot(b: Bound) -> str:
    if not b.has("num_classes") or b.lit("num_classes") == -1:
        raise Manual("one_hot without num_classes infers it from the data (a host read and a data-dependent shape): pass num_classes")
    return f"{b.jax}.nn.one_hot({b['tensor']}, {b['num_classes']}, dtype={b.jnp}.int32)"


op("F.one_hot", "tensor, num_classes", _one_hot, "jax.nn.one_hot(x, num_classes, dtype=jnp.int32)",
   "torch returns integers (int64); jax.nn.one_hot defaults to floats, so the port asks for int32",
   [Case("F.one_hot(i, 5)", i="i4:5"), Case("F.one_hot(i, num_classes=3)", i="i2,3:3")])


def _embedding(b: Bound) -> str:
    for k in ("padding_idx", "max_norm"):
        if b.has(k) and b.lit(k) is not None:
            raise Manual(f"F.embedding({k}=) is not ported")
    return f"{b.jnp}.take({b['weight']}, {b['input']}, axis=0)"


op("F.embedding", "input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse", _embedding,
   "jnp.take(weight, ids, axis=0)", cases=[Case("F.embedding(i, w)", i="i2,3:5", w="f5,4")])


def _sdpa(b: Bound) -> str:
    """F.scaled_dot_product_attention. Without a mask or dropout: jax.nn.dot_product_attention
    inline, on JAX's layout (the length and head axes swapped there and back). With an
    attn_mask (its dtype says how torch reads it, known only when the code runs) or a
    dropout_p that is not literally 0: the port's torch_sdpa (JX011), the dropout drawn from
    the module's nnx.Rngs."""
    q, k, v = b["query"], b["key"], b["value"]
    dropout = b.has("dropout_p") and b.lit("dropout_p") != 0.0  # not literally 0: may draw a mask
    masked = b.has("attn_mask") and b.lit("attn_mask") is not None
    scale = b["scale"] if b.has("scale") and b.lit("scale") is not None else None
    causal = b.lit("is_causal", False)
    if dropout or masked:
        args = [q, k, v]
        if masked:
            args.append(f"attn_mask={b['attn_mask']}")
        if dropout:
            args.append(f"dropout_p={b['dropout_p']}")
        if causal is not False:
            args.append(f"is_causal={b['is_causal']}")
        if scale is not None:
            args.append(f"scale={scale}")
        if b.has("enable_gqa") and b.lit("enable_gqa") is not False:
            args.append(f"enable_gqa={b['enable_gqa']}")
        if dropout:
            p = b["dropout_p"]
            args.append(f"rngs={b.module_rngs(f'attention dropout (dropout_p={p})')}")
        return f"torch_sdpa({', '.join(args)})"
    # torch: (..., L, E) with heads before L; jax.nn.dot_product_attention: (B, T, N, H). JAX
    # shares key/value heads among query heads when their numbers differ (torch's enable_gqa)
    j = b.jnp
    extra = "" if causal is False else f", is_causal={b['is_causal']}"
    if scale is not None:
        extra += f", scale={scale}"
    return (f"{j}.swapaxes({b.jax}.nn.dot_product_attention({j}.swapaxes({q}, -2, -3), {j}.swapaxes({k}, -2, -3), "
            f"{j}.swapaxes({v}, -2, -3){extra}), -2, -3)")


_QKV = dict(q="f2,3,5,4", k="f2,3,6,4", v="f2,3,6,4")
_SELF = dict(q="f2,3,5,4", k="f2,3,5,4", v="f2,3,5,4")
op("F.scaled_dot_product_attention", "query, key, value, attn_mask, dropout_p, is_causal, *, scale, enable_gqa", _sdpa,
   "jnp.swapaxes(jax.nn.dot_product_attention(q', k', v', is_causal=..., scale=...), -2, -3); torch_sdpa(q, k, v, attn_mask=..., dropout_p=..., rngs=self.rngs)",
   "torch's layout is (batch, heads, length, dim), JAX's (batch, length, heads, dim): the port swaps twice (3-D and 4-D "
   "inputs, values of the queries' size: JAX raises otherwise); is_causal keeps key j <= query i as torch (top left); "
   "scale= kept. An attn_mask (boolean: True takes part; float: added) or a dropout_p that is not literally 0 goes to the emitted torch_sdpa (any number of leading axes, "
   "rows with every key masked give zeros as torch's kernels do), whose attention-weight dropout draws from the "
   "module's nnx.Rngs (in a module method; elsewhere reported): `p if self.training else 0` gives torch's numbers in eval mode",
   [Case("F.scaled_dot_product_attention(q, k, v)", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, is_causal=True)", **_SELF),
    Case("F.scaled_dot_product_attention(q, k, v, None, 0.0, True)", **_SELF),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=False, scale=None)", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)", **_QKV),
    Case("F.scaled_dot_product_attention(query=q, key=k, value=v, scale=1.0 / q.shape[-1])", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, m)", m="b5,6", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.7)", m="b2,1,5,6", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m)", m="f2,3,5,6", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0)", m="f5,6", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m & (m.sum(-1, keepdim=True) > 3))", m="b5,6", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, m, 0.0, True)", m="b5,6", **_QKV),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m)", m="b5,6", q="f2,5,4", k="f2,6,4", v="f2,6,4"),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m)", m="f5,6", q="f5,4", k="f6,4", v="f6,4"),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.4)", m="b2,1,5,6", q="f2,3,5,4", k="f2,3,6,4", v="f2,3,6,7"),
    Case("F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)", q="f2,4,5,4", k="f2,2,5,4", v="f2,2,5,4"),
    Case("F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)", m="b5,6", q="f2,4,5,4", k="f2,2,6,4", v="f2,2,6,4"),
    Case("F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True)", **_SELF)])

# Reported for manual porting
_RANDOM = "random numbers need an explicit PRNG key in JAX (jax.random.<fn>(key, ...)): thread a key (nnx.Rngs) through this code"
for _fn in ("randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial", "randn_like", "rand_like", "randint_like", "poisson"):
    op(f"torch.{_fn}", "*args, generator, out, dtype, layout, device, requires_grad, pin_memory, low, high, size", None,
       f"jax.random.* (key)", manual=_RANDOM, cases=[Case(f"torch.{_fn}(3)")])
for _m in (".uniform_", ".normal_", ".bernoulli_", ".random_", ".exponential_"):
    op(_m, "input, *args, generator", None, "jax.random.* (key)", manual=_RANDOM, cases=[Case(f"a{_m}()", a="f3")])
op(["F.dropout", "F.dropout1d", "F.dropout2d", "torch.dropout", "F.alpha_dropout"], "input, p, training, inplace", None, "nnx.Dropout(rate, rngs=rngs)",
   manual="dropout needs a PRNG key and a train/eval switch: use an nnx.Dropout layer built with rngs (the module rules) or jax.random.bernoulli",
   cases=[Case("@(a, 0.5, training=True)", a="f3")])
_RESAMPLE = ("linear", "bilinear", "bicubic", "trilinear")


def _interpolate(b: Bound) -> str:
    mode = b.lit("mode", "nearest")
    s = b.lit("scale_factor", None)
    if mode in _RESAMPLE or (b.has("mode") and mode is NOT_LITERAL):  # a mode known at run time: interpolate_nd checks it
        for k in ("recompute_scale_factor", "antialias"):
            if b.has(k) and b.lit(k) not in (None, False):
                raise Manual(f"{k}= is not ported")
        if b.has("size") == b.has("scale_factor"):
            raise Manual("F.interpolate needs exactly one of size= and scale_factor=")
        args = [b["input"], f"size={b['size']}" if b.has("size") else f"scale_factor={b['scale_factor']}",
                f"mode={b['mode']}"]
        if b.has("align_corners"):
            args.append(f"align_corners={b['align_corners']}")
        return f"interpolate_nd({', '.join(args)})"
    if mode != "nearest" or b.has("size") or not (isinstance(s, int) and not isinstance(s, bool) and s >= 1):
        raise Manual("only mode='nearest' with an integer scale_factor, and 'linear' / 'bilinear' / 'bicubic' / 'trilinear' "
                     "are ported exactly: port and compare by hand")
    for k in ("align_corners", "recompute_scale_factor", "antialias"):
        if b.has(k) and b.lit(k) not in (None, False):
            raise Manual(f"{k}= is not ported")
    x = b.atom("input")
    # each element repeated in an s x s (x s) block: a Kronecker product with a block of ones
    return f"{b.jnp}.kron({b['input']}, {b.jnp}.ones((1, 1) + ({s},) * ({x}.ndim - 2), {x}.dtype))"


op("F.interpolate", "input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias", _interpolate,
   "jnp.kron(x, jnp.ones((1, 1) + (s,) * (x.ndim - 2), x.dtype)); interpolate_nd(x, size, scale_factor, mode, align_corners)",
   "nearest with an integer scale_factor (any number of spatial dims); linear / bilinear / bicubic / trilinear through "
   "the emitted interpolate_nd: torch's source positions (align_corners either way, 1 / scale_factor when given), its "
   "clamped borders and bicubic's A = -0.75; other modes, antialias and recompute_scale_factor are reported",
   cases=[Case("F.interpolate(a, scale_factor=2)", a="f1,2,2,3"), Case("F.interpolate(a, scale_factor=3, mode='nearest')", a="f2,3,4"),
          Case("F.interpolate(a, scale_factor=2)", a="f1,2,2,3,2"),
          Case("F.interpolate(a, size=(7, 3), mode='bicubic', align_corners=False)", a="f2,3,5,6"),
          Case("F.interpolate(a, size=(4, 9), mode='bicubic', align_corners=True)", a="f1,2,5,6"),
          Case("F.interpolate(a, scale_factor=1.7, mode='bilinear')", a="f2,2,5,4"),
          Case("F.interpolate(a, size=(2, 3), mode='bilinear', align_corners=True)", a="f1,2,5,7"),
          Case("F.interpolate(a, scale_factor=0.5, mode='bilinear', align_corners=False)", a="f1,2,8,6"),
          Case("F.interpolate(a, size=11, mode='linear')", a="f2,3,4"),
          Case("F.interpolate(a, size=(3, 4, 5), mode='trilinear', align_corners=True)", a="f1,1,2,3,4"),
          Case("m = 'bicubic'; F.interpolate(a, size=(6, 6), mode=m, align_corners=True)", a="f1,2,3,3")])
op(["F.upsample_bilinear", "F.grid_sample", "F.affine_grid"], "input, *args, size, scale_factor, mode, padding_mode, align_corners", None,
   "jax.image.resize / jax.scipy.ndimage.map_coordinates",
   manual="resampling: JAX's resize and map_coordinates sample at other positions than torch's conventions: port and compare by hand",
   cases=[Case("@(a, scale_factor=2)", a="f1,1,2,2")])


def _meshgrid(b: Bound) -> str:
    indexing = b.lit("indexing", "ij")
    if indexing not in ("ij", "xy"):
        raise Manual("indexing= is not a literal")
    ops_ = ", ".join(("*" if a.star else "") + code(a.value) for a in b.varargs)
    if len(b.varargs) == 1 and isinstance(b.varargs[0].value, (cst.List, cst.Tuple)) and not b.varargs[0].star:
        ops_ = "*" + code(b.varargs[0].value)
    return f"{b.jnp}.meshgrid({ops_}, indexing={indexing!r})"


op("torch.meshgrid", "*tensors, indexing", _meshgrid, "jnp.meshgrid(*tensors, indexing='ij')",
   "torch's default indexing is 'ij', jnp's 'xy': the port spells it out; the grids come back as a list (torch: a tuple)",
   [Case("torch.meshgrid(a, b, indexing='ij')", a="f3", b="f4"), Case("torch.meshgrid([a, b], indexing='xy')", a="f3", b="f4"),
    Case("torch.stack(torch.meshgrid(a, b))", a="f3", b="f2")])
op(["torch.nonzero", ".nonzero", "torch.masked_select", ".masked_select", "torch.unique", ".unique", "torch.argwhere"],
   "input, *args, as_tuple, sorted, return_inverse, return_counts, dim, mask", None, "jnp.nonzero(x, size=...)", cases=[Case("@(a)", a="f3")],
   manual="the result's shape depends on the data: jit needs a static size (jnp.nonzero(x, size=N, fill_value=...), "
          "jnp.unique(x, size=N)) or a mask with jnp.where", shared=True)
op(["torch.median", ".median"], "input, dim, keepdim", None, "jnp.quantile(x, 0.5, method='lower')",
   manual="torch.median returns the lower of the two middle values (and indices with dim=); jnp.median averages them",
   cases=[Case("@(a)", a="f4")], shared=True)
op([".register_hook", ".retain_grad", ".requires_grad_"], "input, *args", None, "nnx.value_and_grad",
   manual="autograd calls: gradients come from nnx.value_and_grad (wrt= filters choose what is trained); "
          "`loss.backward()` itself belongs to the training-loop rules", shared=True,
   cases=[Case("@(a)", a="f3")])
op(".pin_memory", "input, device", lambda b: b["input"], "x",
   "dropped: pinned host memory is for CUDA copies; the port's batches are host arrays the jitted step takes as they are",
   [Case("a.pin_memory()", a="f3,4")])
op([".data_ptr", ".storage", ".share_memory_"], "input, *args", None, "-",
   manual="storage and memory calls have no JAX counterpart", cases=[Case("@(a)", a="f3")])


# --------------------------------------------------------------------------------------
# Losses (rules JX150 for F.<loss>(...), JX151 for nn.<Loss>() instances)
# --------------------------------------------------------------------------------------
def _reduction(b: Bound, allowed=("mean", "sum", "none")) -> str:
    legacy = {k: b.lit(k, None) for k in ("size_average", "reduce")}
    if any(v is not None for v in legacy.values()):
        # torch's _Reduction.legacy_get_string: the deprecated pair overrides reduction=
        if any(v not in (None, True, False) for v in legacy.values()):
            raise Manual("size_average=/reduce= (deprecated in torch) must be literal True/False here: write reduction=")
        size_average, reduce = (True if v is None else v for v in legacy.values())
        return "mean" if size_average and reduce else "sum" if reduce else "none"
    r = b.lit("reduction", "mean")
    if r not in allowed:
        raise Manual("reduction= must be a literal " + "/".join(repr(a) for a in allowed))
    return r


def _reduce_loss(b: Bound, per: str, r: str) -> str:
    if r == "mean":
        return f"{_atom_text(per)}.mean()"
    if r == "sum":
        return f"{_atom_text(per)}.sum()"
    return per


def _atom_text(text: str) -> str:
    return atom(astutil.parse_expression(text))


def _opt(b: Bound, name: str) -> Optional[str]:
    """An optional argument's code; None when absent or a literal None."""
    if not b.has(name) or b.lit(name) is None:
        return None
    return b[name]


_FLOAT_MAKERS = ("float", "double", "half", "softmax", "sigmoid", "log_softmax")


def calls_with_float_targets(ctx: FileContext, name: str) -> bool:
    """Whether the loss object bound to ``name`` (``criterion``, ``self.loss``) is called at
    least once and every call passes a visibly float target (``criterion(out, soft.float())``)."""
    calls = [n for n in astutil.walk(ctx.module, into_functions=True)
             if isinstance(n, cst.Call) and _dotted(n.func) == name]
    targets = []
    for c in calls:
        positional = [a for a in c.args if a.keyword is None and not a.star]
        if len(positional) < 2:
            return False
        targets.append(positional[1].value)
    return bool(targets) and all(_float_target(t, ctx) for t in targets)


def _float_target(node: cst.CSTNode, ctx: FileContext) -> bool:
    """A target that is visibly a float tensor (class probabilities): `y.float()`,
    `F.softmax(...)`, `jax.nn.softmax(...)`, `x.astype(jnp.float32)`, `y.to(torch.float32)`,
    `torch.as_tensor(y, dtype=torch.float32)`."""
    if isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in _FLOAT_MAKERS + ("astype", "to"):
            if node.func.attr.value in ("astype", "to"):
                return any((code(a.value).rsplit(".", 1)[-1] in ("float32", "float", "float64", "float16", "bfloat16")) for a in node.args)
            return True
        q = ctx.qualname(node.func) or ""
        # torch.as_tensor(y, dtype=torch.float32); jnp.asarray(y, dtype=jnp.float32), which an
        # inner edit may have written before the file imports jnp (by its spelling then)
        if q in _FLOAT_CONVERSIONS or (not q and _dotted(node.func) in _FLOAT_CONVERSION_SPELLINGS):
            dtype = astutil.arg(node, "dtype")
            return dtype is not None and code(dtype.value).rsplit(".", 1)[-1] in _FLOAT_DTYPES
        return q.rsplit(".", 1)[-1] in ("softmax", "sigmoid", "smooth_labels")
    return False


_FLOAT_CONVERSIONS = ("torch.as_tensor", "torch.tensor", "jax.numpy.asarray", "jax.numpy.array")
_FLOAT_CONVERSION_SPELLINGS = ("jnp.asarray", "jnp.array")
_FLOAT_DTYPES = ("float32", "float", "float64", "double", "float16", "half", "bfloat16")


def _class_loss(kind: str):
    def build(b: Bound) -> str:
        r = _reduction(b)
        x, y = b["input"], b["target"]
        xa = b.atom("input")
        w = _opt(b, "weight")
        eps = None
        if kind == "ce" and b.has("label_smoothing"):
            v = b.lit("label_smoothing")
            if v != 0 and v != 0.0:
                eps = b["label_smoothing"] if v is NOT_LITERAL else repr(v)
        w_cls = f"{_atom_text(w)}.reshape((-1,) + (1,) * ({xa}.ndim - 2))" if w else None
        if kind == "ce" and (b.float_target or _float_target(b.node("target"), b.ctx)):
            if b.has("ignore_index"):
                raise Manual("ignore_index= with class-probability targets: torch does not allow it either")
            t = y if eps is None else f"{_atom_text(y)} * (1 - {eps}) + {eps} / {xa}.shape[1]"
            if w:
                per = f"-{b.jnp}.sum({b.jax}.nn.log_softmax({x}, axis=1) * {_atom_text(t)} * {w_cls}, axis=1)"
            else:
                per = f"{b.optax}.softmax_cross_entropy({x}, {t}, axis=1)"
            return _reduce_loss(b, per, r)
        mask = None
        ysafe = y
        if b.has("ignore_index"):
            mask = f"{b.atom('target')} != {b.atom('ignore_index')}"
            ysafe = f"{b.jnp}.where({mask}, {y}, 0)"
        if kind == "ce":
            per = f"{b.optax}.softmax_cross_entropy_with_integer_labels({x}, {ysafe}, axis=1)"
        else:
            per = f"-{b.jnp}.take_along_axis({x}, {b.jnp}.expand_dims({ysafe}, 1), axis=1).squeeze(1)"
        wy = None
        if w:
            wy = f"{_atom_text(w)}[{ysafe}]"
            if mask:
                wy = f"{b.jnp}.where({mask}, {wy}, 0.0)"
            per = f"{wy} * {_atom_text(per)}"
        elif mask:
            per = f"({mask}) * {_atom_text(per)}"
        if eps is not None:
            logp = f"{b.jax}.nn.log_softmax({x}, axis=1)"
            smooth = f"-{b.jnp}.sum({logp} * {w_cls}, axis=1)" if w else f"-{b.jnp}.sum({logp}, axis=1)"
            if mask:
                smooth = f"({mask}) * {_atom_text(smooth)}"
            per = f"(1 - {eps}) * {_atom_text(per)} + {eps} / {xa}.shape[1] * {_atom_text(smooth)}"
        if r == "mean" and (w or mask):
            return f"{b.jnp}.sum({per}) / {b.jnp}.sum({wy if w else mask})"
        return _reduce_loss(b, per, r)

    return build


def _pointwise_loss(per_fn):
    def build(b: Bound) -> str:
        r = _reduction(b)
        per = per_fn(b)
        w = _opt(b, "weight")
        if w:
            per = f"{_atom_text(w)} * {_atom_text(per)}"
        return _reduce_loss(b, per, r)

    return build


def _bce(b: Bound) -> str:
    x, y = b.atom("input"), b.atom("target")
    j = b.jnp
    return f"-({y} * {j}.maximum({j}.log({x}), -100.0) + (1 - {y}) * {j}.maximum({j}.log(1 - {x}), -100.0))"


def _bce_logits(b: Bound) -> str:
    pw = _opt(b, "pos_weight")
    if pw is None:
        return f"{b.optax}.sigmoid_binary_cross_entropy({b['input']}, {b['target']})"
    x, y = b["input"], b.atom("target")
    return f"-({_atom_text(pw)} * {y} * {b.jax}.nn.log_sigmoid({x}) + (1 - {y}) * {b.jax}.nn.log_sigmoid(-{b.atom('input')}))"


def _smooth_l1(b: Bound) -> str:
    beta = b.lit("beta", 1.0) if b.has("beta") else 1.0
    if beta == 0:
        return f"{b.jnp}.abs({b.atom('input')} - {b.atom('target')})"
    if beta == 1:
        return f"{b.optax}.huber_loss({b['input']}, {b['target']})"
    return f"{b.optax}.huber_loss({b['input']}, {b['target']}, delta={b['beta']}) / {b.atom('beta')}"


def _kl_div(b: Bound) -> str:
    r = _reduction(b, ("mean", "sum", "none", "batchmean"))
    x, y = b.atom("input"), b.atom("target")
    log_target = b.lit("log_target", False)
    if log_target is NOT_LITERAL:
        raise Manual("log_target= is not a literal")
    if log_target:
        per = f"{b.jnp}.exp({y}) * ({y} - {x})"
    else:
        per = f"{b.jax}.scipy.special.xlogy({b['target']}, {b['target']}) - {y} * {x}"
    if r == "batchmean":
        return f"{_atom_text(per)}.sum() / {x}.shape[0]"
    return _reduce_loss(b, per, r)


@dataclass(frozen=True)
class LossModule:
    name: str  # torch.nn.CrossEntropyLoss
    sig: Sig  # the constructor's parameters
    functional: Op


_LOSS_DEFS = [
    # functional name, functional signature, builder, target text, note, constructor, constructor signature, cases
    ("cross_entropy", "input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing", _class_loss("ce"),
     "optax.softmax_cross_entropy_with_integer_labels(x, y, axis=1).mean()",
     "class axis 1 as in torch; ignore_index: masked mean over the other targets; label_smoothing and weight as torch "
     "defines them; a target that is visibly a float tensor (y.float(), softmax(...)) is read as class probabilities "
     "(optax.softmax_cross_entropy). torch's default ignore_index=-100 is not masked unless written: a -100 label gives NaN, never a silent value",
     "CrossEntropyLoss", "weight, size_average, ignore_index, reduce, reduction, label_smoothing",
     [Case("@(a, y)", a="f4,5", y="i4:5"), Case("@(a, y, reduction='sum')", a="f4,5", y="i4:5"),
      Case("@(a, y, reduction='none')", a="f4,5", y="i4:5"), Case("@(a, y, ignore_index=0)", a="f6,5", y="i6:5"),
      Case("@(a, y, ignore_index=1, reduction='sum')", a="f6,5", y="i6:3"), Case("@(a, y, label_smoothing=0.1)", a="f4,5", y="i4:5"),
      Case("@(a, y, weight=w)", a="f6,5", y="i6:5", w="p5"), Case("@(a, y, weight=w, reduction='none')", a="f6,5", y="i6:5", w="p5"),
      Case("@(a, y, weight=w, ignore_index=2, label_smoothing=0.2)", a="f8,5", y="i8:5", w="p5"),
      Case("@(a, y, ignore_index=0, label_smoothing=0.1, reduction='sum')", a="f8,5", y="i8:4"),
      Case("@(a, y)", a="f2,5,3", y="i2,3:5"), Case("@(a, y, label_smoothing=0.1, weight=w)", a="f2,5,3", y="i2,3:5", w="p5"),
      Case("@(a, p.softmax(dim=1))", a="f4,5", p="f4,5"), Case("@(a, torch.as_tensor(p, dtype=torch.float32), reduction='none')", a="f4,5", p="u4,5"),
      Case("@(a, p.softmax(dim=1), label_smoothing=0.1, weight=w)", a="f4,5", p="f4,5", w="p5"),
      Case("nn.CrossEntropyLoss()(a, y)", a="f4,5", y="i4:5"),
      Case("crit = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.05); crit(a, y)", a="f6,5", y="i6:5")]),
    ("nll_loss", "input, target, weight, size_average, ignore_index, reduce, reduction", _class_loss("nll"),
     "-jnp.take_along_axis(logp, jnp.expand_dims(y, 1), axis=1).squeeze(1).mean()",
     "weights and ignore_index as torch (weighted mean over the other targets)", "NLLLoss", "weight, size_average, ignore_index, reduce, reduction",
     [Case("@(a.log_softmax(dim=1), y)", a="f4,5", y="i4:5"), Case("@(a, y, reduction='sum')", a="f4,5", y="i4:5"),
      Case("@(a, y, weight=w, ignore_index=1)", a="f6,5", y="i6:5", w="p5"), Case("@(a, y, reduction='none')", a="f2,5,3", y="i2,3:5"),
      Case("crit = nn.NLLLoss(weight=w); crit(a, y)", a="f6,5", y="i6:5", w="p5")]),
    ("mse_loss", "input, target, size_average, reduce, reduction, weight", _pointwise_loss(lambda b: f"{b.optax}.squared_error({b['input']}, {b['target']})"),
     "optax.squared_error(x, y).mean()", "", "MSELoss", "size_average, reduce, reduction",
     [Case("@(a, b)", a="f3,4", b="f3,4"), Case("nn.MSELoss(size_average=False)(a, b)", a="f3,4", b="f3,4"),
      Case("@(a, b, size_average=None, reduce=True, reduction='none')", a="f3,4", b="f3,4"), Case("@(a, b, reduction='sum')", a="f3,4", b="f3,4"), Case("@(a, b, reduction='none')", a="f3,4", b="f3,4"),
      Case("crit = nn.MSELoss(); crit(a, b)", a="f3,4", b="f3,4")]),
    ("l1_loss", "input, target, size_average, reduce, reduction", _pointwise_loss(lambda b: f"{b.jnp}.abs({b.atom('input')} - {b.atom('target')})"),
     "jnp.abs(x - y).mean()", "", "L1Loss", "size_average, reduce, reduction",
     [Case("@(a, b)", a="f3,4", b="f3,4"), Case("@(a, b, reduction='none')", a="f3,4", b="f3,4"), Case("nn.L1Loss(reduction='sum')(a, b)", a="f3,4", b="f3,4")]),
    ("smooth_l1_loss", "input, target, size_average, reduce, reduction, beta", _pointwise_loss(_smooth_l1),
     "(optax.huber_loss(x, y, delta=beta) / beta).mean()", "torch's smooth L1 is the Huber loss divided by beta (beta=0: L1)",
     "SmoothL1Loss", "size_average, reduce, reduction, beta",
     [Case("@(a * 2, b)", a="f3,4", b="f3,4"), Case("@(a, b, beta=0.5)", a="f3,4", b="f3,4"), Case("@(a, b, beta=0.0, reduction='sum')", a="f3,4", b="f3,4"),
      Case("crit = nn.SmoothL1Loss(beta=2.0); crit(a * 3, b)", a="f3,4", b="f3,4")]),
    ("huber_loss", "input, target, reduction, delta, weight", _pointwise_loss(lambda b: f"{b.optax}.huber_loss({b['input']}, {b['target']}" + (f", delta={b['delta']})" if b.has("delta") else ")")),
     "optax.huber_loss(x, y, delta=delta).mean()", "", "HuberLoss", "reduction, delta",
     [Case("@(a * 2, b)", a="f3,4", b="f3,4"), Case("@(a * 2, b, delta=0.5, reduction='sum')", a="f3,4", b="f3,4"),
      Case("nn.HuberLoss(delta=0.3)(a, b)", a="f3,4", b="f3,4")]),
    ("binary_cross_entropy", "input, target, weight, size_average, reduce, reduction", _pointwise_loss(_bce),
     "-(y * jnp.maximum(jnp.log(p), -100.0) + (1 - y) * jnp.maximum(jnp.log(1 - p), -100.0))", "torch clamps the logs at -100",
     "BCELoss", "weight, size_average, reduce, reduction",
     [Case("@(p, y)", p="u3,4", y="u3,4"), Case("@(p, y, weight=w, reduction='sum')", p="u3,4", y="u3,4", w="p4"),
      Case("crit = nn.BCELoss(); crit(p, y)", p="u5", y="u5"), Case("@(p, y, size_average=False)", p="u3,4", y="u3,4"),
      Case("@(p, y, size_average=True, reduce=False)", p="u3,4", y="u3,4")]),
    ("binary_cross_entropy_with_logits", "input, target, weight, size_average, reduce, reduction, pos_weight", _pointwise_loss(_bce_logits),
     "optax.sigmoid_binary_cross_entropy(x, y).mean()", "pos_weight: -(pos_weight * y * log_sigmoid(x) + (1 - y) * log_sigmoid(-x))",
     "BCEWithLogitsLoss", "weight, size_average, reduce, reduction, pos_weight",
     [Case("@(a, y)", a="f3,4", y="u3,4"), Case("@(a, y, pos_weight=pw)", a="f3,4", y="u3,4", pw="p4"),
      Case("@(a, y, weight=w, pos_weight=pw, reduction='none')", a="f3,4", y="u3,4", w="p4", pw="p4"),
      Case("crit = nn.BCEWithLogitsLoss(pos_weight=pw); crit(a, y)", a="f3,4", y="u3,4", pw="p4")]),
    ("kl_div", "input, target, size_average, reduce, reduction, log_target", _kl_div,
     "(jax.scipy.special.xlogy(y, y) - y * x).mean()", "reduction='batchmean' divides the sum by the batch size", "KLDivLoss",
     "size_average, reduce, reduction, log_target",
     [Case("@(a.log_softmax(dim=1), p.softmax(dim=1))", a="f3,4", p="f3,4"), Case("@(a, p, reduction='batchmean')", a="f3,4", p="u3,4"),
      Case("@(a, b, reduction='sum', log_target=True)", a="f3,4", b="f3,4"), Case("nn.KLDivLoss(reduction='batchmean')(a, p)", a="f3,4", p="u3,4")]),
]
LOSSES: list[Op] = []
LOSS_MODULES: dict[str, LossModule] = {}
for _fname, _sig, _builder, _target, _note, _mod, _msig, _cases in _LOSS_DEFS:
    _full = f"torch.nn.functional.{_fname}"
    _module_cases = [c for c in _cases if "@(" not in c.expr and f"nn.{_mod}(" in c.expr]  # tests of the module form (JX151)
    _o = Op(_full, Sig.parse(_sig), _builder, _target, _note, tuple(_cases_for(_full, _cases)) + tuple(_module_cases))
    LOSSES.append(_o)
    LOSS_MODULES[f"torch.nn.{_mod}"] = LossModule(f"torch.nn.{_mod}", Sig.parse(_msig), _o)
    LOSS_MODULES[f"torch.nn.modules.loss.{_mod}"] = LOSS_MODULES[f"torch.nn.{_mod}"]
LOSS_FUNCTIONS = {o.name: o for o in LOSSES}


def build_loss_module(lm: LossModule, ctor: cst.Call, ctx: FileContext, call: Optional[cst.Call] = None,
                      float_target: bool = False):
    """(code, modules) for an nn.<Loss>(...) instance: a lambda of (input, target), or, when
    ``call`` applies the new instance at once (``nn.MSELoss()(a, b)``), the loss expression.
    ``float_target``: every call of the instance passes a visibly float target (class
    probabilities for CrossEntropyLoss)."""
    kw = bind(ctor, lm.sig, ctx)
    args = dict(kw.args)
    if call is not None:
        outer = bind(call, Sig(("input", "target")), ctx)
        args.update(outer.args)
    else:
        args["input"] = cst.Name("input")
        args["target"] = cst.Name("target")
    b = Bound(ctx, args, keywords=frozenset(kw.args))
    b.float_target = float_target
    body = lm.functional.build(b)
    if call is not None:
        return body, b.used
    return f"lambda input, target: {body}", b.used


# --------------------------------------------------------------------------------------
# Indexes
# --------------------------------------------------------------------------------------
FUNCTIONS: dict[str, Op] = {}
METHODS: dict[str, Op] = {}
for _op in TABLE:
    (METHODS if _op.is_method else FUNCTIONS)[_op.name.lstrip(".")] = _op


def known_function(qualname: str) -> bool:
    """A torch function of the table (each call ported, or reported where it cannot be) or a
    functional loss (JX150): torch 2.x has them all (JX110's feature probes)."""
    return qualname in FUNCTIONS or qualname in LOSS_FUNCTIONS


# In-place tensor methods (x.add_(y)) map to their functional entry.
_TORCH_INPLACE = (
    "abs neg exp exp2 log log2 log10 log1p expm1 sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh asinh atanh "
    "sigmoid floor ceil trunc round sign reciprocal square erf relu frac add sub mul div pow fmod remainder atan2 "
    "clamp clamp_min clamp_max clip masked_fill lerp logical_not logical_and logical_or eq ne lt le gt ge "
    "t transpose swapaxes squeeze unsqueeze floor_divide true_divide hypot tril triu"
).split()
# in-place forms that store a result of another dtype (bool) back in x's dtype
INPLACE_CAST = frozenset(f"{n}_" for n in "eq ne lt le gt ge logical_not logical_and logical_or".split())
INPLACE = {f"{name}_": METHODS[name] for name in _TORCH_INPLACE if name in METHODS}
INPLACE["zero_"] = Op(".zero_", Sig.parse("input"), lambda b: f"{b.jnp}.zeros_like({b['input']})", "jnp.zeros_like(x)")
INPLACE["fill_"] = Op(".fill_", Sig.parse("input, value"), lambda b: f"{b.jnp}.full_like({b['input']}, {b['value']})", "jnp.full_like(x, value)")
INPLACE["copy_"] = Op(".copy_", Sig.parse("input, src, non_blocking"),
                      lambda b: f"{b.jnp}.broadcast_to({b['src']}, {b.atom('input')}.shape).astype({b.atom('input')}.dtype)",
                      "jnp.broadcast_to(src, x.shape).astype(x.dtype)")


def build(o: Op, call_node: cst.Call, ctx: FileContext, receiver: Optional[cst.BaseExpression] = None):
    """(code or pair, modules used) for one call; raises Manual / NotMine."""
    out, b = build_bound(o, call_node, ctx, receiver)
    return out, b.used


def build_bound(o: Op, call_node: cst.Call, ctx: FileContext, receiver: Optional[cst.BaseExpression] = None,
                scope=LOOKUP):
    """(code or pair, the Bound it was built from: modules used, the nnx.Rngs it draws from);
    ``scope``: the rngs scope an earlier build of the same call read (Bound.rngs_scope)."""
    if o.manual:
        raise Manual(o.manual)
    b = bind(call_node, o.sig, ctx, receiver)
    b.rngs_scope = scope
    out = o.build(b)
    return out, b


# --------------------------------------------------------------------------------------
# Docs
# --------------------------------------------------------------------------------------
def render_markdown() -> str:
    """docs/jax-ops.md: every construct of the table (tests/test_jax_ops.py checks it is current)."""
    lines = [
        "# torch -> JAX: the op table",
        "",
        "Generated from `codemods/jax/_ops_table.py` by `python -m porter.docs`",
        "(tests/test_jax_ops.py checks it is current). Rules JX101 (functions), JX102 (tensor methods),",
        "JX103 (dtypes) and JX104 (in-place methods) use this table; every entry is checked numerically",
        "against torch by tests/test_jax_ops_run.py.",
        "",
        "Arguments: `dim` -> `axis`, `keepdim` -> `keepdims`; `device=`, `requires_grad=`, `pin_memory=`,",
        "`layout=`, `memory_format=` and `non_blocking=` are dropped; `out=` is reported (JAX arrays are",
        "immutable). Dtypes: " + ", ".join(f"`torch.{k}` -> `jnp.{v}`" for k, v in DTYPES.items()) + ".",
        "",
        "Tensor methods are recognised by name. Names that only tensors have (`view`, `permute`,",
        "`unsqueeze`, `masked_fill`...) are rewritten wherever torch is imported, on any receiver that is",
        "not a module, a literal or `self`. Names that other objects share (`split` on str, `size`, `sum`,",
        "`max`, `repeat`, `transpose`, `float`, `to`...; marked *shared* below) are rewritten only when",
        "the receiver is known to be a tensor: a parameter of `forward`/`__call__` of a module class, of a",
        "jitted function (`@nnx.jit def train_step(...)`) or annotated `Tensor`/`jax.Array`; a name",
        "assigned from a torch/jnp call, a model or loss call (`model(x)`, `criterion(out, y)`) or another",
        "tensor expression in the same function; a tensor expression itself (`x.view(...).size(0)`); or",
        "when the call is spelled as only torch spells it (`dim=`/`keepdim=` arguments, `x.size(0)`).",
        "Data-loading code stays torch: torch.utils.data Dataset/Sampler classes, the arguments of",
        "TensorDataset/DataLoader calls, and the functions and assignments that produce them.",
        "",
        f"{sum(1 for o in TABLE if not o.manual)} constructs ported, {sum(1 for o in TABLE if o.manual)} reported for manual porting,",
        f"{len(INPLACE)} in-place methods (`x.add_(y)` -> `x = x + y` when `x` is a plain name).",
        "",
        "| torch | JAX | notes |",
        "| --- | --- | --- |",
    ]
    for o in TABLE:
        if o.manual:
            continue
        note = o.note + (" *(shared name)*" if o.shared and o.is_method else "")
        lines.append(f"| `{o.torch_display}` | `{o.target}` | {_md(note)} |")
    lines += ["", "## Losses (JX150, JX151)", "",
              "`nn.<Loss>(...)` instances become `lambda input, target: <expression>`; an instance called at once becomes the expression.",
              "", "| torch | JAX | notes |", "| --- | --- | --- |"]
    for lm_name, lm in LOSS_MODULES.items():
        if ".modules.loss." in lm_name:
            continue
        o = lm.functional
        lines.append(f"| `{o.torch_display}`, `{lm_name.replace('torch.nn.', 'nn.')}` | `{o.target}` | {_md(o.note)} |")
    lines += ["", "## Reported for manual porting", "", "| torch | why |", "| --- | --- |"]
    for o in TABLE:
        if o.manual:
            lines.append(f"| `{o.torch_display}` | {_md(o.manual)} |")
    lines.append("")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


# --------------------------------------------------------------------------------------
# Rule helpers: which calls are tensor calls, reporting, manual markers
# --------------------------------------------------------------------------------------
_TENSOR_ANNOTATIONS = ("torch.Tensor", "Tensor", "jax.Array", "jnp.ndarray", "jax.numpy.ndarray", "torch.FloatTensor", "torch.LongTensor")
_NOT_TENSOR_MODULES = ("torch.nn.", "torch.optim", "torch.utils", "torch.device", "torch.cuda", "torch.distributed",
                       "torch.backends", "torch.Size", "torch.no_grad", "torch.jit", "torch.autograd", "torch.amp", "torch.save",
                       "torch.load", "torch.manual_seed", "torch.set_", "torch.get_", "torch.is_", "torch.finfo", "torch.iinfo")
_DATA_BASES = ("torch.utils.data.Dataset", "torch.utils.data.IterableDataset", "torch.utils.data.Sampler",
               "torch.utils.data.dataset.Dataset")
_TENSOR_ATTRS = ("T", "mT", "data", "grad", "real", "imag")
# names of objects whose calls return tensors (a model, a loss) in training scripts
_MODEL_NAMES = frozenset({"model", "net", "network", "module", "encoder", "decoder", "generator", "discriminator",
                          "netG", "netD", "backbone", "head", "classifier", "criterion", "loss_fn", "loss_func"})


def is_module_class(cls: cst.ClassDef, ctx: FileContext) -> bool:
    """A class deriving from torch.nn.Module or nnx.Module (by name through the imports; any
    base spelled ``...Module`` counts, so subclasses of the file's own modules do too)."""
    for base in cls.bases:
        q = ctx.qualname(base.value) or _dotted(base.value) or ""
        if q.endswith("Module") or q in _module_classes(ctx):
            return True
    return False


def _dotted(node: cst.CSTNode) -> Optional[str]:
    from porter.context import dotted_name

    return dotted_name(node)


def _module_classes(ctx: FileContext) -> frozenset:
    return module_fact(ctx, _module_classes_of)


def _module_classes_of(ctx: FileContext) -> frozenset:
    """(A module fact, porter.rules.module_fact, as the other facts of the file below.)"""
    names = set()
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.ClassDef):
            for base in stmt.bases:
                q = ctx.qualname(base.value) or _dotted(base.value) or ""
                if q.endswith("Module") or q in names:
                    names.add(stmt.name.value)
    return frozenset(names)


def in_data_pipeline(ctx: FileContext) -> bool:
    """Inside data-loading code, which stays torch (the loop rules feed the port's step from a
    torch DataLoader): a torch.utils.data Dataset/Sampler class, the arguments of a
    TensorDataset/DataLoader call, an assignment of a name such a call reads, or a function of
    the file whose result such a call reads (``x, y = make_data(...)``; ``TensorDataset(x, y)``)."""
    facts = _data_facts(ctx)
    for anc in ctx.ancestors:
        if isinstance(anc, cst.ClassDef):
            for base in anc.bases:
                q = ctx.qualname(base.value) or ""
                if q in _DATA_BASES:
                    return True
        elif isinstance(anc, cst.FunctionDef) and anc.name.value in facts[0]:
            return True
        elif id(anc) in facts[1]:
            return True
    return False


def data_function_names(ctx: FileContext) -> frozenset:
    """The file's functions the input pipeline calls or is given (a DataLoader's collate_fn)."""
    return _data_facts(ctx)[0]


def data_node_ids(ctx: FileContext) -> frozenset:
    """The ids of the input pipeline's own nodes (kept torch): the arguments of the file's
    TensorDataset/DataLoader calls and the statements assigning the names they read."""
    return _data_facts(ctx)[1]


_DATA_CALLS = ("torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset",
               "torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")


def _data_facts(ctx: FileContext) -> tuple[frozenset, frozenset]:
    """(names of the file's data functions, ids of data nodes: TensorDataset/DataLoader
    arguments and the statements assigning names they read)."""
    return module_fact(ctx, _data_facts_of)


def _function_names_part(ctx: FileContext, stmt: cst.CSTNode, pre) -> frozenset:
    fdef = cst.FunctionDef  # (exact node types here: isinstance against LibCST's classes goes through ABCMeta)
    return frozenset(n.name.value for n in astutil.walk(stmt, into_functions=True) if type(n) is fdef)


def _function_names_combine(ctx: FileContext, parts: list, pre) -> frozenset:
    return frozenset().union(*parts)


# the names of every function of the file, nested ones too
_function_names = StatementFact(_function_names_part, _function_names_combine, name="_function_names")


def _data_reads(ctx: FileContext, nodes, functions: frozenset, data_functions: set, data_nodes: set) -> set:
    """The names the TensorDataset/DataLoader calls among ``nodes`` read (their arguments
    added to ``data_nodes``, the file's functions they call to ``data_functions``)."""
    read: set[str] = set()
    call, name = cst.Call, cst.Name
    for n in nodes:
        if type(n) is call and (ctx.qualname(n.func) or "") in _DATA_CALLS:
            for a in n.args:
                data_nodes.add(id(a))
                for m in astutil.walk(a.value):
                    if type(m) is name:
                        read.add(m.value)
                        if m.value in functions:  # called (`TensorDataset(*make())`) or given (`collate_fn=pad`)
                            data_functions.add(m.value)
    return read


_PLAIN_MODULES = ("torch.", "numpy.", "math.", "builtins.")


def _data_assigns(ctx: FileContext, nodes, functions: frozenset) -> list:
    """(id, names assigned, the file's functions the value calls or is given, the names the value
    reads when it only calls torch/NumPy/math functions or builtins, else None) of each
    one-assignment line (``x, y = make_data(...)``; ``train_set = train_set.transform(scale)``;
    ``w = torch.randn(5, 1)``)."""
    out = []
    for n in nodes:
        if isinstance(n, cst.SimpleStatementLine) and len(n.body) == 1 and isinstance(n.body[0], cst.Assign):
            a = n.body[0]
            reads = astutil.reads(a.value)
            used = frozenset(m for m in reads if m in functions)  # (not keywords: `train=True`)
            plain = all(_plain_call(ctx, c) for c in astutil.calls_in(a.value))
            out.append((id(n), frozenset(t for target in a.targets for t in astutil.target_names(target.target)), used,
                        frozenset(reads) if plain and not used else None))
    return out


def _plain_call(ctx: FileContext, call: cst.Call) -> bool:
    """A call of torch, NumPy, math or a builtin, or a method of a value (``x.float()``)."""
    name = ctx.qualname(call.func)
    return name.startswith(_PLAIN_MODULES) if name else type(call.func) is cst.Attribute


def _data_closure(assigns: list, read: set, data_functions: set, data_nodes: set) -> None:
    """The assignments of names ``read`` into ``data_nodes``; then, to a fixpoint, the plain
    assignments (torch/NumPy values) of the names those read: ``w = torch.randn(5, 1)`` for
    ``y = x @ w``, ``TensorDataset(x, y)``."""
    frontier = set(read)
    for node_id, names, used, _ in assigns:
        if names & frontier:
            data_nodes.add(node_id)
            data_functions |= used
    changed = True
    while changed:
        changed = False
        for node_id, names, _, reads in assigns:
            if node_id in data_nodes and reads and not reads <= frontier:
                frontier |= reads
                changed = True
        for node_id, names, _, reads in assigns:
            if node_id not in data_nodes and reads is not None and names & frontier:
                data_nodes.add(node_id)
                changed = True


def _data_facts_part(ctx: FileContext, stmt: cst.CSTNode, functions: frozenset) -> tuple:
    """One top-level statement's part of _data_facts_of: its functions' data facts, whole, and
    its module-level data reads and assignments (the module is one scope: combined below)."""
    data_functions: set[str] = set()
    data_nodes: set[int] = set()
    fdef = cst.FunctionDef
    for fn in (n for n in astutil.walk(stmt, into_functions=True) if type(n) is fdef):
        read = _data_reads(ctx, astutil.walk(fn.body), functions, data_functions, data_nodes)
        if read:
            _data_closure(_data_assigns(ctx, astutil.walk(fn.body), functions), read, data_functions, data_nodes)
    module_level = () if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else list(astutil.walk(stmt))
    read = _data_reads(ctx, module_level, functions, data_functions, data_nodes)
    return data_functions, data_nodes, read, _data_assigns(ctx, module_level, functions)


def _data_facts_combine(ctx: FileContext, parts: list, functions: frozenset) -> tuple[frozenset, frozenset]:
    data_functions: set[str] = set()
    data_nodes: set[int] = set()
    read: set[str] = set()
    for part_functions, part_nodes, part_read, _ in parts:
        data_functions |= part_functions
        data_nodes |= part_nodes
        read |= part_read
    if read:
        _data_closure([a for *_, assigns in parts for a in assigns], read, data_functions, data_nodes)
    return (frozenset(data_functions), frozenset(data_nodes))


# built statement by statement (porter.rules.StatementFact): `porter lsp` reads again only the
# statements an edit changed
_data_facts_of = StatementFact(_data_facts_part, _data_facts_combine, _function_names, name="_data_facts_of")


def _scope(ctx: FileContext) -> cst.CSTNode:
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, (cst.FunctionDef, cst.Lambda)):
            return anc
    return ctx.module


def _enclosing_class(ctx: FileContext, fn: cst.CSTNode) -> Optional[cst.ClassDef]:
    seen = False
    for anc in reversed(ctx.ancestors):
        if anc is fn:
            seen = True
            continue
        if seen:
            if isinstance(anc, cst.ClassDef):
                return anc
            if isinstance(anc, (cst.FunctionDef, cst.Lambda)):
                return None
    return None


def tensor_names(ctx: FileContext) -> frozenset:
    """Names known to hold tensors in the current function (or module level): parameters of
    forward/__call__ of a module class, parameters annotated as tensors, and names assigned
    from tensor expressions (repeated until nothing new is found)."""
    scope = _scope(ctx)
    key = ("ops.tensor_names", scope)
    if key in ctx.cache:
        return ctx.cache[key]
    names: set[str] = set()
    in_module_forward = False
    if isinstance(scope, cst.FunctionDef):
        cls = _enclosing_class(ctx, scope)
        in_module_forward = cls is not None and is_module_class(cls, ctx) and not _nnx_call(cls, scope, ctx)
        names |= _param_tensors(scope, in_module_forward)
        for anc in ctx.ancestors:  # a closure reads the arrays of the functions around it
            if isinstance(anc, cst.FunctionDef) and anc is not scope:
                names |= _param_tensors(anc, False)
        if cls is None and scope in module_fact(ctx, _top_functions):
            names |= _call_site_tensors(ctx, scope)
    ctx.cache[key] = frozenset(names)  # provisional, while assignments are read
    _assigned_tensors(ctx, scope, names, in_module_forward)
    ctx.cache[key] = frozenset(names)
    ctx.cache[("ops.in_forward", scope)] = in_module_forward
    return ctx.cache[key]


def _assigned_tensors(ctx: FileContext, scope, names: set, in_module_forward: bool) -> None:
    """Adds to ``names`` the names the scope assigns from tensor expressions."""
    from porter import astutil

    body = list(astutil.walk(scope.body if isinstance(scope, (cst.FunctionDef, cst.Lambda)) else scope))
    assigns = [n for n in body if isinstance(n, (cst.Assign, cst.AnnAssign, cst.AugAssign))]
    # the items of a loop's batch, read on the host as NumPy arrays (`x, y = x.numpy(), y.numpy()`,
    # what the loop rules write before the jitted step): torch's methods on them (`y.float()`,
    # `y.to(torch.float32)`) are translated as on arrays (jnp and astype take NumPy arrays)
    batch = _batch_items([n for n in body if isinstance(n, cst.For)])

    def is_tensor(value: cst.BaseExpression) -> bool:
        if _batch_to_host(value, batch):
            return True
        return _is_tensor(value, ctx, names, in_module_forward)

    for _ in range(3):
        before = len(names)
        for a in assigns:
            value = a.value
            if value is None:
                continue
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            if is_tensor(value):
                for t in targets:
                    names.update(astutil.target_names(t))
            elif isinstance(value, cst.Tuple):  # q, k, v = qkv[0], qkv[1], qkv[2]
                for t in targets:
                    if isinstance(t, (cst.Tuple, cst.List)) and len(t.elements) == len(value.elements):
                        for te, ve in zip(t.elements, value.elements):
                            if isinstance(te.value, cst.Name) and is_tensor(ve.value):
                                names.add(te.value.value)
        if len(names) == before:
            break
    # the conversions themselves read torch tensors (see is_tensor)
    ctx.cache[("ops.host_reads", scope)] = frozenset(
        a for a in assigns if isinstance(a, cst.Assign) and any(_batch_to_host(v, batch) for v in _assigned_parts(a.value)))


def _batch_items(loops: list) -> set:
    """The names the loops bind to a batch or its items: their targets, and in their bodies the
    names given an item of a target (``x, y = batch[0], batch[1]``, ``x = batch["input"]``)."""
    items: set[str] = set()
    for loop in loops:
        targets = set(astutil.target_names(loop.target))
        items |= targets
        for n in astutil.walk(loop.body):
            if isinstance(n, cst.Assign) and len(n.targets) == 1:
                target, value = n.targets[0].target, n.value
                pairs = (zip([e.value for e in target.elements], _assigned_parts(value))
                         if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, cst.Tuple)
                         and len(target.elements) == len(value.elements) else [(target, value)])
                for t, v in pairs:
                    if isinstance(t, cst.Name) and isinstance(v, cst.Subscript) and isinstance(v.value, cst.Name) \
                            and v.value.value in targets:
                        items.add(t.value)
    return items


def _assigned_parts(value: cst.BaseExpression) -> list:
    return [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]


def _batch_to_host(value: cst.CSTNode, batch: set) -> bool:
    """``x.numpy()`` of a name a for-loop of the scope binds (a DataLoader's batch item)."""
    return (isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "numpy" and isinstance(value.func.value, cst.Name)
            and value.func.value.value in batch)


def _call_site_tensors(ctx: FileContext, fn: cst.FunctionDef) -> set:
    """Parameters of a top-level function that every call of it in the file (one at least)
    gives a tensor: ``loss_function(recon_batch, data, mu, logvar)`` after
    ``recon_batch, mu, logvar = model(data)``. The callers' tensors are their parameters known
    as such and what they assign from tensor expressions (no further call-site reading)."""
    return module_fact(ctx, _call_site_tensors_of).get(fn, frozenset())


def _params(fn: cst.FunctionDef) -> tuple:
    return tuple(p.name.value for p in (*fn.params.posonly_params, *fn.params.params))


def _call_site_signatures(ctx: FileContext) -> tuple:
    """What a call site's reading depends on outside its statement: the top-level functions'
    (name, positional parameters), and the jitted ones (_is_tensor reads them)."""
    return (tuple((s.name.value, _params(s)) for s in ctx.module.body if isinstance(s, cst.FunctionDef)),
            jitted_functions(ctx))


def _call_sites_part(ctx: FileContext, stmt: cst.CSTNode, pre: tuple) -> list:
    """The calls of top-level functions in one top-level statement, in walk order: (name,
    None) for a call whose arguments cannot be read (``*args``),
    else (name, {parameters: the parameters given a tensor}) for each signature of that name."""
    signatures = pre[0]
    wanted = {name for name, _ in signatures}
    sites: list = []

    def visit(node, chain):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in wanted:
            sites.append((node.func.value, node, chain))
        if isinstance(node, (cst.ClassDef, cst.Lambda)):
            return
        if isinstance(node, cst.FunctionDef):
            chain = [*chain, node]
        for child in astutil.children(node):
            visit(child, chain)

    visit(stmt, [])
    caller_names: dict = {}  # the callers' tensors, by chain of functions (the same for every callee)
    out: list = []
    for name, call, chain in sites:
        if any(a.star for a in call.args):
            out.append((name, None))
            continue
        chain_key = tuple(id(f) for f in chain)
        names = caller_names.get(chain_key)
        if names is None:
            names = set()
            for outer in chain:
                names |= _param_tensors(outer, False)
            # (a call at module level: what its own top-level statement assigns, a loop's body)
            _assigned_tensors(ctx, chain[-1] if chain else stmt, names, False)
            caller_names[chain_key] = names
        positional = [a for a in call.args if a.keyword is None]
        given = {}
        for params in {p for n, p in signatures if n == name}:
            here = set()
            for i, param in enumerate(params):
                arg = positional[i] if i < len(positional) else next(
                    (a for a in call.args if a.keyword is not None and a.keyword.value == param), None)
                if arg is not None and _is_tensor(arg.value, ctx, names, False):
                    here.add(param)
            given[params] = frozenset(here)
        out.append((name, given))
    return out


def _call_site_combine(ctx: FileContext, parts: list, pre: tuple) -> dict:
    sites: dict = {}
    for part in parts:
        for name, given in part:
            sites.setdefault(name, []).append(given)
    out: dict = {}
    for fn in (s for s in ctx.module.body if isinstance(s, cst.FunctionDef)):
        params = _params(fn)
        found: "frozenset | None" = None
        for given in sites.get(fn.name.value, ()):
            if given is None:
                found = None
                break
            found = given[params] if found is None else found & given[params]
        out[fn] = frozenset(found or ())
    return out


# _call_site_tensors of every top-level function (node -> frozenset), a module fact built
# statement by statement (porter.rules.StatementFact): `porter lsp` reads again only the call
# sites of the statements an edit changed
_call_site_tensors_of = StatementFact(_call_sites_part, _call_site_combine, _call_site_signatures,
                                      name="_call_site_tensors_of")


def _nnx_call(cls: cst.ClassDef, fn: cst.FunctionDef, ctx: FileContext) -> bool:
    """``__call__`` of a Flax NNX module (jnp arrays, whose ``x.max(1)``, ``x.repeat(2)``,
    ``x.view(dtype)`` mean numpy's): its parameters are not taken for torch tensors. (A torch
    module's ``forward`` is ported in the pass that renames it.)"""
    if fn.name.value != "__call__":
        return False
    from . import _nnx

    if cls.name.value in _nnx.module_classes(ctx):
        return _nnx.root_kind(cls, ctx) == "nnx"
    return any((ctx.qualname(b.value) or "").startswith("flax.") for b in cls.bases)


def _top_functions(ctx: FileContext) -> frozenset:
    """The module's top-level functions (nodes)."""
    return frozenset(s for s in ctx.module.body if isinstance(s, cst.FunctionDef))


def _param_tensors(fn: cst.FunctionDef, in_module_forward: bool) -> set[str]:
    """Parameters known to be arrays: annotated as tensors, the inputs of a module's forward,
    or any parameter of a jitted function (`@nnx.jit def train_step(model, optimizer, x, y)`;
    calling a tensor method on the model or optimizer there would fail anyway)."""
    params = list(fn.params.posonly_params) + list(fn.params.params) + list(fn.params.kwonly_params)
    jitted = any((_dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "").endswith("jit")
                 for d in fn.decorators)
    out = set()
    for i, p in enumerate(params):
        ann = p.annotation
        if ann is not None and (_dotted(ann.annotation) or "") in _TENSOR_ANNOTATIONS:
            out.add(p.name.value)
        elif in_module_forward and fn.name.value in ("forward", "__call__") and i > 0:
            out.add(p.name.value)
        elif jitted:
            out.add(p.name.value)
    return out


def is_tensor(node: cst.CSTNode, ctx: FileContext) -> bool:
    names = tensor_names(ctx)
    if isinstance(node, cst.Name):  # a batch item is NumPy after its host read, a torch tensor in it
        reads = ctx.cache.get(("ops.host_reads", _scope(ctx)), frozenset())
        stmt = astutil.enclosing_simple_statement(ctx) if reads else None
        if stmt is not None and any(s in reads and node.value in {n for t in s.targets for n in astutil.target_names(t.target)}
                                    for s in stmt.body):
            return False
    return _is_tensor(node, ctx, names, ctx.cache.get(("ops.in_forward", _scope(ctx)), False))


def _nnx_array_value(node: cst.Subscript) -> bool:
    """``layer.kernel[...]`` / ``self.emb.embedding[...]``: an NNX layer's array read whole (JX021's
    port of ``.weight``), a jax array."""
    return (isinstance(node.value, cst.Attribute) and node.value.attr.value in _NNX_ARRAYS
            and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
            and isinstance(node.slice[0].slice.value, cst.Ellipsis))


_NNX_ARRAYS = frozenset({"kernel", "embedding", "scale", "bias"})


def _is_tensor(node: cst.CSTNode, ctx: FileContext, names, in_forward: bool) -> bool:
    if isinstance(node, cst.Name):
        return node.value in names
    if isinstance(node, cst.Call):
        q = ctx.qualname(node.func)
        if q:
            if q.startswith("torch."):
                return not q.startswith(_NOT_TENSOR_MODULES) or q.startswith("torch.nn.functional.")
            return q.startswith(("jax.", "optax."))  # numpy results are host arrays: their methods are numpy's
        if isinstance(node.func, cst.Attribute):
            recv = node.func.value
            name = node.func.attr.value
            if isinstance(recv, cst.Name) and recv.value == "self":
                return in_forward  # a layer call inside forward
            o = METHODS.get(name)
            if (o is not None and not o.manual) or name in INPLACE:
                return _is_tensor(recv, ctx, names, in_forward)
            return False
        last = (_dotted(node.func) or "").rsplit(".", 1)[-1]
        if isinstance(node.func, cst.Name) and node.func.value in jitted_functions(ctx):
            return True  # loss, outputs = train_step(...): the arrays a jitted step returns
        return last in _MODEL_NAMES  # model(x), self.net(x), criterion(out, y): tensors
    if isinstance(node, cst.Attribute):
        return node.attr.value in _TENSOR_ATTRS and _is_tensor(node.value, ctx, names, in_forward)
    if isinstance(node, cst.Subscript):
        if _nnx_array_value(node):
            return True
        return _is_tensor(node.value, ctx, names, in_forward)
    if isinstance(node, cst.BinaryOperation):
        return _is_tensor(node.left, ctx, names, in_forward) or _is_tensor(node.right, ctx, names, in_forward)
    if isinstance(node, cst.UnaryOperation):
        return _is_tensor(node.expression, ctx, names, in_forward)
    if isinstance(node, cst.Comparison):
        return _is_tensor(node.left, ctx, names, in_forward) or any(_is_tensor(c.comparator, ctx, names, in_forward) for c in node.comparisons)
    if isinstance(node, cst.IfExp):
        return _is_tensor(node.body, ctx, names, in_forward) and _is_tensor(node.orelse, ctx, names, in_forward)
    return False


_NEVER_RECEIVERS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.List, cst.Dict, cst.Set,
                    cst.Integer, cst.Float, cst.ListComp, cst.DictComp, cst.SetComp, cst.Tuple)

_STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


def _is_version_string(expr: cst.CSTNode) -> bool:
    """A module's ``__version__`` (``torch.__version__``), or a str method's result on one
    (``torch.__version__.split("+")[0]``): a string, never a tensor."""
    while isinstance(expr, (cst.Call, cst.Subscript, cst.Attribute)):
        if isinstance(expr, cst.Attribute) and expr.attr.value == "__version__":
            return True
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return False


def method_op(call: cst.Call, ctx: FileContext) -> Optional[Op]:
    """The table entry of a tensor-method call, or None when the call is not (or not clearly)
    a tensor method: see the heuristic in docs/jax-ops.md."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    o = METHODS.get(func.attr.value)
    if o is None:
        return None
    recv = func.value
    if ctx.qualname(func) is not None or isinstance(recv, _NEVER_RECEIVERS):
        return None  # a module function (np.sum, F.relu), or a literal's method ("a b".split())
    if isinstance(recv, cst.Name) and recv.value in ("self", "cls"):
        return None
    if isinstance(recv, cst.Call) and isinstance(recv.func, cst.Name) and recv.func.value == "super":
        return None
    if _is_version_string(recv) or (func.attr.value == "split" and call.args and not call.args[0].keyword
                                    and isinstance(call.args[0].value, _STRINGS)):
        return None  # str methods: `torch.__version__.split(".")`, `name.split("/")`
    if o.shared and not is_tensor(recv, ctx) and not _torch_spelling(call) and not _cpu_numpy(call, ctx):
        return None
    if _is_numpy(recv, ctx, numpy_names(ctx)):
        return None  # a numpy array's own method (a.view(np.int32), a.max(1))
    return o


def numpy_names(ctx: FileContext) -> frozenset:
    """Names the current function (or module level) assigns only from numpy expressions
    (``np.*`` calls, methods and arithmetic of such names), never from anything else."""
    scope = _scope(ctx)
    key = ("ops.numpy_names", scope)
    if key in ctx.cache:
        return ctx.cache[key]
    from porter import astutil

    ctx.cache[key] = frozenset()
    assigns = [n for n in astutil.walk(scope.body if isinstance(scope, (cst.FunctionDef, cst.Lambda)) else scope)
               if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For))]
    names: set = set()
    other: set = set()
    for _ in range(3):
        for a in assigns:
            if isinstance(a, cst.For):
                other.update(astutil.target_names(a.target))
                continue
            if a.value is None:
                continue
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            found = set()
            for t in targets:
                found.update(astutil.target_names(t))
            if isinstance(targets[0], cst.Name) and _is_numpy(a.value, ctx, names):
                names |= found
            else:
                other |= found
    if isinstance(scope, cst.FunctionDef):
        other.update(p.name.value for p in (*scope.params.posonly_params, *scope.params.params, *scope.params.kwonly_params))
    ctx.cache[key] = frozenset(names - other)
    return ctx.cache[key]


def _is_numpy(node: cst.CSTNode, ctx: FileContext, names) -> bool:
    if isinstance(node, cst.Name):
        return node.value in names
    if isinstance(node, cst.Call):
        q = ctx.qualname(node.func)
        if q:
            return q.startswith("numpy.") and not q.startswith(("numpy.testing",))
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("reshape", "astype", "transpose", "copy", "view",
                                                                              "sum", "mean", "max", "min", "squeeze"):
            return _is_numpy(node.func.value, ctx, names)
        return False
    if isinstance(node, cst.Subscript):
        return _is_numpy(node.value, ctx, names)
    if isinstance(node, cst.BinaryOperation):
        return (_is_numpy(node.left, ctx, names) or _is_numpy(node.right, ctx, names)) and not (
            is_tensor(node.left, ctx) or is_tensor(node.right, ctx))
    return False


def _cpu_numpy(call: cst.Call, ctx: FileContext) -> bool:
    """``x.cpu().numpy()``: a chain only torch tensors have (numpy arrays have no .cpu()),
    read on either of its two calls."""
    name = call.func.attr.value  # type: ignore[attr-defined]
    if name == "numpy" and not call.args:
        recv = call.func.value  # type: ignore[attr-defined]
        return (isinstance(recv, cst.Call) and isinstance(recv.func, cst.Attribute)
                and recv.func.attr.value == "cpu" and not recv.args)
    if name == "cpu" and not call.args:
        parent = ctx.parent
        return isinstance(parent, cst.Attribute) and parent.attr.value == "numpy" and parent.value is call
    return False


def _torch_spelling(call: cst.Call) -> bool:
    """Arguments only torch spells this way: dim=/keepdim= (numpy says axis, str.split has
    neither), or x.size(<int>) (numpy's size is an attribute)."""
    if any(a.keyword is not None and a.keyword.value in ("dim", "keepdim") for a in call.args):
        return True
    name = call.func.attr.value  # type: ignore[attr-defined]
    if name == "size" and len(call.args) == 1 and call.args[0].keyword is None:
        v = literal(call.args[0].value)
        return isinstance(v, int) and not isinstance(v, bool)
    return False


def function_op(call: cst.Call, ctx: FileContext) -> Optional[Op]:
    q = ctx.qualname(call.func)
    return FUNCTIONS.get(q) if q else None


_SAFE_PARENTS = (cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Expr, cst.Element, cst.DictElement,
                 cst.Index, cst.Param)


def as_expression(text: str, parent: Optional[cst.CSTNode], original: cst.CSTNode) -> cst.BaseExpression:
    """Parse ``text``; parenthesize it unless it is an atom or sits where any expression can."""
    new = astutil.parse_expression(text)
    lpar = getattr(original, "lpar", ())
    if lpar:
        return new.with_changes(lpar=original.lpar, rpar=original.rpar)
    if not isinstance(new, _ATOMS) and not isinstance(parent, _SAFE_PARENTS):
        return new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return new


MANUAL_MARK = astutil.MANUAL
report_manual = astutil.report_manual


def port_call(rule, node: cst.Call, o: Op, receiver: Optional[cst.BaseExpression]) -> None:
    """Report one table call with its fix (or for manual porting)."""
    from porter.rules import Edit, Fix

    ctx = rule.ctx
    try:
        out, bound = build_bound(o, node, ctx, receiver)
    except NotMine:
        return
    except Manual as exc:
        report_manual(rule, node, f"{o.torch_display}: {exc}")
        return
    used, scope = bound.used, bound.rngs_scope
    keep: tuple = ()
    if bound.needs_rngs:  # the port draws from self.rngs: the module's __init__ keeps them
        keep = keep_rngs(scope[0])
        if keep is None:
            return  # a module class without __init__ yet (JX001 adds one, with its rngs)
    target: cst.CSTNode = node
    pick = None  # which part of a (values, indices) pair the parent takes
    parent = ctx.parent
    grand = ctx.ancestors[-3] if len(ctx.ancestors) >= 3 else None
    if isinstance(out, tuple):
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in ("values", "indices"):
            pick = 0 if parent.attr.value == "values" else 1
            target, parent = parent, grand
        elif (isinstance(parent, cst.Subscript) and parent.value is node and len(parent.slice) == 1
              and isinstance(parent.slice[0].slice, cst.Index) and literal(parent.slice[0].slice.value) in (0, 1)):
            pick = literal(parent.slice[0].slice.value)
            target, parent = parent, grand

    def text_of(result) -> str:
        if isinstance(result, tuple):
            if pick is not None:
                return result[pick]
            return result[2] if len(result) > 2 else f"({result[0]}, {result[1]})"
        return result

    text = text_of(out)
    if text == code(target):
        return
    is_method = receiver is not None

    def replacement(updated: cst.CSTNode) -> cst.CSTNode:
        call_node = updated.value if target is not node else updated
        recv = call_node.func.value if is_method else None
        try:
            result, _ = build_bound(o, call_node, ctx, recv, scope)
        except (Manual, NotMine):  # an edit inside changed the call: the next pass decides again
            return updated
        return as_expression(text_of(result), parent, updated)

    new_text = code(as_expression(text, parent, target))
    what = o.torch_display
    rule.report(
        target,
        f"{what} -> {new_text if len(new_text) < 70 else o.target}" + (f" ({o.note})" if o.note and len(o.note) < 90 else ""),
        Fix((Edit(target, replacement), *keep), imports=tuple(sorted(used)), remove_imports=leftover_imports(node, ctx)),
    )


# `import torch.nn.functional as F` / `from torch.nn import functional as F`: removed once no
# F.* call is left (the engine keeps an import that something still reads)
FUNCTIONAL_IMPORTS = (("torch.nn.functional", None), ("torch.nn", "functional"))


def leftover_imports(node: cst.Call, ctx: FileContext) -> tuple:
    """The imports a ported call may leave unused: torch.nn.functional for an F.* call."""
    qual = ctx.qualname(node.func) or ""
    return FUNCTIONAL_IMPORTS if qual.startswith("torch.nn.functional.") else ()
