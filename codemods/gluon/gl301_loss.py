from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

# Gluon loss -> (torch module, how a call's label and result are adapted)
_LOSSES = {
    "mxnet.gluon.loss.SoftmaxCrossEntropyLoss": ("CrossEntropyLoss", "class_index"),
    "mxnet.gluon.loss.SoftmaxCELoss": ("CrossEntropyLoss", "class_index"),
    "mxnet.gluon.loss.SigmoidBinaryCrossEntropyLoss": ("BCEWithLogitsLoss", "per_sample"),
    "mxnet.gluon.loss.SigmoidBCELoss": ("BCEWithLogitsLoss", "per_sample"),
    "mxnet.gluon.loss.L2Loss": ("MSELoss", "half_per_sample"),
    "mxnet.gluon.loss.L1Loss": ("L1Loss", "per_sample"),
}
# constructor arguments that keep Gluon's defaults (anything else is reported)
_DEFAULTS = {
    "axis": ("-1",), "sparse_label": ("True",), "from_logits": ("False",), "from_sigmoid": ("False",),
    "batch_axis": ("0",), "weight": ("None", "1", "1.0"),
}
# SoftmaxCrossEntropyLoss(sparse_label=False): the label holds class probabilities
_SOFTMAX_CE = ("mxnet.gluon.loss.SoftmaxCrossEntropyLoss", "mxnet.gluon.loss.SoftmaxCELoss")


def loss_objects(ctx) -> dict[str, str]:
    """Names bound to a Gluon loss this rule translates -> how its calls are adapted
    (``class_index``, ``probabilities``, ``per_sample``, ``half_per_sample``)."""
    key = ("gluon.losses", ctx.module)
    if key not in ctx.cache:
        ctx.cache[key] = {n: _how(ctx, n, q) for n, q in sc.names_bound_to(ctx, _LOSSES).items() if _translatable(ctx, n)}
    return ctx.cache[key]


def _how(ctx, name: str, qualname: str) -> str:
    call = _ctor(ctx, name)
    sparse = astutil.arg(call, "sparse_label") if call is not None else None
    if qualname in _SOFTMAX_CE and sparse is not None and sc.code(sparse.value) == "False":
        return "probabilities"
    return _LOSSES[qualname][1]


def _ctor(ctx, name: str) -> Optional[cst.Call]:
    for n, value, _ in sc.assignments(ctx):
        if n == name and sc.call_name(ctx, value) in _LOSSES:
            return value
    return None


def _translatable(ctx, name: str) -> bool:
    call = _ctor(ctx, name)
    if call is None:
        return False
    allowed = dict(_DEFAULTS)
    if sc.call_name(ctx, call) in _SOFTMAX_CE:
        allowed["sparse_label"] = ("True", "False")  # False: probability labels (torch takes them as float targets)
    for a in call.args:
        if a.keyword is None or a.keyword.value not in allowed or sc.code(a.value) not in allowed[a.keyword.value]:
            return False
    # every binding of the name is this constructor (no rebinding to something else)
    return sum(1 for n, _, _ in sc.assignments(ctx) if n == name) == 1


