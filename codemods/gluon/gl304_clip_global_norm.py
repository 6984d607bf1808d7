from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import trainer_names

_CLIP = ("mxnet.gluon.utils.clip_global_norm",)


def _grad_list(value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """``[p.grad(ctx) for p in params]`` -> ``params``."""
    if not isinstance(value, cst.ListComp) or value.for_in.inner_for_in is not None or value.for_in.ifs:
        return None
    elt, target = value.elt, value.for_in.target
    if (isinstance(elt, cst.Call) and isinstance(elt.func, cst.Attribute) and elt.func.attr.value == "grad"
            and isinstance(target, cst.Name) and isinstance(elt.func.value, cst.Name) and elt.func.value.value == target.value
            and len(elt.args) <= 1):
        return value.for_in.iter
    return None


def _model_parameters(params: cst.BaseExpression, ctx) -> cst.BaseExpression:
    """``params`` bound once to ``[p for p in net.collect_params().values() if p.grad_req !=
    "null"]`` (Gluon's trainable parameters) -> ``net.parameters()`` (torch's parameters are
    the trainable ones; running statistics are buffers); else ``params`` itself."""
    name = dotted_name(params)
    bound = [value for n, value, _ in sc.assignments(ctx) if n == name]
    if name is None or len(bound) != 1 or not isinstance(bound[0], cst.ListComp):
        return params
    comp = bound[0]
    it = comp.for_in.iter
    if (comp.for_in.inner_for_in is None and isinstance(comp.for_in.target, cst.Name) and isinstance(comp.elt, cst.Name)
            and comp.elt.value == comp.for_in.target.value and len(comp.for_in.ifs) <= 1
            and isinstance(it, cst.Call) and astutil.method_name(it) == "values" and isinstance(it.func.value, cst.Call)
            and astutil.method_name(it.func.value) == "collect_params" and not it.func.value.args):
        if comp.for_in.ifs:
            test = comp.for_in.ifs[0].test
            if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                    and isinstance(test.left, cst.Attribute) and test.left.attr.value == "grad_req"
                    and isinstance(test.comparisons[0].operator, cst.NotEqual)
                    and astutil.string_value(test.comparisons[0].comparator) == "null"):
                return params
        model = it.func.value.func.value
        return cst.Call(cst.Attribute(model, cst.Name("parameters")))
    return params


