from __future__ import annotations

import libcst as cst

from porter.astutil import code, method_name, string_value, walk
from porter.rules import Example, Rule, Severity, module_fact

from ._meters import MeterUpdate, meter_update
from ._host_sync import (
    HOST_READ_METHODS, loop_losses, in_logging_statement, in_test, is_host_sum, logged_scalar, reads_tensor_value,
    step_loop, under,
)

_ADVICE = {
    "item": "keep the value on the device (`.detach()`) and read it after the loop or in "
            "`xm.add_step_closure`",
    "tolist": "collect the tensors on the device (`.detach()`, then `torch.cat`/`torch.stack` after "
              "the loop) and convert once",
    "cpu": "collect the tensors on the device and move them once after the loop, or read them in "
           "`xm.add_step_closure`",
    "numpy": "collect the tensors on the device and convert once after the loop, or read them in "
             "`xm.add_step_closure`",
}


class HostReadInStep(Rule):
    """
    ## What it does
    Reports the reads of tensor values on the host inside a training or evaluation step that
    the other TX4xx rules do not rewrite: `x.item()`, `x.tolist()`, `x.cpu()`, `x.numpy()`,
    `x.to('cpu')`, and `float(t)` / `int(t)` / `bool(t)` of a tensor (the loss, or an
    expression with `.sum()`, `.max()`, ... in it). Running sums (TX401), logging calls (TX402)
    and conditions (TX404) have rules of their own.

    ## Why
    Each of these executes the step's pending graph before the step ends and copies to the
    host: an extra graph execution (often a compilation), then a device-to-host transfer, in
    every step. Typical cases and their static alternatives:

    - `losses.append(loss.item())` -> `losses.append(loss.detach())`, and
      `torch.stack(losses).tolist()` after the loop;
    - `meter.update(loss.item(), n)` -> read the value every N steps, in a step closure; where
      the meter's class only does arithmetic with the value, TX406 passes `loss.detach()`
      (a class of the file, or of a module whose source porter finds); for an imported class
      porter cannot read, the finding says so and names that rewrite;
    - `preds.extend(out.argmax(1).cpu().numpy())` -> `preds.append(out.argmax(1))`, then
      `torch.cat(preds).cpu().numpy()` after the loop;
    - a call of a function of the file that reads on the host (`acc = accuracy(out, y)` with
      `.item()` in `accuracy`) -> the function returns the tensor, read after the loop.

    ## Fix safety
    No automatic fix: what the host value is used for (a list, a meter, a library call)
    decides the rewrite, and the Python types change.
    """

    code = "TX403"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "host-read-in-step"
    target = "torch-xla"
    summary = "x.item()/.cpu()/.numpy()/.tolist()/float(t) in the step: reported with the static alternative"
    severity = Severity.WARNING
    needs_text = ("backward", "no_grad", "inference_mode")  # a step loop runs a backward pass or sits under no_grad
    examples = [
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                losses = []
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.item())
                return losses
            """,
            None,
            title="a per-step list of losses",
        ),
        Example(
            """
            import torch

            def evaluate(model, loader):
                preds = []
                with torch.no_grad():
                    for x, _ in loader:
                        preds.extend(model(x).argmax(1).cpu().numpy())
                return preds
            """,
            None,
            title="predictions copied to the host every batch",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer, history):
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    history.record(float(loss))
            """,
            None,
            title="float() of the loss",
        ),
        Example(
            """
            import torch
            from porter_example_missing import metrics

            def train(model, loader, optimizer):
                losses = metrics.AverageMeter()
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    losses.update(loss.item(), x.size(0))
            """,
            None,
            title="a meter of a module porter cannot read (TX406 moves one it can read to the device)",
        ),
    ]
    valid = [
        # outside a step
        "import torch\nvalues = [t.item() for t in ts]\nlast = loss.item()\n",
        # owned by TX401 / TX402 / TX404
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    total += loss.item()\n"
        "    print(loss.item())\n    if loss.item() > 10:\n        break\n",
        # in a step closure: runs after the step
        "import torch\nimport torch_xla.core.xla_model as xm\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n"
        "    xm.add_step_closure(lambda loss: history.append(loss.item()), args=(loss,))\n",
        # float() of a plain number
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    lr = float(args.lr)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        what = self._host_read(node)
        if what is None:
            self._reading_helper(node)
            return
        loop = step_loop(self.ctx)
        if loop is None or self._owned_elsewhere() or self._inside_other_read():
            return
        if what == "item" and logged_scalar(self.ctx, node) is not None:
            return  # TX405 keeps it on the device
        meter = meter_update(self.ctx, node) if what == "item" else None
        if meter is not None and meter.on_device:
            return  # TX406 keeps it on the device
        if meter is not None and meter.meter.cls is None:
            self._library_meter(node, meter)
            return
        if what in HOST_READ_METHODS or what == "to":
            key = "cpu" if what == "to" else what
            self.report(node, f"`.{what}()` in the step executes the graph and copies to the host every step: {_ADVICE[key]}")
            return
        if reads_tensor_value(node.args[0].value, self.ctx, loop_losses(self.ctx, loop)):
            self.report(node, f"`{what}()` of a tensor in the step executes the graph and copies to the host every step: {_ADVICE['item']}")

    def _reading_helper(self, node: cst.Call) -> None:
        """A call in the step of a function of the file that reads tensor values on the host
        (`def accuracy(out, y): return (...).mean().item()`): each call reads, every step."""
        if not isinstance(node.func, cst.Name):
            return
        read = module_fact(self.ctx, _host_reading_functions).get(node.func.value)
        if read is None or step_loop(self.ctx) is None or self._owned_elsewhere() or self._inside_other_read():
            return
        self.report(node, f"`{node.func.value}()` reads tensor values on the host (`.{read}()` in its body): called in "
                          "the step, it executes the graph and copies to the host every step; return the tensor "
                          "(without `.item()`) and read it after the loop or in `xm.add_step_closure`, or call it "
                          "every N steps")

    def _library_meter(self, node: cst.Call, found: MeterUpdate) -> None:
        receiver = code(found.call.func.value)  # type: ignore[attr-defined]
        value = code(node.func.value)  # type: ignore[attr-defined]
        self.report(
            node,
            f"`.item()` in the step executes the graph and copies to the host every step, for "
            f"`{receiver}.update`: `{found.meter.shown}` is imported ({found.meter.imported}) and porter "
            "cannot read its source here; if its `update` only does arithmetic with the value (sums, "
            f"averages, as an AverageMeter), pass `{value}.detach()` so that the meter sums on the device, "
            f"and read `{receiver}` at the logging steps (in `xm.add_step_closure`); else update it every N "
            "steps, in a step closure",
        )

    def _host_read(self, node: cst.Call):
        m = method_name(node)
        if m in HOST_READ_METHODS and not node.args:
            return m
        if m == "to" and len(node.args) == 1 and string_value(node.args[0].value) == "cpu":
            return "to"
        q = self.ctx.qualname(node.func)
        if q in ("builtins.float", "builtins.int", "builtins.bool") and len(node.args) == 1 and not node.args[0].star:
            return q.split(".")[1]
        return None

    def _inside_other_read(self) -> bool:
        """``t.cpu().numpy().tolist()``: one finding, on the outermost read of the chain."""
        stack = self.ctx.ancestors
        if len(stack) < 3:
            return False
        attr, outer = stack[-2], stack[-3]
        return (
            isinstance(attr, cst.Attribute) and attr.value is stack[-1] and isinstance(outer, cst.Call)
            and outer.func is attr and self._host_read(outer) is not None
        )

    def _owned_elsewhere(self) -> bool:
        summed = under(self.ctx, cst.AugAssign, "value")
        if summed is not None and is_host_sum(summed):  # type: ignore[arg-type]
            return True
        return in_test(self.ctx) is not None or in_logging_statement(self.ctx)


def _host_reading_functions(ctx) -> dict:
    """The file's top-level functions that call a host-read method (`.item()`, `.tolist()`,
    `.cpu()`, `.numpy()`): name -> the first such method (a module fact)."""
    found = {}
    for fn in ctx.module.body:
        if isinstance(fn, cst.FunctionDef):
            read = next((m for n in walk(fn.body) if isinstance(n, cst.Call) and not n.args
                         for m in [method_name(n)] if m in HOST_READ_METHODS), None)
            if read is not None:
                found[fn.name.value] = read
    return found
