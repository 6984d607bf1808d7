from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

# methods of a training step and of its optimizer: the loop rules read them statement by statement
_STEP_METHODS = frozenset({"backward", "step", "zero_grad"})


class OneStatementPerLine(Rule):
    """
    ## What it does
    Splits a line of several statements joined by `;` into one line each, where one of them
    is torch code the JAX port rewrites: a step of training (`opt.zero_grad(); loss.backward();
    opt.step()`) or a torch call (`X = torch.randn(32, 4); y = torch.randint(0, 2, (32,))`).
    The first line keeps the comments above, the last the comment at the end.

    ## Why
    The JAX rules find a training step, a tensor made for the input pipeline and a host draw
    statement by statement: a step written on one line was not rewritten (its `zero_grad`
    raised AttributeError on the nnx.Optimizer), and a line of two data tensors was handed to
    JAX where the pipeline needs torch tensors.

    ## Fix safety
    Safe: the same statements in the same order.
    """

    code = "JX323"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-one-statement-per-line"
    target = "jax"
    summary = "a line of `;`-joined torch statements -> one statement per line (the loop rules read them one by one)"
    severity = Severity.INFO
    needs_text = (";",)
    examples = [
        Example(
            """
            import torch

            X = torch.randn(32, 4); y = torch.randint(0, 2, (32,))
            for x, t in loader:
                optimizer.zero_grad(); loss_fn(model(x), t).backward(); optimizer.step()  # one step
            """,
            """
            import torch

            X = torch.randn(32, 4)
            y = torch.randint(0, 2, (32,))
            for x, t in loader:
                optimizer.zero_grad()
                loss_fn(model(x), t).backward()
                optimizer.step()  # one step
            """,
        ),
    ]
    valid = [
        "import torch\na = 1; b = 2\n",
        "import torch\nx = torch.zeros(2)\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) < 2 or not any(self._rewritten(small) for small in node.body):
            return
        lines = []
        last = len(node.body) - 1
        for i, small in enumerate(node.body):
            lines.append(cst.SimpleStatementLine(
                [small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
                leading_lines=node.leading_lines if i == 0 else (),
                trailing_whitespace=node.trailing_whitespace if i == last else cst.TrailingWhitespace()))
        self.report(node, "several statements on one line, torch code among them: one statement per line, which "
                          "the JAX rules read one by one", Fix((self.replace(node, cst.FlattenSentinel(lines)),)))

    def _rewritten(self, small: cst.BaseSmallStatement) -> bool:
        for n in astutil.walk(small):
            if isinstance(n, cst.Call) and (astutil.method_name(n) in _STEP_METHODS
                                            or (self.ctx.qualname(n.func) or "").startswith("torch.")):
                return True
        return False
