"""What the file binds its names to, and which expressions are the XLA device (shared by the
device-placement and loader rules).

The binding index is a module fact: every name (``device``, ``args.device``) with the values
assigned to it anywhere in the file, and None for a binding porter cannot read (a parameter,
a loop or ``with`` target, an augmented or tuple assignment, an import). It is read by name,
not by scope: a value is trusted only when every binding of that spelling in the file agrees.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import arg, children, target_names, walk
from porter.context import FileContext, dotted_name
from porter.rules import module_fact

from ._tables import XLA_DEVICE, device_choice, is_cuda_string, only_availability

XLA_DEVICE_CALLS = ("torch_xla.device", XLA_DEVICE)


Binding = tuple[Optional[cst.FunctionDef], Optional[cst.BaseExpression]]


def _bindings(ctx: FileContext) -> dict[str, tuple[Binding, ...]]:
    found: dict[str, list[Binding]] = {}

    def visit(node: cst.CSTNode, scope: Optional[cst.FunctionDef]) -> None:
        def add(name: Optional[str], value: Optional[cst.BaseExpression]) -> None:
            if name is not None:
                found.setdefault(name, []).append((scope, value))

        def unknown(target: cst.CSTNode) -> None:
            for name in target_names(target):
                add(name, None)

        n = node
        if isinstance(n, cst.Assign):
            for t in n.targets:
                if isinstance(t.target, (cst.Name, cst.Attribute)):
                    add(dotted_name(t.target), n.value)
                else:
                    unknown(t.target)
        elif isinstance(n, cst.AnnAssign):
            add(dotted_name(n.target), n.value)
        elif isinstance(n, cst.AugAssign):
            add(dotted_name(n.target), None)
        elif isinstance(n, (cst.For, cst.CompFor)):
            unknown(n.target)
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            unknown(n.asname.name)
        elif isinstance(n, cst.NamedExpr):
            unknown(n.target)
        elif isinstance(n, (cst.Global, cst.Nonlocal)):
            for item in n.names:
                add(item.name.value, None)
        elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            add(n.name.value, None)
        inner = scope
        if isinstance(n, cst.FunctionDef):
            inner = n
            for p in walk(n.params, into_functions=False):
                if isinstance(p, cst.Param):
                    found.setdefault(p.name.value, []).append((n, None))
        for child in children(n):
            if isinstance(n, cst.FunctionDef) and child is n.params:
                continue
            visit(child, inner)

    visit(ctx.module, None)
    return {k: tuple(v) for k, v in found.items()}


def bindings(ctx: FileContext, name: str, scoped: bool = False) -> tuple[Optional[cst.BaseExpression], ...]:
    """The values bound to ``name`` in the file (None: a binding that is not a plain value).
    ``scoped``: only those of the innermost enclosing function that binds it (else the
    module's), for a plain name read at the current node."""
    every = module_fact(ctx, _bindings).get(name, ())
    if scoped:
        functions = [a for a in ctx.ancestors if isinstance(a, cst.FunctionDef)]
        for fn in reversed(functions):
            local = tuple(v for s, v in every if s is fn)
            if local:
                return local
        return tuple(v for s, v in every if s is None)
    return tuple(v for _, v in every)


def is_xla_device_expr(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """``torch_xla.device()``, ``xm.xla_device()``, or what the TX1 rules make the XLA device:
    ``torch.device('cuda')``, ``'cuda:0'``, ``'cuda' if torch.cuda.is_available() else 'cpu'``."""
    if isinstance(expr, cst.Call):
        name = ctx.qualname(expr.func)
        if name in XLA_DEVICE_CALLS:
            return True
        if name == "torch.device":
            first = arg(expr, "type", 0)
            return first is not None and is_xla_device_expr(first.value, ctx)
        return False
    if is_cuda_string(expr):
        return True
    choice = device_choice(expr, ctx)
    return choice is not None and only_availability(choice.node.test, ctx)


def xla_device_value(expr: cst.BaseExpression, ctx: FileContext, at: Optional[cst.CSTNode] = None) -> bool:
    """``expr`` provably holds the XLA device in the port: an XLA device expression, or a name
    (not a parameter of a function enclosing the current node) every binding of which in the
    file is one."""
    if is_xla_device_expr(expr, ctx):
        return True
    name = dotted_name(expr)
    if name is None:
        return False
    root = name.split(".")[0]
    for scope in ctx.ancestors:
        if isinstance(scope, cst.Lambda) and any(p.name.value == root for p in walk(scope.params) if isinstance(p, cst.Param)):
            return False
    if root != name and bindings(ctx, root, scoped=True) and None in bindings(ctx, root, scoped=True):
        return False  # `args.device` with `args` a parameter or a loop target
    values = bindings(ctx, name, scoped="." not in name)
    return bool(values) and all(v is not None and is_xla_device_expr(v, ctx) for v in values)


DEVICE_VARIABLE = "device"


def device_variable(ctx: FileContext) -> Optional[str]:
    """The script's device variable where the current node can read it, else None: a
    parameter ``device`` of an enclosing function, a ``device = ...`` in a statement of the
    enclosing function before the current one, or (for code in a function, or module-level code
    after it) a module-level ``device = ...``. Heuristic by spelling: only the name ``device``."""
    anc = ctx.ancestors
    functions = [i for i, a in enumerate(anc) if isinstance(a, cst.FunctionDef)]
    for i in reversed(functions):
        fn = anc[i]
        assert isinstance(fn, cst.FunctionDef)
        if any(isinstance(p, cst.Param) and p.name.value == DEVICE_VARIABLE for p in walk(fn.params)):
            return DEVICE_VARIABLE
        if _assigned_before(fn.body, anc[i + 1:]):
            return DEVICE_VARIABLE
        if any(s is fn and v is not None for s, v in module_fact(ctx, _bindings).get(DEVICE_VARIABLE, ())):
            return None  # assigned in this function, but not before the current statement
    module_level = [v for s, v in module_fact(ctx, _bindings).get(DEVICE_VARIABLE, ()) if s is None]
    if not module_level or None in module_level:
        return None
    if functions:
        return DEVICE_VARIABLE
    return DEVICE_VARIABLE if _assigned_before(ctx.module, anc[1:]) else None


def _assigned_before(block: cst.CSTNode, path: list) -> bool:
    """A statement of ``block`` (a function body or the module) before the one on ``path``
    assigns the device variable (also inside its `if`/`with`/`try` blocks)."""
    body = getattr(block, "body", ())
    for stmt in body:
        if any(stmt is p for p in path[:2]):
            return False
        for n in walk(stmt):
            if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == DEVICE_VARIABLE
                                                 for t in n.targets):
                return True
    return False


def placement_expr(ctx: FileContext) -> cst.BaseExpression:
    """Where inserted or rewritten code places tensors: the script's device variable when it
    has one here (so one device decides, also when a user's flag keeps it on the CPU), else
    ``torch_xla.device()``."""
    name = device_variable(ctx)
    if name is not None:
        return cst.Name(name)
    return cst.parse_expression(f"{ctx.module_alias('torch_xla')}.device()")
