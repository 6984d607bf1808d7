import libcst as cst

from porter.rules import Example, Fix, Rule, Severity


class OptimizerStep(Rule):
    """
    ## What it does
    Rewrites `optimizer.step()` in a training step to `xm.optimizer_step(optimizer)`.

    ## Why
    On XLA the optimizer step must be part of the traced step graph and, when several
    replicas train together, gradients must be all-reduced before the update.
    `xm.optimizer_step` does both (and is a plain `optimizer.step()` on one device).

    ## Fix safety
    Safe: on a single device it calls `optimizer.step()`; with several replicas it adds the
    gradient all-reduce the XLA data-parallel set-up needs.
    """

    code = "TX201"
    name = "xla-optimizer-step"
    target = "torch-xla"
    summary = "optimizer.step() -> xm.optimizer_step(optimizer)"
    severity = Severity.WARNING
    needs_text = (".step(",)
    examples = [
        Example(
            """
            import torch

            def train(model, optimizer, loss):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            """
            import torch
            import torch_xla.core.xla_model as xm

            def train(model, optimizer, loss):
                optimizer.zero_grad()
                loss.backward()
                xm.optimizer_step(optimizer)
            """,
        ),
    ]
    valid = [
        "scheduler.step()\n",
        "import torch_xla.core.xla_model as xm\nxm.optimizer_step(opt)\n",
        "import torch\nopt.step(closure)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and not node.args):
            return
        receiver = func.value
        if not _looks_like_optimizer(receiver):
            return
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        new = cst.parse_expression(f"{xm}.optimizer_step(_)").with_changes(
            args=[cst.Arg(receiver)]
        )
        self.report(
            node,
            "optimizer.step() on XLA: use xm.optimizer_step(optimizer)",
            Fix((self.replace(node, new),), imports=("torch_xla.core.xla_model",)),
        )


def _looks_like_optimizer(node: cst.BaseExpression) -> bool:
    # `optimizer`, `opt`, `optimizerD`, `self.optimizer`, `optimizers[0]` - but not schedulers.
    if isinstance(node, cst.Subscript):
        node = node.value
    if isinstance(node, cst.Attribute):
        node = node.attr
    if not isinstance(node, cst.Name):
        return False
    name = node.value.lower()
    return ("opt" in name) and "sched" not in name and "scaler" not in name
