"""Helpers of the script-side Gluon rules (GL0xx, GL3xx, GL4xx): resolving MXNet names through
the file's imports, finding the objects a script builds (trainers, losses, metrics) and
rendering the emitted code (metrics, the Gluon weight converter) from templates/."""
from __future__ import annotations

from typing import Iterable, Optional

import jinja2
import libcst as cst

from porter import astutil
from porter.astutil import code as code
from porter.astutil import kwarg as kwarg
from porter._layout import templates_dir
from porter.context import FileContext, dotted_name

NEEDS_MXNET = ("mxnet",)

# spellings of the same module, normalised to the first
_MODULE_SPELLINGS = (
    ("mxnet.ndarray.", "mxnet.nd."),
    ("mxnet.gluon.metric.", "mxnet.metric."),
    ("mxnet.contrib.ndarray.", "mxnet.nd.contrib."),
)


def qualname(ctx: FileContext, node: cst.CSTNode) -> Optional[str]:
    """The qualified name with MXNet's aliases normalised (``mxnet.ndarray.x`` -> ``mxnet.nd.x``)."""
    name = ctx.qualname(node)
    if name is None:
        return None
    for old, new in _MODULE_SPELLINGS:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def call_name(ctx: FileContext, node: cst.CSTNode) -> Optional[str]:
    """For a call: the qualified name of the function called, else None."""
    if isinstance(node, cst.Call):
        return qualname(ctx, node.func)
    return None


def expr(text: str) -> cst.BaseExpression:
    return astutil.parse_expression(text)


def torch_name(ctx: FileContext) -> str:
    return ctx.module_alias("torch")


def module_statements(ctx: FileContext) -> list[cst.CSTNode]:
    """Every statement of the file, in any body (compound statements entered)."""
    key = ("gluon.statements", ctx.module)
    if key not in ctx.cache:
        ctx.cache[key] = [n for n in astutil.walk(ctx.module, into_functions=True)
                          if isinstance(n, (cst.SimpleStatementLine, cst.BaseCompoundStatement))]
    return ctx.cache[key]


def assignments(ctx: FileContext) -> list[tuple[str, cst.BaseExpression, cst.Assign]]:
    """(name, value, node) for every ``name = value`` of the file (any depth)."""
    key = ("gluon.assignments", ctx.module)
    if key not in ctx.cache:
        out = []
        for n in astutil.walk(ctx.module, into_functions=True):
            if isinstance(n, cst.Assign) and len(n.targets) == 1:
                target = n.targets[0].target
                name = dotted_name(target)
                if name is not None:
                    out.append((name, n.value, n))
        ctx.cache[key] = out
    return ctx.cache[key]


def names_bound_to(ctx: FileContext, qualnames: Iterable[str]) -> dict[str, str]:
    """Local (dotted) name -> the qualified name of the constructor it was assigned from, for
    the constructors ``qualnames`` (``loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()``)."""
    wanted = set(qualnames)
    found: dict[str, str] = {}
    for name, value, _ in assignments(ctx):
        q = call_name(ctx, value)
        if q in wanted:
            found[name] = q
    return found


def used_names(ctx: FileContext) -> set[str]:
    key = ("gluon.used_names", ctx.module)
    if key not in ctx.cache:
        ctx.cache[key] = {n.value for n in astutil.walk(ctx.module, into_functions=True) if isinstance(n, cst.Name)}
    return ctx.cache[key]


def defined_at_top(ctx: FileContext, name: str) -> bool:
    for stmt in ctx.module.body:
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)) and stmt.name.value == name:
            return True
    return False


# ----------------------------------------------------------------------------------------
# Contexts and context lists (Gluon's single-process data parallelism)
# ----------------------------------------------------------------------------------------
GPU_CONTEXTS = ("mxnet.gpu", "mxnet.context.gpu")
CPU_CONTEXTS = ("mxnet.cpu", "mxnet.context.cpu", "mxnet.cpu_pinned", "mxnet.context.cpu_pinned")


def is_context_call(ctx: FileContext, node: cst.CSTNode) -> bool:
    return call_name(ctx, node) in (*GPU_CONTEXTS, *CPU_CONTEXTS)


def is_context_list(ctx: FileContext, node: cst.CSTNode) -> bool:
    """A list of contexts: ``[mx.gpu(i) for i in range(n)]``, ``[mx.gpu(0), mx.gpu(1)]``,
    ``[mx.cpu()]``, or a choice between such lists (``[...] if n > 0 else [mx.cpu()]``)."""
    if isinstance(node, cst.IfExp):
        return is_context_list(ctx, node.body) and is_context_list(ctx, node.orelse)
    if isinstance(node, cst.ListComp):
        return is_context_call(ctx, node.elt)
    if isinstance(node, cst.List):
        return bool(node.elements) and all(not isinstance(e, cst.StarredElement) and is_context_call(ctx, e.value)
                                           for e in node.elements)
    return False


def context_list_names(ctx: FileContext) -> set[str]:
    """Names the file binds to a list of contexts anywhere (``ctx = [mx.gpu(i) for ...]``),
    or to a one-element list display (the usual ``if isinstance(ctx, mx.Context): ctx = [ctx]``).
    Read where a context is expected (``ctx=`` of initialize, load_parameters): there such a
    name holds a context list."""
    key = ("gluon.context_lists", ctx.module)
    if key not in ctx.cache:
        out = set()
        for name, value, _ in assignments(ctx):
            if is_context_list(ctx, value) or (isinstance(value, cst.List) and len(value.elements) == 1
                                               and isinstance(value.elements[0], cst.Element)):
                out.add(name)
        ctx.cache[key] = out
    return ctx.cache[key]


