from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import TRAINER

_RECORD = ("mxnet.autograd.record",)


def trained_models(ctx) -> set[str]:
    """The names of the models the file's gluon.Trainers update (`net` of `net.collect_params()`)."""
    key = ("gluon.trained_models", ctx.module)
    if key not in ctx.cache:
        out = set()
        for _, value, _ in sc.assignments(ctx):
            if sc.call_name(ctx, value) in TRAINER and value.args:
                params = value.args[0].value
                if isinstance(params, cst.Call) and astutil.method_name(params) == "collect_params":
                    name = dotted_name(params.func.value)
                    if name:
                        out.add(name)
        ctx.cache[key] = out
    return ctx.cache[key]


def _has_record(node: cst.CSTNode, ctx) -> bool:
    return any(isinstance(n, cst.With) and any(isinstance(i.item, cst.Call) and sc.call_name(ctx, i.item) in _RECORD for i in n.items)
               for n in astutil.walk(node))


def _calls_model(node: cst.CSTNode, models: set[str]) -> set[str]:
    return {dotted_name(c.func) for c in astutil.calls_in(node) if dotted_name(c.func) in models}


class GluonPredictMode(Rule):
    """
    ## What it does
    Gives a function that runs a trained model outside `autograd.record()` (an evaluation
    helper) PyTorch's inference mode, which Gluon implies:

        def evaluate(net, loader, device):          def evaluate(net, loader, device):
            metric = mx.metric.Accuracy()               net.eval()
            for data, label in loader:                  metric = mx.metric.Accuracy()
                ...                            ->       with torch.no_grad():
                metric.update([label], [net(data)])         for data, label in loader:
            return metric.get()[1]                              ...
                                                        net.train()
                                                        return metric.get()[1]

    In Gluon the mode is the recording scope: outside `autograd.record()` Dropout is off,
    BatchNorm normalises with its running statistics (and leaves them alone), and nothing
    is recorded. In PyTorch the mode is the module's flag: `net.eval()` and
    `torch.no_grad()` for the evaluation, `net.train()` again before the function returns,
    so the training loop that called it continues in training mode (as the recorded steps
    of the original do). The models are those a `gluon.Trainer` updates (`net` of
    `net.collect_params()`), by the name the function calls them with; the function must
    not record itself, and its model calls must sit in top-level `for` loops (else
    reported).

    ## Why
    A torch module stays in training mode until told otherwise: without this, an evaluation
    helper would apply dropout and update BatchNorm's running statistics.

    ## Fix safety
    Safe: the same computation in the same mode as the original.
    """

    code = "GL306"
    name = "gluon-predict-mode"
    target = "torch"
    summary = "a function calling the trained model outside autograd.record() -> net.eval(), torch.no_grad(), net.train() before it returns"
    severity = Severity.ERROR
    needs_text = ("Trainer",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx
            from mxnet import gluon

            def evaluate(net, loader):
                correct = 0
                for data, label in loader:
                    correct += (net(data).argmax(axis=1) == label).sum()
                return correct

            net = get_net()
            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            """,
            """
            import mxnet as mx
            from mxnet import gluon
            import torch

            def evaluate(net, loader):
                net.eval()
                correct = 0
                with torch.no_grad():
                    for data, label in loader:
                        correct += (net(data).argmax(axis=1) == label).sum()
                net.train()
                return correct

            net = get_net()
            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            """,
        ),
    ]
    valid = [
        "import torch\ndef evaluate(net, loader):\n    net.eval()\n    return [net(x) for x in loader]\n",
    ]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        models = trained_models(self.ctx)
        if not models or _has_record(node, self.ctx) or not isinstance(node.body, cst.IndentedBlock):
            return
        called = _calls_model(node.body, models)
        if not called:
            return
        body = list(node.body.body)
        loops = [s for s in body if isinstance(s, cst.For) and _calls_model(s, models)]
        outside = [s for s in body if not isinstance(s, cst.For) and _calls_model(s, models)]
        if outside or not loops:
            self.report(node, f"{node.name.value} runs {', '.join(sorted(called))} outside autograd.record() (Gluon's "
                        "inference mode) other than in top-level for loops: add eval()/no_grad()/train() by hand")
            return
        if any(isinstance(s, cst.SimpleStatementLine) and any(
                isinstance(x, cst.Expr) and astutil.method_name(x.value) in ("eval", "train") for x in s.body) for s in body):
            return  # already explicit
        names = sorted(called)
        torch = sc.torch_name(self.ctx)

        def build(u: cst.FunctionDef) -> cst.FunctionDef:
            stmts = list(u.body.body)
            out: list[cst.BaseStatement] = []
            start = 1 if stmts and _is_docstring(stmts[0]) else 0
            out.extend(stmts[:start])
            out.extend(cst.parse_statement(f"{m}.eval()\n") for m in names)
            returned = False
            for s in stmts[start:]:
                if isinstance(s, cst.For) and _calls_model(s, set(names) | models):
                    w = cst.parse_statement(f"with {torch}.no_grad():\n    pass\n")
                    s = w.with_changes(body=w.body.with_changes(body=[s.with_changes(leading_lines=[])]), leading_lines=s.leading_lines)
                if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, cst.Return) for x in s.body):
                    out.extend(cst.parse_statement(f"{m}.train()\n") for m in names)
                    returned = True
                out.append(s)
            if not returned:
                out.extend(cst.parse_statement(f"{m}.train()\n") for m in names)
            return u.with_changes(body=u.body.with_changes(body=out))

        self.report(node, f"{node.name.value} runs {', '.join(names)} outside autograd.record(): Gluon's inference mode "
                    "-> eval(), torch.no_grad(), train() before returning", Fix((self.replace(node, build),), imports=("torch",)))


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))
