import libcst as cst

from porter.context import dotted_name
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _ops_table as ops


class LossModule(Rule):
    """
    ## What it does
    Rewrites torch loss modules (`nn.CrossEntropyLoss(...)`, `nn.MSELoss()`,
    `nn.BCEWithLogitsLoss(pos_weight=...)`, `nn.NLLLoss`, `nn.L1Loss`, `nn.SmoothL1Loss`,
    `nn.HuberLoss`, `nn.BCELoss`, `nn.KLDivLoss`) to a function of `(input, target)`:
    `criterion = nn.CrossEntropyLoss(ignore_index=0)` becomes
    `criterion = lambda input, target: <the loss expression>`, so `criterion(out, y)` calls
    keep working unchanged; an instance called at once (`nn.MSELoss()(a, b)`) becomes the
    expression itself. The expression is the one JX150 writes for the functional loss with
    the constructor's arguments (reduction, weight, ignore_index, label_smoothing, ...).
    A `CrossEntropyLoss` whose every call passes a visibly float target
    (`criterion(out, soft.float())`, `criterion(out, y.softmax(1))`,
    `criterion(out, torch.as_tensor(y, dtype=torch.float32))`) takes class
    probabilities, as torch does with a float target: `optax.softmax_cross_entropy`.

    ## Why
    A torch loss module is a callable object holding its options; in JAX a loss is a plain
    function of arrays.

    ## Fix safety
    Safe: the same expressions as JX150, compared with torch on random inputs. Arguments
    given to the constructor (a weight tensor) are evaluated when the loss is called
    rather than once (the same values: they are expressions of the file's own names).
    """

    code = "JX151"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "loss-module-to-function"
    target = "jax"
    summary = "nn.CrossEntropyLoss(...) and other loss modules -> lambda input, target: ..."
    severity = Severity.ERROR
    needs_text = ("Loss",)
    examples = [
        Example(
            """
            import torch.nn as nn

            criterion = nn.CrossEntropyLoss()

            def step(model, x, y):
                return criterion(model(x), y)
            """,
            """
            import optax

            criterion = lambda input, target: optax.softmax_cross_entropy_with_integer_labels(input, target, axis=1).mean()

            def step(model, x, y):
                return criterion(model(x), y)
            """,
            title="a criterion called later",
        ),
        Example(
            """
            import torch
            from torch import nn

            class Trainer:
                def __init__(self, pos_weight):
                    self.loss = nn.BCEWithLogitsLoss(pos_weight=pos_weight, reduction="sum")
                    self.mse = nn.MSELoss()(torch.zeros(3), torch.ones(3))
            """,
            """
            import torch
            from torch import nn
            import jax
            import optax

            class Trainer:
                def __init__(self, pos_weight):
                    self.loss = lambda input, target: (-(pos_weight * target * jax.nn.log_sigmoid(input) + (1 - target) * jax.nn.log_sigmoid(-input))).sum()
                    self.mse = optax.squared_error(torch.zeros(3), torch.ones(3)).mean()
            """,
            title="constructor arguments, and an instance applied at once",
        ),
        Example(
            """
            import torch.nn as nn

            criterion = nn.CrossEntropyLoss(reduction="none")

            def step(model, x, soft):
                return criterion(model(x), soft.float())
            """,
            """
            import optax

            criterion = lambda input, target: optax.softmax_cross_entropy(input, target, axis=1)

            def step(model, x, soft):
                return criterion(model(x), soft.float())
            """,
            title="every call passes a float target: class probabilities",
        ),
    ]
    valid = ["import torch.nn as nn\nlayer = nn.Linear(3, 4)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        q = self.ctx.qualname(node.func)
        lm = ops.LOSS_MODULES.get(q) if q else None
        if lm is None:
            return
        parent = self.ctx.parent
        applied = parent if isinstance(parent, cst.Call) and parent.func is node else None
        target = applied or node
        display = q.replace("torch.nn.", "nn.")
        float_target = False
        if applied is None and isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is node:
            bound = dotted_name(parent.targets[0].target)
            float_target = bound is not None and ops.calls_with_float_targets(self.ctx, bound)
        try:
            text, used = ops.build_loss_module(lm, node, self.ctx, applied, float_target)
        except ops.Manual as exc:
            ops.report_manual(self, node, f"{display}: {exc}")
            return
        grand = self.ctx.ancestors[-3] if applied is not None and len(self.ctx.ancestors) >= 3 else parent

        def replacement(updated: cst.CSTNode) -> cst.CSTNode:
            ctor = updated.func if applied is not None else updated
            try:
                new_text, _ = ops.build_loss_module(lm, ctor, self.ctx, updated if applied is not None else None, float_target)
            except ops.Manual:  # an edit inside changed the call: the next pass decides again
                return updated
            return ops.as_expression(new_text, grand, updated)

        self.report(
            target,
            f"{display}: in JAX a loss is a function of arrays" + ("" if applied is not None else ": a lambda of (input, target)"),
            Fix((Edit(target, replacement),), imports=tuple(sorted(used))),
        )
