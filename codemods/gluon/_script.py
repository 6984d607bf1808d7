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


def trainer_names(ctx) -> dict[str, str]:
    """Names bound to a gluon.Trainer -> the Gluon optimizer name (lower case) or ''."""
    key = ("gluon.trainers", ctx.module)
    if key not in ctx.cache:
        out = {}
        for name, value, _ in assignments(ctx):
            if isinstance(value, cst.Call) and call_name(ctx, value) in TRAINER:
                opt = astutil.arg(value, "optimizer", 1)
                out[name] = (astutil.string_value(opt.value) or "").lower() if opt is not None else ""
        ctx.cache[key] = out
    return ctx.cache[key]


GPU_CONTEXTS = ("mxnet.gpu", "mxnet.context.gpu")
CPU_CONTEXTS = ("mxnet.cpu", "mxnet.context.cpu", "mxnet.cpu_pinned", "mxnet.context.cpu_pinned")
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
