from typing import Optional

import libcst as cst

from porter.astutil import arg, insert_before, target_names, walk
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _training as tr
from ._devices import places_on_device

# Torch calls that make a new CPU tensor; moved with `.to(device)` after them, so the values
# (random ones included: the CPU generator makes them) stay the original's.
_FACTORIES = (
    "torch.from_numpy", "torch.tensor", "torch.as_tensor", "torch.Tensor", "torch.FloatTensor",
    "torch.LongTensor", "torch.randn", "torch.rand", "torch.randint", "torch.randperm", "torch.zeros",
    "torch.ones", "torch.full", "torch.empty", "torch.arange", "torch.linspace", "torch.eye",
)
# Calls whose result is a Python number, not a tensor.
_SCALAR_CALLS = ("builtins.len", "builtins.int", "builtins.float", "builtins.round")
_SCALAR_METHODS = ("size", "item", "numel", "dim")
# Methods that copy a tensor to the host; on an XLA tensor they need `.cpu()` first.
_HOST_METHODS = ("numpy",)
_HOST_RESULT_METHODS = ("numpy", "item", "tolist")
# Builtins that take an XLA tensor as they take a CPU one (they format it, or read a number).
_TAKE_XLA = ("builtins.print", "builtins.str", "builtins.repr", "builtins.float", "builtins.int", "builtins.len")


class _Refused(Exception):
    def __init__(self, node: cst.CSTNode, why: str) -> None:
        super().__init__(why)
        self.node = node
        self.why = why


def _is_number(expr: cst.CSTNode) -> bool:
    if isinstance(expr, cst.UnaryOperation):
        expr = expr.expression
    return isinstance(expr, (cst.Integer, cst.Float))


