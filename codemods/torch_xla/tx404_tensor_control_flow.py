from __future__ import annotations

import libcst as cst

from porter.rules import Example, Rule, Severity

from ._host_sync import is_step_loop, loop_losses, reads_tensor_value, step_loop

_KIND = {cst.If: "`if`", cst.While: "`while`", cst.IfExp: "a conditional expression", cst.Assert: "`assert`"}


class TensorControlFlow(Rule):
    """
    ## What it does
    Reports Python control flow on tensor values inside a training or evaluation step:
    `if loss.item() > 10:`, `if torch.isnan(loss):`, `while t.sum() > 0:`,
    `assert mask.all()`, `x if loss < best else y`.

    ## Why
    A Python condition needs the value on the host: the step's graph executes up to that
    point, the value is copied, and the rest of the step is traced as a second graph - in
    every step. Both branches also trace different graphs, so a condition that flips
    causes new compilations. Static alternatives:

    - choose values with `torch.where(cond, a, b)` or a mask (`loss * finite_mask`) instead
      of branching;
    - skip a bad update on the device: scale it with
      `torch.where(torch.isfinite(loss), 1.0, 0.0)` rather than `if not torch.isfinite(loss): continue`;
    - checks and early stopping: test every N steps, after `torch_xla.sync()`, or after the
      loop; debugging asserts: in `xm.add_step_closure`.

    ## Fix safety
    No automatic fix: the branches decide what the rewrite must be.
    """

    code = "TX404"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "tensor-control-flow"
    target = "torch-xla"
    summary = "if/while/assert on a tensor value in the step: reported with torch.where/mask alternatives"
    severity = Severity.WARNING
    needs_text = ("backward", "no_grad", "inference_mode")  # a step loop runs a backward pass or sits under no_grad
    examples = [
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                for x, y in loader:
                    loss = model(x, y)
                    if torch.isnan(loss):
                        continue
                    loss.backward()
                    optimizer.step()
            """,
            None,
            title="skipping a step on a NaN loss",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    if loss.item() < 0.01:
                        break
            """,
            None,
            title="early stopping inside the step",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                for x, y in loader:
                    out = model(x)
                    assert (out >= 0).all()
                    out.sum().backward()
                    optimizer.step()
            """,
            None,
            title="an assert on tensor values",
        ),
        Example(
            """
            import torch

            def train(model, batch, optimizer):
                loss = model(batch)
                while loss.item() > 0.1:
                    optimizer.zero_grad()
                    loss = model(batch)
                    loss.backward()
                    optimizer.step()
            """,
            None,
            title="a training loop whose own condition reads the loss",
        ),
    ]
    valid = [
        # a Python counter as the loop condition
        "import torch\nwhile step < max_steps:\n    loss = f()\n    loss.backward()\n    step += 1\n",
        # plain Python values
        "import torch\nfor step, (x, y) in enumerate(loader):\n    loss = f(x, y)\n    loss.backward()\n"
        "    if step % 10 == 0 and step > 0:\n        pass\n    if loss.shape[0] > 1:\n        pass\n",
        # outside a step
        "import torch\nif torch.isnan(loss):\n    raise ValueError\n",
    ]

    def _check(self, node: cst.CSTNode) -> None:
        test = node.test  # type: ignore[attr-defined]
        # a `while` that is itself the training loop tests its condition every step
        own = node if isinstance(node, cst.While) and is_step_loop(node, self.ctx) else None
        loop = own or step_loop(self.ctx)
        if loop is None:
            return
        if reads_tensor_value(test, self.ctx, loop_losses(self.ctx, loop)):
            self.report(
                node.test,  # type: ignore[attr-defined]
                f"{_KIND[type(node)]} on a tensor value in the step executes the graph and copies to the "
                "host every step: use torch.where / a mask on the device, or check it every N steps or "
                "after the loop",
            )

    def visit_If(self, node: cst.If) -> None:
        self._check(node)

    def visit_While(self, node: cst.While) -> None:
        self._check(node)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._check(node)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._check(node)
