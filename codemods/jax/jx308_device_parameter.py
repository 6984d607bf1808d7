from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity, StatementFact, module_fact

from . import _loop as lp

_NAMES = ("device", "dev")


class DeviceParameter(Rule):
    """
    ## What it does
    Removes a `device` parameter that a module-level function no longer reads (once its
    `.to(device)` calls are gone, JX303), together with the argument every call of the
    function in the file passes for it. When nothing reads the `device = torch.device(...)`
    variable any more, JX303 then removes it too.

    Only when every call in the file passes the argument in a form porter can drop (by
    position or by keyword, no `*args`/`**kwargs`), and the function is not a method.

    ## Why
    JAX places arrays itself: the classic `train(args, model, device, loader, optimizer,
    epoch)` signature carries a device that nothing uses in the port.

    ## Fix safety
    Unsafe for a public function (another module may call it with the old signature); safe
    for a `_private` one.
    """

    code = "JX308"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-device-parameter"
    target = "jax"
    summary = "an unused `device` parameter and the arguments passed for it removed"
    severity = Severity.INFO
    needs_text = ("device", "dev")
    examples = [
        Example(
            """
            def train(model, device, loader, epoch):
                for x, y in loader:
                    x, y = x.numpy(), y.numpy()
                    step(model, x, y)

            def main():
                device = "cpu"
                for epoch in range(3):
                    train(model, device, loader, epoch=epoch)
            """,
            """
            def train(model, loader, epoch):
                for x, y in loader:
                    x, y = x.numpy(), y.numpy()
                    step(model, x, y)

            def main():
                device = "cpu"
                for epoch in range(3):
                    train(model, loader, epoch=epoch)
            """,
            unsafe=True,
        ),
    ]
    valid = [
        "def f(model, device):\n    return model.to(device)\n",
        "def f(model, device):\n    pass\nf(*args)\n",
    ]

    def visit_FunctionDef(self, fn: cst.FunctionDef) -> None:
        # a module-level function (the last of its name), with the calls and references of
        # its name in the whole file: a module fact built statement by statement, so that
        # `porter lsp` checks this rule one statement at a time (porter.incremental)
        if len(self.ctx.ancestors) != 2:
            return
        # the function's own parameters first: the file's uses of function names (the module
        # fact below, a walk of the whole file) are only needed for one with a device parameter
        params = list(fn.params.params)
        at = next((i for i, p in enumerate(params) if p.name.value in _NAMES and p.default is None), None)
        if at is None or fn.params.posonly_params or fn.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None):
            return
        facts = module_fact(self.ctx, _FUNCTION_USES)
        name = fn.name.value
        if facts.functions.get(name) is not fn:
            return
        calls = {name: facts.calls.get(name, ())}
        refs = {name: facts.refs.get(name, 0)}
        pname = params[at].name.value
        if pname in lp.reads(fn.body):
            return
        edits = []
        ok = True
        for call in calls[name]:
            arg = _argument_for(call, at, pname)
            if arg is None:
                ok = False
                break
            edits.append(self.replace(call, _drop_arg(call, arg)))
        # the function used other than by plain calls (passed around): leave it
        if not ok or refs.get(name, 0) != len(calls[name]) + 1:
            return
        new_params = [p for i, p in enumerate(params) if i != at]
        if new_params:
            new_params[-1] = new_params[-1].with_changes(comma=params[-1].comma if at != len(params) - 1 else cst.MaybeSentinel.DEFAULT)
        edits.append(self.replace(fn.params, fn.params.with_changes(params=new_params)))
        safety = Safety.SAFE if name.startswith("_") else Safety.UNSAFE
        self.report(fn, f"`{pname}` is not used by {name}() any more (JAX places arrays itself): parameter and arguments removed",
                    Fix(tuple(edits), safety))


def _references(root: cst.CSTNode, names: frozenset) -> dict:
    """For each of ``names``, how many times it is referred to as a variable under ``root``
    (a def of that name included), not counting attribute names, keyword names and functions
    that bind the name locally (their bodies are not read for it). One walk for all names:
    each function's locals are computed once."""
    counts = dict.fromkeys(names, 0)
    stack: list[tuple[cst.CSTNode, frozenset]] = [(root, names)]
    while stack:
        n, active = stack.pop()
        if not active:
            continue
        if isinstance(n, cst.FunctionDef):
            if n.name.value in active:
                counts[n.name.value] += 1
            inner = active - lp.function_locals(n)
            if inner:
                stack.append((n.body, inner))
            continue
        if isinstance(n, cst.Name):
            if n.value in active:
                counts[n.value] += 1
            continue
        if isinstance(n, (cst.Attribute, cst.Arg)):
            stack.append((n.value, active))
            continue
        stack.extend((c, active) for c in astutil.children(n))
    return counts


def _argument_for(call: cst.Call, position: int, name: str):
    if any(a.star for a in call.args):
        return None
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    positional = [a for a in call.args if a.keyword is None]
    return positional[position] if position < len(positional) else None


def _drop_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    args = [a for a in call.args if a is not arg]
    if args and call.args[-1] is arg:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)


@dataclass
class FunctionUses:
    """The module-level functions by name (the last def of a name) and, for each name, the
    calls ``name(...)`` and the references to it anywhere in the file (see _references)."""

    functions: dict
    calls: dict
    refs: dict


def _function_names(ctx) -> frozenset:
    return frozenset(s.name.value for s in ctx.module.body if isinstance(s, cst.FunctionDef))


def _uses_part(ctx, stmt: cst.BaseStatement, names: frozenset):
    calls: dict = {}
    for n in astutil.walk(stmt, into_functions=True):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in names:
            calls.setdefault(n.func.value, []).append(n)
    refs = _references(stmt, names)
    return (stmt if isinstance(stmt, cst.FunctionDef) else None), calls, refs


def _uses_combine(ctx, parts, names: frozenset) -> FunctionUses:
    functions: dict = {}
    calls: dict = {name: [] for name in names}
    refs: dict = {name: 0 for name in names}
    for fn, part_calls, part_refs in parts:
        if fn is not None:
            functions[fn.name.value] = fn
        for name, found in part_calls.items():
            calls[name].extend(found)
        for name, count in part_refs.items():
            refs[name] += count
    return FunctionUses(functions, {k: tuple(v) for k, v in calls.items()}, refs)


_FUNCTION_USES = StatementFact(_uses_part, _uses_combine, _function_names, name="jx308_function_uses")
