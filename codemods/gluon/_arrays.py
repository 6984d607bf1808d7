"""Which names of a Gluon file hold MXNet arrays (NDArrays, torch tensors in the port) and which
hold NumPy arrays, read from how each function (or the module) binds them.

The facts are per scope and flow-insensitive: a name has a kind when every binding of it in
its scope gives that kind (``x = x.asnumpy()`` after ``x = nd.ones(...)`` gives it none). What
binds an array: an MXNet operator's result, a method of an array, arithmetic with an
array, an item of a list of arrays (``split_and_load``), a block's output, the batches of a
DataLoader, the inputs of a block's ``forward``/``hybrid_forward``, and the image a function
given to a dataset's ``transform(fn)`` / ``transform_first(fn)`` receives. Used by GL203 to
translate the NDArray methods torch tensors do not have, or have with other semantics."""
from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from porter import astutil
from porter.context import FileContext

from . import _model
from . import _script as sc

ARRAY = "array"  # an MXNet array (a torch tensor in the port)
NUMPY = "numpy"
LIST = "list"  # a list of arrays: split_and_load's result, a DataLoader's batch
BLOCK = "block"  # a Gluon block or loss: calling it gives an array
LOADER = "loader"  # a DataLoader: iterating it gives batches of arrays
NAMESPACE = "F"  # hybrid_forward's F
_PENDING = "pending"  # while the facts are computed: a name whose bindings are not read yet

_Scope = Union[cst.Module, cst.FunctionDef, cst.Lambda]

_ARRAY_MODULES = ("mxnet.nd.", "mxnet.np.", "mxnet.numpy.", "mxnet.npx.", "mxnet.sym.", "mxnet.symbol.",
                  "mxnet.image.imresize", "mxnet.image.imdecode", "mxnet.image.fixed_crop", "mxnet.image.center_crop",
                  "mxnet.image.resize_short", "mxnet.image.color_normalize")
_LOADERS = ("mxnet.gluon.data.DataLoader", "mxnet.gluon.data.dataloader.DataLoader", "torch.utils.data.DataLoader")
_LISTS = ("mxnet.gluon.utils.split_and_load", "mxnet.gluon.utils.split_data")
_BLOCK_CALLS = ("mxnet.gluon.loss.", "mxnet.gluon.model_zoo.vision.get_model", "mxnet.gluon.nn.", "mxnet.gluon.rnn.")
# methods of an array whose result is not an array
_NOT_ARRAY_METHODS = frozenset({"asscalar", "item", "tolist", "wait_to_read", "attach_grad", "backward", "numel",
                                "dim", "size"})
_FORWARDS = ("forward", "hybrid_forward")
_TRANSFORMS = ("transform", "transform_first")


def jax_stage(ctx: FileContext) -> bool:
    """The JAX rules have begun on this file (it imports JAX or Flax): its arrays are JAX's,
    whose methods (``x.astype(jnp.float32)``, ``x.sum(axis=1)``) are no longer MXNet's."""
    return any(m == "jax" or m.startswith(("jax.", "flax")) for m in ctx.module_names)


def kind(ctx: FileContext, node: cst.BaseExpression) -> Optional[str]:
    """The kind of ``node`` (ARRAY, NUMPY, LIST, BLOCK, LOADER, or None: not known), read in the
    innermost function around the current node of the traversal."""
    scope: _Scope = ctx.module
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, (cst.FunctionDef, cst.Lambda)):
            scope = anc
            break
    return _Kinds(ctx, scope).of(node)


class _Kinds:
    def __init__(self, ctx: FileContext, scope: _Scope) -> None:
        self.ctx = ctx
        self.local = _scope_kinds(ctx, scope)
        self.outer = _scope_kinds(ctx, ctx.module) if scope is not ctx.module else {}

    def name(self, name: str) -> Optional[str]:
        if name in self.local:
            return self.local[name]
        return self.outer.get(name)

    def of(self, node: cst.CSTNode) -> Optional[str]:
        return _expr_kind(self.ctx, node, self.name)


