from __future__ import annotations

import functools
from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _nnx

# the Gluon helpers (templates/gluon_layers.py.j2) that have a JAX form (templates/gluon_jax_layers.py.j2)
TWINS = ("LazyDense", "init_xavier", "init_normal", "init_uniform", "init_constant", "init_zero", "init_one",
         "with_init", "initialize", "begin_state", "with_activation", "gluon_conv", "gluon_imresize")
# the modules each JAX form uses
_IMPORTS = {
    "LazyDense": ("jax", "jax.numpy", "flax.nnx", "math"),
    "init_xavier": ("jax", "jax.numpy", "math"),
    "init_normal": ("jax", "jax.numpy"), "init_uniform": ("jax", "jax.numpy"),
    "init_constant": ("jax.numpy",), "init_zero": ("jax.numpy",), "init_one": ("jax.numpy",),
    "with_init": (),
    "initialize": ("jax", "jax.numpy", "flax.nnx", "numpy", "functools"),
    "begin_state": ("jax.numpy",),
    "with_activation": ("functools",),
    "gluon_conv": ("flax.nnx", "functools"),
    "gluon_imresize": ("jax.numpy",),
}
_UNSAFE = Safety.UNSAFE
# torch-only parts of the torch initialize(): the JAX form has its own
_INIT_PARTS = ("_gluon_init_parameter", "_gluon_init_module")
_ZEROS = {"torch.zeros": "zeros", "torch.ones": "ones"}


def _first_doc_line(stmt: cst.CSTNode) -> Optional[str]:
    doc = stmt.get_docstring() if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else None
    return doc.strip().splitlines()[0].strip() if doc else None


@functools.lru_cache(maxsize=None)
def _docs(template: str, **values) -> dict[str, str]:
    text = _nnx._ENV.get_template(template).render(names=set(TWINS), gluon_conv_dims=(1, 2, 3), **values)
    return {s.name.value: _first_doc_line(s) for s in cst.parse_module(text).body
            if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and _first_doc_line(s)}


def torch_docs() -> dict[str, str]:
    """name -> first docstring line of the torch helper porter's Gluon front end emits."""
    return _docs("gluon_layers.py.j2", torch="torch", nn="nn")


def jax_docs() -> dict[str, str]:
    return _docs("gluon_jax_layers.py.j2")


@functools.lru_cache(maxsize=None)
def _twin_statements(name: str, conv_dims: tuple = (1, 2, 3)) -> tuple:
    body = _nnx.render("gluon_jax_layers.py.j2", names={name}, gluon_conv_dims=conv_dims)
    return tuple(_nnx.spaced(body))


def _conv_dims(module: cst.Module) -> tuple:
    """The ranks the file's `gluon_conv(dims, ...)` calls ask for (all three where one is not a literal)."""
    dims = set()
    for node in astutil.walk(module, into_functions=True):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "gluon_conv":
            first = node.args[0] if node.args else None
            if first is None or first.keyword is not None or first.star or not (
                    isinstance(first.value, cst.Integer) and first.value.value in ("1", "2", "3")):
                return (1, 2, 3)
            dims.add(int(first.value.value))
    return tuple(sorted(dims)) or (2,)


def gluon_helpers(ctx) -> dict[str, tuple[str, cst.CSTNode]]:
    """Top-level Gluon helpers of the file: name -> ("torch" | "jax", statement)."""
    key = ("jx015.helpers",)
    if key in ctx.cache:
        return ctx.cache[key]
    found = {}
    torch, jax = torch_docs(), jax_docs()
    for stmt in ctx.module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value in TWINS:
            doc = _first_doc_line(stmt)
            if doc is not None and doc == torch.get(stmt.name.value):
                found[stmt.name.value] = ("torch", stmt)
            elif doc is not None and doc == jax.get(stmt.name.value):
                found[stmt.name.value] = ("jax", stmt)
    ctx.cache[key] = found
    return found


# the emitted Gluon parameter-file reader (templates/gluon_weights.py.j2) also marks a port of Gluon code
_GLUON_IO = ("read_gluon_parameters", "load_gluon_parameters")
# Gluon's BatchNorm: MXNet's biased running variance (torch's layer updates it with the unbiased one)
_BATCH_NORMS = {"TorchBatchNorm": "GluonBatchNorm", "TorchLazyBatchNorm": "GluonLazyBatchNorm"}


