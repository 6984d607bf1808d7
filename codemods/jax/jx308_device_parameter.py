from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

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

    def visit_Module(self, node: cst.Module) -> None:
        functions = {s.name.value: s for s in node.body if isinstance(s, cst.FunctionDef)}
        calls: dict[str, list[cst.Call]] = {name: [] for name in functions}
        for n in astutil.walk(node, into_functions=True):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in calls:
                calls[n.func.value].append(n)
        refs = {name: _references(node, name) for name in functions}
        for name, fn in functions.items():
            params = list(fn.params.params)
            at = next((i for i, p in enumerate(params) if p.name.value in _NAMES and p.default is None), None)
            if at is None or fn.params.posonly_params or fn.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None):
                continue
            pname = params[at].name.value
            if pname in lp.reads(fn.body):
                continue
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
                continue
            new_params = [p for i, p in enumerate(params) if i != at]
            if new_params:
                new_params[-1] = new_params[-1].with_changes(comma=params[-1].comma if at != len(params) - 1 else cst.MaybeSentinel.DEFAULT)
            edits.append(self.replace(fn.params, fn.params.with_changes(params=new_params)))
            safety = Safety.SAFE if name.startswith("_") else Safety.UNSAFE
            self.report(fn, f"`{pname}` is not used by {name}() any more (JAX places arrays itself): parameter and arguments removed",
                        Fix(tuple(edits), safety))


def _references(module: cst.Module, name: str) -> int:
    """How many times ``name`` is referred to as a variable (the def itself included), not
    counting attribute names, keyword names and functions that bind ``name`` locally."""
    count = 0
    stack: list[cst.CSTNode] = [module]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.FunctionDef):
            if n.name.value == name:
                count += 1
            if name in lp.function_locals(n):
                continue
            stack.append(n.body)
            continue
        if isinstance(n, cst.Name):
            count += n.value == name
            continue
        if isinstance(n, cst.Attribute):
            stack.append(n.value)
            continue
        if isinstance(n, cst.Arg):
            stack.append(n.value)
            continue
        stack.extend(astutil.children(n))
    return count


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