class GluonGradients(Rule):
    """
    ## What it does
    Translates the gradient-clipping idiom of Gluon scripts and the parameter lists it reads:

        params = [p for p in net.collect_params().values() if p.grad_req != "null"]
        ...
        loss.backward()
        grads = [p.grad(ctx) for p in params]
        gluon.utils.clip_global_norm(grads, max_norm)
        trainer.step(n)

    becomes

        params = [p for p in net.parameters() if p.requires_grad]
        ...
        (loss.sum() / n).backward()                                   # GL303
        torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm / n)
        trainer.step()

    (`net.parameters()` when `params` is that list of Gluon's trainable parameters: torch's
    parameters are the trainable ones, running statistics being buffers; another list
    stays.) Gluon clips the gradients before `trainer.step(n)` divides them by `n`; in the port they
    are divided already (GL303), so the threshold is divided by the same `n`: the same
    clipped update. `net.collect_params().values()` -> `net.parameters()` and
    `p.grad_req != "null"` -> `p.requires_grad` wherever they appear.

    Reported: `clip_global_norm` on a list porter cannot trace to `[p.grad() for p in ...]`,
    or without a `trainer.step(n)` after it in the same body.

    ## Why
    torch clips in place over the parameters' `.grad`; the torch-xla rules keep it in the
    step graph and the JAX rules turn it into `optax.clip_by_global_norm`.

    ## Fix safety
    Safe: the same clipping of the same (scaled) gradients, up to float rounding of the
    divided threshold.
    """

    code = "GL304"
    name = "gluon-clip-global-norm"
    target = "torch"
    summary = "gluon.utils.clip_global_norm(grads, c) before trainer.step(n) -> clip_grad_norm_(params, c / n); collect_params().values() -> parameters()"
    severity = Severity.ERROR
    needs_text = ("clip_global_norm", "collect_params", "grad_req")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 20})
            params = [p for p in model.collect_params().values() if p.grad_req != "null"]
            for data, target in batches:
                loss = step(data, target)
                grads = [p.grad(ctx) for p in params]
                gluon.utils.clip_global_norm(grads, clip * batch_size)
                trainer.step(batch_size)
            """,
            """
            from mxnet import gluon
            import torch

            trainer = gluon.Trainer(model.collect_params(), "sgd", {"learning_rate": 20})
            params = [p for p in model.parameters() if p.requires_grad]
            for data, target in batches:
                loss = step(data, target)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip * batch_size / batch_size)
                trainer.step(batch_size)
            """,
            title="the step's scaling is GL303's",
        ),
        Example(
            """
            from mxnet import gluon

            gluon.utils.clip_global_norm(arrays, 1.0)
            """,
            None,
            title="not before a trainer.step: reported",
        ),
    ]
    valid = ["import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "values" and not node.args:
            inner = func.value
            if isinstance(inner, cst.Call) and astutil.method_name(inner) == "collect_params" and not inner.args:
                self.report(node, "net.collect_params().values() -> net.parameters()",
                            Fix((self.replace(node, lambda u: u.func.value.with_changes(
                                func=u.func.value.func.with_changes(attr=cst.Name("parameters")))),)))
            return
        if sc.call_name(self.ctx, node) not in _CLIP:
            return
        plan = self._plan(node)
        if isinstance(plan, str):
            self.report(node, f"gluon.utils.clip_global_norm: {plan}; write torch.nn.utils.clip_grad_norm_ by hand "
                        "(mind the trainer.step(n) scaling: Gluon clips the unscaled gradients)")
            return
        grads_stmt, params, n = plan
        params = _model_parameters(params, self.ctx)
        torch = sc.torch_name(self.ctx)

        def build(u: cst.Call) -> cst.Call:
            threshold = u.args[1].value
            t = threshold.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if isinstance(threshold, (cst.BinaryOperation,)) and not isinstance(threshold.operator, (cst.Multiply, cst.Divide)) else threshold
            nn = n.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if isinstance(n, cst.BinaryOperation) else n
            return cst.Call(sc.expr(f"{torch}.nn.utils.clip_grad_norm_"),
                            [cst.Arg(params, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                             cst.Arg(cst.BinaryOperation(t, cst.Divide(), nn))])

        self.report(node, "clip_global_norm before trainer.step(n) -> clip_grad_norm_(params, max_norm / n)",
                    Fix((self.replace(node, build), self.remove(grads_stmt)), imports=("torch",)))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) != 1:
            return
        comp = node.comparisons[0]
        left = node.left
        if (isinstance(left, cst.Attribute) and left.attr.value == "grad_req" and isinstance(comp.operator, cst.NotEqual)
                and astutil.string_value(comp.comparator) == "null"):
            self.report(node, "p.grad_req != \"null\" -> p.requires_grad",
                        Fix((self.replace(node, lambda u: u.left.with_changes(attr=cst.Name("requires_grad"))),)))

    def _plan(self, node: cst.Call):
        if len(node.args) != 2 or any(a.keyword is not None for a in node.args):
            return "arguments other than (gradients, max_norm)"
        grads = dotted_name(node.args[0].value)
        stmt = astutil.enclosing_statement(self.ctx)
        parent = self.ctx.ancestors[-4] if len(self.ctx.ancestors) >= 4 else None
        body = getattr(parent, "body", None)
        if stmt is None or not isinstance(body, (list, tuple)) or stmt not in body:
            return "not a statement porter can read"
        index = list(body).index(stmt)
        grads_stmt = None
        for prev in reversed(body[:index]):
            if (isinstance(prev, cst.SimpleStatementLine) and len(prev.body) == 1 and isinstance(prev.body[0], cst.Assign)
                    and dotted_name(prev.body[0].targets[0].target) == grads):
                grads_stmt = prev
                break
        if grads_stmt is None:
            return "the gradient list is not built right before it ([p.grad() for p in params])"
        params = _grad_list(grads_stmt.body[0].value)
        if params is None:
            return "the gradient list is not [p.grad() for p in params]"
        if any(grads in {n.value for n in astutil.walk(s) if isinstance(n, cst.Name)} for s in body[index + 1:]):
            return "the gradient list is used after it"
        trainers = trainer_names(self.ctx)
        for later in body[index + 1:]:
            if (isinstance(later, cst.SimpleStatementLine) and len(later.body) == 1 and isinstance(later.body[0], cst.Expr)
                    and isinstance(later.body[0].value, cst.Call)):
                call = later.body[0].value
                if astutil.method_name(call) == "step" and dotted_name(call.func.value) in trainers and len(call.args) == 1:
                    return grads_stmt, params, call.args[0].value
        return "no trainer.step(n) of a gluon.Trainer follows it"
