from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp


class DeviceAccumulator(Rule):
    """
    ## What it does
    In a loop that calls a jitted step (a train step, or the evaluation's `eval_step`), a
    running sum updated on every iteration from the step's results through `.item()` (`running_loss += loss.item()`, `correct +=
    (logits.argmax(1) == y).sum().item()`) accumulates the JAX value instead
    (`running_loss += loss`). The `.item()` calls under the loop's logging condition, and
    everything that reads the sum there, stay as they are: a JAX scalar array formats
    (`{:.4f}`, `%d`), divides and converts (`float()`, `math.exp`) like the number it holds.

    ## Why
    JAX dispatches work asynchronously: `loss.item()` on every step makes the host wait for
    the device at each step, so the next step cannot be queued while this one runs. Summing
    on the device keeps the loop free of host reads except on the steps that print.

    ## Fix safety
    Unsafe: the sum is kept in float32 on the device rather than in a Python float (float64),
    and it is a JAX array, not a `float`, for the code that reads it afterwards (JSON
    serialisation, `isinstance(x, float)` checks need `float(x)`).
    """

    code = "JX309"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-device-accumulator"
    target = "jax"
    summary = "running_loss += loss.item() on every step -> running_loss += loss (no host read per step)"
    severity = Severity.WARNING
    needs_text = (".item()",)
    examples = [
        Example(
            """
            import jax
            from flax import nnx

            @nnx.jit
            def train_step(model, optimizer, x, y):
                ...

            def train(model, optimizer, loader, log_interval):
                running_loss, correct = 0.0, 0
                for i, (x, y) in enumerate(loader):
                    loss, logits = train_step(model, optimizer, x, y)
                    pred = logits.argmax(1)
                    running_loss += loss.item()
                    correct += (pred == y).sum().item()
                    if i % log_interval == 0:
                        print(f"loss {running_loss / (i + 1):.4f} last {loss.item():.4f} correct {correct}")
                return running_loss / len(loader)
            """,
            """
            import jax
            from flax import nnx

            @nnx.jit
            def train_step(model, optimizer, x, y):
                ...

            def train(model, optimizer, loader, log_interval):
                running_loss, correct = 0.0, 0
                for i, (x, y) in enumerate(loader):
                    loss, logits = train_step(model, optimizer, x, y)
                    pred = logits.argmax(1)
                    running_loss += loss
                    correct += (pred == y).sum()
                    if i % log_interval == 0:
                        print(f"loss {running_loss / (i + 1):.4f} last {loss.item():.4f} correct {correct}")
                return running_loss / len(loader)
            """,
            unsafe=True,
        ),
    ]
    valid = [
        "import torch\nfor x in loader:\n    total += model(x).item()\n",
    ]

    def visit_For(self, node: cst.For) -> None:
        self._loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._loop(node)

    def _loop(self, loop) -> None:
        if not isinstance(loop.body, cst.IndentedBlock):
            return
        steps = lp.jitted_functions(self.ctx)
        if not steps:
            return
        tainted: set[str] = set()
        for stmt in loop.body.body:
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            small = stmt.body[0]
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and \
                    isinstance(small.value.func, cst.Name) and small.value.func.value in steps:
                for t in small.targets:
                    tainted.update(astutil.target_names(t.target))
                continue
            if isinstance(small, cst.Assign) and ".item()" not in lp.code(small.value) and tainted & set(lp.reads(small.value)):
                for t in small.targets:
                    tainted.update(astutil.target_names(t.target))
                continue
            if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name) and tainted:
                items = [c for c in astutil.calls_in(small.value) if astutil.method_name(c) == "item" and not c.args]
                if not items or not all(tainted & set(lp.reads(c.func.value)) for c in items):  # type: ignore[attr-defined]
                    continue
                edits = tuple(self.replace(c, _receiver(c)) for c in items)
                self.report(small, f"`{small.target.value}` reads the device on every step: sum the JAX value, "
                                   "read it where the loop prints", Fix(edits, Safety.UNSAFE))


def _receiver(call: cst.Call) -> cst.CSTNode:
    value = call.func.value  # type: ignore[attr-defined]
    return value.with_changes(lpar=[], rpar=[]) if isinstance(value, cst.Name) else value


