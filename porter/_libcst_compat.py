"""Everything porter takes from LibCST beyond its public API, in one place.

LibCST's code generation with positions (what ``PositionProvider`` computes) is reached here
through its internal classes (``libcst._nodes.internal.CodegenState``,
``libcst.metadata.position_provider.PositionProvidingCodegenState``), the nodes' ``_codegen``
method and the sink attribute ``_computed``: one codegen of the module gives every node's range
without the metadata wrapper's extra walk of the tree (0.32 s -> 0.07 s a file on torch's
sources). The walks over a tree read the node dataclasses' fields and skip the whitespace and
punctuation ones by name (``SKIPPED_FIELDS``).

These are checked against one LibCST version, ``CHECKED_VERSION``: the lock's
(requirements.lock). tests/test_edits.py fails, saying so, on another version, and checks
that no other module of porter imports LibCST's private modules. On a new LibCST: read the
functions below against its sources, run tests/test_engine.py (``node_positions`` against
``PositionProvider``) and tests/test_incremental.py, then change ``CHECKED_VERSION``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Optional, cast

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata.position_provider import PositionProvidingCodegenState

CHECKED_VERSION = "1.9.0"


def installed_version() -> str:
    from importlib.metadata import version

    return version("libcst")


# --------------------------------------------------------------------------------------
# Fields of the node dataclasses that can hold code
# --------------------------------------------------------------------------------------
SKIPPED_FIELDS = re.compile(
    r"^(whitespace.*|lpar|rpar|comma|semicolon|header|footer|leading_lines|lines_after_decorators"
    r"|newline|equal|colon|dot|lbracket|rbracket|lbrace|rbrace|operator|star|asynchronous"
    r"|first_line|trailing_whitespace|default_indent|default_newline|encoding|has_trailing_newline)$"
)
FIELDS: dict[type, tuple[str, ...]] = {}


def child_fields(kind: type) -> tuple[str, ...]:
    """The fields of node type ``kind`` that can hold code (nodes), in order; memoized."""
    fields = FIELDS.get(kind)
    if fields is None:
        fields = tuple(f.name for f in dataclasses.fields(kind) if not SKIPPED_FIELDS.match(f.name))
        FIELDS[kind] = fields
    return fields


NODE_TYPES: dict[type, bool] = {}


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of ``node`` that can hold code (not whitespace, commas, parentheses),
    from the fields: ``node.children`` rebuilds and re-validates the node, about 10x the cost."""
    out: list[cst.CSTNode] = []
    for name in child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            out.extend(v for v in value if is_node_type(type(v)))
        elif is_node_type(kind):
            out.append(value)
    return out


def is_node_type(kind: type) -> bool:
    """``issubclass(kind, cst.CSTNode)``, memoized per type: ``isinstance`` against LibCST's
    abstract base class goes through ``ABCMeta.__instancecheck__``, most of a walk's own cost."""
    found = NODE_TYPES.get(kind)
    if found is None:
        found = NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return found


# --------------------------------------------------------------------------------------
# Code generation, with and without positions
# --------------------------------------------------------------------------------------
class _PositionSink:
    """Where LibCST's position-tracking codegen writes each node's range (the attribute
    PositionProvider itself offers it)."""

    def __init__(self) -> None:
        self._computed: dict = {}


class PlainCodegen:
    """The code of nodes generated one after the other, as a module with this indentation
    and newline would write them."""

    def __init__(self, default_indent: str = "    ", default_newline: str = "\n") -> None:
        self.state = CodegenState(default_indent=default_indent, default_newline=default_newline)

    def add(self, node: cst.CSTNode) -> None:
        node._codegen(self.state)

    @property
    def tokens(self) -> list[str]:
        return self.state.tokens

    def code(self) -> str:
        return "".join(self.state.tokens)