class GluonLoss(Rule):
    """
    ## What it does
    Translates Gluon losses into torch loss modules that return one value per sample, as
    Gluon's do, and adapts each call of the loss object:

    | Gluon | PyTorch | a call `loss_fn(pred, label)` |
    | --- | --- | --- |
    | `SoftmaxCrossEntropyLoss()` | `nn.CrossEntropyLoss(reduction="none")` | `loss_fn(pred, label.long())` (Gluon takes float class indices) |
    | `SoftmaxCrossEntropyLoss(sparse_label=False)` | `nn.CrossEntropyLoss(reduction="none")` | `loss_fn(pred, torch.as_tensor(label, dtype=torch.float32))` (class probabilities: torch reads a float target as probabilities, and the JAX rules see them, `-sum(label * log_softmax(pred))` per sample as Gluon) |
    | `SigmoidBinaryCrossEntropyLoss()` | `nn.BCEWithLogitsLoss(reduction="none")` | `loss_fn(pred, label.reshape(pred.shape)).reshape(pred.shape[0], -1).mean(1)` |
    | `L2Loss()` | `nn.MSELoss(reduction="none")` | `(loss_fn(pred, label.reshape(pred.shape)) / 2).reshape(pred.shape[0], -1).mean(1)` |
    | `L1Loss()` | `nn.L1Loss(reduction="none")` | like `SigmoidBinaryCrossEntropyLoss` |

    Gluon reshapes the label like the prediction and averages over every axis but the batch
    axis: the call keeps both. The per-sample values then meet GL303, which makes the
    `trainer.step(batch_size)` scaling explicit. `SoftmaxCrossEntropyLoss` takes the class
    axis last (Gluon's `axis=-1`), torch at 1: the same for the (batch, classes) predictions
    of a classifier; a loss over more axes must be reshaped to two first.

    Reported, not translated: non-default arguments (`from_logits`,
    `from_sigmoid`, `weight`, `axis`), a call with `sample_weight`, a loss object used other
    than by calling it, and for the reshaping losses a prediction that is not a plain name
    (it is read twice).

    ## Why
    torch's losses average over the batch by default; Gluon's never do.

    ## Fix safety
    Safe: the same per-sample values.
    """

    code = "GL301"
    name = "gluon-loss"
    target = "torch"
    summary = "gluon.loss.* -> torch losses with reduction=\"none\" and Gluon's per-sample mean; labels adapted at each call"
    severity = Severity.ERROR
    needs_text = ("Loss",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
            loss = loss_fn(net(data), label)
            """,
            """
            import torch.nn

            loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
            loss = loss_fn(net(data), label.long())
            """,
        ),
        Example(
            """
            from mxnet import gluon

            bce = gluon.loss.SigmoidBinaryCrossEntropyLoss()
            out = netD(fake)
            err = bce(out, fake_label)
            """,
            """
            import torch.nn

            bce = torch.nn.BCEWithLogitsLoss(reduction="none")
            out = netD(fake)
            err = bce(out, fake_label.reshape(out.shape)).reshape(out.shape[0], -1).mean(1)
            """,
        ),
        Example(
            """
            from mxnet import gluon

            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
            loss = loss_fn(output, mixed_label)
            """,
            """
            import torch
            import torch.nn

            loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
            loss = loss_fn(output, torch.as_tensor(mixed_label, dtype=torch.float32))
            """,
            title="probability labels (mixup, label smoothing): a float target",
        ),
        Example(
            """
            from mxnet import gluon

            loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(from_logits=True)
            """,
            None,
            title="non-default arguments: reported",
        ),
    ]
    valid = ["import torch\nloss_fn = torch.nn.CrossEntropyLoss()\nl = loss_fn(a, b)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        if name in _LOSSES:
            self._constructor(node, name)
            return
        callee = dotted_name(node.func)
        objects = loss_objects(self.ctx)
        if callee in objects:
            self._call(node, objects[callee])

    def _constructor(self, node: cst.Call, name: str) -> None:
        assign = self.ctx.enclosing(cst.Assign)
        bound = dotted_name(assign.targets[0].target) if assign is not None and len(assign.targets) == 1 and assign.value is node else None
        if bound is None or bound not in loss_objects(self.ctx):
            self.report(node, f"{sc.code(node.func)} with arguments (or a use) porter does not translate: "
                        "write the torch loss by hand, reduction=\"none\" and Gluon's mean over the non-batch axes")
            return
        torch_loss, _ = _LOSSES[name]
        nn = self.ctx.module_alias("torch.nn")
        new = sc.expr(f'{nn}.{torch_loss}(reduction="none")')
        self.report(node, f"{sc.code(node.func)} -> torch.nn.{torch_loss}(reduction=\"none\") (per sample, as Gluon)",
                    Fix((self.replace(node, new),), imports=("torch.nn",)))

    def _call(self, node: cst.Call, how: str) -> None:
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if len(positional) != 2 or len(node.args) != 2:
            self.report(node, "a Gluon loss called with sample_weight or keywords: translate by hand")
            return
        pred = positional[0].value
        if how == "probabilities":

            torch = sc.torch_name(self.ctx)

            def build_float(u: cst.Call) -> cst.Call:
                label = sc.code(u.args[1].value)
                return u.with_changes(args=[u.args[0], u.args[1].with_changes(
                    value=sc.expr(f"{torch}.as_tensor({label}, dtype={torch}.float32)"))])

            self.report(node, "SoftmaxCrossEntropyLoss(sparse_label=False) takes class probabilities: a float32 target, "
                        "which torch's CrossEntropyLoss reads as probabilities", Fix((self.replace(node, build_float),), imports=("torch",)))
            return
        if how == "class_index":

            def build(u: cst.Call) -> cst.Call:
                label = u.args[1].value
                return u.with_changes(args=[u.args[0], u.args[1].with_changes(
                    value=cst.Call(cst.Attribute(_paren(label), cst.Name("long"))))])

            self.report(node, "Gluon's SoftmaxCrossEntropyLoss takes float labels: .long() for torch",
                        Fix((self.replace(node, build),)))
            return
        if not isinstance(pred, cst.Name):
            self.report(node, "the prediction is read twice (Gluon reshapes the label like it): assign it to a name first")
            return
        p = pred.value
        half = how == "half_per_sample"

        def build2(u: cst.Call) -> cst.BaseExpression:
            label = u.args[1].value
            reshaped = cst.Call(cst.Attribute(_paren(label), cst.Name("reshape")), [cst.Arg(sc.expr(f"{p}.shape"))])
            call = u.with_changes(args=[u.args[0], u.args[1].with_changes(value=reshaped)])
            inner: cst.BaseExpression = call
            if half:
                inner = cst.BinaryOperation(call, cst.Divide(), cst.Integer("2"), lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            flat = cst.Call(cst.Attribute(inner, cst.Name("reshape")), [cst.Arg(sc.expr(f"{p}.shape[0]")), cst.Arg(sc.expr("-1"))])
            return cst.Call(cst.Attribute(flat, cst.Name("mean")), [cst.Arg(cst.Integer("1"))])

        self.report(node, "Gluon reshapes the label like the prediction and averages each sample's values",
                    Fix((self.replace(node, build2),)))


def _paren(e: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(e, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return e
    return e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
