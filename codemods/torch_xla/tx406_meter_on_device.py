from __future__ import annotations

import libcst as cst

from porter.astutil import method_name
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from ._host_sync import step_loop
from ._meters import meter_update


class MeterOnDevice(Rule):
    """
    ## What it does
    In a training or evaluation step, rewrites `meter.update(loss.item(), n)` (or an
    arithmetic of it: `meter.update(loss.item() * accum_steps, n)`) to
    `meter.update(loss.detach(), n)` when `meter` is bound by a plain `meter = AverageMeter(...)`
    in the same function, of a class defined in the file (pytorch/examples' `AverageMeter`) or
    imported from a library or a module beside the script (timm's `utils.AverageMeter`: porter
    reads the class in its installed source, found as `import` would find it, without
    importing it), and that class's `update(self, val, ...)` only assigns to attributes of
    `self` with arithmetic of the value (`self.val = val`, `self.sum += val * n`,
    `self.count += n`, `self.avg = self.sum / self.count if self.count else 0`, a test that
    reads nothing computed from the value): such a method computes the same thing with a
    0-dim tensor, on the device. Formatting the meter later (`'{:.4e}'.format(meter.val)`)
    works on a 0-dim tensor too (`Tensor.__format__` reads it then): run that printing in a
    step closure (TX402 does for a logging method of the file's classes).

    Any other `update` (one that calls `float(val)`, tests it, appends it to a list) keeps
    the `.item()`, and TX403 reports it; so does an imported meter whose source porter does not
    find (TX403 then says what to check in it and the rewrite).

    ## Why
    `.item()` in the step executes the pending graph and copies the value to the host every
    step. The meter's running sums can stay on the device: each step adds to them in the step
    graph, and the host reads them only when a line is printed.

    ## Fix safety
    Unsafe: the meter's attributes (`val`, `sum`, `avg`...) become device tensors. Arithmetic
    and formatting give the same numbers (summed in the tensor's dtype, float32, instead of a
    Python float), but other code that reads them changes: a comparison returns a tensor,
    `json.dump` or `torch.tensor([meter.sum, ...])` of them fails or copies to the host, and
    every read outside a step closure is a host transfer of its own.
    """

    code = "TX406"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "meter-on-device"
    target = "torch-xla"
    summary = "meter.update(loss.item(), n) of an AverageMeter-style class -> meter.update(loss.detach(), n)"
    severity = Severity.WARNING
    needs_text = (".item()", "update(")
    examples = [
        Example(
            """
            import torch

            class AverageMeter:
                def __init__(self, name):
                    self.name = name
                    self.sum = 0.0
                    self.count = 0

                def update(self, val, n=1):
                    self.val = val
                    self.sum += val * n
                    self.count += n

            def train(model, loader, optimizer):
                losses = AverageMeter('Loss')
                for images, target in loader:
                    loss = model(images, target)
                    losses.update(loss.item(), images.size(0))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            """
            import torch

            class AverageMeter:
                def __init__(self, name):
                    self.name = name
                    self.sum = 0.0
                    self.count = 0

                def update(self, val, n=1):
                    self.val = val
                    self.sum += val * n
                    self.count += n

            def train(model, loader, optimizer):
                losses = AverageMeter('Loss')
                for images, target in loader:
                    loss = model(images, target)
                    losses.update(loss.detach(), images.size(0))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
            unsafe=True,
            title="an AverageMeter whose update only does arithmetic",
        ),
        Example(
            """
            import torch

            class RunningMean:
                def __init__(self):
                    self.total = self.count = 0

                def update(self, val, n=1):
                    self.last = val
                    self.total += val * n
                    self.count += n
                    self.mean = self.total / self.count if self.count > 0 else 0

            def evaluate(model, loader, criterion, accum):
                loss_m = RunningMean()
                with torch.no_grad():
                    for x, y in loader:
                        loss = criterion(model(x), y)
                        loss_m.update(loss.item() * accum, x.shape[0])
                return loss_m.mean
            """,
            """
            import torch

            class RunningMean:
                def __init__(self):
                    self.total = self.count = 0

                def update(self, val, n=1):
                    self.last = val
                    self.total += val * n
                    self.count += n
                    self.mean = self.total / self.count if self.count > 0 else 0

            def evaluate(model, loader, criterion, accum):
                loss_m = RunningMean()
                with torch.no_grad():
                    for x, y in loader:
                        loss = criterion(model(x), y)
                        loss_m.update(loss.detach() * accum, x.shape[0])
                return loss_m.mean
            """,
            unsafe=True,
            title="a scaled value, and an average guarded by a test of the count",
        ),
    ]
    valid = [
        # update() converts the value: it needs a number
        "import torch\nclass M:\n    def update(self, val):\n        self.vals.append(float(val))\n"
        "def train(loader):\n    m = M()\n    for x in loader:\n        loss = f(x)\n        loss.backward()\n        m.update(loss.item())\n",
        # update() tests the value
        "import torch\nclass M:\n    def update(self, val):\n        if val < self.best:\n            self.best = val\n"
        "def train(loader):\n    m = M()\n    for x in loader:\n        loss = f(x)\n        loss.backward()\n        m.update(loss.item())\n",
        # update() tests a value computed from the value
        "import torch\nclass M:\n    def update(self, val):\n        self.sum += val\n        self.best = val if self.sum > 0 else 0\n"
        "def train(loader):\n    m = M()\n    for x in loader:\n        loss = f(x)\n        loss.backward()\n        m.update(loss.item())\n",
        # a class porter cannot read (no such module installed): TX403 reports it
        "import torch\nfrom porter_example_missing.meters import AverageMeter\ndef train(loader):\n    m = AverageMeter()\n    for x in loader:\n"
        "        loss = f(x)\n        loss.backward()\n        m.update(loss.item())\n",
        # the meter is passed in: its class is not known
        "import torch\nclass M:\n    def update(self, val):\n        self.val = val\n"
        "def train(loader, m):\n    for x in loader:\n        loss = f(x)\n        loss.backward()\n        m.update(loss.item())\n",
        # outside a step
        "import torch\nclass M:\n    def update(self, val):\n        self.val = val\n"
        "def report(loss):\n    m = M()\n    m.update(loss.item())\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) != "item" or node.args or not isinstance(node.func, cst.Attribute):
            return
        found = meter_update(self.ctx, node)
        if found is None or not found.on_device or step_loop(self.ctx) is None:
            return
        new = node.with_changes(func=node.func.with_changes(attr=cst.Name("detach")))
        where = " (an imported class, read in its source)" if found.meter.imported else ""
        self.report(
            node,
            f"`.item()` copies the value to the host every step, but `{found.meter.shown}.update`{where} only "
            "does arithmetic with it: pass the 0-dim tensor (`.detach()`) and the meter sums on the "
            "device (its attributes become tensors: unsafe fix); print the meter in a step closure",
            Fix((Edit(node, new),), Safety.UNSAFE),
        )
