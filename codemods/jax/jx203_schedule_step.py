import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _optax


class ScheduleStep(Rule):
    """
    ## What it does
    Removes `scheduler.step()` statements once JX201 has folded the scheduler into the
    optimizer: `scheduler` is then an optax schedule (a function of the update count) that
    the `nnx.Optimizer`'s transformation reads by itself, so there is nothing to step.
    The rule recognises the name as a schedule when the file assigns it an `optax` schedule
    (or a `lambda` of the step) and passes it to an `nnx.Optimizer(...)` construction.

    ## Why
    A torch scheduler mutates the optimizer's learning rate when stepped; optax computes the
    rate from the number of updates, so the call has no counterpart (and an optax schedule
    has no `step` method).

    ## Fix safety
    Safe: the schedule already advances with every `optimizer.update(...)` (JX201 divides
    the update count by the loader length for schedulers torch steps once per epoch).
    """

    code = "JX203"
    name = "remove-schedule-step"
    target = "jax"
    summary = "scheduler.step() of a schedule folded into nnx.Optimizer -> removed"
    severity = Severity.ERROR
    needs_text = (".step(",)
    examples = [
        Example(
            """
            import optax
            from flax import nnx

            scheduler = optax.exponential_decay(0.1, transition_steps=1, decay_rate=0.7, staircase=True)
            optimizer = nnx.Optimizer(model, optax.sgd(lambda step: scheduler(step // len(train_loader))), wrt=nnx.Param)
            for epoch in range(3):
                train(model, optimizer, train_loader)
                scheduler.step()
            """,
            """
            import optax
            from flax import nnx

            scheduler = optax.exponential_decay(0.1, transition_steps=1, decay_rate=0.7, staircase=True)
            optimizer = nnx.Optimizer(model, optax.sgd(lambda step: scheduler(step // len(train_loader))), wrt=nnx.Param)
            for epoch in range(3):
                train(model, optimizer, train_loader)
            """,
            title="the scheduler is now the optimizer's learning-rate schedule",
        ),
    ]
    valid = [
        "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(opt, 1)\nscheduler.step()\n",
        "import optax\nsched = optax.cosine_decay_schedule(0.1, 10)\nsched.step()\n",  # not given to an optimizer
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "step" and not call.args):
            return
        name = cst.Module([]).code_for_node(call.func.value)
        folded = _optax.folded_schedules(self.ctx)
        if name not in folded and not (name.startswith("self.") and _optax.stored_name(self.ctx, name) in folded):
            return  # neither a folded schedule nor a trainer's attribute that keeps one
        parent = self.ctx.parent
        only = isinstance(parent, cst.IndentedBlock) and len(parent.body) == 1
        fix = Fix((self.replace(node, cst.SimpleStatementLine([cst.Pass()], leading_lines=node.leading_lines) if only else cst.RemoveFromParent()),))
        self.report(node, f"{name}.step(): {name} is an optax schedule read by the optimizer at each update; nothing to step", fix)
