"""The imports an expression reaches its names through, as ``Fix.remove_imports`` pairs.

A fix that deletes or rewrites code lists the imports that code used; the engine removes the
ones nothing else uses afterwards (LibCST's RemoveImportsVisitor, scope analysis), so a
candidate that is still used, or that the file does not have, costs nothing.
"""
from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst

from porter.astutil import children as _children

from porter.context import FileContext, dotted_name

Pair = tuple[str, Optional[str]]


def import_pairs(ctx: FileContext, node: cst.CSTNode) -> tuple[Pair, ...]:
    """The imports that may bind the head of the dotted name ``node`` (``cudnn.benchmark``,
    ``GradScaler``, ``torch.cuda.amp.autocast``), resolved through the file's imports:

    * ``import a.b as x`` / ``import a`` -> ``("a.b", None)`` / ``("a", None)``;
    * ``from a import b [as x]`` -> ``("a", "b")``;
    * ``import a.b`` (no alias, binds ``a``) used as ``a.b.c`` -> ``("a.b", None)``.

    Empty when the head is not bound by an import (a local, a parameter, an attribute of a
    call): there is nothing to remove then."""
    dotted = dotted_name(node)
    if dotted is None:
        return ()
    head = dotted.split(".")[0]
    full = ctx.aliases.get(head)
    if full is None:
        return ()
    pairs: list[Pair] = [(full, None)]
    module, _, name = full.rpartition(".")
    if module:
        pairs.append((module, name))
    qualified = ctx.qualname(node) or full
    parts = qualified.split(".")
    for i in range(2, len(parts)):
        pairs.append((".".join(parts[:i]), None))
    return tuple(dict.fromkeys(pairs))


def pairs_in(ctx: FileContext, nodes: Iterable[cst.CSTNode]) -> tuple[Pair, ...]:
    """``import_pairs`` of every Name/Attribute chain inside ``nodes`` (outermost chains
    only: ``a.b.c`` counts once, not also as ``a.b`` and ``a``)."""
    found: dict[Pair, None] = {}
    for node in nodes:
        for chain in _chains(node):
            for pair in import_pairs(ctx, chain):
                found[pair] = None
    return tuple(found)


def _chains(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.Name, cst.Attribute)) and dotted_name(current) is not None:
            yield current
            continue
        if isinstance(current, cst.Attribute):  # `f().x`: only the receiver holds names
            stack.append(current.value)
            continue
        stack.extend(_children(current))