def is_gluon_port(ctx) -> bool:
    """The file is porter's port of MXNet/Gluon code: it has the front end's helpers."""
    key = ("jx015.gluon_port",)
    if key not in ctx.cache:
        ctx.cache[key] = bool(gluon_helpers(ctx)) or any(
            isinstance(s, cst.FunctionDef) and s.name.value in _GLUON_IO for s in ctx.module.body)
    return ctx.cache[key]


def _seed(ctx) -> str:
    """The seed of the enclosing function's `torch.manual_seed(S)`, else "0"."""
    scope = ctx.enclosing(cst.FunctionDef) or ctx.module
    for node in astutil.walk(scope):
        if isinstance(node, cst.Call) and ctx.qualname(node.func) == "torch.manual_seed" and node.args:
            return _nnx.code(node.args[0].value)
    return "0"


def _earlier_initialize_calls(call: cst.Call, ctx) -> int:
    """How many `initialize(...)` calls come before `call` in its function."""
    scope = ctx.enclosing(cst.FunctionDef) or ctx.module
    n = 0
    for node in astutil.walk(scope):
        if node is call:
            return n
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "initialize":
            n += 1
    return n


class GluonHelpersJax(Rule):
    """
    ## What it does
    Replaces the Gluon helpers porter's MXNet front end emits as torch code
    (templates/gluon_layers.py.j2: `LazyDense`, `initialize`, `init_xavier` / `init_normal` /
    `init_uniform` / `init_constant` / `init_zero` / `init_one`, `with_init`, `with_activation`,
    `begin_state`),
    recognised by name and docstring, with their JAX forms (templates/gluon_jax_layers.py.j2):

    - `LazyDense`: an NNX layer whose parameters are made at its first eager call from the
      input's size, or from the torch state dict's shapes by `load_torch_state_dict` (JX011's
      `_TorchLazy`);
    - the initializers: functions `init(key, shape, dtype)` in torch's (MXNet's) layout, with
      MXNet's fans;
    - `initialize(model, init, *, key)`: Gluon's semantics on the NNX model, in torch's names
      and layouts through the weight converter (own initializer first, gamma one, biases zero,
      every other weight from `init`); lazy layers are initialized when their first eager call
      makes their parameters (Gluon's deferred initialization). Its calls get
      `key=jax.random.key(S)`, S the seed of the function's `torch.manual_seed(S)` (else 0;
      the function's second model `jax.random.fold_in(jax.random.key(S), 1)`, ...);
    - `with_activation` (Gluon's `activation=` of a convolution): the layer's class becomes a
      subclass applying the activation to its output (no forward hooks in NNX);
    - `gluon_conv(dims, *args, **kwargs)` (`Conv2D(**kwargs)`, Gluon's signature bound when it
      runs): the same binding, then `TorchConv{n}d` / `TorchLazyConv{n}d` (JX011) with the
      caller's `rngs`, for the ranks the file's calls give (all three for a rank not written
      as a literal), its activation as `with_activation` applies it;
    - in a port of Gluon code (one with these helpers), `TorchBatchNorm` / `TorchLazyBatchNorm`
      -> `GluonBatchNorm` / `GluonLazyBatchNorm` (JX011): the running variance is updated with
      the biased batch variance, as MXNet's BatchNorm does (torch's with the unbiased one);
    - `begin_state`: `jnp.zeros` by default; calls drop `ctx=` (a traced array has no
      device) and pass `func=jnp.zeros` for `func=torch.zeros`;
    - `gluon_imresize` (GL406: `mx.image.imresize`): the same resize in jnp, one axis at a
      time (torch's source positions and bicubic kernel, OpenCV's nearest neighbour).

    The `import torch` the torch helper needed goes once nothing else uses it.

    ## Why
    The torch helpers set tensors in place (`nn.init.uniform_`, `fill_`) and hook lazy
    modules' first forward, which NNX has no form for; the JAX forms compute the same
    (Gluon's) initialization with JAX random numbers.

    ## Fix safety
    Unsafe: the random numbers differ from torch's (as torch's differ from MXNet's); the
    distributions, fans and which parameter gets what are Gluon's (tests/test_gluon_jax_models.py).
    """

    code = "JX015"
    name = "gluon-helpers-jax"
    target = "jax"
    summary = "porter's emitted Gluon helpers (initialize, init_*, LazyDense, begin_state) -> their JAX forms"
    severity = Severity.ERROR
    needs_text = ("Gluon", "gluon")
    examples = [
        Example(
            '''
            import torch


            def init_normal(sigma=0.01):
                """Gluon's mx.init.Normal: normal(0, sigma)."""
                return lambda weight: torch.nn.init.normal_(weight, 0.0, sigma)
            ''',
            '''
            import jax
            import jax.numpy as jnp


            def init_normal(sigma=0.01):
                """Gluon's mx.init.Normal as a JAX initializer: normal(0, sigma)."""
                return lambda key, shape, dtype=jnp.float32: sigma * jax.random.normal(key, shape, dtype)
            ''',
            unsafe=True,
        ),
    ]
    valid = [
        # a user's own function of that name (another docstring) is not porter's helper
        'def init_normal(sigma=0.01):\n    """My initializer."""\n    return sigma\n',
    ]

    def visit_Module(self, node: cst.Module) -> None:
        helpers = gluon_helpers(self.ctx)
        torch_helpers = {n: s for n, (kind, s) in helpers.items() if kind == "torch"}
        if not torch_helpers:
            return
        defined = {s.name.value for s in node.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
        for name, stmt in torch_helpers.items():
            new = list(_twin_statements(name, _conv_dims(node) if name == "gluon_conv" else (1, 2, 3)))
            # a part two JAX forms share (_gluon_activated_class) is written once
            new = [s for s in new if not (isinstance(s, (cst.FunctionDef, cst.ClassDef))
                                          and s.name.value != name and s.name.value in defined)]
            defined |= {s.name.value for s in new if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
            new[0] = new[0].with_changes(leading_lines=stmt.leading_lines)
            self.report(
                stmt,
                f"{name}: porter's Gluon helper in its JAX form",
                Fix((self.replace(stmt, cst.FlattenSentinel(new)),), safety=_UNSAFE,
                    imports=_IMPORTS[name], remove_imports=(("torch", None),)),  # the torch helper's, once unused
            )
        if "initialize" in torch_helpers:
            for stmt in node.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value in _INIT_PARTS and stmt.get_docstring() is None:
                    self.report(stmt, f"{stmt.name.value}: part of the torch initialize()",
                                Fix((self.remove(stmt),), safety=_UNSAFE))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
        if isinstance(func, cst.Name) and name in _BATCH_NORMS and is_gluon_port(self.ctx):
            self.report(node, f"{name}: Gluon's BatchNorm updates the running variance with the biased batch variance",
                        Fix((self.replace(node, node.with_changes(func=cst.Name(_BATCH_NORMS[name]))),), safety=_UNSAFE))
            return
        if name not in ("initialize", "begin_state"):
            return
        helpers = gluon_helpers(self.ctx)
        if name not in helpers:
            return
        if name == "initialize":
            if not isinstance(func, cst.Name) or _nnx.has_kwarg(node, "key") or self.ctx.enclosing(cst.FunctionDef) is helpers[name][1]:
                return
            jax_name = self.ctx.module_alias("jax")
            key = f"{jax_name}.random.key({_seed(self.ctx)})"
            n = _earlier_initialize_calls(node, self.ctx)
            if n:  # a second model of the function: another stream of the same seed
                key = f"{jax_name}.random.fold_in({key}, {n})"
            new = _nnx.with_arg(node, _nnx.kwarg("key", cst.parse_expression(key)))
            self.report(node, "initialize(): its random numbers from a JAX key", Fix((self.replace(node, new),), safety=_UNSAFE, imports=("jax",)))
            return
        args, changed = [], False
        jnp = self.ctx.module_alias("jax.numpy")
        for a in node.args:
            if a.keyword is not None and a.keyword.value == "ctx":
                changed = True
                continue
            if a.keyword is not None and a.keyword.value == "func" and self.ctx.qualname(a.value) in _ZEROS:
                a = a.with_changes(value=cst.parse_expression(f"{jnp}.{_ZEROS[self.ctx.qualname(a.value)]}"))
                changed = True
            args.append(a)
        if changed:
            if args and node.args and args[-1] is not node.args[-1]:
                args[-1] = args[-1].with_changes(comma=node.args[-1].comma)
            self.report(node, "begin_state(): no device argument on the JAX port (jnp arrays on the default device)",
                        Fix((self.replace(node, node.with_changes(args=args)),), safety=_UNSAFE, imports=("jax.numpy",)))
