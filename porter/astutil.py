"""The rule toolkit: small, pure helpers over LibCST nodes that every rule and target helper
module (``codemods/<target>/_*.py``) calls, defined once here.

- code of a node: ``code``; literal values: ``literal`` / ``python_literal`` and the one
  ``NOT_LITERAL``; arguments: ``arg``, ``has_kwarg``, ``kwarg``; parameters: ``params``,
  ``has_param``
- names: ``target_names``, ``reads``, ``binds``, ``function_locals``, ``name_values``
- walks: ``children``, ``walk``, ``calls_in``; loops and statements around a node
- the ``# porter: manual`` marker: ``MANUAL``, ``has_manual_marker``, ``with_manual_comment``,
  ``manual_comment``, ``report_manual``
- edits: ``parse_expression``, ``append_to_body``, ``insert_after``, ``insert_before``

Layers (import-linter contracts in pyproject.toml): porter's core (this module included) <-
target helpers ``codemods/<target>/_*.py`` <- rules; a helper never imports a rule and a rule
never imports another rule. docs/contributing.md shows a rule written with these."""
from __future__ import annotations

import ast
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import libcst as cst

from porter._libcst_compat import FIELDS as _FIELDS
from porter._libcst_compat import NODE_TYPES as _NODE_TYPES
from porter._libcst_compat import child_fields as _child_fields
from porter._libcst_compat import children as children
from porter._libcst_compat import is_node_type as _is_node_type
from porter.context import FileContext, dotted_name
from porter.rules import Edit, Fix, Severity, module_fact

_EMPTY = cst.Module([])


def code(node: cst.CSTNode) -> str:
    """The source code of ``node`` alone (an empty module's default indentation and newline)."""
    return _EMPTY.code_for_node(node)


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


def target_names(target: cst.CSTNode) -> Iterator[str]:
    """Names bound by an assignment target (tuples, lists and starred unpacking included)."""
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_names(target.value)


def top_level_names(module: cst.Module) -> set[str]:
    """The names a module binds at its top level by ``class``, ``def`` and (annotated)
    assignment, unpacked targets included."""
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        names.update(target_names(t.target))
                elif isinstance(small, cst.AnnAssign):
                    names.update(target_names(small.target))
    return names


def assigned_values(scope: cst.CSTNode, name: str) -> list[Optional[cst.BaseExpression]]:
    """The values ``name`` is given by the assignments in ``scope`` (not in nested defs):
    ``name = v``, ``a = name = v``, ``name: T = v``, and ``a, name = u, v`` (the element of a
    literal tuple or list of the same length, no starred part); None for an unpacking of any
    other value (``a, name = f()``), whose part for ``name`` the code does not show."""
    out: list[Optional[cst.BaseExpression]] = []
    for node in walk(scope):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                out.extend(_unpacked_values(target.target, node.value, name))
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            out.extend(_unpacked_values(node.target, node.value, name))
    return out


def _unpacked_values(target: cst.CSTNode, value: Optional[cst.BaseExpression], name: str):
    if isinstance(target, cst.Name):
        return [value] if target.value == name else []
    if isinstance(target, cst.StarredElement):
        return [None] if name in target_names(target) else []
    if not isinstance(target, (cst.Tuple, cst.List)) or name not in target_names(target):
        return []
    parts = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
    if (parts is None or len(parts) != len(target.elements)
            or any(isinstance(p, cst.StarredElement) for p in (*parts, *target.elements))):
        return [None]
    return [v for t, p in zip(target.elements, parts) for v in _unpacked_values(t.value, p.value, name)]


_SCOPE_KINDS = frozenset({cst.FunctionDef, cst.Lambda, cst.ClassDef})


# the nodes of the last modules walked whole: the module facts of a pass each walk the module,
# and LibCST's trees are immutable, so one walk serves them all ({(id, into_functions): (module,
# nodes)}, the oldest dropped past _WALKS_KEPT)
_WALKS: dict[tuple[int, bool], tuple[cst.Module, list[cst.CSTNode]]] = {}
_WALKS_KEPT = 8


