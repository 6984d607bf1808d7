from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from ._host_sync import logged_scalar


class LoggedScalar(Rule):
    """
    ## What it does
    Finds a scalar read with `.item()` in the training or evaluation step only to be logged,
    `D_x = output.mean().item()` followed (in the same loop) by
    `print('... D(x): %.4f' % D_x)`, and keeps it on the device:
    `D_x = output.mean().detach()`. TX402 then moves the log line into a step closure, so
    the value is copied to the host only in the steps that log.

    It applies when every read of the name in the loop prints the same for a 0-dim tensor
    as for a Python number (a format spec in an f-string or `str.format`, a numeric `%`
    conversion, `math.*`, `float()`, `int()`, possibly after arithmetic), and the name is
    not read after the loop. Otherwise TX403 reports the `.item()`.

    ## Why
    `.item()` executes the step's graph before the step ends and copies the value to the
    host in every step, although it is only needed in the steps that log.

    ## Fix safety
    Safe when the value is only formatted: formatting a 0-dim tensor formats the same Python
    number `.item()` returned. Unsafe when a read does arithmetic on it first (`100 * acc`):
    that then runs in float32 on the device instead of float64 on the host.
    """

    code = "TX405"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "logged-scalar"
    target = "torch-xla"
    summary = "name = x.item() in the step, only logged -> keep it on the device (x.detach())"
    severity = Severity.WARNING
    needs_text = (".item(",)
    examples = [
        Example(
            """
            import torch

            def train(netD, loader, optimizer, criterion, log_interval):
                for i, (data, label) in enumerate(loader):
                    output = netD(data)
                    err = criterion(output, label)
                    err.backward()
                    D_x = output.mean().item()
                    optimizer.step()
                    if i % log_interval == 0:
                        print('[%d] Loss_D: %.4f D(x): %.4f' % (i, err.item(), D_x))
            """,
            """
            import torch

            def train(netD, loader, optimizer, criterion, log_interval):
                for i, (data, label) in enumerate(loader):
                    output = netD(data)
                    err = criterion(output, label)
                    err.backward()
                    D_x = output.mean().detach()
                    optimizer.step()
                    if i % log_interval == 0:
                        print('[%d] Loss_D: %.4f D(x): %.4f' % (i, err.item(), D_x))
            """,
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                for step, (x, y) in enumerate(loader):
                    out = model(x)
                    loss = (out - y).pow(2).mean()
                    loss.backward()
                    optimizer.step()
                    acc = (out.argmax(1) == y).float().mean().item()
                    print(f'step {step} acc {100 * acc:.2f}%')
            """,
            """
            import torch

            def train(model, loader, optimizer):
                for step, (x, y) in enumerate(loader):
                    out = model(x)
                    loss = (out - y).pow(2).mean()
                    loss.backward()
                    optimizer.step()
                    acc = (out.argmax(1) == y).float().mean().detach()
                    print(f'step {step} acc {100 * acc:.2f}%')
            """,
            unsafe=True,
            title="arithmetic before formatting: float32 on the device, unsafe",
        ),
    ]
    valid = [
        # read after the loop
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    last = loss.item()\nprint(f'{last:.3f}')\n",
        # stored, not only printed
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    v = loss.item()\n    history.append(v)\n",
        # outside a step
        "import torch\nv = loss.item()\nprint(f'{v:.3f}')\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        found = logged_scalar(self.ctx, node)
        if found is None:
            return
        assign, checker = found
        name = assign.targets[0].target.value  # type: ignore[attr-defined]
        new = node.with_changes(func=node.func.with_changes(attr=cst.Name("detach")))  # type: ignore[attr-defined]
        safety = Safety.UNSAFE if checker.computed else Safety.SAFE
        self.report(
            node,
            f"`{name} = ....item()` copies to the host every step but `{name}` is only logged: "
            "keep it on the device (.detach()) and let the log line read it after the step"
            + (" (unsafe: arithmetic on it then runs in float32)" if checker.computed else ""),
            Fix((self.replace(node, new),), safety),
        )