def _expr_kind(ctx: FileContext, node: cst.CSTNode, name_kind) -> Optional[str]:
    of = lambda n: _expr_kind(ctx, n, name_kind)  # noqa: E731
    if isinstance(node, cst.Name):
        return name_kind(node.value)
    if isinstance(node, (cst.BinaryOperation,)):
        kinds = {of(node.left), of(node.right)}
        return next((k for k in (ARRAY, _PENDING, NUMPY) if k in kinds), None)
    if isinstance(node, cst.UnaryOperation):
        return of(node.expression)
    if isinstance(node, cst.Subscript):
        value = of(node.value)
        return ARRAY if value in (ARRAY, LIST) else value if value in (NUMPY, _PENDING) else None
    if isinstance(node, cst.IfExp):
        kinds = {of(node.body), of(node.orelse)}
        return _PENDING if _PENDING in kinds else kinds.pop() if len(kinds) == 1 else None
    if isinstance(node, cst.Attribute):
        return of(node.value) if node.attr.value == "T" and of(node.value) in (ARRAY, NUMPY) else None
    if not isinstance(node, cst.Call):
        return None
    func = node.func
    q = sc.qualname(ctx, func)
    if q is not None:
        if q.startswith(_LOADERS):
            return LOADER
        if q in _LISTS:
            return LIST
        if q.startswith(_BLOCK_CALLS) and q.split(".")[-1][:1].isupper() or q.endswith(".get_model"):
            return BLOCK
        if q.startswith(_ARRAY_MODULES):
            return ARRAY
        if q.startswith("numpy."):
            return NUMPY
        return None
    if isinstance(func, cst.Name):
        target = name_kind(func.value)
        if target == BLOCK:
            return ARRAY
        if target is None and _is_block_class_name(ctx, func.value):
            return BLOCK
        return None
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    receiver = func.value
    if isinstance(receiver, cst.Name):
        rk = name_kind(receiver.value)
        if rk == NAMESPACE:
            return ARRAY
        if receiver.value == "self" and _in_forward(ctx):
            return ARRAY  # self.fc(x), self.features(x) in a block's forward
    rk = of(receiver)
    if rk == _PENDING:
        return _PENDING
    if rk == ARRAY:
        if method in ("asnumpy", "numpy"):  # (numpy: GL004's port of asnumpy)
            return NUMPY
        return None if method in _NOT_ARRAY_METHODS else ARRAY
    if rk == NUMPY:
        return None if method in _NOT_ARRAY_METHODS else NUMPY
    if rk == BLOCK and method in ("forward", "hybrid_forward"):
        return ARRAY
    return None


def _in_forward(ctx: FileContext) -> bool:
    fn = ctx.enclosing(cst.FunctionDef)
    return isinstance(fn, cst.FunctionDef) and fn.name.value in _FORWARDS


def _is_block_class_name(ctx: FileContext, name: str) -> bool:
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
            return _model.is_block_class(stmt, ctx)
    return False


def transform_functions(ctx: FileContext) -> dict:
    """Functions of the file (by name; a lambda by its node) handed to a dataset's
    ``transform(fn)`` (-> "transform": fn takes the sample's fields, the image first) or
    ``transform_first(fn)`` (-> "transform_first")."""
    key = ("gluon.arrays.transforms", ctx.module)
    if key not in ctx.cache:
        out: dict = {}
        for node in astutil.walk(ctx.module, into_functions=True):
            if (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in _TRANSFORMS and node.args and node.args[0].keyword is None):
                fn = node.args[0].value
                if isinstance(fn, cst.Name):
                    out.setdefault(fn.value, node.func.attr.value)
                elif isinstance(fn, cst.Lambda):
                    out.setdefault(fn, node.func.attr.value)  # a lambda: keyed by its node
        ctx.cache[key] = out
    return ctx.cache[key]


def _param_kinds(ctx: FileContext, scope: _Scope) -> dict[str, Optional[str]]:
    if isinstance(scope, cst.Module):
        return {}
    names = [p.name.value for p in astutil.params(scope.params)]
    out: dict[str, Optional[str]] = {n: None for n in names}
    if isinstance(scope, cst.FunctionDef):
        if scope.name.value in _FORWARDS and names and names[0] == "self" and _in_block_class(ctx, scope):
            rest = names[1:]
            if scope.name.value == "hybrid_forward" and rest:
                out[rest[0]] = NAMESPACE
                rest = rest[1:]
            for n in rest:
                out[n] = ARRAY
        elif scope.name.value in transform_functions(ctx) and names:
            out[names[0]] = ARRAY  # the image (the label of a vision dataset is a NumPy scalar)
    elif scope in transform_functions(ctx) and names:
        out[names[0]] = ARRAY
    return out


def _in_block_class(ctx: FileContext, fn: cst.FunctionDef) -> bool:
    """``fn`` is a method of a Gluon block class of the file (not of a torch module: porter's
    emitted classes and the blocks already ported hold torch code)."""
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.ClassDef) and any(s is fn for s in stmt.body.body):
            return _model.is_block_class(stmt, ctx)
    return False


