from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp

_STEP = "eval_step"


class EvalStep(Rule):
    """
    ## What it does
    In an evaluation loop (a loop without a backward pass, under `torch.no_grad()` /
    `@torch.no_grad()` or after `model.eval()`), a statement that calls the model,
    `output = model(data)` or `output, hidden = model(data, hidden)`, calls it through one
    module-level jitted function instead:

        @nnx.jit
        def eval_step(model, *inputs):
            return model(*inputs)

    What the loop does with the outputs (losses, `argmax`, `.item()` sums) stays as it is.

    ## Why
    An NNX model called outside `nnx.jit` runs op by op (each one dispatched from Python);
    under `nnx.jit` the forward pass is compiled once per input shape and runs as one
    program. `model.eval()` is part of what is compiled (Dropout off, BatchNorm on its running
    averages), so a train step and the evaluation do not share a compiled program.

    ## Fix safety
    Safe: the same forward pass of the same module in the same mode.
    """

    code = "JX310"
    name = "jax-eval-step"
    target = "jax"
    summary = "output = model(x) in an evaluation loop -> output = eval_step(model, x) (@nnx.jit)"
    severity = Severity.WARNING
    needs_text = (".eval()", "no_grad", "inference_mode", "eval_step(")
    examples = [
        Example(
            """
            import torch

            def test(model, loader):
                model.eval()
                correct = 0
                for data, target in loader:
                    output = model(data)
                    correct += (output.argmax(1) == target).sum().item()
                return correct
            """,
            """
            import torch
            import flax.nnx as nnx

            @nnx.jit
            def eval_step(model, *inputs):
                return model(*inputs)

            def test(model, loader):
                model.eval()
                correct = 0
                for data, target in loader:
                    output = eval_step(model, data)
                    correct += (output.argmax(1) == target).sum().item()
                return correct
            """,
        ),
    ]
    valid = [
        "import torch\ndef f(model, loader):\n    for x in loader:\n        y = model(x)\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign):
            return
        assign = node.body[0]
        call = assign.value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
            return
        if any(a.keyword is not None or a.star for a in call.args) or not call.args:
            return
        model = call.func.value
        if model == _STEP:
            self._define_step()  # the call is ours, its def lost to another edit of the same statement
            return
        loop = astutil.enclosing_loop(self.ctx)
        if loop is None or not isinstance(loop, cst.For) or self.ctx.parent is not loop.body:
            return
        if not lp.is_model(model, self.ctx) or lp.has_backward(loop.body) or not self._evaluating(loop, model):
            return
        facts = lp.file_facts(self.ctx)
        nnx = lp.nnx_name(self.ctx)
        edits = [self.replace(call, call.with_changes(
            func=cst.Name(_STEP), args=[cst.Arg(cst.Name(model), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *call.args]))]
        defined = self.ctx.cache.setdefault(("jx310.defined",), set())
        if _STEP not in facts.toplevel and "pass" not in defined:
            defined.add("pass")
            holder = self.ctx.ancestors[1]
            step = cst.parse_statement(f"@{nnx}.jit\ndef {_STEP}(model, *inputs):\n    return model(*inputs)\n")
            edits.append(self.replace(holder, _insert_before(step)))
        elif _STEP in facts.toplevel and not self._ours():
            return  # a function of that name exists and is not porter's
        self.report(node, f"{model}(...) in an evaluation loop runs op by op: call it through the jitted {_STEP}",
                    Fix(tuple(edits), Safety.SAFE, ("flax.nnx",)))

    def _define_step(self) -> None:
        """``eval_step(model, ...)`` called and no top-level def of it: the def. (The def goes in
        with the first call's rewrite, before the statement holding it; when another rule
        replaces that statement in the same pass, e.g. JX302 flattening a `with torch.no_grad():`,
        the insertion is dropped and made here in the next pass.)"""
        facts = lp.file_facts(self.ctx)
        defined = self.ctx.cache.setdefault(("jx310.defined",), set())
        if _STEP in facts.toplevel or "pass" in defined or len(self.ctx.ancestors) < 2:
            return
        defined.add("pass")
        nnx = lp.nnx_name(self.ctx)
        holder = self.ctx.ancestors[1]
        step = cst.parse_statement(f"@{nnx}.jit\ndef {_STEP}(model, *inputs):\n    return model(*inputs)\n")
        self.report(self.ctx.ancestors[-1], f"{_STEP}(...) is called and not defined: its jitted def",
                    Fix((self.replace(holder, _insert_before(step)),), Safety.SAFE, ("flax.nnx",)))

    def _ours(self) -> bool:
        for stmt in self.ctx.module.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == _STEP:
                return lp.code(stmt.body).strip().endswith("return model(*inputs)")
        return False


    def _evaluating(self, loop, model: str) -> bool:
        if astutil._under_no_grad(loop, self.ctx):
            return True
        fn = self.ctx.enclosing(cst.FunctionDef)
        scope = fn.body if fn is not None else self.ctx.module
        for c in astutil.calls_in(scope):
            if astutil.method_name(c) == "eval" and lp.code(c.func.value) == model:  # type: ignore[attr-defined]
                return True
        return False


def _insert_before(step):
    def apply(updated):
        blank = []
        for line in updated.leading_lines:
            if line.comment is not None:
                break
            blank.append(line)
        lines = list(updated.leading_lines) if blank else [cst.EmptyLine(), *updated.leading_lines]
        return cst.FlattenSentinel([step.with_changes(leading_lines=blank), updated.with_changes(leading_lines=lines)])

    return apply
