"""Helpers shared by the precision (TX6xx), distributed (TX7xx) and sparse (TX9xx) rules.

Pure functions over LibCST nodes: argument lists rebuilt with tidy commas, dtype and string
recognition through the file's imports, statement removal that never leaves an empty block,
and the name tracking that finds every use of a GradScaler variable.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence, Union

import libcst as cst

from porter import astutil
from porter.astutil import children as _children
from porter.astutil import target_names

from porter.astutil import string_value
from porter.context import FileContext, dotted_name
from porter.astutil import is_string, needs_parens, parenthesized, positional, source_of  # noqa: F401 (for the TX rules)
from porter.grad_scalers import (  # noqa: F401 (for the TX rules)
    GRAD_SCALERS, Parents, Scaler, ScalerUse, binds_locally, expression_statement, find_scalers, is_grad_scaler_call,
    removal_edits, walk_scope,
)

FLOAT16 = ("torch.float16", "torch.half")
BFLOAT16 = ("torch.bfloat16",)


# --------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------


def has_star(call: cst.Call) -> bool:
    return any(a.star for a in call.args)


keyword = astutil.kwarg  # ``name=value`` formatted like hand-written code


def as_keyword(a: cst.Arg, name: str) -> cst.Arg:
    """A positional argument turned into ``name=value`` (a keyword one is returned as is)."""
    if a.keyword is not None:
        return a
    return keyword(name, a.value).with_changes(comma=a.comma)


def with_args(call: cst.Call, args: Sequence[cst.Arg]) -> cst.Call:
    """``call`` with a new argument list; the last argument keeps the original call's
    trailing comma (if it had one), every other one gets a comma."""
    original_last = call.args[-1].comma if call.args else cst.MaybeSentinel.DEFAULT
    out = []
    for i, a in enumerate(args):
        last = i == len(args) - 1
        if last:
            a = a.with_changes(comma=original_last)
        elif not isinstance(a.comma, cst.Comma):
            a = a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        out.append(a)
    return call.with_changes(args=out)




def quote_like(node: Optional[cst.CSTNode], text: str) -> cst.SimpleString:
    """A string literal ``text`` in the quote style of ``node`` (single quotes by default)."""
    quote = "'"
    if isinstance(node, cst.SimpleString):
        q = node.quote
        if q in ("'", '"'):
            quote = q
    return cst.SimpleString(f"{quote}{text}{quote}")


def is_literal(node: Optional[cst.CSTNode], value: object) -> bool:
    if node is None:
        return False
    if value is True or value is False or value is None:
        return isinstance(node, cst.Name) and node.value == repr(value)
    if isinstance(value, int) and isinstance(node, cst.Integer):
        return node.evaluated_value == value
    return False


def dtype_of(ctx: FileContext, node: Optional[cst.CSTNode]) -> Optional[str]:
    """"float16" / "bfloat16" / other dtype name for ``torch.<dtype>`` spelled through the
    file's imports; None when the expression is not a torch dtype attribute."""
    if node is None:
        return None
    name = ctx.qualname(node)
    if not name or not name.startswith("torch.") or name.count(".") != 1:
        return None
    short = name.split(".", 1)[1]
    return "float16" if short == "half" else short


def torch_attr(ctx: FileContext, attr: str) -> cst.BaseExpression:
    """``torch.<attr>`` spelled with the file's own alias for torch."""
    return cst.parse_expression(f"{ctx.module_alias('torch')}.{attr}")








# --------------------------------------------------------------------------------------
# Calls that start the XLA runtime (TX708): made in a parent process before
# torch_xla.launch, they make the launch fail ("Runtime is already initialized")
# --------------------------------------------------------------------------------------
RUNTIME_STARTING = tuple(
    f"{mod}.{name}"
    for mod, names in (
        ("torch_xla", ("manual_seed", "device", "devices", "device_count")),
        ("torch_xla.torch_xla", ("manual_seed", "device", "devices", "device_count")),
        ("torch_xla.core.xla_model", ("xla_device", "set_rng_state", "get_rng_state", "xla_device_hw",
                                      "get_xla_supported_devices", "xrt_world_size", "get_ordinal")),
        ("torch_xla.runtime", ("world_size", "global_ordinal", "local_ordinal", "process_index",
                               "global_runtime_device_count", "addressable_device_count",
                               "local_device_count", "global_device_count")),
    )
    for name in names
)


# --------------------------------------------------------------------------------------
# Sparse embeddings
# --------------------------------------------------------------------------------------
SPARSE_ADAM = ("torch.optim.SparseAdam", "torch.optim.sparse_adam.SparseAdam")


def mentions_sparse_adam(ctx: FileContext, module: cst.Module) -> bool:
    """Whether the file refers to torch's SparseAdam anywhere (through its imports)."""
    for node in walk_scope(module):
        if isinstance(node, (cst.Name, cst.Attribute)) and ctx.qualname(node) in SPARSE_ADAM:
            return True
    return False