def _scope_kinds(ctx: FileContext, scope: _Scope) -> dict[str, Optional[str]]:
    key = ("gluon.arrays.scope", scope)
    cached = ctx.cache.get(key)
    if cached is not None:
        return cached
    params = _param_kinds(ctx, scope)
    outer = _scope_kinds(ctx, ctx.module) if not isinstance(scope, cst.Module) else {}
    bindings: list[tuple[cst.CSTNode, Optional[cst.CSTNode], str]] = []  # (target, value, how)
    body = scope.body if isinstance(scope, cst.Lambda) else scope
    for node in astutil.walk(body):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                bindings.append((t.target, node.value, "="))
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            bindings.append((node.target, node.value, "="))
        elif isinstance(node, cst.AugAssign):
            bindings.append((node.target, node.value, "+="))
        elif isinstance(node, (cst.For, cst.CompFor)):
            bindings.append((node.target, node.iter, "in"))
    bound = {n for target, _, _ in bindings for n in astutil.target_names(target)}
    kinds: dict[str, Optional[str]] = {**{n: _PENDING for n in bound}, **params}
    for _ in range(8):  # to a fixpoint: a name's kind may come from another name's
        seen: dict[str, set] = {}

        def name_kind(n: str) -> Optional[str]:
            return kinds[n] if n in kinds else outer.get(n)

        for target, value, how in bindings:
            for n, k in _bind(ctx, target, value, how, name_kind):
                seen.setdefault(n, set()).add(k)
        new = dict(kinds)
        for n, ks in seen.items():
            if params.get(n) is not None:
                continue  # a block's input stays an array, whatever it is rebound to
            ks = ks - {_PENDING} | ({params[n]} if n in params else set())
            new[n] = _PENDING if not ks else ks.pop() if len(ks) == 1 else None
        if new == kinds:
            break
        kinds = new
    kinds = {n: (None if k == _PENDING else k) for n, k in kinds.items()}
    ctx.cache[key] = kinds
    return kinds


def _bind(ctx, target, value, how, name_kind):
    """(name, kind) for each name ``target`` binds from ``value``."""
    of = lambda n: _expr_kind(ctx, n, name_kind)  # noqa: E731
    if how == "+=":
        if isinstance(target, cst.Name):
            yield target.value, of(value)
        return
    if how == "in":
        yield from _bind_items(ctx, target, value, name_kind)
        return
    if isinstance(target, cst.Name):
        yield target.value, of(value)
    elif isinstance(target, (cst.Tuple, cst.List)):
        elements = [e.value for e in target.elements]
        if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements) and not any(
                isinstance(e, cst.StarredElement) for e in value.elements):
            for t, v in zip(elements, value.elements):
                yield from _bind(ctx, t, v.value, "=", name_kind)
        else:
            k = of(value)
            for t in elements:
                yield from _bind_kind(t, ARRAY if k == LIST else _PENDING if k == _PENDING else None)


def _bind_kind(target, k):
    if isinstance(target, cst.Name):
        yield target.value, k
    elif isinstance(target, (cst.Tuple, cst.List)):
        for e in target.elements:
            yield from _bind_kind(e.value, k)
    elif isinstance(target, cst.StarredElement):
        yield from _bind_kind(target.value, None)


def _bind_items(ctx, target, iterable, name_kind):
    """The names a for-loop target binds from the items of ``iterable``."""
    of = lambda n: _expr_kind(ctx, n, name_kind)  # noqa: E731
    q = sc.qualname(ctx, iterable.func) if isinstance(iterable, cst.Call) else None
    if q == "builtins.enumerate" and iterable.args and isinstance(target, (cst.Tuple, cst.List)) \
            and len(target.elements) == 2:
        yield from _bind_kind(target.elements[0].value, None)
        yield from _bind_items(ctx, target.elements[1].value, iterable.args[0].value, name_kind)
        return
    if q == "builtins.zip" and isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(iterable.args):
        for t, a in zip(target.elements, iterable.args):
            yield from _bind_items(ctx, t.value, a.value, name_kind)
        return
    k = of(iterable)
    if k == _PENDING:
        yield from _bind_kind(target, _PENDING)
    elif k == LOADER:  # a batch: a list of arrays, or unpacked into arrays
        yield from (_bind_kind(target, LIST) if isinstance(target, cst.Name) else _bind_kind(target, ARRAY))
    elif k in (LIST, ARRAY):
        yield from _bind_kind(target, ARRAY)
    else:
        yield from _bind_kind(target, None)
