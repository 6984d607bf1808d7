"""Porter's own emitted definitions: the helper functions and classes the JAX rules render from
templates/ (the layer classes, the weight converter, the optimizer transformations, the Gluon
helpers' JAX forms) and insert into a port. (What the Gluon rules render is torch code, which
the JAX rules port further: not recorded.)

Once inserted they are a large part of a small port (a one-layer module's JAX port is 13 lines
of the user's and 130 of helpers), and every pass of every rule walked them again, to find
nothing: they are target code already. The renderers record the code of each top-level
definition they render (:func:`record`), and the engine's walk and whole-file passes that
check statements one by one skip a top-level definition whose code is one of them
(:func:`emitted_ids`). A definition changed after it was inserted, or rendered in another
process (a port given to porter again), is not recognised and is walked as before: skipping
only saves time, the rules find nothing in porter's own helpers (tests/test_emitted.py runs
the rules both ways over the fixtures' ports).
"""
from __future__ import annotations

from typing import Iterable

import libcst as cst

_DEFS = (cst.FunctionDef, cst.ClassDef)
# name -> the codes of that name's rendered definitions, without their leading blank lines
_CODES: dict[str, set[str]] = {}
_ENABLED = True


def record(statements: Iterable[cst.BaseStatement]) -> None:
    """Remember the top-level definitions among ``statements`` (as a renderer returns them)."""
    for stmt in statements:
        if isinstance(stmt, _DEFS):
            _CODES.setdefault(stmt.name.value, set()).add(_code(stmt))


def emitted_ids(module: cst.Module) -> frozenset[int]:
    """The ids of ``module``'s top-level definitions that are porter's rendered helpers as
    rendered (decorators and body alike; the blank lines above them may differ)."""
    if not _ENABLED or not _CODES:
        return frozenset()
    return frozenset(id(stmt) for stmt in module.body
                     if isinstance(stmt, _DEFS) and stmt.name.value in _CODES
                     and _code(stmt) in _CODES[stmt.name.value])


def set_enabled(on: bool) -> bool:
    """Turn the skipping on or off (tests compare both); returns the previous setting."""
    global _ENABLED
    before, _ENABLED = _ENABLED, on
    return before


def _code(stmt: cst.BaseStatement) -> str:
    return cst.Module([stmt.with_changes(leading_lines=())]).code