def walk(node: cst.CSTNode, into_functions: bool = False) -> Iterator[cst.CSTNode]:
    """Every node below ``node`` (pre-order), not descending into nested defs/lambdas/classes."""
    if type(node) is not cst.Module:
        return _walk(node, into_functions)
    key = (id(node), into_functions)
    hit = _WALKS.get(key)
    if hit is None or hit[0] is not node:
        hit = _WALKS[key] = (node, list(_walk(node, into_functions)))
        if len(_WALKS) > _WALKS_KEPT:
            del _WALKS[next(iter(_WALKS))]
    return iter(hit[1])


def _walk(node: cst.CSTNode, into_functions: bool) -> Iterator[cst.CSTNode]:
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
    # (exact node type: LibCST's node classes are never subclassed, and isinstance against
    # them goes through ABCMeta.__instancecheck__)
    call = cst.Call
    for n in walk(node):
        if type(n) is call:
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


def _loop_facts(loop: Union[cst.For, cst.While], ctx: Optional[FileContext]) -> tuple[bool, bool]:
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
    if not name:
        return False
    return name in _NO_GRAD or name.endswith(("no_grad", "inference_mode"))


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


# --------------------------------------------------------------------------------------
# Literal values
# --------------------------------------------------------------------------------------
class _NotLiteral:
    def __repr__(self) -> str:
        return "<not a literal>"


NOT_LITERAL: Any = _NotLiteral()
"""What ``literal`` and ``python_literal`` return for an expression that is not a literal
(``None`` is a literal's value)."""


def literal(node: Optional[cst.CSTNode], *, lists_as_tuples: bool = False, unary_plus: bool = True):
    """The Python value of a literal expression: numbers, strings, True/False/None, tuples and
    lists of those, a signed number; else NOT_LITERAL.

    ``lists_as_tuples``: a list's value is a tuple too (the Gluon rules compare shapes and
    axes written either way); ``unary_plus=False``: ``+1`` is not a literal (only ``-1``)."""
    if node is None:
        return NOT_LITERAL
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        try:
            return node.evaluated_value
        except Exception:
            return NOT_LITERAL
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.UnaryOperation) and (
            isinstance(node.operator, cst.Minus) or (unary_plus and isinstance(node.operator, cst.Plus))):
        v = literal(node.expression, lists_as_tuples=lists_as_tuples, unary_plus=unary_plus)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.operator, cst.Minus) else v
        return NOT_LITERAL
    if isinstance(node, (cst.Tuple, cst.List)):
        out = []
        for el in node.elements:
            if isinstance(el, cst.StarredElement):
                return NOT_LITERAL
            v = literal(el.value, lists_as_tuples=lists_as_tuples, unary_plus=unary_plus)
            if v is NOT_LITERAL:
                return NOT_LITERAL
            out.append(v)
        return tuple(out) if isinstance(node, cst.Tuple) or lists_as_tuples else out
    return NOT_LITERAL


def python_literal(node: Optional[cst.CSTNode]):
    """The value of any expression ``ast.literal_eval`` accepts (``literal``'s, and dicts,
    sets, complex numbers, implicitly concatenated strings), else NOT_LITERAL."""
    if node is None:
        return NOT_LITERAL
    try:
        return ast.literal_eval(code(node))
    except Exception:
        return NOT_LITERAL


# --------------------------------------------------------------------------------------
# Arguments and parameters
# --------------------------------------------------------------------------------------
def has_kwarg(call: cst.Call, name: str) -> bool:
    """``call`` passes ``name=``."""
    return any(a.keyword is not None and a.keyword.value == name for a in call.args)


def kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """A new ``name=value`` argument, written without spaces around ``=``."""
    return cst.Arg(value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def params(parameters: cst.Parameters) -> Iterator[cst.Param]:
    """Every parameter, in order: positional-only, ordinary, ``*args``, keyword-only, ``**kwargs``."""
    yield from parameters.posonly_params
    yield from parameters.params
    if isinstance(parameters.star_arg, cst.Param):
        yield parameters.star_arg
    yield from parameters.kwonly_params
    if parameters.star_kwarg is not None:
        yield parameters.star_kwarg


# --------------------------------------------------------------------------------------
# Names read and bound
# --------------------------------------------------------------------------------------
def reads(node: cst.CSTNode) -> list[str]:
    """Names an expression or statement reads, in order of first appearance (attribute
    names, keyword names and plain assignment targets are not reads)."""
    out: dict[str, None] = {}
    _reads(node, out)
    return list(out)


def _reads(node: cst.CSTNode, out: dict) -> None:
    if isinstance(node, cst.Name):
        out[node.value] = None
    elif isinstance(node, cst.Attribute):
        _reads(node.value, out)
    elif isinstance(node, cst.Arg):
        _reads(node.value, out)
    elif isinstance(node, cst.Assign):
        _reads(node.value, out)
        for t in node.targets:
            _target_reads(t.target, out)
    elif isinstance(node, cst.AnnAssign):
        if node.value is not None:
            _reads(node.value, out)
        _target_reads(node.target, out)
    elif isinstance(node, cst.AugAssign):
        _reads(node.target, out)
        _reads(node.value, out)
    elif isinstance(node, (cst.Param,)):
        if node.default is not None:
            _reads(node.default, out)
    elif isinstance(node, (cst.Lambda, cst.FunctionDef)):
        inner: dict = {}
        for child in children(node):
            _reads(child, inner)
        own = {p.name.value for p in params(node.params)}
        for name in inner:
            if name not in own:
                out[name] = None
    elif isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
        inner = {}
        for child in children(node):
            _reads(child, inner)
        bound: set[str] = set()
        comp: Optional[cst.CompFor] = node.for_in
        while comp is not None:
            bound.update(target_names(comp.target))
            comp = comp.inner_for_in
        for name in inner:
            if name not in bound:
                out[name] = None
    elif isinstance(node, cst.CompFor):
        _target_reads(node.target, out)
        for child in (node.iter, *[i.test for i in node.ifs]):
            _reads(child, out)
        if node.inner_for_in is not None:
            _reads(node.inner_for_in, out)
    else:
        for child in children(node):
            _reads(child, out)


def _target_reads(target: cst.CSTNode, out: dict) -> None:
    """A target reads the objects it stores into (``a.b = ..`` and ``a[i] = ..`` read ``a``)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        for e in target.elements:
            _target_reads(e.value, out)
    elif isinstance(target, cst.StarredElement):
        _target_reads(target.value, out)
    elif not isinstance(target, cst.Name):
        _reads(target, out)


def binds(stmt: cst.CSTNode) -> set[str]:
    """Names a statement (re)binds, or mutates in place (``x.fill_(0)``, ``x[i] = 0``); an
    ``if``/``with`` binds what its blocks bind."""
    out: set[str] = set()
    for small in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()):
        if isinstance(small, cst.Assign):
            for t in small.targets:
                out.update(_bound_or_stored(t.target))
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            out.update(_bound_or_stored(small.target))
        elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            m = method_name(small.value)
            if m and m.endswith("_") and not m.startswith("_"):
                root = root_name(small.value.func.value)  # type: ignore[attr-defined]
                if root:
                    out.add(root)
    if isinstance(stmt, cst.For):
        out.update(target_names(stmt.target))
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        out.add(stmt.name.value)
    if isinstance(stmt, (cst.If, cst.With)):
        # `if kind == "a": loss = f(out)` / `else: loss = g(out)`: what its blocks bind
        if isinstance(stmt, cst.With):
            for item in stmt.items:
                if item.asname is not None:
                    out.update(target_names(item.asname.name))
        block: Any = stmt
        while block is not None:
            if isinstance(block.body, cst.IndentedBlock):
                for inner in block.body.body:
                    out |= binds(inner)
            block = getattr(block, "orelse", None)
            if isinstance(block, cst.Else):
                if isinstance(block.body, cst.IndentedBlock):
                    for inner in block.body.body:
                        out |= binds(inner)
                block = None
    return out


def _bound_or_stored(target: cst.CSTNode) -> set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _bound_or_stored(e.value)}
    if isinstance(target, cst.StarredElement):
        return _bound_or_stored(target.value)
    root = root_name(target)
    return {root} if root else set()


def root_name(expr: cst.CSTNode) -> Optional[str]:
    """``a`` for ``a``, ``a.b.c``, ``a[i].b``; None when the root is not a name."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def function_locals(fn: cst.FunctionDef) -> set[str]:
    """Parameters and every name the function binds (not inside nested functions/classes)."""
    names: set[str] = {p.name.value for p in params(fn.params)}
    for node in walk(fn.body):
        if type(node) not in _LOCAL_BINDERS:  # (the kinds tested below, exactly: see calls_in)
            continue
        if isinstance(node, cst.Assign):
            for t in node.targets:
                names.update(target_names(t.target))
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and isinstance(node.target, cst.Name):
            names.add(node.target.value)
        elif isinstance(node, (cst.For, cst.CompFor)):
            names.update(target_names(node.target))
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            names.update(target_names(node.asname.name))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not fn:
            names.add(node.name.value)
        elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                local = alias.asname.name if alias.asname else alias.name
                d = dotted_name(local)
                if d:
                    names.add(d.split(".")[0])
    return names


def rebinds_globals(ctx: FileContext) -> bool:
    """The module calls exec() or globals(): a configurator (``exec(open('configurator.py').read())``,
    ``globals()[key] = value``) may set any module-level name from the command line."""
    return module_fact(ctx, _rebinds_globals)


def _rebinds_globals(ctx: FileContext) -> bool:
    return any(isinstance(n, cst.Call) and ctx.qualname(n.func) in ("builtins.exec", "builtins.globals")
               for n in walk(ctx.module, into_functions=True))


def name_values(ctx: FileContext, name: str) -> Optional[list[cst.BaseExpression]]:
    """Every value NAME can hold where the current node reads it, when the code shows them all:
    the values of the plain assignments to it in the enclosing function (or, for a name the
    function does not bind, the module), and nothing else binds it there: not a parameter, a
    ``global``/``nonlocal``, a loop, an augmented assignment, a ``with``, an import or an
    unpacking of a value the code does not show. None otherwise (or where it is never
    assigned). (A module's name may also be set by ``exec``: see ``rebinds_globals``.)"""
    found = ctx.enclosing(cst.FunctionDef)
    fn = found if isinstance(found, cst.FunctionDef) and name in function_locals(found) else None
    scope: cst.CSTNode = fn.body if fn is not None else ctx.module
    declared = (n for n in walk(scope, into_functions=fn is None) if isinstance(n, (cst.Global, cst.Nonlocal)))
    if (fn is not None and has_param(fn, name)) or any(x.name.value == name for n in declared for x in n.names):
        return None  # (a module's name: no function may rebind it through `global`)
    values = assigned_values(scope, name)
    if not values or any(v is None for v in values):
        return None
    for n in walk(scope):
        bound = n.target if isinstance(n, (cst.For, cst.CompFor, cst.AugAssign)) else n.asname.name if isinstance(
            n, (cst.WithItem, cst.ImportAlias)) and n.asname is not None else None
        if bound is not None and name in target_names(bound):
            return None
        if isinstance(n, cst.ImportAlias) and n.asname is None and (dotted_name(n.name) or "").split(".")[0] == name:
            return None
    return [v for v in values if v is not None]


_LOCAL_BINDERS = frozenset({
    cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.WithItem, cst.FunctionDef, cst.ClassDef,
    cst.Import, cst.ImportFrom,
})


# --------------------------------------------------------------------------------------
# The `# porter: manual` marker: a line a person still has to port
# --------------------------------------------------------------------------------------
MANUAL = "porter: manual"


def header_line(stmt: Optional[cst.CSTNode]) -> Optional[cst.TrailingWhitespace]:
    """The end of a statement's (first) line, where a trailing comment goes: a simple
    statement's trailing whitespace, a compound statement's header; else None."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt.trailing_whitespace
    body = getattr(stmt, "body", None)
    return body.header if isinstance(body, cst.IndentedBlock) else None


def has_manual_marker(stmt: Optional[cst.CSTNode], *, header: bool = True, leading_lines: bool = False) -> bool:
    """``stmt`` carries a ``# porter: manual`` comment at the end of its line (``header``: a
    compound statement's header line counts; else only a simple statement's line), or
    (``leading_lines``) on a comment line above it."""
    if header:
        trailing = header_line(stmt)
    else:
        trailing = stmt.trailing_whitespace if isinstance(stmt, cst.SimpleStatementLine) else None
    if trailing is not None and trailing.comment is not None and MANUAL in trailing.comment.value:
        return True
    return leading_lines and any(line.comment is not None and MANUAL in line.comment.value
                                 for line in getattr(stmt, "leading_lines", ()))


def manual_text(code_: Optional[str] = None, reason: Optional[str] = None) -> str:
    """``# porter: manual``, or ``# porter: manual (CODE): reason`` with a rule code."""
    return f"# {MANUAL} ({code_}): {reason}" if code_ else f"# {MANUAL}"


