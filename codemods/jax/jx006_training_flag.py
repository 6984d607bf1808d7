from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _nnx


class NnxTrainingFlag(Rule):
    """
    ## What it does
    In a module class that reads `self.training`, the reads become `not self.deterministic`
    and `__init__` starts with `self.deterministic = False` (a module starts in training
    mode, as in torch); so does the `__init__` of a class that reads `self.deterministic`
    without setting it (the reads of a class without `__init__` are rewritten in the pass
    where JX001 writes one).

    ## Why
    NNX modules have no `training` attribute. `model.train()` / `model.eval()` of an
    `nnx.Module` set `deterministic` (and `use_running_average`) on every submodule that has
    the attribute: `nnx.Dropout`'s own switch. A module with a `deterministic` attribute
    follows the same switch, so `if self.training:` keeps meaning what it meant.

    ## Fix safety
    Safe: `model.train()` sets `deterministic = False` and `model.eval()` sets it to True on
    the module, exactly when torch sets `training` to True / False.
    """

    code = "JX006"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-training-flag"
    target = "jax"
    summary = "self.training -> not self.deterministic (set by model.train() / model.eval())"
    severity = Severity.ERROR
    needs_text = ("training", "deterministic")
    examples = [
        Example(
            """
            import torch.nn as nn

            class Noisy(nn.Module):
                def __init__(self, sigma):
                    super().__init__()
                    self.sigma = sigma

                def forward(self, x, noise):
                    if self.training:
                        x = x + self.sigma * noise
                    return x, self.training == False
            """,
            """
            import torch.nn as nn

            class Noisy(nn.Module):
                def __init__(self, sigma):
                    self.deterministic = False
                    super().__init__()
                    self.sigma = sigma

                def forward(self, x, noise):
                    if not self.deterministic:
                        x = x + self.sigma * noise
                    return x, (not self.deterministic) == False
            """,
        ),
        Example(
            """
            from flax import nnx

            class Gate(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.rngs = rngs

                def __call__(self, x):
                    return x if not self.deterministic else 0.5 * x
            """,
            """
            from flax import nnx

            class Gate(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.deterministic = False
                    self.rngs = rngs

                def __call__(self, x):
                    return x if not self.deterministic else 0.5 * x
            """,
            title="reads rewritten before the class had an __init__ (JX001 writes one for a module class without)",
        ),
    ]
    valid = ["import torch.nn as nn\nclass M(nn.Module):\n    def forward(self, x):\n        return x\n"]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if _nnx.module_classes(self.ctx).get(node.name.value) is not node:
            return
        edits: list[Edit] = []
        for n in astutil.walk(node.body, into_functions=True):
            if isinstance(n, cst.ClassDef):
                continue
            for child in astutil.children(n):
                if _is_self_training(child):
                    edits.append(self.replace(child, _not_deterministic(n, child)))
        init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if not edits and (init is None or not _reads_deterministic(node)):
            return
        if init is not None and not _assigns_deterministic(init):
            # also where an earlier pass rewrote the reads before JX001 gave the class its __init__
            edits.append(self.replace(init.body, _prepend(cst.parse_statement("self.deterministic = False"))))
        if not edits:
            return
        self.report(node, f"class {node.name.value} reads self.training: NNX modules switch `deterministic` "
                    "(model.train() / model.eval())", Fix(tuple(edits)))


def _is_self_training(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Attribute) and node.attr.value == "training"
        and isinstance(node.value, cst.Name) and node.value.value == "self"
    )


_BARE_OK = (cst.If, cst.While, cst.IfExp, cst.Arg, cst.Return, cst.Assign, cst.AnnAssign, cst.BooleanOperation,
            cst.Assert, cst.Expr, cst.Element, cst.DictElement)


def _not_deterministic(parent: cst.CSTNode, node: cst.Attribute) -> cst.BaseExpression:
    expr = cst.UnaryOperation(cst.Not(), cst.Attribute(cst.Name("self"), cst.Name("deterministic")))
    if isinstance(parent, _BARE_OK):
        return expr.with_changes(lpar=node.lpar, rpar=node.rpar)
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _reads_deterministic(cls: cst.ClassDef) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value == "deterministic" and isinstance(n.value, cst.Name)
               and n.value.value == "self" for n in astutil.walk(cls.body, into_functions=True))


def _assigns_deterministic(func: cst.FunctionDef) -> bool:
    for n in astutil.walk(func.body):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                if isinstance(t.target, cst.Attribute) and t.target.attr.value == "deterministic":
                    return True
    return False


def _prepend(stmt: cst.BaseStatement):
    def apply(body: cst.IndentedBlock) -> cst.IndentedBlock:
        items = list(body.body)
        at = 1 if items and isinstance(items[0], cst.SimpleStatementLine) and isinstance(items[0].body[0], cst.Expr) \
            and isinstance(items[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)) else 0
        return body.with_changes(body=[*items[:at], stmt, *items[at:]])
    return apply
