from typing import Optional

import libcst as cst

from porter.astutil import arg, insert_before, method_name, params, root_name, target_names, walk
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
# Factories that take `device=`: made on the input's device in a module's own methods. The
# random ones are made on the CPU (the CPU generator: the original's numbers) and moved.
_DEVICE_KWARG = (
    "torch.tensor", "torch.as_tensor", "torch.zeros", "torch.ones", "torch.full", "torch.empty", "torch.arange",
    "torch.linspace", "torch.eye",
)
_RANDOM = ("torch.randn", "torch.rand", "torch.randint", "torch.randperm")
# `Variable(x)` is x (torch >= 0.4).
_IDENTITY = ("torch.autograd.Variable", "torch.autograd.variable.Variable")
# Methods and attributes only a tensor has: a method parameter read with one is a tensor.
_TENSOR_ONLY = frozenset({
    "shape", "size", "dim", "view", "reshape", "device", "dtype", "unsqueeze", "squeeze", "permute", "transpose",
    "contiguous", "flatten", "expand", "new_zeros", "new_ones", "new_full", "new_empty", "float", "long", "numel",
})
# Calls whose result is a Python number, not a tensor.
_SCALAR_CALLS = ("builtins.len", "builtins.int", "builtins.float", "builtins.round")
_SCALAR_METHODS = ("size", "item", "numel", "dim")
# Methods that copy a tensor to the host; on an XLA tensor they need `.cpu()` first.
_HOST_METHODS = ("numpy",)
_HOST_RESULT_METHODS = ("numpy", "item", "tolist")
# Builtins that take an XLA tensor as they take a CPU one (they format it, or read a number).
_TAKE_XLA = ("builtins.print", "builtins.str", "builtins.repr", "builtins.float", "builtins.int", "builtins.len",
             "builtins.zip", "builtins.enumerate", "builtins.reversed")


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
    (`model = nn.Linear(1, 1).to(torch_xla.device())`, before its optimizer is made; a model
    built again, to load saved weights, too), and the tensors its steps take where the script
    makes them: `inputs = torch.from_numpy(x)`, `torch.tensor(...)`, `torch.randn(...)`, a
    function of the file that returns a new tensor (`encode(words)`), get
    `.to(torch_xla.device())`; a batch taken with `next(iter(loader))` is moved where the model
    takes it. A `.numpy()` of a value computed on the device gets `.cpu()` first. The
    DataLoader loops that feed the model are left to TX301, which wraps them in
    `pl.MpDeviceLoader` once the model is on a device.

    The model's own classes make their tensors where their input is: a factory call in a
    method (`h = torch.zeros(x.size(0), self.hidden)`) gets `device=x.device` of a parameter
    the method reads as a tensor, or, in a method of the trained model with no such parameter
    (`init_hidden(self)`), `device=next(self.parameters()).device`; a random one is made as
    before and moved (`torch.randn(...).to(x.device)`).

    A trained model is a name whose `.parameters()` an optimizer (`torch.optim.*`) is built
    from, or whose parameters a loop updates in place in a scope with a backward pass
    (`for p in model.parameters(): p -= lr * p.grad`), bound in its scope (the module or a
    function) only to constructor calls.

    ## Why
    Without it the port of a CPU-only script trains on the CPU: no XLA computation runs at all.

    ## Fix safety
    Safe when porter can follow every tensor the model meets, and only then: every argument of
    a model call, and every tensor combined with a value computed from the model (a loss's
    target, a compared label, a sum it is added into), is a tensor the fix places (a torch
    factory call, a function of the file returning one, a batch of a DataLoader loop TX301
    wraps or of `next(iter(loader))`, a torch function or method chain of them) or a Python
    number, and the device values (outputs, parameters, layers read from the model) go only to
    torch functions, their own methods, the loss modules the script builds, `print`, f-strings
    and `str.format`, `zip`/`enumerate`, a list the script appends them to, or `.numpy()`
    (given `.cpu()`). Random tensors are made on the CPU as before and then moved, so they
    hold the original's numbers. Anything else (the model passed to a function, a device value
    passed to `plt.plot` or `np.mean`, a tensor porter cannot trace, a model used inside
    another function, a tensor the model keeps as a plain attribute, which `.to()` does not
    move, a tensor a module's method makes with no device to take) is reported at its line,
    and nothing is moved.
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


            class Rnn(nn.Module):
                def __init__(self, n_in, n_hidden):
                    super().__init__()
                    self.n_hidden = n_hidden
                    self.cell = nn.GRUCell(n_in, n_hidden)

                def init_hidden(self):
                    return torch.zeros(1, self.n_hidden)

                def forward(self, seq, h):
                    h = h.expand(seq.size(0), -1) + torch.randn(seq.size(0), self.n_hidden) * 0.01
                    for t in range(seq.size(1)):
                        h = self.cell(seq[:, t], h)
                    return h.sum(1)


            x = torch.randn(4, 5, 3)
            y = torch.randn(4)
            rnn = Rnn(3, 8)
            for step in range(10):
                loss = ((rnn(x, rnn.init_hidden()) - y) ** 2).mean()
                rnn.zero_grad()
                loss.backward()
                with torch.no_grad():
                    for p in rnn.parameters():
                        p -= 0.01 * p.grad
            """,
            """
            import torch
            import torch.nn as nn
            import torch_xla


            class Rnn(nn.Module):
                def __init__(self, n_in, n_hidden):
                    super().__init__()
                    self.n_hidden = n_hidden
                    self.cell = nn.GRUCell(n_in, n_hidden)

                def init_hidden(self):
                    return torch.zeros(1, self.n_hidden, device=next(self.parameters()).device)

                def forward(self, seq, h):
                    h = h.expand(seq.size(0), -1) + torch.randn(seq.size(0), self.n_hidden).to(seq.device) * 0.01
                    for t in range(seq.size(1)):
                        h = self.cell(seq[:, t], h)
                    return h.sum(1)


            x = torch.randn(4, 5, 3).to(torch_xla.device())
            y = torch.randn(4).to(torch_xla.device())
            rnn = Rnn(3, 8).to(torch_xla.device())
            for step in range(10):
                loss = ((rnn(x, rnn.init_hidden()) - y) ** 2).mean()
                rnn.zero_grad()
                loss.backward()
                with torch.no_grad():
                    for p in rnn.parameters():
                        p -= 0.01 * p.grad
            """,
            title="parameters updated by hand; tensors the model's own methods make",
        ),
        Example(
            """
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, TensorDataset


            def encode(words, vocab):
                return torch.tensor([vocab[w] for w in words])


            data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
            loader = DataLoader(data, batch_size=16)
            model = nn.Linear(8, 3)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for inputs, labels in loader:
                loss = nn.functional.cross_entropy(model(inputs), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
            torch.save(model.state_dict(), "model.pth")

            model = nn.Linear(8, 3)
            model.load_state_dict(torch.load("model.pth"))
            images, targets = next(iter(loader))
            print((model(images).argmax(1) == targets).sum().item())
            """,
            """
            import torch
            import torch.nn as nn
            from torch.utils.data import DataLoader, TensorDataset
            import torch_xla


            def encode(words, vocab):
                return torch.tensor([vocab[w] for w in words])


            data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
            loader = DataLoader(data, batch_size=16)
            model = nn.Linear(8, 3).to(torch_xla.device())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for inputs, labels in loader:
                loss = nn.functional.cross_entropy(model(inputs), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
            torch.save(model.state_dict(), "model.pth")

            model = nn.Linear(8, 3).to(torch_xla.device())
            model.load_state_dict(torch.load("model.pth"))
            images, targets = next(iter(loader))
            print((model(images.to(torch_xla.device())).argmax(1) == targets.to(torch_xla.device())).sum().item())
            """,
            title="a model built again to load its weights, a batch taken with next(iter(loader))",
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
        edits: dict[tuple[int, str], Edit] = {}
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
                if model_name not in names:
                    names.append(model_name)
                for key, edit in scope_edits.items():  # a class two scopes build is edited once
                    edits.setdefault(key, edit)
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
            Fix(tuple(edits.values()), imports=("torch_xla",)),
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

    def _models(self) -> list[tuple[str, cst.CSTNode]]:
        """The trained models of the scope, each with the node that trains it: a name whose
        `.parameters()` a `torch.optim` optimizer is built from, or whose parameters a loop of a
        scope with a backward pass updates by hand (`for p in model.parameters(): p -= lr * p.grad`)."""
        models: list[tuple[str, cst.CSTNode]] = []

        def add(owner: cst.CSTNode, trainer: cst.CSTNode) -> None:
            if isinstance(owner, cst.Call) and isinstance(owner.func, cst.Attribute) \
                    and owner.func.attr.value == "parameters" and isinstance(owner.func.value, cst.Name) \
                    and owner.func.value.value not in [m for m, _ in models]:
                models.append((owner.func.value.value, trainer))

        backward = any(method_name(n) == "backward" for n in self.nodes)
        for n in self.nodes:
            if isinstance(n, cst.For) and backward and _updates_target(n):
                add(n.iter, n)
            if not isinstance(n, cst.Call):
                continue
            qual = self.ctx.qualname(n.func) or ""
            if qual.startswith("torch.optim.") and ".lr_scheduler" not in qual:
                for a in n.args:
                    add(a.value, n)
        return models

    # -- the plan -------------------------------------------------------------------------
    def plan(self) -> list[tuple[cst.CSTNode, str, dict[tuple[int, str], Edit]]]:
        models = self._models()
        if not models:
            return []
        self.models = [m for m, _ in models]
        built = []
        for name, trainer in models:
            binds = self._bindings(name)
            constructors = [b for b in binds if isinstance(b[2], cst.Call) and isinstance(b[1], cst.Assign)
                            and (self.ctx.qualname(b[2].func) or "") not in _FACTORIES]
            if not binds or len(constructors) != len(binds):
                raise _Refused(trainer, f"`{name}` is not bound only to constructor calls in the scope that trains it")
            for _, node, value in constructors:  # a model built again (to load saved weights) is moved too
                self._move(value)  # type: ignore[arg-type]
                built.append((node, name))
        self.models.extend(self._parts())
        for name in self.models:
            self._model_uses(name)
        self._module_code(built)
        self._start_before_backward([node for node, _ in built])
        done = -1
        while done != len(self.edits):  # each tensor moved is a device value whose uses are checked in turn
            done = len(self.edits)
            self._device_values()
            self._consumers()
        return [(node, name, self.edits) for node, name in built]

    def _parts(self) -> list[str]:
        """Names bound once to a part of a model (`layer = model[0]`, `head = model.fc`): modules
        on the device like the model."""
        parts = []
        for n in self.nodes:
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name) \
                    and isinstance(n.value, (cst.Subscript, cst.Attribute)) and root_name(n.value) in self.models:
                name = n.targets[0].target.value
                if name not in self.models and len(self._bindings(name)) == 1:
                    parts.append(name)
        return parts

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
            elif isinstance(n, (cst.Attribute, cst.Subscript)):
                allowed.add(id(n.value))
            elif isinstance(n, cst.Assign):
                allowed.update(id(t.target) for t in n.targets)
        for n in self.nodes:
            if isinstance(n, cst.Name) and n.value == name and id(n) not in allowed:
                raise _Refused(n, f"the model `{name}` is handed on as a value, and porter does not follow it")

    def _device_values(self) -> None:
        """Bindings whose value is computed on the device: a model call, or an expression of
        device values that does not end in a host read (`.item()`, `.numpy()`)."""
        for n in self.nodes:
            if isinstance(n, cst.For) and method_name(n.iter) == "parameters" \
                    and root_name(n.iter.func.value) in self.models:  # type: ignore[attr-defined,operator]
                self.device.add(id(n))
        changed = True
        while changed:
            changed = False
            for n in self.nodes:
                if isinstance(n, (cst.Assign, cst.AugAssign, cst.For)) and id(n) not in self.device \
                        and self._is_device(n.iter if isinstance(n, cst.For) else n.value, n):
                    self.device.add(id(n))  # a loop over device values (`zip(labels, predictions)`) binds them
                    changed = True

    def _is_device(self, expr: cst.CSTNode, at: cst.CSTNode) -> bool:
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) \
                and expr.func.attr.value in _HOST_RESULT_METHODS + _SCALAR_METHODS:
            return False
        return self._touches(expr, at)

    def _touches(self, expr: cst.CSTNode, at: Optional[cst.CSTNode] = None) -> bool:
        nodes = list(_value_nodes(expr))
        methods = {id(n.func) for n in nodes if isinstance(n, cst.Call)}
        for n in nodes:
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in self.models:
                return True
            if (id(n), "to") in self.edits:
                return True
            if isinstance(n, (cst.Attribute, cst.Subscript)) and id(n) not in methods \
                    and isinstance(n.value, cst.Name) and n.value.value in self.models:
                return True  # a parameter, buffer or layer of a model: `model.fc.weight`, `model[0]`
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
                if isinstance(func, cst.Attribute) and self._touches(func.value, n):
                    for value in args:  # `x.pow(p)` with `p = torch.tensor([1, 2, 3])`: moved too
                        if not self._touches(value, n) and self._made_tensor(value, n):
                            self._need(value, n)
                if not any(self._touches(a, n) for a in args):
                    continue
                qual = self.ctx.qualname(func) or ""
                if qual in _TAKE_XLA or (isinstance(func, cst.Attribute) and func.attr.value == "format"):
                    continue
                if self._list_append(n):
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
            elif isinstance(n, cst.AugAssign):
                sides = [n.target, n.value]  # `total += loss.data`: the sum is on the device too
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
            if qual in _FACTORIES or self._makes_tensor(expr):
                self._move(expr, factory=qual in _FACTORIES)
                return
            if qual in _SCALAR_CALLS or (isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SCALAR_METHODS):
                return
            if qual in _IDENTITY and len(expr.args) >= 1 and expr.args[0].keyword is None:
                self._need(expr.args[0].value, at, depth + 1)
                return
            if qual.startswith("torch.") and not qual.startswith("torch.nn.") and qual.count(".") == 1:
                # a torch function of CPU tensors (`torch.cos(xs)`, `torch.cat([a, b], 1)`): its
                # tensors on the device put its result there
                for a in expr.args:
                    if a.keyword is not None or a.star:
                        continue
                    parts = a.value.elements if isinstance(a.value, (cst.List, cst.Tuple)) else [a.value]
                    for part in parts:
                        self._need(part.value if isinstance(part, cst.BaseElement) else part, at, depth + 1)
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
            if value is None and self._loader_batch(node):
                self._move(expr)  # `images, labels = next(iter(test_loader))`: moved where the model takes it
                return
            if isinstance(node, cst.For):
                plan = tr.plan_loader_wrap(node, self.ctx)
                if plan is None or plan.problem is not None:
                    raise _Refused(at, f"`{expr.value}` comes from a loop that is not over a DataLoader "
                                   "pl.MpDeviceLoader can wrap")
                return
            if value is None and isinstance(node, cst.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0].target, (cst.Tuple, cst.List)):
                self._need(node.value, node, depth + 1)  # `inputs, labels = data`: the parts of a batch
                return
            if value is None:
                raise _Refused(at, f"porter cannot trace where `{expr.value}`, which meets the model's values, is made")
            if isinstance(value, cst.Call) and ((self.ctx.qualname(value.func) or "") in _FACTORIES
                                                or self._makes_tensor(value)):
                self._move(value, factory=(self.ctx.qualname(value.func) or "") in _FACTORIES)
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

    def _list_append(self, call: cst.Call) -> bool:
        """`losses.append(loss)` onto a list the scope binds once to `[]`: the list then holds
        device values, and its own uses are checked as theirs."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "append" and isinstance(func.value, cst.Name)):
            return False
        binds = self._bindings(func.value.value)
        if len(binds) != 1 or not (isinstance(binds[0][2], cst.List) and not binds[0][2].elements):
            return False
        self.device.add(id(binds[0][1]))
        return True

    def _made_tensor(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Whether ``expr`` is, or names, a tensor this scope makes on the CPU (a factory call, a
        function of this file that returns one, a DataLoader batch)."""
        if isinstance(expr, cst.Name):
            b = self._reaching(expr.value, at)
            if b is None:
                return False
            if b[2] is None:
                return self._loader_batch(b[1])
            expr = b[2]
        return isinstance(expr, cst.Call) and ((self.ctx.qualname(expr.func) or "") in _FACTORIES
                                               or self._makes_tensor(expr))

    def _loader_batch(self, binding: cst.CSTNode) -> bool:
        """A tuple bound to one batch of a DataLoader: `x, y = next(iter(loader))`, or
        `next(batches)` with `batches = iter(loader)` bound before."""
        if not isinstance(binding, cst.Assign) or len(binding.targets) != 1:
            return False
        value = binding.value
        if not (isinstance(value, cst.Call) and self.ctx.qualname(value.func) == "builtins.next" and value.args):
            return False
        source = value.args[0].value
        if isinstance(source, cst.Name):
            b = self._reaching(source.value, binding)
            source = b[2] if b is not None and b[2] is not None else source
        if not (isinstance(source, cst.Call) and self.ctx.qualname(source.func) == "builtins.iter" and source.args):
            return False
        loader = source.args[0].value
        return tr.loader_resolution(loader, self.ctx) == tr.DATALOADER

    def _makes_tensor(self, call: cst.Call) -> bool:
        """A call of a function of this file that returns a new CPU tensor on every path: each
        `return` gives a torch factory call, or a name the function binds once to one
        (`def encode(seq, table): return torch.tensor([table[s] for s in seq])`)."""
        if not isinstance(call.func, cst.Name):
            return False
        fn = next((s for s in self.module.body if isinstance(s, cst.FunctionDef) and s.name.value == call.func.value), None)
        if fn is None or fn.asynchronous is not None:
            return False
        returns = [n for n in walk(fn.body) if isinstance(n, cst.Return)]
        if not returns or any(isinstance(n, (cst.Yield, cst.Await)) for n in walk(fn.body)):
            return False
        for r in returns:
            value = r.value
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                    and self.ctx.qualname(value.func) is None \
                    and value.func.attr.value not in _HOST_RESULT_METHODS + _SCALAR_METHODS:
                value = value.func.value  # `return vec.view(1, -1)`: a view of the new tensor
            if isinstance(value, cst.Name):
                binds = [n for n in walk(fn.body) if isinstance(n, (cst.Assign, cst.AugAssign, cst.For))
                         and value.value in [t for tg in _targets(n) for t in target_names(tg)]]
                if len(binds) != 1 or not isinstance(binds[0], cst.Assign):
                    return False
                value = binds[0].value
            if not (isinstance(value, cst.Call) and (self.ctx.qualname(value.func) or "") in _FACTORIES):
                return False
        return True

    def _module_code(self, built: list[tuple[cst.CSTNode, str]]) -> None:
        """The models' own classes (and the classes of this file they build or derive from) make
        their tensors on their input's device: a factory call in a method other than
        `__init__` (`h = torch.zeros(x.size(0), self.hidden)`) gets `device=x.device` (a random
        one is made as before and moved: `.to(x.device)`), where `x` is a parameter of the method
        that it reads as a tensor only can be read (`x.size(0)`, `x.shape`, `x.view(...)`). A
        method with no such parameter, a tensor kept as a plain attribute (`self.mask =
        torch.ones(n)`: `.to()` does not move it), or a factory without a `device=` keyword
        (`torch.from_numpy`) stops the placement."""
        classes = {c.name.value: c for c in self.module.body if isinstance(c, cst.ClassDef)}
        values = [n.value for n, _ in built if isinstance(n, cst.Assign)]
        # the models' own classes: they have parameters (an optimizer is built on them)
        trained = {v.func.value for v in values if isinstance(v, cst.Call) and isinstance(v.func, cst.Name)}
        # and the classes of this file the constructor call builds (`nn.Sequential(Stem(), Head())`)
        todo = [n.func.value for v in values for n in walk(v) if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)]
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen or name not in classes:
                continue
            seen.add(name)
            cls = classes[name]
            todo.extend(b.value.value for b in cls.bases if isinstance(b.value, cst.Name))
            todo.extend(n.func.value for n in walk(cls, into_functions=True)
                        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name))
        for name in sorted(seen):
            methods = [m for m in classes[name].body.body if isinstance(m, cst.FunctionDef)]
            making = {m.name.value for m in methods if m.name.value != "__init__" and self._factory_calls(m)}
            for method in methods:
                self._method_factories(method, name in trained, making)

    def _factory_calls(self, method: cst.FunctionDef) -> list[cst.Call]:
        return [n for n in walk(method, into_functions=True) if isinstance(n, cst.Call)
                and (self.ctx.qualname(n.func) or "") in _FACTORIES and arg(n, "device") is None]

    def _method_factories(self, method: cst.FunctionDef, trained: bool, making: set[str]) -> None:
        calls = self._factory_calls(method)
        if method.name.value == "__init__":
            for n in walk(method, into_functions=True):
                if not (isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Attribute) for t in n.targets)):
                    continue
                made = any(c is n.value for c in calls) or (
                    isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Attribute)
                    and isinstance(n.value.func.value, cst.Name) and n.value.func.value.value == "self"
                    and n.value.func.attr.value in making)  # `self.hidden = self.init_hidden()`
                if made:
                    raise _Refused(n, "the model keeps a tensor as a plain attribute, which `.to(device)` does not "
                                   "move (register it with `self.register_buffer`)")
            return
        if not calls:
            return
        tensor = self._tensor_parameter(method)
        # a method of the trained model with no tensor to follow makes its tensors where the
        # model's parameters are (`def init_hidden(self): return torch.zeros(1, self.n)`)
        device = f"{tensor}.device" if tensor is not None else "next(self.parameters()).device" if trained else None
        for call in calls:
            qual = self.ctx.qualname(call.func) or ""
            if device is None or (qual not in _DEVICE_KWARG and qual not in _RANDOM):
                raise _Refused(call, f"`{method.name.value}` of the model makes this tensor on the CPU, and porter "
                               "cannot tell which device to make it on (give it `device=` of the input it meets)")
            if qual in _RANDOM:
                self._move(call, device=device)
            else:
                self.edits.setdefault((id(call), "device"), Edit(call, tr.append_kwarg("device", device)))

    @staticmethod
    def _tensor_parameter(method: cst.FunctionDef) -> Optional[str]:
        names = [p.name.value for p in params(method.params)][1:]
        for name in names:
            for n in walk(method.body):
                if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == name \
                        and n.attr.value in _TENSOR_ONLY:
                    return name
        return None

    def _move(self, call: cst.BaseExpression, factory: bool = False, device: Optional[str] = None) -> None:
        if (id(call), "to") in self.edits:
            return
        if factory and isinstance(call, cst.Call) and arg(call, "requires_grad") is not None:
            raise _Refused(call, "a tensor the model takes is made with requires_grad (moving it would make it a non-leaf)")
        device = device or self.xla

        def to_device(updated: cst.CSTNode) -> cst.CSTNode:
            return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("to")),
                            args=[cst.Arg(cst.parse_expression(device))])

        self.edits[(id(call), "to")] = Edit(call, to_device)


def _updates_target(loop: cst.For) -> bool:
    """Whether the loop's body updates its target in place: `p -= lr * p.grad`,
    `p.data.add_(p.grad, alpha=-lr)`, `p.data = p.data - lr * p.grad`."""
    names = set(target_names(loop.target))
    for n in walk(loop.body):
        if isinstance(n, cst.AugAssign) and root_name(n.target) in names:
            return True
        if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Attribute) and t.target.attr.value == "data"
                                             and root_name(t.target) in names for t in n.targets):
            return True
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value.endswith("_") \
                and not n.func.attr.value.startswith("_") and root_name(n.func.value) in names:
            return True
    return False


def _value_nodes(expr: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes of ``expr`` whose values it may hand on: not the ones inside an f-string (its
    value is a str; formatting a device value reads it as a number)."""
    nodes = []
    skipped: set[int] = set()
    for n in walk(expr):
        if id(n) in skipped:
            continue
        if isinstance(n, cst.FormattedString) and n is not expr:
            skipped.update(id(m) for m in walk(n))
            continue
        nodes.append(n)
    return nodes


def _targets(node: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(node, cst.Assign):
        return [t.target for t in node.targets]
    return [node.target]  # type: ignore[attr-defined]


def _then_cpu(updated: cst.CSTNode) -> cst.CSTNode:
    return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name("cpu")))