def with_manual_comment(stmt: cst.CSTNode, code_: Optional[str] = None, reason: Optional[str] = None, *,
                        respace: bool = True, once: bool = False) -> cst.CSTNode:
    """``stmt`` with ``manual_text(code_, reason)`` at the end of its line (a compound
    statement's header line), after a comment the line already has; a statement with no
    such line comes back as it is.

    ``respace``: the whitespace before the comment becomes two spaces (else a comment already
    there keeps its own); ``once``: a line already marked is left as it is."""
    trailing = header_line(stmt)
    if trailing is None:
        return stmt
    if once and trailing.comment is not None and MANUAL in trailing.comment.value:
        return stmt
    text = manual_text(code_, reason)
    if trailing.comment is not None:
        text = f"{trailing.comment.value}  {text}"
        new = trailing.with_changes(comment=cst.Comment(text))
        if respace:
            new = new.with_changes(whitespace=cst.SimpleWhitespace("  "))
    else:
        new = trailing.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(text))
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt.with_changes(trailing_whitespace=new)
    return stmt.with_changes(body=stmt.body.with_changes(header=new))  # type: ignore[attr-defined]


def manual_comment(code_: Optional[str] = None, reason: Optional[str] = None, *, respace: bool = True,
                   once: bool = False) -> Callable[[cst.CSTNode], cst.CSTNode]:
    """An Edit replacement callable: ``with_manual_comment`` of the updated statement."""

    def apply(stmt: cst.CSTNode) -> cst.CSTNode:
        return with_manual_comment(stmt, code_, reason, respace=respace, once=once)

    return apply


