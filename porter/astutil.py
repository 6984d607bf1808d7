"""Small, pure helpers over LibCST nodes shared by the rules."""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import libcst as cst

from porter.context import FileContext, dotted_name
from porter.engine import _FIELDS, _child_fields


def arg(call: cst.Call, keyword: str, position: Optional[int] = None) -> Optional[cst.Arg]:
    """The argument passed as ``keyword=`` or at ``position`` (0-based), else None."""
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a
    if position is not None:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if position < len(positional):
            return positional[position]
    return None


def method_name(call: cst.CSTNode) -> Optional[str]:
    """``x.foo(...)`` -> "foo"."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return None


def string_value(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:
            return None
        return value if isinstance(value, str) else None
    return None


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of ``node`` that can hold code (not whitespace, commas, parentheses).

    Use this rather than ``node.children``: LibCST computes that property by running a visitor
    that rebuilds (and re-validates) the node, about 10x the cost of reading the fields."""
    out: list[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            out.extend(v for v in value if _is_node_type(type(v)))
        elif _is_node_type(kind):
            out.append(value)
    return out


_NODE_TYPES: dict[type, bool] = {}


def _is_node_type(kind: type) -> bool:
    """``issubclass(kind, cst.CSTNode)``, memoized: ``isinstance`` against LibCST's abstract
    base class goes through ABCMeta.__instancecheck__, the largest cost of a walk."""
    found = _NODE_TYPES.get(kind)
    if found is None:
        found = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return found


def target_names(target: cst.CSTNode) -> Iterator[str]:
    """Names bound by an assignment target (tuples, lists and starred unpacking included)."""
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_names(target.value)


_SCOPE_KINDS = frozenset({cst.FunctionDef, cst.Lambda, cst.ClassDef})


def walk(node: cst.CSTNode, into_functions: bool = False) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (pre-order), not descending into nested defs/lambdas/classes."""
    stack = [node]
    pop, push = stack.pop, stack.append
    node_types = _NODE_TYPES
    while stack:
        current = pop()
        yield current
        kind = type(current)
        if not into_functions and kind in _SCOPE_KINDS and current is not node:
            continue
        fields = _FIELDS.get(kind) or _child_fields(kind)
        mark = len(stack)
        for name in fields:  # children(current), pushed so that the first is popped first
            value = getattr(current, name)
            vkind = type(value)
            if vkind is tuple or vkind is list:
                for v in value:
                    k = type(v)
                    if node_types.get(k) or (k not in node_types and _is_node_type(k)):
                        push(v)
            else:
                if node_types.get(vkind) or (vkind not in node_types and _is_node_type(vkind)):
                    push(value)
        if len(stack) - mark > 1:
            stack[mark:] = stack[:mark - 1:-1] if mark else stack[::-1]


def calls_in(node: cst.CSTNode) -> Iterator[cst.Call]:
    for n in walk(node):
        if isinstance(n, cst.Call):
            yield n


def loop_kind(loop: cst.CSTNode, ctx: Optional[FileContext] = None) -> Optional[str]:
    """"train" for a loop whose body runs a backward pass or an optimizer step itself (not in
    a nested loop), "eval" for a loop over batches under ``torch.no_grad()``/``inference_mode``
    (or containing one) that calls a model, None otherwise."""
    if not isinstance(loop, (cst.For, cst.While)):
        return None
    backward, no_grad_inside = _loop_facts(loop, ctx)
    if backward:
        return "train"
    if isinstance(loop, cst.For) and (_under_no_grad(loop, ctx) or no_grad_inside):
        return "eval"
    return None


def _loop_facts(loop: cst.CSTNode, ctx: Optional[FileContext]) -> tuple[bool, bool]:
    """(the body calls .backward() outside nested loops, the body holds a no_grad block):
    the part of loop_kind that walks the body, computed once per loop and file."""
    cache = ctx.cache if ctx is not None else None
    key = ("astutil.loop_facts", loop)
    if cache is not None and key in cache:
        return cache[key]
    methods = set()
    for n in walk(loop.body):
        if isinstance(n, (cst.For, cst.While)) and n is not loop:
            continue
        m = method_name(n)
        if m:
            methods.add(m)
    backward = "backward" in methods
    facts = (backward, not backward and isinstance(loop, cst.For) and _has_no_grad(loop.body))
    if cache is not None:
        cache[key] = facts
    return facts


_NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.set_grad_enabled")


def _is_no_grad_item(item: cst.WithItem, ctx: Optional[FileContext]) -> bool:
    expr = item.item
    if isinstance(expr, cst.Call):
        expr = expr.func
    name = ctx.qualname(expr) if ctx else dotted_name(expr)
    return bool(name) and (name in _NO_GRAD or name.endswith(("no_grad", "inference_mode")))


def _under_no_grad(loop: cst.CSTNode, ctx: Optional[FileContext]) -> bool:
    if ctx is None:
        return False
    for anc in reversed(ctx.ancestors):
        if isinstance(anc, cst.With) and any(_is_no_grad_item(i, ctx) for i in anc.items):
            return True
        if isinstance(anc, cst.FunctionDef):
            return any(
                isinstance(d.decorator, (cst.Name, cst.Attribute, cst.Call))
                and (dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "").endswith(("no_grad", "inference_mode"))
                for d in anc.decorators
            )
    return False


def _has_no_grad(body: cst.CSTNode) -> bool:
    for n in walk(body):
        if isinstance(n, cst.With) and any(_is_no_grad_item(i, None) for i in n.items):
            return True
    return False


def enclosing_loop(ctx: FileContext) -> Optional[cst.CSTNode]:
    """The innermost for/while loop around the current node, not crossing a function."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, (cst.For, cst.While)):
            return anc
        if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return None
    return None


def enclosing_statement(ctx: FileContext) -> Optional[cst.CSTNode]:
    """The statement (simple line or compound) that contains the current node."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return anc
    return None


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def parse_expression(text: str) -> cst.BaseExpression:
    """``text`` (an expression written from the code of existing nodes) as a node that is valid
    wherever an expression can stand.

    The code of a node that sat inside brackets may span lines (``(x\n  .view(-1))``'s
    ``x\n  .view(-1)``), or end in a comment; alone it does not parse. Such text is parsed, and
    kept, in parentheses of its own (the closing one on a line of its own after a comment);
    text that parses alone comes back as ``cst.parse_expression`` gives it.
    """
    try:
        return cst.parse_expression(text)
    except cst.ParserSyntaxError:
        if "\n" not in text and "\r" not in text:
            raise
    closing = "\n)" if "#" in text else ")"
    return cst.parse_expression(f"({text}{closing}")


def append_to_body(node: cst.CSTNode, statements: Sequence[cst.BaseStatement]):
    """An Edit replacement callable that appends ``statements`` to a compound's indented body."""

    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        body = updated.body  # type: ignore[attr-defined]
        return updated.with_changes(body=body.with_changes(body=[*body.body, *statements]))

    return apply


def insert_after(statements: Sequence[cst.BaseStatement]):
    """An Edit replacement callable for a statement: itself followed by ``statements``."""

    def apply(updated: cst.CSTNode):
        return cst.FlattenSentinel([updated, *statements])

    return apply


def insert_before(statements: Sequence[cst.BaseStatement]):
    def apply(updated: cst.CSTNode):
        return cst.FlattenSentinel([*statements, updated])

    return apply