class PositionCodegen(PlainCodegen):
    """Code generation that records each generated node's range (lines from 1, columns in
    code points), as ``PositionProvider`` gives them."""

    def __init__(self, default_indent: str = "    ", default_newline: str = "\n") -> None:
        self.sink = _PositionSink()
        self.state = PositionProvidingCodegenState(
            default_indent=default_indent, default_newline=default_newline, provider=cast(Any, self.sink))

    def advance(self, tokens: list[str]) -> None:
        """Move the line and column past ``tokens`` (code generated elsewhere), as generating
        them would."""
        text = "".join(tokens)
        if "\r" in text:  # a token ending in \r and one beginning with \n count as two line breaks
            for token in tokens:
                self.state.add_token(token)
        elif text:
            self.state.add_token(text)

    @property
    def positions(self) -> dict:
        """node -> CodeRange of every node generated so far."""
        return self.sink._computed


def node_positions(module: cst.Module) -> dict:
    """node -> CodeRange for every node, from one position-tracking codegen of the module.

    What ``MetadataWrapper(module).resolve(PositionProvider)`` computes, without the
    wrapper's extra full-tree visit; tests/test_engine.py checks the two agree."""
    gen = PositionCodegen(module.default_indent, module.default_newline)
    gen.add(module)
    return gen.positions


def code_of(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> str:
    """The code of ``nodes`` one after the other, with ``module``'s indentation and newline."""
    gen = PlainCodegen(module.default_indent, module.default_newline)
    for n in nodes:
        gen.add(n)
    return gen.code()


def relative_positions(module: cst.Module, node: cst.CSTNode, default_indent: Optional[str] = None) -> dict:
    """node -> CodeRange of ``node`` and the nodes in it, generated alone (lines counted from
    its first line) with ``module``'s indentation and newline."""
    gen = PositionCodegen(default_indent or module.default_indent, module.default_newline)
    gen.add(node)
    return gen.positions


# --------------------------------------------------------------------------------------
# The matcher set-up of LibCST's own codemod visitors, once per class
# --------------------------------------------------------------------------------------
# A MatcherDecoratableTransformer/Visitor looks, at every construction, through every name of
# dir(self) (some 400 visit_/leave_ methods) for the methods decorated with matchers
# (libcst.matchers._visitors: _gather_constructed_visit_funcs, _gather_constructed_leave_funcs,
# and _gather_matchers at its first node): about 15 ms a construction. porter.edits builds an
# AddImportsVisitor (which builds a gatherer of its own) for each fix pass that adds an import
# and a RemoveImportsVisitor (three gatherers) for each one that removes some. The visitors of
# libcst.codemod.visitors that porter uses declare no decorated method, so for them the three
# functions give empty tables every time: a class found empty once is answered empty from then
# on. Every other class (any class with a decorated method, a subclass of our own) goes through
# LibCST's functions as before.
_UNDECORATED_VISITORS = frozenset({
    "AddImportsVisitor", "RemoveImportsVisitor", "_GatherTopImportsBeforeStatements", "GatherImportsVisitor",
    "GatherUnusedImportsVisitor", "GatherNamesFromStringAnnotationsVisitor", "GatherExportsVisitor",
    "GatherCommentsVisitor", "RemovedNodeVisitor",
})


def _memoize_matcher_setup() -> None:
    from libcst.matchers import _visitors

    for fname in ("_gather_constructed_visit_funcs", "_gather_constructed_leave_funcs", "_gather_matchers"):
        original = getattr(_visitors, fname)
        if getattr(original, "porter_memoized", False):
            continue
        empty: set[type] = set()

        def gather(obj: object, original: Any = original, empty: set = empty) -> dict:
            kind = type(obj)
            if kind in empty:
                return {}
            found = original(obj)
            if (not found and kind.__name__ in _UNDECORATED_VISITORS
                    and kind.__module__.startswith("libcst.codemod.visitors.")):
                empty.add(kind)
            return found

        gather.porter_memoized = True  # type: ignore[attr-defined]
        setattr(_visitors, fname, gather)


_memoize_matcher_setup()
