from __future__ import annotations

import libcst as cst

from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import trainer_names


class GluonLearningRate(Rule):
    """
    ## What it does
    Translates the learning-rate accessors of a `gluon.Trainer`:

    | Gluon | PyTorch |
    | --- | --- |
    | `trainer.learning_rate` | `trainer.param_groups[0]["lr"]` |
    | `trainer.set_learning_rate(v)` (a statement) | `for param_group in trainer.param_groups: param_group["lr"] = v` |

    ## Why
    A torch optimizer keeps its learning rate in its parameter groups (one group here: the
    trainer's `net.parameters()`, GL302).

    ## Fix safety
    Safe: the same learning rate for every parameter. (Gluon's SGD scales its momentum
    buffer by the learning rate, torch's does not: see GL302.)
    """

    code = "GL305"
    name = "gluon-learning-rate"
    target = "torch"
    summary = "trainer.learning_rate / set_learning_rate(v) -> the torch optimizer's param_groups"
    severity = Severity.ERROR
    needs_text = ("learning_rate",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            if epoch in decay_epochs:
                trainer.set_learning_rate(trainer.learning_rate * 0.1)
            print(f"lr={trainer.learning_rate:g}")
            """,
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            if epoch in decay_epochs:
                for param_group in trainer.param_groups:
                    param_group["lr"] = trainer.param_groups[0]["lr"] * 0.1
            print(f"lr={trainer.param_groups[0]['lr']:g}")
            """,
        ),
    ]
    valid = ["opt.param_groups[0]['lr'] = 0.1\n"]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "learning_rate" or dotted_name(node.value) not in trainer_names(self.ctx):
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        quote = "'" if self.ctx.inside(cst.FormattedString) and self._fstring_quote() == '"' else '"'

        def build(u: cst.Attribute) -> cst.BaseExpression:
            return cst.Subscript(
                cst.Subscript(cst.Attribute(u.value, cst.Name("param_groups")), [cst.SubscriptElement(cst.Index(cst.Integer("0")))]),
                [cst.SubscriptElement(cst.Index(cst.SimpleString(f"{quote}lr{quote}")))])

        self.report(node, "trainer.learning_rate -> trainer.param_groups[0][\"lr\"]", Fix((self.replace(node, build),)))

    def _fstring_quote(self) -> str:
        f = self.ctx.enclosing(cst.FormattedString)
        return f.quote[-1] if f is not None else '"'

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "set_learning_rate"
                and dotted_name(call.func.value) in trainer_names(self.ctx) and len(call.args) == 1):
            return
        name = "param_group"

        def build(u: cst.SimpleStatementLine) -> cst.BaseStatement:
            c = u.body[0].value
            loop = cst.parse_statement(f"for {name} in {sc.code(c.func.value)}.param_groups:\n    {name}[\"lr\"] = _\n")
            assign = loop.body.body[0]
            assign = assign.with_changes(body=[assign.body[0].with_changes(value=c.args[0].value)])
            return loop.with_changes(body=loop.body.with_changes(body=[assign]), leading_lines=u.leading_lines)

        self.report(node, "trainer.set_learning_rate(v) -> set the lr of each param group", Fix((self.replace(node, build),)))
