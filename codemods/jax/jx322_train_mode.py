from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _loop as lp


class TrainMode(Rule):
    """
    ## What it does
    Rewrites torch's `model.train(mode)` for a model of the port: `model.train(True)` ->
    `model.train()`, `model.train(False)` -> `model.eval()`, and a mode computed at run time
    (`model.train(is_training)`, `model.train(mode=phase == "train")`) -> `model.train() if
    is_training else model.eval()`. A module switched where its value is bound (`teacher =
    copy.deepcopy(model).eval()`, `net = Net().train()`) is bound first and switched on the
    next line.

    ## Why
    `nnx.Module.train(**attributes)` takes no positional mode (it sets the given attributes on
    every submodule; `deterministic=False`, `use_running_average=False` is what `train()`
    means): torch's spelling raises "train() takes 1 positional argument but 2 were given".

    ## Fix safety
    Safe: the same switch (dropout and batch statistics on in train mode, off in eval mode);
    the mode expression is evaluated once, as torch evaluates it.
    """

    code = "JX322"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-train-mode"
    target = "jax"
    summary = "model.train(mode) -> model.train() / model.eval() (NNX's train() takes no mode)"
    severity = Severity.ERROR
    needs_text = (".train(", ".eval()")
    examples = [
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                pass

            def run_epoch(model, loader, training):
                model.train(training)
                for x, y in loader:
                    step(model, x, y)

            model = Net()
            model.train(True)
            model.train(mode=False)
            """,
            """
            import torch.nn as nn

            class Net(nn.Module):
                pass

            def run_epoch(model, loader, training):
                model.train() if training else model.eval()
                for x, y in loader:
                    step(model, x, y)

            model = Net()
            model.train()
            model.eval()
            """,
            title="a literal mode, a mode given by the caller",
        ),
        Example(
            """
            import copy
            import torch.nn as nn

            class Net(nn.Module):
                pass

            model = Net()
            teacher = copy.deepcopy(model).eval()
            """,
            """
            import copy
            import torch.nn as nn

            class Net(nn.Module):
                pass

            model = Net()
            teacher = copy.deepcopy(model)
            teacher.eval()
            """,
            title="eval() as a value: NNX's returns None",
        ),
    ]
    valid = [
        "import torch\nmodel = Net()\nmodel.train()\nmodel.eval()\n",
        # not a module: an evaluator's own eval() result
        "import torch\nscore = evaluator.eval()\n",
        # not a model of the port: a trainer's own train(epochs)
        "import torch\ntrainer = Trainer(cfg)\ntrainer.train(10)\n",
        "import flax.nnx as nnx\nmodel = Net(rngs=nnx.Rngs(0))\nmodel.train(deterministic=False)\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """``shadow = copy.deepcopy(model).eval()``: torch's eval()/train() return the module, NNX's
        return None; the module is bound first and switched on the next line."""
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign) or len(node.body[0].targets) != 1:
            return
        assign = node.body[0]
        call, target = assign.value, assign.targets[0].target
        if not (isinstance(call, cst.Call) and astutil.method_name(call) in ("eval", "train") and not call.args):
            return
        if not isinstance(target, (cst.Name, cst.Attribute)) or not self._module_value(call.func.value):  # type: ignore[attr-defined]
            return
        method = call.func.attr.value  # type: ignore[attr-defined]
        bound = node.with_changes(body=[assign.with_changes(value=call.func.value)])  # type: ignore[attr-defined]
        switch = cst.parse_statement(f"{lp.code(target)}.{method}()\n")
        self.report(node, f"{lp.code(call)}: NNX's {method}() switches the module and returns None (torch's returns "
                          "the module): bind the module, then switch it",
                    Fix((self.replace(node, cst.FlattenSentinel([bound, switch])),)))

    def _module_value(self, value: cst.BaseExpression) -> bool:
        """A model of the port, a copy of one (``copy.deepcopy(model)``), or a model class built
        in place (``Net(...)``)."""
        if isinstance(value, cst.Call):
            if (self.ctx.qualname(value.func) or "") in ("copy.deepcopy", "copy.copy") and value.args:
                return self._module_value(value.args[0].value)
            name = lp.code(value.func)
            return name in lp.file_facts(self.ctx).module_classes
        return lp.is_model(lp.code(value), self.ctx)

    def visit_Call(self, node: cst.Call) -> None:
        if astutil.method_name(node) != "train" or len(node.args) != 1 or node.args[0].star:
            return
        arg = node.args[0]
        if arg.keyword is not None and arg.keyword.value != "mode":
            return  # NNX's own train(**attributes)
        receiver = node.func.value  # type: ignore[attr-defined]
        model = lp.code(receiver)
        if not lp.is_model(model, self.ctx):
            return
        mode = arg.value
        train = node.with_changes(args=())
        evaluate = node.with_changes(func=node.func.with_changes(attr=cst.Name("eval")), args=())  # type: ignore[attr-defined]
        if isinstance(mode, cst.Name) and mode.value in ("True", "False"):
            new: cst.BaseExpression = train if mode.value == "True" else evaluate
        else:
            new = cst.IfExp(test=mode, body=train, orelse=evaluate)
        self.report(node, f"{lp.code(node)}: NNX's train() takes no mode (it sets attributes by keyword); "
                          "train() switches to training, eval() to evaluation",
                    Fix((self.replace(node, new),)))
