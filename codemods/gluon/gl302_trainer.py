from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import TRAINER, optimizer_name, trainer_names

# Gluon optimizer -> (torch.optim class, Gluon optimizer parameter -> torch keyword, fixed torch keywords)
_OPTIMIZERS = {
    "sgd": ("SGD", {"learning_rate": "lr", "momentum": "momentum", "wd": "weight_decay"}, {}),
    "nag": ("SGD", {"learning_rate": "lr", "momentum": "momentum", "wd": "weight_decay"}, {"nesterov": "True"}),
    "adam": ("GluonAdam", {"learning_rate": "lr", "wd": "weight_decay", "epsilon": "eps"}, {}),
}
_IGNORED = ("lazy_update",)  # dense gradients: no effect


def _literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)) or (
        isinstance(node, cst.Name) and node.value in ("True", "False", "None"))


def optimizer_params_dict(ctx, node: cst.BaseExpression) -> Optional[cst.Dict]:
    """The optimizer parameters' dict: a dict literal, or a name the file binds once to a dict of
    literal values (``optimizer_params = {'learning_rate': 0.1, 'wd': 1e-4}``), never a
    parameter, never changed (``d[k] = v``, ``d.update(...)``); else None."""
    if isinstance(node, cst.Dict):
        return node
    if not isinstance(node, cst.Name):
        return None
    name = node.value
    values = [v for n, v, _ in sc.assignments(ctx) if n == name]
    if len(values) != 1 or not isinstance(values[0], cst.Dict):
        return None
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Param) and n.name.value == name:
            return None
        if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value == name:
            return None  # d[k] read or written: not followed
        if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == name:
            return None  # d.update(...), d.pop(...)
    if not all(isinstance(el, cst.DictElement) and _literal(el.value) for el in values[0].elements):
        return None
    return values[0]