def one_device(ctx: FileContext, contexts: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The device a port puts a model or a batch on where Gluon takes a context or a context
    list (``ctx=``): a list display's first element, ``name[0]`` for a name bound to a context
    list (the port keeps one device per process: the list has one device, see GL002), the
    expression itself otherwise (one context)."""
    if isinstance(contexts, (cst.List, cst.Tuple)):
        if not contexts.elements or isinstance(contexts.elements[0], cst.StarredElement):
            return None
        return contexts.elements[0].value
    if isinstance(contexts, cst.ListComp):
        return None
    if dotted_name(contexts) in context_list_names(ctx):
        return cst.Subscript(contexts, [cst.SubscriptElement(cst.Index(cst.Integer("0")))])
    return contexts


# ----------------------------------------------------------------------------------------
# Emitted code
# ----------------------------------------------------------------------------------------
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(templates_dir())), keep_trailing_newline=True,
    autoescape=False, trim_blocks=True, lstrip_blocks=True,
)


def render(template: str, **values) -> list[cst.BaseStatement]:
    text = _ENV.get_template(template).render(**values)
    return list(cst.parse_module(text).body)


def _is_head(stmt: cst.CSTNode) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(isinstance(s, (cst.Import, cst.ImportFrom)) or
                   (isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString)))
                   for s in stmt.body)
    return False


def insert_before_defs(statements: list[cst.BaseStatement]):
    """An Edit replacement for the Module: ``statements`` inserted after the module's head
    (docstring and imports), before its first other statement, two blank lines around."""

    def apply(module: cst.Module) -> cst.Module:
        body = list(module.body)
        at = 0
        while at < len(body) and _is_head(body[at]):
            at += 1
        new = list(statements)
        if at < len(body):
            body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        if new and at > 0:
            new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        return module.with_changes(body=[*body[:at], *new, *body[at:]])

    return apply


# --------------------------------------------------------------------------------------
# Facts several rules read: trainers, contexts, dtypes
# --------------------------------------------------------------------------------------
TRAINER = ("mxnet.gluon.Trainer", "mxnet.gluon.trainer.Trainer")


def optimizer_name(ctx, node: cst.BaseExpression) -> str:
    """The Gluon optimizer's name (lower case) that ``node`` spells: a string, or a name the
    file binds to one string only (``optimizer = 'nag'``, and no parameter of that name); else ''."""
    text = astutil.string_value(node)
    if text is None and isinstance(node, cst.Name) and not any(
            isinstance(n, cst.Param) and n.name.value == node.value for n in astutil.walk(ctx.module, into_functions=True)):
        values = {astutil.string_value(v) for name, v, _ in assignments(ctx) if name == node.value}
        if len(values) == 1:
            text = values.pop()
    return (text or "").lower()


def trainer_names(ctx) -> dict[str, str]:
    """Names bound to a gluon.Trainer -> the Gluon optimizer name (lower case) or ''."""
    key = ("gluon.trainers", ctx.module)
    if key not in ctx.cache:
        out = {}
        for name, value, _ in assignments(ctx):
            if isinstance(value, cst.Call) and call_name(ctx, value) in TRAINER:
                opt = astutil.arg(value, "optimizer", 1)
                out[name] = optimizer_name(ctx, opt.value) if opt is not None else ""
        ctx.cache[key] = out
    return ctx.cache[key]


_DEVICE_LIKE = ("device", "dev")


def is_context(node: cst.CSTNode, ctx) -> bool:
    """``mx.gpu()``, ``mx.cpu(0)``, ``mx.gpu() if c else mx.cpu()``."""
    if isinstance(node, cst.IfExp):
        return is_context(node.body, ctx) and is_context(node.orelse, ctx)
    return call_name(ctx, node) in (*GPU_CONTEXTS, *CPU_CONTEXTS)


def context_renames(ctx) -> dict[str, str]:
    """Variables assigned a context (``ctx = mx.gpu() if ... else mx.cpu()``) -> ``device``."""
    key = ("gluon.context_names", ctx.module)
    if key not in ctx.cache:
        out: dict[str, str] = {}
        names = used_names(ctx)
        for name, value, _ in assignments(ctx):
            if "." in name or name.lower().endswith(_DEVICE_LIKE) or not is_context(value, ctx):
                continue
            if call_name(ctx, value) in CPU_CONTEXTS and name not in ("ctx", "context"):
                continue  # `cpu = mx.cpu()`: a name of its own
            if "device" not in names:
                out[name] = "device"
        if len(set(out)) > 1:  # two context variables: keep their names
            out = {}
        ctx.cache[key] = out
    return ctx.cache[key]


def dtype_expr(node: cst.BaseExpression, torch: str) -> cst.BaseExpression:
    """A Gluon dtype argument (``'float32'``, ``np.float32``) -> ``torch.float32``; anything
    else as it is."""
    text = astutil.string_value(node)
    if text is None:
        dotted = code(node)
        text = dotted.split(".")[-1] if dotted.startswith(("np.", "numpy.")) else None
    if text is None:
        return node
    return expr(f"{torch}.{text}")
