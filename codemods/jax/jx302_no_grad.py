from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Safety, Severity

_NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad")


class NoGrad(Rule):
    """
    ## What it does
    Removes `with torch.no_grad():` / `with torch.inference_mode():` around evaluation code
    (the block's statements move up one level, its comments with them) and the
    `@torch.no_grad()` decorator of an evaluation function. `model.eval()` and
    `model.train()` stay: NNX modules have both and they switch Dropout and BatchNorm the
    same way. The evaluation loop keeps calling the model directly.

    ## Why
    JAX records nothing while code runs: gradients exist only where a function is passed to
    `nnx.grad` / `nnx.value_and_grad` (the train step), so there is no autograd state to
    switch off, and `torch.no_grad()` has no meaning for JAX arrays.

    ## Fix safety
    Safe: outside a differentiated function JAX computes no gradients. A `with` holding
    other context managers keeps them.
    """

    code = "JX302"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-no-grad"
    target = "jax"
    summary = "with torch.no_grad(): / @torch.no_grad() -> plain code (JAX computes gradients only where asked)"
    severity = Severity.WARNING
    needs_text = ("no_grad", "inference_mode")
    examples = [
        Example(
            """
            import torch

            def test(model, loader):
                model.eval()
                correct = 0
                with torch.no_grad():
                    # the whole test set
                    for data, target in loader:
                        output = model(data)
                        correct += (output.argmax(1) == target).sum().item()
                return correct
            """,
            """
            def test(model, loader):
                model.eval()
                correct = 0
                # the whole test set
                for data, target in loader:
                    output = model(data)
                    correct += (output.argmax(1) == target).sum().item()
                return correct
            """,
            title="an evaluation loop",
        ),
        Example(
            """
            import torch

            @torch.no_grad()
            def sample(model, z):
                return model.decode(z)

            with torch.inference_mode(), open("out.txt", "w") as f:
                f.write(str(sample(model, z)))
            """,
            """
            def sample(model, z):
                return model.decode(z)

            with open("out.txt", "w") as f:
                f.write(str(sample(model, z)))
            """,
            title="a decorator; a with statement keeps its other context managers",
        ),
    ]
    valid = [
        "import torch\nwith torch.enable_grad():\n    y = f(x)\n",
        "import torch\nwith torch.no_grad(False):\n    y = f(x)\n",
    ]

    def _is_no_grad(self, expr: cst.CSTNode) -> bool:
        if isinstance(expr, cst.Call):
            if expr.args:
                return False
            expr = expr.func
        q = self.ctx.qualname(expr) or dotted_name(expr) or ""
        return q in _NO_GRAD

    def visit_With(self, node: cst.With) -> None:
        keep = [item for item in node.items if not self._is_no_grad(item.item)]
        if len(keep) == len(node.items):
            return
        if keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            new: object = node.with_changes(items=keep)
        else:
            new = _unwrap  # a callable: edits inside the block (other rules) are kept
        self.report(node, "torch.no_grad(): JAX computes gradients only inside nnx.grad / value_and_grad; "
                          "the context is not needed", Fix((self.replace(node, new),), Safety.SAFE))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        drop = [d for d in node.decorators if self._is_no_grad(d.decorator)]
        if not drop:
            return
        kept = [d for d in node.decorators if not any(d is x for x in drop)]
        new = node.with_changes(decorators=kept)
        if not kept and node.decorators[0].leading_lines:
            new = new.with_changes(leading_lines=[*node.leading_lines, *node.decorators[0].leading_lines])
        self.report(node, "@torch.no_grad(): JAX computes gradients only where asked; the decorator is not needed",
                    Fix((self.replace(node, new),), Safety.SAFE))


def _unwrap(node: cst.With) -> cst.CSTNode:
    body = node.body
    if isinstance(body, cst.SimpleStatementSuite):
        stmts: list[cst.BaseStatement] = [cst.SimpleStatementLine(body.body)]
    else:
        stmts = list(body.body)  # type: ignore[attr-defined]
    first: Optional[cst.BaseStatement] = stmts[0] if stmts else None
    if first is not None:
        lines = [*node.leading_lines, *getattr(first, "leading_lines", ())]
        stmts[0] = first.with_changes(leading_lines=lines)
    return cst.FlattenSentinel(stmts)
