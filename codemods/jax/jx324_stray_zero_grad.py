from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _loop as lp


class StrayZeroGrad(Rule):
    """
    ## What it does
    Removes a `zero_grad()` statement of an optimizer the port made an `nnx.Optimizer` (or of
    its model) that no training step holds any more: before the training loop (`opt.zero_grad()`
    ahead of a loop that zeroes again after each step, or of a gradient-accumulation loop),
    after an epoch, in a reset helper (the whole helper where that is all it does and nothing
    calls it any more). The steps themselves are JX301's.

    ## Why
    `nnx.Optimizer` has no `zero_grad`: a JAX step computes its gradients afresh (JX301's
    `nnx.value_and_grad`, or its accumulation that starts from `grads = None`), so there is
    nothing to zero and the call raised AttributeError.

    ## Fix safety
    Safe: the ported steps never read gradients left from before them.
    """

    code = "JX324"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-stray-zero-grad"
    target = "jax"
    summary = "optimizer.zero_grad() outside the ported steps -> removed (an nnx.Optimizer has no gradients)"
    severity = Severity.INFO
    needs_text = ("zero_grad",)
    examples = [
        Example(
            """
            import flax.nnx as nnx
            import optax

            opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
            opt.zero_grad()
            for x, y in loader:
                loss = train_step(model, opt, x, y)
            """,
            """
            import flax.nnx as nnx
            import optax

            opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
            for x, y in loader:
                loss = train_step(model, opt, x, y)
            """,
        ),
    ]
    valid = [
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nopt.zero_grad()\n",
        # a step still torch's: JX301 ports (or reports) it whole
        "import flax.nnx as nnx\nopt = nnx.Optimizer(model, tx, wrt=nnx.Param)\nfor x in loader:\n"
        "    opt.zero_grad()\n    model(x).sum().backward()\n",
    ]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        # `def reset_grad(): d_optimizer.zero_grad(); g_optimizer.zero_grad()` that nothing calls
        # any more (JX301 took its calls with the steps): the whole helper goes
        if self._removable_helper(node):
            self.report(node, f"{node.name.value}() only zeroes the gradients of nnx.Optimizers, and nothing calls it "
                              "any more: the JAX port's steps compute their gradients afresh", Fix((self.remove(node),)))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        owner = self._stray(node)
        if owner is None:
            return
        fn = self.ctx.enclosing(cst.FunctionDef)
        if fn is not None and self._removable_helper(fn):
            return  # (one finding, for the whole helper)
        if any(isinstance(a, (cst.For, cst.While)) and lp.has_backward(a.body, into_functions=True)
               for a in self.ctx.ancestors):
            return  # inside a loop whose step is still torch's
        self.report(node, f"{owner}.zero_grad(): the JAX port's steps compute their gradients afresh (an "
                          "nnx.Optimizer has no zero_grad)", Fix((self.remove_statement(node),)))

    def _stray(self, stmt: cst.CSTNode):
        """The owner's code of ``stmt`` when it is `<nnx optimizer or its model>.zero_grad()` alone."""
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
            return None
        call = stmt.body[0].value
        if not isinstance(call, cst.Call) or astutil.method_name(call) != "zero_grad" or call.args:
            return None
        owner = lp.code(call.func.value)  # type: ignore[attr-defined]
        return owner if self._nnx_optimizer_or_its_model(owner) else None

    def _removable_helper(self, fn: cst.FunctionDef) -> bool:
        """``fn`` holds stray zero_grad statements only, and nothing in the file names it."""
        body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else ()
        return bool(body) and all(self._stray(s) is not None for s in body) and not any(
            isinstance(n, cst.Name) and n.value == fn.name.value and n is not fn.name
            for n in astutil.walk(self.ctx.module, into_functions=True))

    def _nnx_optimizer_or_its_model(self, owner: str) -> bool:
        key = ("jx324.nnx_optimizers", id(self.ctx.module))
        found = self.ctx.cache.get(key)
        if found is None:
            found = set()
            for n in astutil.walk(self.ctx.module, into_functions=True):
                if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call) \
                        and self.ctx.qualname(n.value.func) == "flax.nnx.Optimizer" and n.value.args:
                    found.add(lp.code(n.targets[0].target))
                    found.add(lp.code(n.value.args[0].value))  # its model
            self.ctx.cache[key] = found = frozenset(found)
        return owner in found
