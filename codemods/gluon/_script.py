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


def manual_comment(stmt: cst.SimpleStatementLine, code_: str, reason: str) -> cst.SimpleStatementLine:
    """``stmt`` with a ``# porter: manual[CODE] reason`` comment line above it (once)."""
    text = f"# porter: manual[{code_}] {reason}"
    for line in stmt.leading_lines:
        if line.comment is not None and line.comment.value == text:
            return stmt
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, cst.EmptyLine(comment=cst.Comment(text))])
