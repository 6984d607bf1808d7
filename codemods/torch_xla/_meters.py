"""Meter objects of the file (pytorch/examples' AverageMeter / ProgressMeter): instances of a
class defined at the top level of the module, bound by a plain assignment in the function
that uses them. Shared by TX403 (`meter.update(loss.item(), n)`, left to TX406), TX406 (keeps
the value on the device) and TX402 (`progress.display(i)` of a class whose method prints).
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import target_names, walk
from porter.context import FileContext
from porter.rules import module_fact

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
    if not isinstance(receiver, cst.Name):
        return None
    fn = ctx.enclosing(cst.FunctionDef)
    if not isinstance(fn, cst.FunctionDef):
        return None
    name = receiver.value
    key = ("instance_class", fn, name)
    if key not in ctx.cache:
        ctx.cache[key] = _instance_class(ctx, fn, name)
    return ctx.cache[key]


def _instance_class(ctx: FileContext, fn: cst.FunctionDef, name: str) -> Optional[cst.ClassDef]:
    params = fn.params
    if any(p.name.value == name for p in (*params.posonly_params, *params.params, *params.kwonly_params)):
        return None
    classes = module_classes(ctx)
    bound: set[str] = set()
    ok = True

    for node in walk(fn):  # the function's own scope: nested defs, lambdas and classes skipped
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name) and t.target.value == name:
                    if len(node.targets) == 1 and isinstance(node.value, cst.Call) and isinstance(node.value.func, cst.Name):
                        bound.add(node.value.func.value)
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
    return classes.get(next(iter(bound)))


def arithmetic_update(cls: cst.ClassDef, method_name: str = "update") -> bool:
    """Whether ``cls.<method_name>(self, val, ...)`` takes the value first and its body is only assignments to attributes of self (``=``, ``+=``...) whose values
    use that parameter in arithmetic alone (``self.val = val``, ``self.sum += val * n``). Such a method works unchanged with a 0-dim tensor in place of a float."""
    fn = method(cls, method_name)
    if fn is None or not isinstance(fn.body, cst.IndentedBlock):
        return False
    params = fn.params.params
    if len(params) < 2 or params[0].name.value != "self":
        return False
    value = params[1].name.value
    for stmt in fn.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
                rhs = small.value
            elif isinstance(small, cst.AugAssign):
                targets = [small.target]
                rhs = small.value
            else:
                return False
            if not all(_self_attribute(t) for t in targets):
                return False
            if not _arithmetic(rhs):
                return False
    return value in _names(fn.body)


def _self_attribute(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def _arithmetic(expr: cst.CSTNode) -> bool:
    """Only names, numbers, ``self.<attr>`` and arithmetic operators (no call, no test)."""
    if isinstance(expr, cst.Attribute):
        return _self_attribute(expr)
    if not isinstance(expr, _ARITH):
        return False
    if isinstance(expr, cst.BinaryOperation):
        return _arithmetic(expr.left) and _arithmetic(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return _arithmetic(expr.expression)
    return True


def _names(node: cst.CSTNode) -> list[str]:
    return [n.value for n in walk(node, into_functions=True) if isinstance(n, cst.Name)]


def prints(fn: cst.FunctionDef, ctx: FileContext) -> bool:
    """The method's own body (not nested functions or lambdas) has a logging call as a
    statement (``print(...)``, ``logger.info(...)``..., as TX402 recognizes them, names
    resolved through the file's imports): it writes a log line."""
    return any(isinstance(node, cst.Expr) and isinstance(node.value, cst.Call) and is_logging_call(node.value, ctx)
               for node in walk(fn))


def meter_update(ctx: FileContext, item: cst.Call) -> Optional[tuple[cst.Call, cst.ClassDef]]:
    """``meter.update(<item>, n)`` as a statement, ``item`` its first positional argument, and
    ``meter`` an instance of a module class whose ``update`` only does arithmetic and
    assignment with the value: the call and the class."""
    stack = ctx.ancestors
    if len(stack) < 4 or stack[-1] is not item:
        return None
    arg, call, stmt = stack[-2], stack[-3], stack[-4]
    if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call) and isinstance(stmt, cst.Expr) and stmt.value is call):
        return None
    if not call.args or call.args[0] is not arg or arg.keyword is not None or arg.star:
        return None
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "update"):
        return None
    cls = instance_class(ctx, func.value)
    if cls is None or not arithmetic_update(cls):
        return None
    return call, cls