class PlaceCpuModel(Rule):
    """
    ## What it does
    In a script that places nothing on a device (a CPU-only tutorial: no `.to(...)`, no
    `.cuda()`, no `device=`), places each trained model on the XLA device where it is built
    (`model = nn.Linear(1, 1).to(torch_xla.device())`, before its optimizer is made), and the
    tensors its steps take where the script makes them: `inputs = torch.from_numpy(x)`,
    `torch.tensor(...)`, `torch.randn(...)` get `.to(torch_xla.device())`. A `.numpy()` of a
    value computed on the device gets `.cpu()` first. The DataLoader loops that feed the model
    are left to TX301, which wraps them in `pl.MpDeviceLoader` once the model is on a device.

    A trained model is a name whose `.parameters()` an optimizer (`torch.optim.*`) is built
    from, bound once in its scope (the module or a function) to a constructor call.

    ## Why
    Without it the port of a CPU-only script trains on the CPU: no XLA computation runs at all.

    ## Fix safety
    Safe when porter can follow every tensor the model meets, and only then: every argument of
    a model call, and every tensor combined with a value computed from the model (a loss's
    target, a compared label), is a tensor the fix places (a torch factory call, a batch of a
    DataLoader loop TX301 wraps, or a method chain on one of them) or a Python number, and the
    device values go only to torch functions, their own methods, the loss modules the script
    builds, `print`/`str.format`, or `.numpy()` (given `.cpu()`). Random tensors are made on
    the CPU as before and then moved, so they hold the original's numbers. Anything else (the
    model passed to a function, a device value passed to `plt.plot`, a tensor porter cannot
    trace, a model used inside another function) is reported at its line, and nothing is
    moved.
    """

    code = "TX109"
    name = "place-cpu-model"
    target = "torch-xla"
    summary = "CPU-only script: build the trained model on torch_xla.device() and move the tensors it takes"
    severity = Severity.WARNING
    needs_text = ("parameters",)
    examples = [
        Example(
            """
            import numpy as np
            import torch
            import torch.nn as nn

            x_train = np.random.rand(16, 1).astype(np.float32)
            y_train = 2 * x_train
            model = nn.Linear(1, 1)
            criterion = nn.MSELoss()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for epoch in range(10):
                inputs = torch.from_numpy(x_train)
                targets = torch.from_numpy(y_train)
                loss = criterion(model(inputs), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                print('loss {:.4f}'.format(loss.item()))
            predicted = model(torch.from_numpy(x_train)).detach().numpy()
            """,
            """
            import numpy as np
            import torch
            import torch.nn as nn
            import torch_xla

            x_train = np.random.rand(16, 1).astype(np.float32)
            y_train = 2 * x_train
            model = nn.Linear(1, 1).to(torch_xla.device())
            criterion = nn.MSELoss()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for epoch in range(10):
                inputs = torch.from_numpy(x_train).to(torch_xla.device())
                targets = torch.from_numpy(y_train).to(torch_xla.device())
                loss = criterion(model(inputs), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                print('loss {:.4f}'.format(loss.item()))
            predicted = model(torch.from_numpy(x_train).to(torch_xla.device())).detach().cpu().numpy()
            """,
            title="numpy-made inputs at top level",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            def main():
                net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
                opt = torch.optim.Adam(net.parameters(), lr=1e-3)
                x = torch.randn(10, 3)
                y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 0])
                for step in range(5):
                    out = net(x)
                    loss = nn.functional.cross_entropy(out, y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                correct = (out.argmax(1) == y).sum()
                print(100 * correct / len(y))
            """,
            """
            import torch
            import torch.nn as nn
            import torch_xla

            def main():
                net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).to(torch_xla.device())
                opt = torch.optim.Adam(net.parameters(), lr=1e-3)
                x = torch.randn(10, 3).to(torch_xla.device())
                y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 0]).to(torch_xla.device())
                for step in range(5):
                    out = net(x)
                    loss = nn.functional.cross_entropy(out, y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                correct = (out.argmax(1) == y).sum()
                print(100 * correct / len(y))
            """,
            title="a model built in a function, torch-made inputs",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            w = torch.tensor(2., requires_grad=True)
            (w * 3).backward()
            print(w.grad)
            layer = nn.Linear(3, 2)
            optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
            inputs = torch.randn(10, 3)
            targets = torch.randn(10, 2)
            loss = nn.MSELoss()(layer(inputs), targets)
            loss.backward()
            optimizer.step()
            """,
            """
            import torch
            import torch.nn as nn
            import torch_xla

            w = torch.tensor(2., requires_grad=True)
            torch_xla.device()  # start XLA before the first backward pass: one run on the CPU before it breaks the later ones on XLA
            (w * 3).backward()
            print(w.grad)
            layer = nn.Linear(3, 2).to(torch_xla.device())
            optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
            inputs = torch.randn(10, 3).to(torch_xla.device())
            targets = torch.randn(10, 2).to(torch_xla.device())
            loss = nn.MSELoss()(layer(inputs), targets)
            loss.backward()
            optimizer.step()
            """,
            title="a backward pass on the CPU before the model is built",
        ),
        Example(
            """
            import torch
            import torch.nn as nn
            import matplotlib.pyplot as plt

            model = nn.Linear(1, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            x = torch.linspace(0, 1, 8).reshape(8, 1)
            loss = (model(x) - 2 * x).pow(2).mean()
            loss.backward()
            optimizer.step()
            plt.plot(x, model(x).detach())
            """,
            None,
            title="a device value handed to another library is reported",
        ),
    ]
    valid = [
        "import torch\nmodel = Net().cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\ndevice = torch.device('cpu')\nmodel = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\nx = torch.randn(3)\nprint(x.sum())\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if places_on_device(self.ctx):
            return
        scopes: list[cst.CSTNode] = [node] + [n for n in walk(node, into_functions=True) if isinstance(n, cst.FunctionDef)]
        edits: list[Edit] = []
        first: Optional[cst.CSTNode] = None
        names: list[str] = []
        refused: list[_Refused] = []
        for scope in scopes:
            try:
                found = _Scope(scope, node, self.ctx).plan()
            except _Refused as why:
                refused.append(why)
                continue
            for model_node, model_name, scope_edits in found:
                first = first or model_node
                names.append(model_name)
                edits.extend(e for e in scope_edits if e not in edits)
        for why in refused:
            self.report(why.node, f"this script places nothing on a device, so its port would train on the CPU; "
                        f"porter does not move the model to torch_xla.device() because {why.why}: move it, and "
                        "every tensor it takes, by hand")
        if refused or first is None:
            return
        xla = self.ctx.module_alias("torch_xla")
        self.report(
            first,
            f"this script places nothing on a device, so its port would train on the CPU: {', '.join(names)} "
            f"built on {xla}.device(), with the tensors its steps take",
            Fix(tuple(edits), imports=("torch_xla",)),
        )


class _Scope:
    """The placement plan of one scope (the module or a function). Bindings are followed in the
    order of the text: a use reads the nearest binding of its name before it."""

    def __init__(self, scope: cst.CSTNode, module: cst.Module, ctx) -> None:
        self.scope = scope
        self.module = module
        self.ctx = ctx
        self.nodes = list(walk(scope))
        self.order = {id(n): i for i, n in enumerate(self.nodes)}
        self.end = {}
        for n in self.nodes:
            if isinstance(n, (cst.Assign, cst.AugAssign)):
                self.end[id(n)] = max(self.order[id(m)] for m in walk(n))
        self.xla = f"{ctx.module_alias('torch_xla')}.device()"
        self.edits: dict[tuple[int, str], Edit] = {}
        self.models: list[str] = []
        self.device: set[int] = set()  # bindings (their nodes) whose value is on the device
        self._binds: dict[str, list[tuple[int, cst.CSTNode, Optional[cst.BaseExpression]]]] = {}
        self._loss_names: Optional[set[str]] = None

    # -- what the scope binds -------------------------------------------------------------
    def _bindings(self, name: str) -> list[tuple[int, cst.CSTNode, Optional[cst.BaseExpression]]]:
        """(position, binding node, value) of every binding of ``name`` in the scope; the value is
        None for a loop target, a tuple element or a parameter. (The scope's nodes never change:
        kept per name.)"""
        if name in self._binds:
            return self._binds[name]
        found: list[tuple[int, cst.CSTNode, Optional[cst.BaseExpression]]] = []
        for n in self.nodes:
            if isinstance(n, cst.Assign):
                for t in n.targets:
                    if isinstance(t.target, cst.Name) and t.target.value == name:
                        found.append((self.end[id(n)], n, n.value))
                    elif name in target_names(t.target):
                        found.append((self.end[id(n)], n, None))
            elif isinstance(n, cst.AugAssign) and name in target_names(n.target):
                found.append((self.end[id(n)], n, n.value))
            elif isinstance(n, (cst.For, cst.CompFor)) and name in target_names(n.target):
                found.append((self.order[id(n)], n, None))
            elif isinstance(n, cst.WithItem) and n.asname is not None and name in target_names(n.asname.name):
                found.append((self.order[id(n)], n, None))
            elif isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n is not self.scope and n.name.value == name:
                found.append((self.order[id(n)], n, None))
        if isinstance(self.scope, cst.FunctionDef):
            for p in tr._all_params(self.scope.params):
                if p.name.value == name:
                    found.append((-1, p, None))
        self._binds[name] = found
        return found

    def _reaching(self, name: str, at: cst.CSTNode):
        where = self.order.get(id(at), len(self.nodes))
        before = [b for b in self._bindings(name) if b[0] < where]
        return max(before, key=lambda b: b[0]) if before else None

    def _models(self) -> list[tuple[str, cst.Call]]:
        models: list[tuple[str, cst.Call]] = []
        for n in self.nodes:
            if not isinstance(n, cst.Call):
                continue
            qual = self.ctx.qualname(n.func) or ""
            if not qual.startswith("torch.optim.") or ".lr_scheduler" in qual:
                continue
            for a in n.args:
                v = a.value
                if isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value == "parameters" \
                        and isinstance(v.func.value, cst.Name) and v.func.value.value not in [m for m, _ in models]:
                    models.append((v.func.value.value, n))
        return models

    # -- the plan -------------------------------------------------------------------------
    def plan(self) -> list[tuple[cst.CSTNode, str, list[Edit]]]:
        models = self._models()
        if not models:
            return []
        self.models = [m for m, _ in models]
        built = []
        for name, optimizer in models:
            binds = self._bindings(name)
            if len(binds) != 1 or not isinstance(binds[0][2], cst.Call) \
                    or (self.ctx.qualname(binds[0][2].func) or "") in _FACTORIES:
                raise _Refused(optimizer, f"`{name}` is not bound once, to a constructor call, in the scope of its optimizer")
            self._model_uses(name)
            self._move(binds[0][2])
            built.append((binds[0][1], name))
        self._start_before_backward([node for node, _ in built])
        done = -1
        while done != len(self.edits):  # each tensor moved is a device value whose uses are checked in turn
            done = len(self.edits)
            self._device_values()
            self._consumers()
        edits = list(self.edits.values())
        return [(node, name, edits) for node, name in built]

    def _start_before_backward(self, bindings: list[cst.CSTNode]) -> None:
        """A backward pass on the CPU before the XLA runtime starts breaks every later backward
        pass on XLA (torch 2.9 / torch_xla 2.9, measured: the autograd engine's INTERNAL ASSERT
        `device.index() < device_ready_queues_.size()`): where the scope runs one before the
        model is built, the device is asked for first."""
        if isinstance(self.scope, cst.FunctionDef) and not isinstance(self.scope.body, cst.IndentedBlock):
            return  # `def f(): ...` on one line: no statement to put before
        body = self.scope.body.body if isinstance(self.scope, cst.FunctionDef) else self.scope.body
        statements = list(body)

        def index(of) -> Optional[int]:
            for i, stmt in enumerate(statements):
                if any(of(n) for n in walk(stmt)):
                    return i
            return None

        backward = index(lambda n: isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                         and n.func.attr.value == "backward")
        built = index(lambda n: any(n is b for b in bindings))
        if backward is None or built is None or backward > built:
            return
        start = cst.parse_statement(f"{self.xla}  # start XLA before the first backward pass: one run on the CPU "
                                    "before it breaks the later ones on XLA\n")
        self.edits[(id(statements[backward]), "start")] = Edit(statements[backward], insert_before([start]))

    def _model_uses(self, name: str) -> None:
        """The model is only called, read by attribute, or bound; in no other function or class."""
        inner = [n for n in walk(self.scope, into_functions=True)
                 if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) and n is not self.scope]
        for fn in inner:
            for n in walk(fn, into_functions=True):
                if isinstance(n, cst.Name) and n.value == name:
                    raise _Refused(n, f"the model `{name}` is used inside another function or class")
        allowed = set()
        for n in self.nodes:
            if isinstance(n, cst.Call):
                allowed.add(id(n.func))
            elif isinstance(n, cst.Attribute):
                allowed.add(id(n.value))
            elif isinstance(n, cst.Assign):
                allowed.update(id(t.target) for t in n.targets)
        for n in self.nodes:
            if isinstance(n, cst.Name) and n.value == name and id(n) not in allowed:
                raise _Refused(n, f"the model `{name}` is handed on as a value, and porter does not follow it")

    def _device_values(self) -> None:
        """Bindings whose value is computed on the device: a model call, or an expression of
        device values that does not end in a host read (`.item()`, `.numpy()`)."""
        changed = True
        while changed:
            changed = False
            for n in self.nodes:
                if isinstance(n, (cst.Assign, cst.AugAssign)) and id(n) not in self.device \
                        and self._is_device(n.value, n):
                    self.device.add(id(n))
                    changed = True

    def _is_device(self, expr: cst.CSTNode, at: cst.CSTNode) -> bool:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) \
                and expr.func.attr.value in _HOST_RESULT_METHODS + _SCALAR_METHODS:
            return False
        return self._touches(expr, at)

    def _touches(self, expr: cst.CSTNode, at: Optional[cst.CSTNode] = None) -> bool:
        for n in walk(expr):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in self.models:
                return True
            if isinstance(n, cst.Call) and (id(n), "to") in self.edits:
                return True
            if isinstance(n, cst.Name) and n.value not in self.models:
                b = self._reaching(n.value, at if at is not None else n)
                if b is not None and id(b[1]) in self.device:
                    return True
        return False

    def _losses(self) -> set[str]:
        """Names bound (anywhere in the file, only) to a torch.nn module: the loss modules."""
        if self._loss_names is not None:
            return self._loss_names
        found: dict[str, bool] = {}
        for n in walk(self.module, into_functions=True):
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name):
                name = n.targets[0].target.value
                ok = isinstance(n.value, cst.Call) and (self.ctx.qualname(n.value.func) or "").startswith("torch.nn.")
                found[name] = found.get(name, True) and ok
        self._loss_names = {k for k, v in found.items() if v}
        return self._loss_names

    def _consumers(self) -> None:
        losses = self._losses()
        for n in self.nodes:
            if isinstance(n, cst.Call):
                func = n.func
                if isinstance(func, cst.Name) and func.value in self.models:
                    for a in n.args:
                        self._need(a.value, n)
                    continue
                if isinstance(func, cst.Attribute) and func.attr.value in _HOST_METHODS and self._touches(func.value, n):
                    self.edits.setdefault((id(func.value), "cpu"), Edit(func.value, _then_cpu))
                    continue
                args = [a.value for a in n.args]
                if not any(self._touches(a, n) for a in args):
                    continue
                qual = self.ctx.qualname(func) or ""
                if qual in _TAKE_XLA or (isinstance(func, cst.Attribute) and func.attr.value == "format"):
                    continue
                receiver = isinstance(func, cst.Attribute) and self._touches(func.value, n)
                module = isinstance(func, cst.Call) and (self.ctx.qualname(func.func) or "").startswith("torch.nn.")
                if receiver or module or qual.startswith("torch.") or (isinstance(func, cst.Name) and func.value in losses):
                    for a in args:
                        if not self._touches(a, n):
                            self._need(a, n)
                    continue
                raise _Refused(n, f"a value computed on the device goes to `{cst.Module([]).code_for_node(func)}`, "
                               "which porter cannot prove takes an XLA tensor")
            elif isinstance(n, cst.BinaryOperation):
                sides = [n.left, n.right]
            elif isinstance(n, cst.Comparison):
                sides = [n.left, *[c.comparator for c in n.comparisons]]
            else:
                continue
            if any(self._touches(s, n) for s in sides):
                for s in sides:
                    if not self._touches(s, n):
                        self._need(s, n)

    def _need(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> None:
        """``expr`` meets a device value at ``at``: make sure it is on the device or a number."""
        if depth > 8:
            raise _Refused(at, "porter cannot trace where a tensor the model takes is made")
        if _is_number(expr) or isinstance(expr, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
            return
        if self._touches(expr, at):
            return
        if isinstance(expr, cst.Call):
            qual = self.ctx.qualname(expr.func) or ""
            if qual in _FACTORIES:
                self._move(expr, factory=True)
                return
            if qual in _SCALAR_CALLS or (isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SCALAR_METHODS):
                return
        if isinstance(expr, cst.BinaryOperation):
            self._need(expr.left, at, depth + 1)
            self._need(expr.right, at, depth + 1)
            return
        if isinstance(expr, cst.Name):
            b = self._reaching(expr.value, at)
            if b is None:
                raise _Refused(at, f"`{expr.value}`, which meets the model's values, is not bound in this scope before it")
            _, node, value = b
            if isinstance(node, cst.For):
                plan = tr.plan_loader_wrap(node, self.ctx)
                if plan is None or plan.problem is not None:
                    raise _Refused(at, f"`{expr.value}` comes from a loop that is not over a DataLoader "
                                   "pl.MpDeviceLoader can wrap")
                return
            if value is None:
                raise _Refused(at, f"porter cannot trace where `{expr.value}`, which meets the model's values, is made")
            if isinstance(value, cst.Call) and (self.ctx.qualname(value.func) or "") in _FACTORIES:
                self._move(value, factory=True)
                self.device.add(id(node))
                return
            self._need(value, node, depth + 1)
            return
        receiver = None
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and self.ctx.qualname(expr.func) is None:
            receiver = expr.func.value  # a method of the tensor: `x.reshape(-1, n)`, `x.float()`
        elif isinstance(expr, (cst.Attribute, cst.Subscript)) and self.ctx.qualname(expr) is None:
            receiver = expr.value  # `outputs.data`, `batch['x']`
        if receiver is not None:
            self._need(receiver, at, depth + 1)
            return
        raise _Refused(at, f"porter cannot trace where `{cst.Module([]).code_for_node(expr)}`, which meets the "
                       "model's values, is made")

    def _move(self, call: cst.Call, factory: bool = False) -> None:
        if (id(call), "to") in self.edits:
            return
        if factory and arg(call, "requires_grad") is not None:
            raise _Refused(call, "a tensor the model takes is made with requires_grad (moving it would make it a non-leaf)")
        device = self.xla

        def to_device(updated: cst.CSTNode) -> cst.CSTNode:
            return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("to")),
                            args=[cst.Arg(cst.parse_expression(device))])

        self.edits[(id(call), "to")] = Edit(call, to_device)


def _then_cpu(updated: cst.CSTNode) -> cst.CSTNode:
    return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("cpu")))