def enclosing_simple_statement(ctx: FileContext) -> Optional[cst.SimpleStatementLine]:
    """The simple statement line around the current node, None inside a compound statement's
    header (``for x in f(y):``)."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.SimpleStatementLine):
            return anc
        if isinstance(anc, cst.BaseCompoundStatement):
            return None
    return None


def report_manual(rule, node: cst.CSTNode, message: str) -> None:
    """Report ``node`` for a person (an error: "manual port needed: <message>"); the fix
    only marks its statement's line ``# porter: manual`` (nothing else changes), so the marker
    is there once the rest of the file is ported."""
    stmt = enclosing_simple_statement(rule.ctx)
    fix = None
    if stmt is not None and not has_manual_marker(stmt):
        fix = Fix((Edit(stmt, manual_comment(respace=False, once=True)),), description="mark the line # porter: manual")
    rule.report(node, f"manual port needed: {message}", fix, severity=Severity.ERROR)


def has_param(func: cst.FunctionDef, name: str) -> bool:
    """``func`` has a parameter called ``name`` (of any kind)."""
    return any(p.name.value == name for p in params(func.params))


def positional(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def is_string(node: Optional[cst.CSTNode], *values: str) -> bool:
    if node is None:
        return False
    value = string_value(node)
    return value is not None and (not values or value in values)


def source_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def needs_parens(expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` must be parenthesized to be the receiver of an attribute access."""
    if expr.lpar:
        return False
    return not isinstance(
        expr,
        (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.ConcatenatedString,
         cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp,
         cst.GeneratorExp, cst.FormattedString),
    )


def parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    if needs_parens(expr):
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr
