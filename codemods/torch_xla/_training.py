"""Shared analysis of the training-loop (TX2xx) and data-loading (TX3xx) rules.

* :func:`kinds_of` tells what a name or attribute is bound to in this file (an optimizer, a
  scheduler, a GradScaler, a DataLoader, an XLA device loader, a function parameter...), by
  following its assignments from constructor calls resolved through the file's imports.
* :func:`loop_source` finds the loader a ``for`` loop iterates (through ``enumerate``,
  ``tqdm``, ``zip``) and :func:`plan_loader_wrap` decides whether TX301 can wrap it in
  ``pl.MpDeviceLoader`` and which per-batch device moves then go away. TX202 asks the same
  question so that a loop gets either a device loader or an explicit step marker, never both.
* :func:`has_step_marker` finds an existing ``torch_xla.sync()``/``xm.mark_step()``/
  ``with torch_xla.step()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import libcst as cst

from porter.astutil import children as _children
from porter.astutil import target_names

from porter import astutil
from porter.context import FileContext, dotted_name
from porter.rules import StatementFact, module_fact

# Binding kinds -------------------------------------------------------------------------
OPTIMIZER = "optimizer"
SCHEDULER = "scheduler"
SCALER = "scaler"
DATALOADER = "dataloader"
DEVICE_LOADER = "device_loader"
PARAM = "param"
UNPACK = "unpack"  # `a, b = pair`: comes from elsewhere, like a parameter
OTHER = "other"

DATALOADER_NAMES = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
DEVICE_LOADER_NAMES = (
    "torch_xla.distributed.parallel_loader.MpDeviceLoader",
    "torch_xla.distributed.parallel_loader.ParallelLoader",
)
SCALER_NAMES = (
    "torch.cuda.amp.GradScaler",
    "torch.amp.GradScaler",
    "torch.cpu.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler",
    "torch_xla.amp.GradScaler",
)
STEP_MARKERS = (
    "torch_xla.sync",
    "torch_xla.step",
    "torch_xla.core.xla_model.mark_step",
    "torch_xla.torch_xla.sync",
    "torch_xla.torch_xla.step",
)
MULTIPROCESS_CALLS = (
    "torch_xla.launch",
    "torch_xla.distributed.xla_multiprocessing.spawn",
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes",
    "torch.distributed.init_process_group",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
DISTRIBUTED_SAMPLER_NAMES = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def classify_value(value: cst.CSTNode, ctx: FileContext, optimizer_classes: frozenset[str] = frozenset()) -> str:
    """The kind of object an assignment's right-hand side builds."""
    if isinstance(value, cst.Call):
        if astutil.method_name(value) == "per_device_loader":
            return DEVICE_LOADER
        q = ctx.qualname(value.func) or ""
        if q.startswith(("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")):
            return SCHEDULER
        if q in SCALER_NAMES:
            return SCALER
        if q.startswith("torch.optim.") and q.rsplit(".", 1)[1][:1].isupper() and q.rsplit(".", 1)[1] != "Optimizer":
            return OPTIMIZER
        if dotted_name(value.func) in optimizer_classes:
            return OPTIMIZER
        if q in DATALOADER_NAMES:
            return DATALOADER
        if q in DEVICE_LOADER_NAMES:
            return DEVICE_LOADER
    return OTHER


@dataclass
class Index:
    """Assignments of the file, per scope and file-wide."""

    # id(scope node) -> name -> kinds bound in that scope (Names only)
    scoped: dict[int, dict[str, set[str]]] = field(default_factory=dict)
    # dotted key ("optimizer", "self.optimizer", "optimizers[]") -> kinds, anywhere in the file
    filewide: dict[str, set[str]] = field(default_factory=dict)
    # id(function node) -> parameter names
    params: dict[int, set[str]] = field(default_factory=dict)
    # keys bound to dict literals (for **kwargs analysis): key -> list of dict nodes or None
    dicts: dict[str, list] = field(default_factory=dict)
    # names called as functions anywhere (qualnames), for "is this script multi-process"
    calls: set[str] = field(default_factory=set)
    # dotted key -> values assigned to it (None for bindings without a plain value)
    values: dict[str, list] = field(default_factory=dict)
    set_epoch_called: bool = False
    # function name -> calls of it by that name (for what callers pass to a parameter)
    calls_by_name: dict[str, list] = field(default_factory=dict)
    # id(function node) -> the function, and its parameter list in order
    functions: dict[int, cst.CSTNode] = field(default_factory=dict)
    # id(call) -> the function, lambda or class whose code holds the call (None: the module's)
    call_scopes: dict[int, Optional[cst.CSTNode]] = field(default_factory=dict)


# the key of the module's own scope in Index.scoped (ids of live nodes are never 0)
MODULE_SCOPE = 0


def index(ctx: FileContext) -> Index:
    """The file's Index, built once per module (a module fact: see porter.rules.module_fact;
    the rules read it through dictionary/set lookups only, so that they can still be checked
    one top-level statement at a time in `porter lsp`)."""
    return module_fact(ctx, _INDEX)


# Both facts are built statement by statement (porter.rules.StatementFact): each top-level
# statement's part is the list of what it adds, in the order of the walk, and the fact is
# made by applying the parts in the order of the statements: the same operations in the same
# order as one walk of the module, so the same fact (also the order of dictionaries and
# sets), and `porter lsp` computes again only the parts of the statements an edit changed.
def _optimizer_class_part(ctx: FileContext, stmt: cst.CSTNode, pre: None) -> tuple:
    """The classes of ``stmt`` (walk order) with, for each base, whether it is one of
    torch.optim's optimizers (through the imports) and its dotted name."""
    out = []
    for node in astutil.walk(stmt, into_functions=True):
        if isinstance(node, cst.ClassDef):
            bases = []
            for base in node.bases:
                q = ctx.qualname(base.value) or ""
                bases.append((q.startswith("torch.optim.") and not q.startswith(("torch.optim.lr_scheduler", "torch.optim.swa_utils")),
                              dotted_name(base.value)))
            out.append((node.name.value, tuple(bases)))
    return tuple(out)


def _optimizer_class_names(ctx: FileContext, parts: list, pre: None) -> frozenset[str]:
    """Classes deriving from a torch.optim optimizer, or from such a class defined earlier."""
    names: set[str] = set()
    for part in parts:
        for name, bases in part:
            for optimizer, dotted in bases:
                if optimizer or dotted in names:
                    names.add(name)
    return frozenset(names)


_OPTIMIZER_CLASSES = StatementFact(_optimizer_class_part, _optimizer_class_names, name="optimizer_classes")


def _optimizer_classes(ctx: FileContext) -> frozenset[str]:
    return module_fact(ctx, _OPTIMIZER_CLASSES)


def _index_part(ctx: FileContext, stmt: cst.CSTNode, opt_classes: frozenset[str]) -> tuple:
    """What one top-level statement adds to the Index, as operations in walk order (see
    _apply_index_ops)."""
    ops: list[tuple] = []
    emit = ops.append
    module_scope = ctx.module

    def bind(scope: cst.CSTNode, target: cst.CSTNode, kind: str, value: Optional[cst.CSTNode] = None) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            values = None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
                values = [e.value for e in value.elements]
            for i, el in enumerate(target.elements):
                if values is not None:
                    bind(scope, el.value, classify_value(values[i], ctx, opt_classes), values[i])
                elif isinstance(value, (cst.Name, cst.Attribute)):
                    bind(scope, el.value, UNPACK)
                else:
                    bind(scope, el.value, OTHER)
            return
        if isinstance(target, cst.StarredElement):
            target = target.value
        key = dotted_name(target)
        if key is None:
            return
        emit(("filewide", key, kind))
        if isinstance(target, cst.Name):
            emit(("scoped", MODULE_SCOPE if scope is module_scope else id(scope), key, kind))
        emit(("dicts", key, value if isinstance(value, (cst.Dict, cst.IfExp)) else None))
        emit(("values", key, value))
        if value is not None:
            if isinstance(value, (cst.List, cst.Tuple)) and value.elements:
                kinds = {classify_value(e.value, ctx, opt_classes) for e in value.elements}
                if len(kinds) == 1:
                    emit(("filewide_update", key + "[]", kinds))

    def visit(node: cst.CSTNode, scope: cst.CSTNode) -> None:
        if isinstance(node, (cst.FunctionDef, cst.Lambda)):
            names = {p.name.value for p in _all_params(node.params)}
            emit(("params", id(node), names))
            emit(("functions", id(node), node))
            for child in _children(node):
                visit(child, node)
            return
        if isinstance(node, cst.ClassDef):
            for child in _children(node):
                visit(child, node)
            return
        if isinstance(node, cst.Assign):
            for t in node.targets:
                bind(scope, t.target, classify_value(node.value, ctx, opt_classes), node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            bind(scope, node.target, classify_value(node.value, ctx, opt_classes), node.value)
        elif isinstance(node, cst.AugAssign):
            bind(scope, node.target, OTHER)
        elif isinstance(node, (cst.For, cst.CompFor)):
            bind(scope, node.target, OTHER)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            bind(scope, node.asname.name, OTHER)
        elif isinstance(node, cst.NamedExpr):
            bind(scope, node.target, classify_value(node.value, ctx, opt_classes), node.value)
        elif isinstance(node, cst.Call):
            emit(("call_scopes", id(node), None if scope is module_scope else scope))
            q = ctx.qualname(node.func)
            if q:
                emit(("calls", q))
            if isinstance(node.func, cst.Name):
                emit(("calls_by_name", node.func.value, node))
            if astutil.method_name(node) == "set_epoch":
                emit(("set_epoch_called",))
            if astutil.method_name(node) == "update" and isinstance(node.func, cst.Attribute):
                key = dotted_name(node.func.value)
                if key is not None:
                    a = node.args[0].value if len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star else None
                    emit(("dicts", key, ("update", a, node)))
        for child in _children(node):
            visit(child, scope)

    visit(stmt, module_scope)
    return tuple(ops)


def _apply_index_ops(ctx: FileContext, parts: list, opt_classes: frozenset[str]) -> Index:
    idx = Index()
    for ops in parts:
        for op in ops:
            what = op[0]
            if what == "filewide":
                idx.filewide.setdefault(op[1], set()).add(op[2])
            elif what == "scoped":
                idx.scoped.setdefault(op[1], {}).setdefault(op[2], set()).add(op[3])
            elif what == "dicts":
                idx.dicts.setdefault(op[1], []).append(op[2])
            elif what == "values":
                idx.values.setdefault(op[1], []).append(op[2])
            elif what == "filewide_update":
                idx.filewide.setdefault(op[1], set()).update(op[2])
            elif what == "params":
                idx.params[op[1]] = set(op[2])
            elif what == "functions":
                idx.functions[op[1]] = op[2]
            elif what == "call_scopes":
                idx.call_scopes[op[1]] = op[2]
            elif what == "calls":
                idx.calls.add(op[1])
            elif what == "calls_by_name":
                idx.calls_by_name.setdefault(op[1], []).append(op[2])
            elif what == "set_epoch_called":
                idx.set_epoch_called = True
            else:  # pragma: no cover
                raise AssertionError(op)
    return idx


_INDEX = StatementFact(_index_part, _apply_index_ops, pre_fact=_OPTIMIZER_CLASSES, name="index")


def _build(ctx: FileContext) -> Index:
    """The Index of the whole module (one walk), as index() has it."""
    return _INDEX(ctx)


def _all_params(params: cst.Parameters) -> Iterator[cst.Param]:
    yield from params.posonly_params
    yield from params.params
    yield from params.kwonly_params
    if isinstance(params.star_arg, cst.Param):
        yield params.star_arg
    if params.star_kwarg is not None:
        yield params.star_kwarg


def caller_kinds(function: cst.CSTNode, param: str, ctx: FileContext) -> set[str]:
    """Kinds of what the file's calls of ``function`` (by its name) pass as ``param``."""
    idx = index(ctx)
    if not isinstance(function, cst.FunctionDef):
        return set()
    positional = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    out: set[str] = set()
    for call in idx.calls_by_name.get(function.name.value, ()):
        arg_value = None
        for i, a in enumerate(call.args):
            if a.star:
                break
            if a.keyword is not None:
                if a.keyword.value == param:
                    arg_value = a.value
            elif i < len(positional) and positional[i] == param:
                arg_value = a.value
        if arg_value is None:
            continue
        if isinstance(arg_value, cst.Call):
            out.add(classify_value(arg_value, ctx))
        else:
            key = dotted_name(arg_value)
            if key is not None:
                out.update(idx.filewide.get(key, set()) - {UNPACK})
    return out


def param_scope(expr: cst.CSTNode, ctx: FileContext) -> Optional[cst.CSTNode]:
    """The function of which the Name ``expr`` is a parameter (the nearest scope binding it)."""
    if not isinstance(expr, cst.Name):
        return None
    idx = index(ctx)
    for scope in [a for a in reversed(ctx.ancestors) if isinstance(a, _SCOPES)]:
        if expr.value in idx.params.get(id(scope), ()):
            return scope
        if expr.value in idx.scoped.get(id(scope), {}):
            return None
    return None


def kinds_of(expr: cst.CSTNode, ctx: FileContext) -> tuple[set[str], set[str]]:
    """(kinds bound in the nearest scope that binds ``expr``, kinds bound anywhere in the file).

    The nearest scope's set contains PARAM when the name is a parameter of that function.
    Attributes (``self.loader``) and subscripts (``optimizers[0]``, key ``optimizers[]``)
    only have file-wide bindings.
    """
    idx = index(ctx)
    if isinstance(expr, cst.Subscript):
        key = dotted_name(expr.value)
        return set(), set(idx.filewide.get(key + "[]", ())) if key else set()
    key = dotted_name(expr)
    if key is None:
        return set(), set()
    filewide = set(idx.filewide.get(key, ()))
    if not isinstance(expr, cst.Name):
        return set(), filewide
    for scope_key in [id(a) for a in reversed(ctx.ancestors) if isinstance(a, _SCOPES)] + [MODULE_SCOPE]:
        local = set(idx.scoped.get(scope_key, {}).get(key, ()))
        if key in idx.params.get(scope_key, ()):
            local.add(PARAM)
        if local:
            return local, filewide
    return set(), filewide


def looks_like_optimizer_name(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Subscript):
        node = node.value
    if isinstance(node, cst.Attribute):
        node = node.attr
    if not isinstance(node, cst.Name):
        return False
    name = node.value.lower()
    return "opt" in name and "sched" not in name and "scaler" not in name and "option" not in name


def optimizer_resolution(expr: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """"resolved" (built by a torch.optim constructor), "param" (a parameter named like an
    optimizer, nothing else known), "name" (only the name suggests it) or None."""
    local, filewide = kinds_of(expr, ctx)
    bad = {SCHEDULER, SCALER, DEVICE_LOADER, DATALOADER}
    if local & bad:
        return None
    if OPTIMIZER in local:
        return "resolved"
    if local - {PARAM, UNPACK}:
        # bound locally to something we do not know: only the name speaks for it
        return "name" if looks_like_optimizer_name(expr) else None
    fn = param_scope(expr, ctx) if PARAM in local else None
    callers = caller_kinds(fn, expr.value, ctx) if fn is not None else set()  # type: ignore[attr-defined]
    if callers & bad:
        return None
    if OPTIMIZER in callers:
        return "resolved"
    if filewide & bad:
        return None
    if OPTIMIZER in filewide:
        return "resolved"
    if local & {PARAM, UNPACK} and looks_like_optimizer_name(expr):
        return "param"
    if looks_like_optimizer_name(expr):
        return "name"
    return None


def _says_loader(expr: cst.CSTNode) -> bool:
    return isinstance(expr, cst.Name) and "loader" in expr.value.lower()


def loader_resolution(expr: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """DATALOADER, DEVICE_LOADER or None for an iterated expression."""
    if isinstance(expr, cst.IfExp):  # TX301's `pl.MpDeviceLoader(loader, d) if <d is XLA> else loader`
        return DEVICE_LOADER if loader_resolution(expr.body, ctx) == DEVICE_LOADER else None
    if isinstance(expr, cst.Call):
        q = ctx.qualname(expr.func)
        if q in DATALOADER_NAMES:
            return DATALOADER
        if q in DEVICE_LOADER_NAMES or astutil.method_name(expr) == "per_device_loader":
            return DEVICE_LOADER
        return None
    local, filewide = kinds_of(expr, ctx)
    if DEVICE_LOADER in local:
        return DEVICE_LOADER
    rest = local - {PARAM, UNPACK}
    if rest:
        return DATALOADER if rest == {DATALOADER} else None
    fn = param_scope(expr, ctx) if PARAM in local else None
    callers = caller_kinds(fn, expr.value, ctx) if fn is not None else set()  # type: ignore[attr-defined]
    if DEVICE_LOADER in callers:
        return DEVICE_LOADER
    if callers == {DATALOADER}:
        return DATALOADER
    if DEVICE_LOADER in filewide:
        return DEVICE_LOADER
    if filewide - {UNPACK} == {DATALOADER}:
        return DATALOADER
    if local & {PARAM, UNPACK} and _says_loader(expr):
        return DATALOADER
    return None


def has_step_marker(loop: cst.CSTNode, ctx: FileContext) -> bool:
    for n in astutil.walk(loop.body):  # type: ignore[attr-defined]
        if isinstance(n, cst.Call):
            q = ctx.qualname(n.func)
            if q in STEP_MARKERS:
                return True
            if q == "torch_xla.core.xla_model.optimizer_step":
                barrier = astutil.arg(n, "barrier", 1)
                if barrier is not None and not (isinstance(barrier.value, cst.Name) and barrier.value.value in ("False", "None")):
                    return True
    return False


def _own_nodes(loop: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Nodes of a loop's body, not descending into nested loops or functions (the nested
    loops themselves are yielded)."""
    stack = [loop.body]  # type: ignore[attr-defined]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        stack.extend(reversed(_children(n)))


def loop_kind(loop: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """``astutil.loop_kind`` restricted to the loop that does the step itself.

    astutil's walk reaches into nested loops, so an epoch loop around a batch loop counts as
    a training (or, with a validation loop under ``no_grad`` inside, evaluation) loop. Here
    a loop holding a nested training/evaluation loop is neither, and a training loop must
    call ``.backward()`` outside nested loops, or call (outside nested loops) a function or
    method of this file that does (:func:`calls_step`): a trainer's
    ``for batch in self.train_loader: self._run_batch(batch)``.
    """
    kind = astutil.loop_kind(loop, ctx)
    if kind != "eval" and any(isinstance(n, cst.Call) and calls_step(n, ctx) for n in _own_nodes(loop)):
        return "train"  # the step is in a function or method the loop calls
    if kind is None:
        return None
    if kind == "train":
        if not any(astutil.method_name(n) == "backward" for n in _own_nodes(loop)):
            return None
        return kind
    if _has_nested_step_loop(loop.body, ctx):  # type: ignore[attr-defined]
        return None
    if isinstance(loop, cst.For) and any(s.kind is not None for s in loop_source(loop, ctx)):
        return kind  # a loop over a loader under no_grad
    return kind if any(_is_model_call(n, ctx) for n in _own_nodes(loop)) else None


_MODEL_METHODS = ("forward", "generate", "predict", "encode", "decode", "sample")


def _is_model_call(node: cst.CSTNode, ctx: FileContext) -> bool:
    """``model(x)``, ``self.net(x)``, ``model.generate(x)``: a call of a module-like object,
    not of an imported function, a builtin or a tensor method."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Name):
        if ctx.qualname(func) is not None:
            return False  # imported or builtin
        return func.value not in module_fact(ctx, top_level_definitions)
    if isinstance(func, cst.Attribute):
        if isinstance(func.value, cst.Name) and func.value.value == "self":
            return True
        return func.attr.value in _MODEL_METHODS and ctx.qualname(func) is None
    return False


def top_level_definitions(ctx: FileContext) -> frozenset[str]:
    """Names of the functions and classes defined at the top level of the module."""
    return frozenset(s.name.value for s in ctx.module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef)))


def _has_nested_step_loop(node: cst.CSTNode, ctx: FileContext) -> bool:
    """A training/evaluation loop below ``node`` (the path to it pushed on ``ctx.ancestors``
    while it is classified, so that an enclosing ``with torch.no_grad()`` is seen)."""
    if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
        return False
    ctx.ancestors.append(node)
    try:
        if isinstance(node, (cst.For, cst.While)):
            return loop_kind(node, ctx) is not None
        return any(_has_nested_step_loop(c, ctx) for c in _children(node))
    finally:
        ctx.ancestors.pop()


# Loop sources ----------------------------------------------------------------------------
@dataclass
class LoopSource:
    loader: cst.BaseExpression  # the expression to wrap (or already a device loader)
    kind: Optional[str]  # DATALOADER, DEVICE_LOADER or None (an iterable we do not know)
    batch_target: Optional[cst.BaseExpression]  # the part of the loop target bound to a batch
    key: Optional[str]  # dotted name of the loader, for linking loops to DataLoader bindings
    zipped: bool = False


def _is_tqdm(func: cst.CSTNode, ctx: FileContext) -> bool:
    q = ctx.qualname(func) or dotted_name(func) or ""
    return q == "tqdm" or q.endswith(".tqdm") or q in ("tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm")


def loop_source(loop: cst.For, ctx: FileContext) -> list[LoopSource]:
    """What a for loop iterates: one LoopSource, several under ``zip``, or none."""
    it: cst.BaseExpression = loop.iter
    target: Optional[cst.BaseExpression] = loop.target
    for _ in range(4):
        if not isinstance(it, cst.Call) or not it.args or it.args[0].keyword is not None or it.args[0].star:
            break
        q = ctx.qualname(it.func)
        if q == "builtins.enumerate":
            it = it.args[0].value
            if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
                target = target.elements[1].value
            else:
                target = None
        elif _is_tqdm(it.func, ctx):
            it = it.args[0].value
        elif q == "builtins.zip":
            out = []
            elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == len(it.args) else None
            for i, a in enumerate(it.args):
                if a.keyword is not None or a.star:
                    continue
                sub = loop_source(loop.with_changes(iter=a.value, target=elements[i].value if elements else cst.Name("_")), ctx)
                for s in sub:
                    out.append(LoopSource(s.loader, s.kind, s.batch_target if elements else None, s.key, True))
            return out
        else:
            break
    kind = loader_resolution(it, ctx)
    key = dotted_name(it)
    wrapper = it.body if kind == DEVICE_LOADER and isinstance(it, cst.IfExp) else it
    if kind == DEVICE_LOADER and isinstance(wrapper, cst.Call) and wrapper.args:
        key = dotted_name(wrapper.args[0].value)  # the CPU loader inside MpDeviceLoader(...)
    return [LoopSource(it, kind, target, key)]


# Per-batch device moves -----------------------------------------------------------------
DTYPES = {
    "float", "float32", "float64", "double", "half", "float16", "bfloat16", "int", "int32",
    "int64", "long", "int8", "int16", "short", "uint8", "bool", "complex64", "complex128",
}


def _to_arg_kind(expr: cst.BaseExpression, ctx: FileContext) -> str:
    """"xla" (the default accelerator: cuda strings/indices), "device" (a device value to
    reuse), "dtype", "cpu" or "unknown"."""
    s = astutil.string_value(expr)
    if s is not None:
        if s.startswith(("cuda", "xla")):
            return "xla"
        return "cpu" if s == "cpu" else "unknown"
    if isinstance(expr, cst.Integer):
        return "xla"
    if isinstance(expr, cst.Call):
        q = ctx.qualname(expr.func)
        if q in ("torch_xla.device", "torch_xla.core.xla_model.xla_device", "torch_xla.torch_xla.device"):
            return "xla"
        if q == "torch.device":
            a = expr.args[0].value if expr.args else None
            if a is not None and astutil.string_value(a) == "cpu":
                return "cpu"
            return "xla"
        return "unknown"
    q = ctx.qualname(expr)
    if q and q.startswith("torch.") and q.split(".", 1)[1] in DTYPES:
        return "dtype"
    name = dotted_name(expr)
    if name is None:
        return "unknown"
    last = name.rsplit(".", 1)[-1].lower()
    if "dtype" in last:
        return "dtype"
    if last in ("rank", "local_rank", "gpu", "gpu_id", "device_id", "device_ids") or "rank" in last:
        return "xla"  # a CUDA device index
    if "device" in last or last == "dev":
        return "device"
    return "unknown"


@dataclass
class Move:
    call: cst.Call
    device: Optional[cst.BaseExpression]  # a reusable device expression, None: torch_xla.device()


def as_device_move(call: cst.CSTNode, ctx: FileContext) -> Optional[Move]:
    """``x.to(device)``, ``x.to(device, non_blocking=True)``, ``x.cuda()``, ``x.to('cuda')``."""
    m = astutil.method_name(call)
    if not isinstance(call, cst.Call) or m not in ("to", "cuda"):
        return None
    if any(a.star for a in call.args):
        return None
    if m == "cuda":
        return Move(call, None)
    dev = astutil.arg(call, "device")
    positional = [a for a in call.args if a.keyword is None]
    if dev is None and positional:
        kind = _to_arg_kind(positional[0].value, ctx)
        if kind not in ("xla", "device"):
            return None
        dev = positional[0]
    if dev is None:
        return None
    kind = _to_arg_kind(dev.value, ctx)
    if kind not in ("xla", "device"):
        return None
    return Move(call, dev.value if kind == "device" else None)


def strip_move(call: cst.CSTNode) -> cst.CSTNode:
    """``x.to(device[, dtype])`` -> ``x`` (or ``x.to(dtype)``); ``x.cuda()`` -> ``x``.

    Works on the node after other rules' edits (``.cuda()`` already rewritten to
    ``.to(torch_xla.device())``): anything but a ``.to``/``.cuda`` call is returned as it is.
    """
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
        return call
    receiver = call.func.value
    m = call.func.attr.value
    if m == "cuda":
        return receiver
    if m != "to":
        return call
    keep = []
    positional_seen = 0
    for a in call.args:
        if a.keyword is None:
            positional_seen += 1
            if positional_seen == 1 and astutil.arg(call, "device") is None:
                continue  # the device
            keep.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        elif a.keyword.value in ("device", "non_blocking"):
            continue
        else:
            keep.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    if not any(a.keyword is None or a.keyword.value == "dtype" for a in keep):
        return receiver
    return call.with_changes(args=keep)


def _root(expr: cst.CSTNode) -> Optional[str]:
    """The variable a value is taken from: ``batch['x'][0]`` -> batch, ``x.view(-1).float()`` -> x."""
    while True:
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        elif isinstance(expr, cst.Name):
            return expr.value
        else:
            return None


@dataclass
class WrapPlan:
    loader: cst.BaseExpression
    device: Optional[str]  # code of the device expression; None -> torch_xla.device()
    drop_calls: list[cst.Call] = field(default_factory=list)  # moves replaced by their receiver
    drop_statements: list[cst.CSTNode] = field(default_factory=list)  # whole statements removed
    problem: Optional[str] = None  # why it cannot be wrapped safely (report only)
    # `if` statements left without a statement once the moves go (removed, if nothing else
    # emptied or replaced them first)
    emptied_ifs: list[cst.If] = field(default_factory=list)


def _structural(expr: cst.CSTNode, pristine: set[str], ctx: FileContext) -> bool:
    """A value that is (part of) a batch: a batch name, an index into it, a method chain on
    it (``x.view(-1)``, ``x.float()``), or a device move of those; tuples of those."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        return bool(expr.elements) and all(_structural(e.value, pristine, ctx) for e in expr.elements)
    r = _root(expr)
    return r is not None and r in pristine


def _comprehension_move(value: cst.CSTNode, target_name: str, ctx: FileContext) -> bool:
    """``{k: v.to(device) for k, v in batch.items()}`` / ``tuple(t.to(device) for t in batch)``
    / ``[t.to(device) for t in batch]`` rebinding ``batch``."""
    comp = value
    if isinstance(value, cst.Call) and ctx.qualname(value.func) in ("builtins.tuple", "builtins.list") and len(value.args) == 1:
        comp = value.args[0].value
    if isinstance(comp, cst.DictComp):
        elt = comp.value
        key_ok = isinstance(comp.key, cst.Name)
    elif isinstance(comp, (cst.GeneratorExp, cst.ListComp)):
        elt = comp.elt
        key_ok = True
    else:
        return False
    f = comp.for_in
    if not key_ok or f.inner_for_in is not None or f.ifs:
        return False
    it = f.iter
    if isinstance(comp, cst.DictComp):
        if not (astutil.method_name(it) == "items" and isinstance(it.func.value, cst.Name) and it.func.value.value == target_name):  # type: ignore[union-attr]
            return False
        if not (isinstance(f.target, cst.Tuple) and len(f.target.elements) == 2):
            return False
        var = f.target.elements[1].value
    else:
        if not (isinstance(it, cst.Name) and it.value == target_name):
            return False
        var = f.target
    move = as_device_move(elt, ctx)
    return (
        move is not None
        and isinstance(var, cst.Name)
        and isinstance(move.call.func, cst.Attribute)
        and isinstance(move.call.func.value, cst.Name)
        and move.call.func.value.value == var.value
    )


def plan_loader_wrap(loop: cst.For, ctx: FileContext) -> Optional[WrapPlan]:
    """How TX301 ports this loop, or None when it does not apply (not a DataLoader, already a
    device loader, or the loop already has an explicit step marker)."""
    sources = loop_source(loop, ctx)
    if len(sources) != 1 or sources[0].kind != DATALOADER:
        if any(s.kind == DATALOADER for s in sources) and not has_step_marker(loop, ctx):
            names = ", ".join(dotted_name(s.loader) or "loader" for s in sources if s.kind == DATALOADER)
            return WrapPlan(sources[0].loader, None, problem=(
                f"this loop zips loaders ({names}): porter does not wrap them; wrap each in "
                "pl.MpDeviceLoader(loader, device) and drop the per-batch .to(device) by hand "
                "(a torch_xla.sync() at the end of the body keeps it correct meanwhile)"))
        return None
    if has_step_marker(loop, ctx):
        return None
    src = sources[0]
    plan = WrapPlan(src.loader, None)
    pristine: set[str] = set(target_names(src.batch_target)) if src.batch_target is not None else set()
    batch_names = set(pristine)
    parents: dict[str, set[str]] = {n: set() for n in pristine}
    covered: set[str] = set()
    used: dict[str, cst.CSTNode] = {}
    devices: list[Optional[str]] = []
    rebound_in_body: set[str] = set()
    for n in astutil.walk(loop.body):
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            for t in targets:
                rebound_in_body.update(target_names(t))

    def note_move(move: Move) -> None:
        if move.device is None:
            devices.append(None)
        else:
            devices.append(cst.Module([]).code_for_node(move.device))

    def scan(node: cst.CSTNode) -> None:
        """Loads in ``node``: drop moves of batch values, record other uses."""
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        move = as_device_move(node, ctx)
        if move is not None and _root(move.call.func.value) in pristine:  # type: ignore[union-attr]
            root = _root(move.call.func.value)  # type: ignore[union-attr]
            covered.add(root)  # type: ignore[arg-type]
            plan.drop_calls.append(move.call)
            note_move(move)
            inner = move.call.func.value  # type: ignore[union-attr]
            if not isinstance(inner, cst.Name):
                scan_children(inner)
            for a in move.call.args:
                scan(a.value)
            return
        if isinstance(node, cst.Name):
            if node.value in pristine and node.value not in used:
                used[node.value] = node
            return
        scan_children(node)

    def scan_children(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Attribute):
            scan(node.value)
            return
        if isinstance(node, cst.Arg):
            scan(node.value)
            return
        for c in _children(node):
            scan(c)

    def statement(stmt: cst.CSTNode, line: Optional[cst.SimpleStatementLine]) -> None:
        if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0].target
            names = list(target_names(target))
            if isinstance(target, cst.Name) and target.value in pristine and _comprehension_move(stmt.value, target.value, ctx):
                covered.add(target.value)
                devices.append(_comp_device(stmt.value, ctx))
                plan.drop_statements.append(line if line is not None and len(line.body) == 1 else stmt)
                return
            structural = _structural(stmt.value, pristine, ctx)
            before = len(plan.drop_calls)
            scan(stmt.value)
            if structural:
                sources = {r for r in _roots(stmt.value) if r in pristine}
                for name in names:
                    parents.setdefault(name, set()).update(sources - {name})
                pristine.update(names)
                # `a, b = a.to(d), b.to(d)` / `x = x.to(d)`: nothing left once the moves go
                if len(plan.drop_calls) > before and _identity_after_drop(target, stmt.value, set(plan.drop_calls[before:])):
                    del plan.drop_calls[before:]
                    plan.drop_statements.append(line if line is not None and len(line.body) == 1 else stmt)
                    for name in names:
                        if used.get(name) is not None and _inside(used[name], stmt.value):
                            del used[name]
            else:
                pristine.difference_update(names)
            return
        if isinstance(stmt, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            scan(stmt)
            targets = [t.target for t in stmt.targets] if isinstance(stmt, cst.Assign) else [stmt.target]
            for t in targets:
                pristine.difference_update(target_names(t))
            return
        scan(stmt)

    def block(body: Sequence[cst.CSTNode]) -> None:
        for stmt in body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    statement(small, stmt)
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            else:
                compound(stmt)

    def compound(stmt: cst.CSTNode) -> None:
        for c in _children(stmt):
            if isinstance(c, (cst.IndentedBlock,)):
                block(c.body)
            elif isinstance(c, cst.SimpleStatementSuite):
                for small in c.body:
                    statement(small, None)
            elif isinstance(c, (cst.BaseSuite,)):
                continue
            elif isinstance(c, (cst.If, cst.Else, cst.ExceptHandler, cst.Finally, cst.ExceptStarHandler)):
                compound(c)
            elif isinstance(c, cst.BaseExpression) or isinstance(c, cst.WithItem):
                scan(c)

    block(loop.body.body if isinstance(loop.body, cst.IndentedBlock) else [])
    if isinstance(loop.body, cst.SimpleStatementSuite):
        for small in loop.body.body:
            statement(small, None)

    def is_covered(name: str, seen: frozenset = frozenset()) -> bool:
        if name in covered:
            return True
        return any(p not in seen and is_covered(p, seen | {name}) for p in parents.get(name, ()))

    def has_covered_child(name: str) -> bool:
        return any(name in ps and (c in covered or has_covered_child(c)) for c, ps in parents.items() if c != name)

    if plan.drop_calls or plan.drop_statements:
        cpu = sorted(n for n in used if not is_covered(n) and not has_covered_child(n))
        if cpu:
            return WrapPlan(src.loader, None, problem=(
                f"batch value{'s' if len(cpu) > 1 else ''} {', '.join(cpu)} "
                f"{'are' if len(cpu) > 1 else 'is'} used without a move to the device, so "
                "pl.MpDeviceLoader, which moves every tensor of the batch, could change what "
                "runs on the CPU: wrap the loader in pl.MpDeviceLoader(loader, device) by hand "
                "once those values may live on the XLA device"))
    _drop_emptied_ifs(loop, plan, ctx)
    distinct = {d for d in devices if d is not None}
    device = None
    if len(distinct) == 1:
        (device,) = distinct
        root = device.split(".")[0].split("(")[0]
        if root in rebound_in_body or root in batch_names:
            device = None
    plan.device = device
    return plan


_PURE_CALLS = ("builtins.isinstance", "builtins.hasattr", "builtins.len", "builtins.getattr", "builtins.callable")


def _pure_test(test: cst.CSTNode, ctx: FileContext) -> bool:
    for n in astutil.walk(test, into_functions=True):
        if isinstance(n, (cst.Call)):
            q = ctx.qualname(n.func) or ""
            if not (q in _PURE_CALLS or q.startswith("torch.cuda.")):
                return False
        elif isinstance(n, (cst.NamedExpr, cst.Await, cst.Yield)):
            return False
    return True


def _drop_emptied_ifs(loop: cst.CSTNode, plan: "WrapPlan", ctx: FileContext) -> None:
    """``if args.gpu is not None: images = images.cuda(args.gpu)`` loses its only statement:
    drop the whole ``if`` (its test has no side effects) rather than leave ``if ...: pass``."""
    dropped = {id(n) for n in plan.drop_statements}

    def visit(node: cst.CSTNode) -> bool:
        """True when ``node`` (a statement) goes away entirely."""
        if id(node) in dropped:
            return True
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(node, cst.If):
            body = node.body
            inner = [visit(c) for c in body.body] if isinstance(body, cst.IndentedBlock) else [False]
            if node.orelse is not None:
                visit(node.orelse)
                return False
            if inner and all(inner) and _pure_test(node.test, ctx):
                plan.emptied_ifs.append(node)
                return True
            return False
        for c in _children(node):
            visit(c)
        return False

    body = loop.body  # type: ignore[attr-defined]
    for stmt in getattr(body, "body", ()):
        visit(stmt)


def remove_if_empty(updated: cst.CSTNode):
    """Edit callable for an ``if`` whose statements were removed by inner edits."""
    if isinstance(updated, cst.If) and updated.orelse is None and isinstance(updated.body, cst.IndentedBlock):
        if not updated.body.body:
            return cst.RemoveFromParent()
    return updated


def _comp_device(value: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    for n in astutil.walk(value):
        m = as_device_move(n, ctx)
        if m is not None:
            return None if m.device is None else cst.Module([]).code_for_node(m.device)
    return None


def _roots(expr: cst.CSTNode) -> Iterator[str]:
    if isinstance(expr, (cst.Tuple, cst.List)):
        for e in expr.elements:
            yield from _roots(e.value)
    else:
        r = _root(expr)
        if r is not None:
            yield r


def _identity_after_drop(target: cst.CSTNode, value: cst.CSTNode, dropped: set) -> bool:
    """After replacing the dropped moves by their receivers, is ``target = value`` a no-op?"""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        return len(target.elements) == len(value.elements) and all(
            _identity_after_drop(t.value, v.value, dropped) for t, v in zip(target.elements, value.elements)
        )
    if isinstance(target, cst.Name) and isinstance(value, cst.Call) and value in dropped:
        stripped = strip_move(value)
        return isinstance(stripped, cst.Name) and stripped.value == target.value
    return False


def _inside(node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(n is node for n in astutil.walk(container, into_functions=True))


# Loop-body edits -----------------------------------------------------------------------
def own_continues(loop: cst.CSTNode) -> list[tuple[cst.Continue, Optional[cst.SimpleStatementLine]]]:
    """``continue`` statements of this loop (not of nested loops), with the line holding them
    when it holds nothing else (else None: the continue sits in a one-line suite)."""
    out: list = []

    def visit(node: cst.CSTNode, line: Optional[cst.SimpleStatementLine]) -> None:
        if isinstance(node, (cst.For, cst.While)) and node is not loop:
            # a nested loop's body continues that loop; its else-clause belongs to ours
            if node.orelse is not None:
                visit(node.orelse, None)
            return
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        if isinstance(node, cst.Continue):
            out.append((node, line))
            return
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                visit(small, node if len(node.body) == 1 else None)
            return
        for c in _children(node):
            visit(c, None)

    visit(loop.body, None)  # type: ignore[attr-defined]
    return out


def sync_statement(ctx: FileContext) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"{ctx.module_alias('torch_xla')}.sync()")  # type: ignore[return-value]


def sync_before(ctx: FileContext) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """Replacement callable for a ``continue``: ``torch_xla.sync(); continue``."""
    expr = cst.Expr(cst.parse_expression(f"{ctx.module_alias('torch_xla')}.sync()"))

    def apply(updated: cst.CSTNode):
        return cst.FlattenSentinel([expr, updated])

    return apply


def dataloader_binding_key(ctx: FileContext) -> Optional[str]:
    """For a DataLoader(...) call being visited: the name it is assigned to, if any."""
    parent = ctx.parent
    node = ctx.ancestors[-1]
    if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    if isinstance(parent, cst.AnnAssign) and parent.value is node:
        return dotted_name(parent.target)
    return None


def kwargs_keys(call: cst.Call, ctx: FileContext) -> Optional[set[str]]:
    """The keyword names a call may receive, including those of ``**name`` when ``name`` is
    only ever bound to dict literals and updated with dict literals (or such names); None
    when unknown."""
    keys = {a.keyword.value for a in call.args if a.keyword is not None}
    idx = index(ctx)
    for a in call.args:
        if a.star == "**":
            more = _dict_keys(a.value, idx, depth=0)
            if more is None:
                return None
            keys |= more
    return keys


def _dict_keys(expr: cst.CSTNode, idx: Index, depth: int) -> Optional[set[str]]:
    if depth > 3:
        return None
    if isinstance(expr, cst.Dict):
        keys = set()
        for el in expr.elements:
            if isinstance(el, cst.StarredDictElement):
                return None
            k = astutil.string_value(el.key)
            if k is None:
                return None
            keys.add(k)
        return keys
    if isinstance(expr, cst.IfExp):
        # `{...} if cond else {...}`: either branch may be passed, so the keys of both
        body = _dict_keys(expr.body, idx, depth + 1)
        orelse = _dict_keys(expr.orelse, idx, depth + 1)
        if body is None or orelse is None:
            return None
        return body | orelse
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "dict" and not expr.args:
        return set()
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "dict":
        if all(a.keyword is not None for a in expr.args):
            return {a.keyword.value for a in expr.args}  # type: ignore[union-attr]
        return None
    key = dotted_name(expr)
    if key is None or key not in idx.dicts:
        return None
    keys: set[str] = set()
    for entry in idx.dicts[key]:
        if entry is None:
            return None
        if isinstance(entry, tuple):
            _, arg_value, _call = entry
            if arg_value is None:
                return None
            more = _dict_keys(arg_value, idx, depth + 1)
        else:
            more = _dict_keys(entry, idx, depth + 1)
        if more is None:
            return None
        keys |= more
    return keys


# DataLoader roles (TX302-TX305) ------------------------------------------------------------
_RANDOM_SAMPLERS = (
    "torch.utils.data.RandomSampler",
    "torch.utils.data.SubsetRandomSampler",
    "torch.utils.data.WeightedRandomSampler",
    "torch.utils.data.sampler.RandomSampler",
    "torch.utils.data.sampler.SubsetRandomSampler",
    "torch.utils.data.sampler.WeightedRandomSampler",
)


def is_false(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def is_true(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


@dataclass
class LoaderCall:
    call: cst.Call
    key: Optional[str]  # the name it is assigned to
    role: Optional[str] = None  # "train", "eval" or None (unknown)


class LoaderUsage:
    """Mixin for rules about DataLoader constructions: records the DataLoader calls of the
    file and the loaders iterated by training / evaluation loops, then calls
    ``self.check_loaders(loaders)`` once the module has been walked."""

    def _usage(self) -> tuple[set, set, list]:
        state = self.__dict__.get("_loader_usage")
        if state is None:
            state = (set(), set(), [])
            self.__dict__["_loader_usage"] = state
        return state

    def visit_For(self, node: cst.For) -> None:
        ctx = self.ctx  # type: ignore[attr-defined]
        kind = loop_kind(node, ctx)
        if kind not in ("train", "eval"):
            return
        train, evals, _ = self._usage()
        for s in loop_source(node, ctx):
            if s.key:
                (train if kind == "train" else evals).update(_linked_keys(s, ctx))

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx  # type: ignore[attr-defined]
        if ctx.qualname(node.func) in DATALOADER_NAMES:
            self._usage()[2].append(LoaderCall(node, dataloader_binding_key(ctx)))

    def leave_Module(self, node: cst.Module) -> None:
        train, evals, calls = self._usage()
        for lc in calls:
            lc.role = _role(lc, train, evals, self.ctx)  # type: ignore[attr-defined]
        self.check_loaders(calls)

    def check_loaders(self, loaders: list[LoaderCall]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def _linked_keys(src: LoopSource, ctx: FileContext) -> set[str]:
    """The loop's loader name, and for a parameter the names callers pass in its place."""
    keys = {src.key} if src.key else set()
    inner = src.loader
    if isinstance(inner, cst.Call) and inner.args:  # pl.MpDeviceLoader(loader, device)
        inner = inner.args[0].value
    fn = param_scope(inner, ctx)
    if isinstance(fn, cst.FunctionDef):
        positional = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
        name = inner.value  # type: ignore[attr-defined]
        for call in index(ctx).calls_by_name.get(fn.name.value, ()):
            for i, a in enumerate(call.args):
                if a.star:
                    break
                if (a.keyword is not None and a.keyword.value == name) or (
                    a.keyword is None and i < len(positional) and positional[i] == name
                ):
                    key = dotted_name(a.value)
                    if key:
                        keys.add(key)
    return keys


def _role(lc: LoaderCall, train: set, evals: set, ctx: FileContext) -> Optional[str]:
    if lc.key in train:
        return "train"
    if lc.key in evals:
        return "eval"
    shuffle = astutil.arg(lc.call, "shuffle", 2)
    if shuffle is not None and is_true(shuffle.value):
        return "train"
    sampler = astutil.arg(lc.call, "sampler", 3)
    if sampler is not None and sampler_shuffles(sampler.value, ctx):
        return "train"
    return None


def sampler_shuffles(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """A sampler built here (or bound to a name built here) that draws in random order."""
    values = [expr]
    key = dotted_name(expr)
    if key is not None:
        values = [v for v in index(ctx).values.get(key, ()) if v is not None]
    for v in values:
        if not isinstance(v, cst.Call):
            continue
        q = ctx.qualname(v.func)
        if q in _RANDOM_SAMPLERS:
            return True
        if q in DISTRIBUTED_SAMPLER_NAMES:
            s = astutil.arg(v, "shuffle", 3)
            if s is None or not is_false(s.value):
                return True
    return False


def batches(call: cst.Call, ctx: FileContext) -> bool:
    """The loader yields batches of more than one sample (so the last one can be ragged)."""
    bs = astutil.arg(call, "batch_size", 1)
    if bs is not None:
        v = bs.value
        if isinstance(v, cst.Integer) and v.evaluated_value <= 1:
            return False
        if isinstance(v, cst.Name) and v.value == "None":
            return False
        return True
    if astutil.arg(call, "batch_sampler", 4) is not None:
        return False
    keys = kwargs_keys(call, ctx)
    return keys is None or "batch_size" in keys


def append_kwarg(name: str, value_code: str) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """Edit callable: ``f(a, b=1)`` -> ``f(a, b=1, name=value)``, keeping a multi-line layout."""

    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        if not isinstance(updated, cst.Call):
            return updated
        if any(a.keyword is not None and a.keyword.value == name for a in updated.args):
            return updated
        new = cst.Arg(
            cst.parse_expression(value_code),
            keyword=cst.Name(name),
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        )
        args = list(updated.args)
        if not args:
            return updated.with_changes(args=[new])
        last = args[-1]
        # the new argument ends the call as the last one did: its trailing comma, or the line
        # break before `)` (the last argument's whitespace_after_arg)
        new = new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
        # and is separated from it as the arguments before are: their line break and
        # indentation (not a blank line or comment), or, after one argument, as `(` is from it
        if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
            between = args[-2].comma.with_changes(whitespace_after=_bare_line_break(args[-2].comma.whitespace_after))
        elif isinstance(updated.whitespace_before_args, cst.ParenthesizedWhitespace):
            between = cst.Comma(whitespace_after=_bare_line_break(updated.whitespace_before_args))
        else:
            between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
        args.append(new)
        return updated.with_changes(args=args)

    return apply


def _bare_line_break(ws: cst.BaseParenthesizableWhitespace) -> cst.BaseParenthesizableWhitespace:
    """The whitespace between two arguments, copied for a new argument: the same line break
    and indentation, without the blank lines and the comment that the copied place had."""
    if not isinstance(ws, cst.ParenthesizedWhitespace):
        return ws
    return ws.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())


def remove_kwarg(name: str) -> Callable[[cst.CSTNode], cst.CSTNode]:
    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        if not isinstance(updated, cst.Call):
            return updated
        args = list(updated.args)
        for i, a in enumerate(args):
            if a.keyword is not None and a.keyword.value == name:
                if i == len(args) - 1 and i > 0:
                    args[i - 1] = args[i - 1].with_changes(comma=a.comma)
                del args[i]
                return updated.with_changes(args=args)
        return updated

    return apply


def compose(*fns: Callable[[cst.CSTNode], cst.CSTNode]) -> Callable[[cst.CSTNode], cst.CSTNode]:
    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        for fn in fns:
            updated = fn(updated)
        return updated

    return apply


def multiprocess(ctx: FileContext) -> bool:
    return bool(index(ctx).calls & set(MULTIPROCESS_CALLS))


def distributed_sampler_name(ctx: FileContext) -> tuple[str, tuple[str, ...]]:
    """The expression naming DistributedSampler here, and the import it needs."""
    for full in DISTRIBUTED_SAMPLER_NAMES:
        if full in ctx.module_names:
            return ctx.module_names[full], ()
    mod = "torch.utils.data.distributed"
    return f"{ctx.module_alias(mod)}.DistributedSampler", (mod,)


# DistributedDataParallel (TX201, TX602) ----------------------------------------------------
DDP_NAMES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
def wraps_in_ddp(ctx: FileContext) -> bool:
    """The file calls torch's DistributedDataParallel (resolved through its imports): its
    backward pass all-reduces the gradients already, so the optimizer step must not reduce
    them again (xm.optimizer_step would)."""
    return module_fact(ctx, _calls_ddp)


def _calls_ddp(ctx: FileContext) -> bool:
    return any(isinstance(node, cst.Call) and ctx.qualname(node.func) in DDP_NAMES
               for node in astutil.walk(ctx.module, into_functions=True))


# Functions and methods that run a training step -----------------------------------------
@dataclass(frozen=True)
class StepFunctions:
    """The functions and methods of the file that run a backward pass outside their own loops,
    directly or through calls of other such functions and methods (a trainer's
    ``_run_batch``, a ``train_step(model, batch)`` helper), keyed ("", name) for functions
    and (class, name) for methods."""

    stepping: frozenset
    # class -> the classes of the file whose methods ``self.m()`` in it may run: itself, its
    # bases and its subclasses defined in the file (a base class's loop calling a method a
    # subclass defines)
    related: dict
    # dotted name ("trainer", "self.engine") -> classes of the file it is built from
    instances: dict


def step_functions(ctx: FileContext) -> StepFunctions:
    return module_fact(ctx, _step_functions)


def _function_own_nodes(fn: cst.FunctionDef) -> Iterator[cst.CSTNode]:
    """Nodes of a function's body outside its loops and nested functions/classes."""
    stack = list(reversed(_children(fn.body)))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        stack.extend(reversed(_children(n)))


def _step_functions(ctx: FileContext) -> StepFunctions:
    functions: list[tuple[tuple[str, str], cst.FunctionDef]] = []
    bases: dict[str, set[str]] = {}
    built: dict[str, set[str]] = {}
    assigns: list[tuple[str, str]] = []

    def visit(node: cst.CSTNode, cls: str) -> None:
        if isinstance(node, cst.ClassDef):
            bases.setdefault(node.name.value, set()).update(
                d for d in (dotted_name(b.value) for b in node.bases) if d)
            for child in _children(node.body):
                if isinstance(child, cst.FunctionDef):
                    functions.append(((node.name.value, child.name.value), child))
                    for grand in _children(child):
                        visit(grand, node.name.value)
                else:
                    visit(child, node.name.value)
            return
        if isinstance(node, cst.FunctionDef):
            functions.append((("", node.name.value), node))
        elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and isinstance(node.value.func, cst.Name):
            for t in node.targets:
                key = dotted_name(t.target)
                if key is not None:
                    assigns.append((key, node.value.func.value))
        for child in _children(node):
            visit(child, cls)

    visit(ctx.module, "")
    related: dict[str, frozenset[str]] = {}
    for name in bases:
        group = {name}
        changed = True
        while changed:  # bases and subclasses, transitively
            changed = False
            for other, its_bases in bases.items():
                if other not in group and (its_bases & group or any(o in bases.get(other, ()) for o in group)):
                    group.add(other)
                    changed = True
                for b in list(its_bases):
                    if other in group and b in bases and b not in group:
                        group.add(b)
                        changed = True
        related[name] = frozenset(group)
    for key, cls in assigns:
        if cls in bases:
            built.setdefault(key, set()).add(cls)
    instances = {k: frozenset(v) for k, v in built.items()}
    facts = StepFunctions(frozenset(), related, instances)
    direct: dict[tuple[str, str], bool] = {}
    callees: dict[tuple[str, str], set] = {}
    for key, fn in functions:
        for n in _function_own_nodes(fn):
            if astutil.method_name(n) == "backward":
                direct[key] = True
            elif isinstance(n, cst.Call):
                callees.setdefault(key, set()).update(_call_targets(n, key[0], facts, ctx))
    stepping = {k for k, v in direct.items() if v}
    changed = True
    while changed:
        changed = False
        for key, targets in callees.items():
            if key not in stepping and targets & stepping:
                stepping.add(key)
                changed = True
    return StepFunctions(frozenset(stepping), related, instances)


def _call_targets(call: cst.Call, cls: str, facts: StepFunctions, ctx: FileContext) -> set:
    """The keys of the file's functions/methods ``call`` may run: ``f(...)`` (not imported),
    ``self.m(...)`` in class ``cls`` (or a related class), ``obj.m(...)`` for an ``obj``
    built from a class of the file."""
    func = call.func
    if isinstance(func, cst.Name):
        return set() if ctx.qualname(func) is not None else {("", func.value)}
    if not isinstance(func, cst.Attribute):
        return set()
    owner = func.value
    classes: frozenset = frozenset()
    if isinstance(owner, cst.Name) and owner.value in ("self", "cls") and cls:
        classes = facts.related.get(cls, frozenset({cls}))
    else:
        key = dotted_name(owner)
        if key is not None:
            for built_from in facts.instances.get(key, ()):
                classes = classes | facts.related.get(built_from, frozenset({built_from}))
    return {(c, func.attr.value) for c in classes}


def calls_step(call: cst.Call, ctx: FileContext) -> bool:
    """The call runs a function or method of this file that runs a backward pass (see
    StepFunctions); ``self.m()`` is resolved in the class around the call (ctx.ancestors)."""
    facts = step_functions(ctx)
    if not facts.stepping:
        return False
    cls = next((a.name.value for a in reversed(ctx.ancestors) if isinstance(a, cst.ClassDef)), "")
    return any(t in facts.stepping for t in _call_targets(call, cls, facts, ctx))
