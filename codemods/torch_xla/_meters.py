"""Meter objects (pytorch/examples' AverageMeter / ProgressMeter, a library's meter such as
timm's `utils.AverageMeter`): instances of a class defined at the top level of the module, or
of a class the file imports, bound by a plain assignment in the function that uses them.
Shared by TX403 (`meter.update(loss.item(), n)`, left to TX406), TX406 (keeps the value on the
device) and TX402 (`progress.display(i)` of a class of the file whose method prints).

An imported class is read from its source where it is installed (or sits beside the script):
the module is found as `import` would find it (the script's folder, then `sys.path`) without
importing anything, and re-exports (`from .metrics import AverageMeter`) are followed.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import NamedTuple, Optional, Union

import libcst as cst

from porter.astutil import dotted_name, target_names, walk
from porter.context import FileContext
from porter.rules import module_fact
from porter.sources import find_spec

from ._host_sync import is_logging_call

# expression nodes through which a value only takes part in arithmetic
_ARITH = (cst.BinaryOperation, cst.UnaryOperation, cst.Name, cst.Integer, cst.Float, cst.Attribute)


def module_classes(ctx: FileContext) -> dict[str, cst.ClassDef]:
    """The classes defined at the top level of the module, by name (a name bound twice is
    left out): a module fact (porter.rules.module_fact), read by lookups only."""
    return module_fact(ctx, _module_classes)


def _module_classes(ctx: FileContext) -> dict[str, cst.ClassDef]:
    found: dict[str, cst.ClassDef] = {}
    twice: set[str] = set()
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.ClassDef):
            name = stmt.name.value
            (twice.add(name) if name in found else found.__setitem__(name, stmt))
    return {k: v for k, v in found.items() if k not in twice}


def method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    hits = [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    return hits[0] if len(hits) == 1 and not hits[0].decorators else None


def instance_class(ctx: FileContext, receiver: cst.CSTNode) -> Optional[cst.ClassDef]:
    """The module class `receiver` (a plain name) is an instance of: every binding of the name
    in the enclosing function is `name = Class(...)` of one class of the module, and the name
    is not a parameter or a global of that function."""
    callee = bound_class(ctx, receiver)
    return module_classes(ctx).get(callee) if callee is not None else None


class MeterClass(NamedTuple):
    """The class a meter is an instance of: ``cls`` its definition where porter could read it
    (None for an imported class whose source it did not find), ``shown`` its name as the file
    spells it, ``imported`` the qualified name of an imported class (None for a module class)."""

    cls: Optional[cst.ClassDef]
    shown: str
    imported: Optional[str]


def meter_class(ctx: FileContext, receiver: cst.CSTNode) -> Optional[MeterClass]:
    """The class `receiver` is an instance of, as `instance_class` finds it, a class of the
    module or one the file imports (`losses = utils.AverageMeter()` with `from timm import
    utils`), read from its installed source."""
    callee = bound_class(ctx, receiver)
    if callee is None:
        return None
    local = module_classes(ctx).get(callee)
    if local is not None:
        return MeterClass(local, callee, None)
    if "." not in callee and callee not in ctx.aliases:
        return None  # a local function or a name bound elsewhere in the file
    qualname = ctx.qualname(cst.parse_expression(callee))
    if qualname is None or qualname.startswith("builtins."):
        return None
    return MeterClass(library_class(qualname, _script_dir(ctx.path)), callee, qualname)


def bound_class(ctx: FileContext, receiver: cst.CSTNode) -> Optional[str]:
    """The callee (a dotted name, as written) of every binding of `receiver`, a plain name of
    the enclosing function that is not one of its parameters or globals: `name = Callee(...)`."""
    if not isinstance(receiver, cst.Name):
        return None
    fn = ctx.enclosing(cst.FunctionDef)
    if not isinstance(fn, cst.FunctionDef):
        return None
    name = receiver.value
    key = ("bound_class", fn, name)
    if key not in ctx.cache:
        ctx.cache[key] = _bound_class(fn, name)
    return ctx.cache[key]


def _bound_class(fn: cst.FunctionDef, name: str) -> Optional[str]:
    params = fn.params
    if any(p.name.value == name for p in (*params.posonly_params, *params.params, *params.kwonly_params)):
        return None
    bound: set[Optional[str]] = set()
    ok = True

    for node in walk(fn):  # the function's own scope: nested defs, lambdas and classes skipped
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name) and t.target.value == name:
                    if len(node.targets) == 1 and isinstance(node.value, cst.Call):
                        bound.add(dotted_name(node.value.func))
                    else:
                        ok = False
                elif name in target_names(t.target):
                    ok = False
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
            ok = ok and name not in target_names(node.target)
        elif isinstance(node, cst.WithItem):
            ok = ok and not (node.asname is not None and name in target_names(node.asname.name))
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            ok = ok and not any(n.name.value == name for n in node.names)
    if not ok or len(bound) != 1:
        return None
    return next(iter(bound))


# --------------------------------------------------------------------------------------
# classes of other modules, read from their source
# --------------------------------------------------------------------------------------
_REEXPORT_DEPTH = 8  # `from .x import Name` hops followed from the module named to the class


def _script_dir(path: str) -> Optional[str]:
    return os.path.dirname(os.path.abspath(path)) if path and os.path.isfile(path) else None


def library_class(qualname: str, script_dir: Optional[str] = None) -> Optional[cst.ClassDef]:
    """The definition of the class `qualname` (``timm.utils.AverageMeter``) in the source of
    its module, found as `import` would find it (`script_dir`, then `sys.path`) without
    importing it, through the re-exports of the modules on the way; None where porter finds
    no Python source that defines it at the top level."""
    module, _, name = qualname.rpartition(".")
    roots = tuple(([script_dir] if script_dir else []) + [p or os.getcwd() for p in sys.path])
    for _ in range(_REEXPORT_DEPTH):
        if not module:
            return None
        found = _module_definition(module, name, roots)
        if isinstance(found, cst.ClassDef) or found is None:
            return found
        module, name = found
    return None


def _module_definition(module: str, name: str, roots: tuple[str, ...]) -> Union[cst.ClassDef, tuple[str, str], None]:
    """What binds `name` at the top level of `module`: its class, or the (module, name) a
    `from ... import` re-exports it from."""
    path = _module_file(module, roots)
    if path is None:
        return None
    tree = _parsed(path, os.stat(path).st_mtime_ns)
    if tree is None:
        return None
    package = module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]
    found: Union[cst.ClassDef, tuple[str, str], None] = None
    for stmt in tree.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
            found = stmt
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    for alias in small.names:
                        local = alias.asname.name if alias.asname is not None else alias.name
                        if isinstance(local, cst.Name) and local.value == name:
                            source = _import_source(small, package)
                            found = (source, dotted_name(alias.name) or "") if source else None
                elif any(name in target_names(t.target) for t in getattr(small, "targets", ())):
                    found = None  # rebound: not a class porter can read
    return found


def _import_source(node: cst.ImportFrom, package: str) -> Optional[str]:
    """The absolute module of `from <module> import ...` in a module of `package`."""
    named = dotted_name(node.module) if node.module is not None else ""
    if not node.relative:
        return named or None
    parts = package.split(".") if package else []
    up = len(node.relative) - 1
    if up > len(parts):
        return None
    base = parts[: len(parts) - up]
    return ".".join([*base, *([named] if named else [])]) or None


def _module_file(module: str, roots: tuple[str, ...]) -> Optional[str]:
    spec = find_spec(module, roots)
    origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int) -> Optional[cst.Module]:
    try:
        with open(path, encoding="utf-8") as f:
            return cst.parse_module(f.read())
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return None


def arithmetic_update(cls: cst.ClassDef, method_name: str = "update") -> bool:
    """Whether ``cls.<method_name>(self, val, ...)`` takes the value first and its body is only
    assignments to attributes of self (``=``, ``+=``...) whose values use that parameter in
    arithmetic alone (``self.val = val``, ``self.sum += val * n``), with conditional
    expressions whose test reads nothing computed from the value (timm's ``self.avg =
    self.sum / self.count if self.count else 0``). Such a method works unchanged with a 0-dim
    tensor in place of a float, and tests nothing on it."""
    fn = method(cls, method_name)
    if fn is None or not isinstance(fn.body, cst.IndentedBlock):
        return False
    params = fn.params.params
    if len(params) < 2 or params[0].name.value != "self":
        return False
    value = params[1].name.value
    assigned: list[tuple[list[str], cst.BaseExpression]] = []
    for stmt in fn.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, cst.AugAssign):
                targets = [small.target]
            else:
                return False
            if not all(_self_attribute(t) for t in targets) or not _arithmetic(small.value):
                return False
            assigned.append(([t.attr.value for t in targets], small.value))  # type: ignore[attr-defined]
    tainted = _from_value(value, assigned)
    if any(_reads(test, value, tainted) for _, rhs in assigned for test in _tests(rhs)):
        return False
    return value in _names(fn.body)


def _from_value(value: str, assigned: list[tuple[list[str], cst.BaseExpression]]) -> set[str]:
    """The attributes of self the method assigns from the value, directly or through other
    such attributes (``self.sum += val * n`` then ``self.avg = self.sum / self.count``)."""
    tainted: set[str] = set()
    while True:
        grown = {a for attrs, rhs in assigned if _reads(rhs, value, tainted) for a in attrs} | tainted
        if grown == tainted:
            return tainted
        tainted = grown


def _reads(expr: cst.CSTNode, value: str, attrs: set[str]) -> bool:
    for n in walk(expr, into_functions=True):
        if isinstance(n, cst.Name) and n.value == value:
            return True
        if _self_attribute(n) and n.attr.value in attrs:  # type: ignore[attr-defined]
            return True
    return False


def _tests(expr: cst.CSTNode) -> list[cst.BaseExpression]:
    return [n.test for n in walk(expr, into_functions=True) if isinstance(n, cst.IfExp)]


def _self_attribute(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def _arithmetic(expr: cst.CSTNode) -> bool:
    """Only names, numbers, ``self.<attr>`` and arithmetic operators (no call), and conditional
    expressions of them whose test compares such values (``a if self.count else 0``)."""
    if isinstance(expr, cst.Attribute):
        return _self_attribute(expr)
    if isinstance(expr, cst.IfExp):
        return _condition(expr.test) and _arithmetic(expr.body) and _arithmetic(expr.orelse)
    if not isinstance(expr, _ARITH):
        return False
    if isinstance(expr, cst.BinaryOperation):
        return _arithmetic(expr.left) and _arithmetic(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return _arithmetic(expr.expression)
    return True


def _condition(expr: cst.CSTNode) -> bool:
    if isinstance(expr, cst.Comparison):
        return _arithmetic(expr.left) and all(_arithmetic(c.comparator) for c in expr.comparisons)
    if isinstance(expr, cst.BooleanOperation):
        return _condition(expr.left) and _condition(expr.right)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        return _condition(expr.expression)
    return _arithmetic(expr)


def _names(node: cst.CSTNode) -> list[str]:
    return [n.value for n in walk(node, into_functions=True) if isinstance(n, cst.Name)]


def prints(fn: cst.FunctionDef, ctx: FileContext) -> bool:
    """The method's own body (not nested functions or lambdas) has a logging call as a
    statement (``print(...)``, ``logger.info(...)``..., as TX402 recognizes them, names
    resolved through the file's imports): it writes a log line."""
    return any(isinstance(node, cst.Expr) and isinstance(node.value, cst.Call) and is_logging_call(node.value, ctx)
               for node in walk(fn))


class MeterUpdate(NamedTuple):
    """``meter.update(<value>, ...)`` as a statement: the call, the meter's class, and whether
    its ``update`` only does arithmetic and assignment with the value (a 0-dim tensor works)."""

    call: cst.Call
    meter: MeterClass
    on_device: bool


# operators through which the host value only takes part in arithmetic on its way to update()
_ARITH_PARENTS = (cst.BinaryOperation, cst.UnaryOperation)


def meter_update(ctx: FileContext, item: cst.Call) -> Optional[MeterUpdate]:
    """``meter.update(<item>, n)`` as a statement, ``item`` its first positional argument or
    a term of arithmetic that is (``loss.item() * accum_steps``), and ``meter`` an instance of
    a class of the module or of one the file imports (`meter_class`)."""
    stack = ctx.ancestors
    if not stack or stack[-1] is not item:
        return None
    i = len(stack) - 2
    while i >= 0 and isinstance(stack[i], _ARITH_PARENTS) and not isinstance(getattr(stack[i], "operator", None), cst.Not):
        i -= 1
    if i < 2:
        return None
    arg, call, stmt = stack[i], stack[i - 1], stack[i - 2]
    if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and isinstance(stmt, cst.Expr) and stmt.value is call):
        return None
    if not call.args or call.args[0] is not arg or arg.keyword is not None or arg.star:
        return None
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "update"):
        return None
    meter = meter_class(ctx, func.value)
    if meter is None:
        return None
    return MeterUpdate(call, meter, meter.cls is not None and arithmetic_update(meter.cls))