def _params_expr(node: cst.BaseExpression, ctx) -> Optional[cst.BaseExpression]:
    """``net.collect_params()`` -> ``net.parameters()``; anything else: None."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "collect_params" and not node.args:
        return node.with_changes(func=node.func.with_changes(attr=cst.Name("parameters")))
    return None


class GluonTrainer(Rule):
    """
    ## What it does
    Translates `gluon.Trainer(net.collect_params(), optimizer, {params})` into a torch
    optimizer over `net.parameters()` (the optimizer's name and its parameters also through a
    variable the file binds once to a string, or to a dict of constants):

    | Gluon optimizer | PyTorch |
    | --- | --- |
    | `"sgd"` (`learning_rate`, `momentum`, `wd`) | `torch.optim.SGD(lr=, momentum=, weight_decay=)` |
    | `"nag"` | `torch.optim.SGD(..., nesterov=True)` |
    | `"adam"` (`learning_rate`, `beta1`, `beta2`, `epsilon`, `wd`) | `GluonAdam(lr=, betas=(beta1, beta2), eps=, weight_decay=)`, a `torch.optim.Adam` emitted in the port that keeps MXNet's epsilon placement |

    Gluon's `wd` is an L2 term added to the gradient after the `1/batch_size` rescaling:
    torch's `weight_decay` (not AdamW's decoupled decay). Gluon's SGD keeps the learning
    rate inside its momentum buffer (`mom = momentum * mom - lr * grad`): the same as torch's
    SGD for a constant learning rate; after a learning-rate change the two differ for the
    steps the old momentum lasts. Gluon's Adam puts epsilon inside the bias correction
    (`lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`); measured on the
    `cnn_bn_dropout` fixture, torch's placement moves the loss of 5 steps by 5.4e-4
    (relative), so the port gets `GluonAdam` (torch's Adam with `eps / sqrt(1 - b2^t)` at
    step t, exactly MXNet's update).

    Reported: other optimizers (their MXNet updates differ from torch's in details: RMSProp
    puts epsilon inside the square root, ...), `clip_gradient`, `rescale_grad`,
    `lr_scheduler` in the parameters, `kvstore`/`update_on_kvstore` other than the default,
    and a parameter set other than `net.collect_params()`.

    ## Why
    A torch training loop steps a `torch.optim` optimizer; the torch-xla and JAX rules take
    it from there (`xm.optimizer_step`, optax).

    ## Fix safety
    Safe: the same update for the optimizers translated (see the SGD note above).
    """

    code = "GL302"
    name = "gluon-trainer"
    target = "torch"
    summary = "gluon.Trainer(net.collect_params(), 'sgd'|'nag'|'adam', {...}) -> torch.optim.SGD / an exact Gluon Adam"
    severity = Severity.ERROR
    needs_text = ("Trainer",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 5e-4})
            """,
            """
            import torch

            trainer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
            """,
        ),
        Example(
            """
            from mxnet import gluon

            optimizer = "nag"
            trainer = gluon.Trainer(net.collect_params(), optimizer, {"learning_rate": 0.1, "momentum": 0.9})
            """,
            """
            import torch

            optimizer = "nag"
            trainer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
            """,
            title="the optimizer named by a variable bound to one string",
        ),
        Example(
            """
            from mxnet import gluon

            optimizer = "nag"
            optimizer_params = {"learning_rate": 0.1, "wd": 1e-4, "momentum": 0.9}
            trainer = gluon.Trainer(net.collect_params(), optimizer, optimizer_params)
            """,
            """
            import torch

            optimizer = "nag"
            optimizer_params = {"learning_rate": 0.1, "wd": 1e-4, "momentum": 0.9}
            trainer = torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=1e-4, momentum=0.9, nesterov=True)
            """,
            title="and its parameters by a variable bound to one dict of constants",
        ),
        Example(
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": lr, "beta1": 0.5})
            """,
            """
            import math
            import torch


            class GluonAdam(torch.optim.Adam):
                \"\"\"gluon.Trainer's "adam" as a torch optimizer. MXNet puts epsilon inside the bias
                correction: w -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps), where
                torch.optim.Adam divides by sqrt(v) / sqrt(1 - beta2^t) + eps; torch's update with
                eps / sqrt(1 - beta2^t) at step t is MXNet's exactly. weight_decay is MXNet's wd: an L2
                term added to the gradient, as in torch's Adam.\"\"\"

                def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
                    super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
                    for group in self.param_groups:
                        group["gluon_eps"] = eps
                        group["gluon_steps"] = 0

                def step(self, closure=None):
                    for group in self.param_groups:
                        group["gluon_steps"] += 1
                        group["eps"] = group["gluon_eps"] / math.sqrt(1 - group["betas"][1] ** group["gluon_steps"])
                    return super().step(closure)


            trainer = GluonAdam(net.parameters(), lr=lr, betas=(0.5, 0.999))
            """,
            title="Adam keeps MXNet's epsilon placement",
        ),
        Example(
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "rmsprop", {"learning_rate": 0.01})
            """,
            None,
            title="another optimizer: reported",
        ),
    ]
    valid = ["import torch\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"]

    def visit_Module(self, node: cst.Module) -> None:
        adam = any(o == "adam" for o in trainer_names(self.ctx).values()) or any(
            sc.call_name(self.ctx, n) in TRAINER and self._optimizer(n) == "adam"
            for n in astutil.walk(node, into_functions=True) if isinstance(n, cst.Call))
        if adam and not sc.defined_at_top(self.ctx, "GluonAdam"):
            self.report(node, "Gluon's Adam: the port defines GluonAdam (torch's Adam with MXNet's epsilon placement)",
                        Fix((self.replace(node, sc.insert_before_defs(sc.render("gluon_script_optim.py.j2"))),),
                            imports=("torch", "math")), severity=Severity.INFO)

    def _optimizer(self, node: cst.Call) -> Optional[str]:
        opt = astutil.arg(node, "optimizer", 1)
        return optimizer_name(self.ctx, opt.value) if opt is not None else None

    def visit_Call(self, node: cst.Call) -> None:
        if sc.call_name(self.ctx, node) not in TRAINER:
            return
        problem = self._problem(node)
        if problem:
            self.report(node, f"gluon.Trainer: {problem}; write the torch optimizer by hand")
            return
        opt = self._optimizer(node)
        torch_cls, mapping, fixed = _OPTIMIZERS[opt]
        opt_params = astutil.arg(node, "optimizer_params", 2)

        def build(u: cst.Call) -> cst.Call:
            params = _params_expr(astutil.arg(u, "params", 0).value, self.ctx)
            args = [cst.Arg(params)]
            op = astutil.arg(u, "optimizer_params", 2)
            values = {}
            if op is not None:
                for el in optimizer_params_dict(self.ctx, op.value).elements:
                    values[astutil.string_value(el.key)] = el.value
            betas = None
            for key, value in values.items():
                if key in ("beta1", "beta2"):
                    continue
                if key in _IGNORED:
                    continue
                args.append(sc.kwarg(mapping[key], value))
            if "beta1" in values or "beta2" in values:
                b1 = values.get("beta1", cst.Float("0.9"))
                b2 = values.get("beta2", cst.Float("0.999"))
                betas = cst.Tuple([cst.Element(b1), cst.Element(b2)])
                # after lr, before the rest (torch's order)
                args.insert(2 if len(args) > 1 and args[1].keyword.value == "lr" else 1, sc.kwarg("betas", betas))
            for key, value in fixed.items():
                args.append(sc.kwarg(key, sc.expr(value)))
            func = sc.expr(torch_cls if torch_cls == "GluonAdam" else f"{sc.torch_name(self.ctx)}.optim.{torch_cls}")
            return cst.Call(func, args)

        del opt_params
        self.report(node, f"gluon.Trainer({opt!r}) -> {torch_cls}", Fix((self.replace(node, build),), imports=("torch",)))

    def _problem(self, node: cst.Call) -> Optional[str]:
        params = astutil.arg(node, "params", 0)
        if params is None or _params_expr(params.value, self.ctx) is None:
            return "the parameters are not `net.collect_params()`"
        opt = self._optimizer(node)
        if opt not in _OPTIMIZERS:
            return f"the optimizer {opt!r} (porter translates {', '.join(repr(k) for k in _OPTIMIZERS)})"
        for a in node.args:
            if a.keyword is not None and a.keyword.value not in ("params", "optimizer", "optimizer_params"):
                if not (a.keyword.value == "kvstore" and astutil.string_value(a.value) == "device"):
                    return f"the argument {a.keyword.value}="
        if len([a for a in node.args if a.keyword is None]) > 3:
            return "kvstore/compression arguments"
        op = astutil.arg(node, "optimizer_params", 2)
        if op is None:
            return None
        params_dict = optimizer_params_dict(self.ctx, op.value)
        if params_dict is None:
            return "optimizer parameters that are not a dict literal"
        allowed = set(_OPTIMIZERS[opt][1]) | set(_IGNORED) | ({"beta1", "beta2"} if opt == "adam" else set())
        for el in params_dict.elements:
            if not isinstance(el, cst.DictElement) or astutil.string_value(el.key) is None:
                return "optimizer parameters that are not a dict literal"
            key = astutil.string_value(el.key)
            if key not in allowed:
                return f"the optimizer parameter {key!r}"
        return None
