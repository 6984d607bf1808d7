from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

_COMPILE = ("torch.compile",)


class TorchCompile(Rule):
    """
    ## What it does
    Removes torch's compile wrapper from a JAX port: `model = torch.compile(model, ...)` goes
    (the name keeps the module), `fast = torch.compile(fn)` becomes `fast = fn`, any other
    `torch.compile(x, ...)` becomes `x`, and the decorators `@torch.compile` /
    `@torch.compile(mode=...)` go. An `if compile:` whose only statement was the wrapper,
    under a condition that only reads, goes whole; a branch with more in it (a message, an
    `unoptimized_model = model` alias) keeps the rest; a branch left with nothing (an `else`
    follows) keeps a `pass`.

    ## Why
    `torch.compile` traces a torch module with TorchDynamo; the JAX port's module is an NNX
    module and its step is already compiled by `nnx.jit` (JX301, JX310): torch's compiler
    fails on it, or wraps it in an object that hides the module's methods and attributes
    (`model.estimate_mfu(...)`, `nnx.state(model)`).

    ## Fix safety
    Safe: the wrapped function or module computes the same values as the wrapper. Unsafe
    where another argument of the call calls something (`backend=make_backend()`), which the
    fix drops.
    """

    code = "JX315"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-torch-compile"
    target = "jax"
    summary = "model = torch.compile(model) / @torch.compile removed (the JAX step is nnx.jit-compiled)"
    severity = Severity.INFO
    needs_text = ("compile",)
    examples = [
        Example(
            """
            import torch

            compile = True
            if compile:
                print("compiling the model...")
                unoptimized_model = model
                model = torch.compile(model, mode="max-autotune")
            if use_compile:
                model = torch.compile(model)
            step = torch.compile(train_step, fullgraph=True)
            """,
            """
            compile = True
            if compile:
                print("compiling the model...")
                unoptimized_model = model
            step = train_step
            """,
            title="the wrapper goes, the branch keeps the rest",
        ),
        Example(
            """
            import torch
            from torch import compile as tcompile

            @torch.compile
            def loss_fn(x, y):
                return ((x - y) ** 2).mean()

            @tcompile(mode="reduce-overhead", dynamic=False)
            def predict(x):
                return net(x)

            if args.compile:
                net = torch.compile(net)
            else:
                net = torch.compile(net, backend="eager")
            """,
            """
            def loss_fn(x, y):
                return ((x - y) ** 2).mean()

            def predict(x):
                return net(x)
            """,
            title="decorators, and both branches of an if",
        ),
        Example(
            """
            import torch

            model = torch.compile(model, backend=make_backend())
            """,
            """
            model = model
            """,
            unsafe=True,
            title="an argument that calls something",
        ),
    ]
    valid = [
        "import re\npattern = re.compile('a+')\n",
        "import torch\nmodel.compile()\n",
        "code = compile(source, 'f.py', 'exec')\n",
    ]

    def _target(self, call: cst.Call) -> Optional[cst.Arg]:
        if self.ctx.qualname(call.func) not in _COMPILE:
            return None
        return astutil.arg(call, "model", 0)

    def _others_call(self, call: cst.Call, kept: Optional[cst.Arg]) -> bool:
        return any(isinstance(n, cst.Call) for a in call.args if a is not kept
                   for n in astutil.walk(a.value, into_functions=True))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        dec = node.decorator
        if self.ctx.qualname(dec) in _COMPILE:
            unsafe = False
        elif isinstance(dec, cst.Call) and self.ctx.qualname(dec.func) in _COMPILE and self._target(dec) is None:
            unsafe = self._others_call(dec, None)
        else:
            return
        fn = self.ctx.parent
        if not isinstance(fn, (cst.FunctionDef, cst.ClassDef)):
            return
        kept = [d for d in fn.decorators if d is not node]
        new = fn.with_changes(decorators=kept)
        if not kept and node.leading_lines:
            new = new.with_changes(leading_lines=[*fn.leading_lines, *node.leading_lines])
        self.report(node, f"@{astutil.code(dec)}: the JAX port's step is compiled by nnx.jit; torch's compiler "
                          "does not trace JAX code (the decorator goes)",
                    Fix((self.replace(fn, new),), Safety.UNSAFE if unsafe else Safety.SAFE))

    def visit_Call(self, node: cst.Call) -> None:
        kept = self._target(node)
        if kept is None or kept.star:
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Decorator):
            return  # visit_Decorator's
        safety = Safety.UNSAFE if self._others_call(node, kept) else Safety.SAFE
        message = (f"{astutil.code(node.func)}(...): the JAX port's module is an NNX module and its step is compiled "
                   "by nnx.jit; torch's compiler does not trace it")
        stmt = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1 \
                and astutil.code(parent.targets[0].target) == astutil.code(kept.value) \
                and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and safety is Safety.SAFE:
            self.report(node, message + ": the wrapper goes (the name keeps the module)",
                        Fix((self._remove(stmt),), safety))
            return
        self.report(node, message + f": {astutil.code(kept.value)} itself",
                    Fix((self.replace(node, kept.value.with_changes(lpar=[], rpar=[])
                                      if isinstance(kept.value, cst.Name) else kept.value),), safety))

    def _remove(self, stmt: cst.SimpleStatementLine):
        """The statement removed; an `if` that held only it (no `else`), under a condition
        that only reads, goes whole; a block left empty keeps a `pass`."""
        block = self.ctx.ancestors[-4] if len(self.ctx.ancestors) >= 4 else None
        if isinstance(block, cst.IndentedBlock) and len(block.body) == 1:
            owner = self.ctx.ancestors[-5] if len(self.ctx.ancestors) >= 5 else None
            if isinstance(owner, cst.If) and owner.body is block and owner.orelse is None \
                    and not self._is_elif(owner) and _only_reads(owner.test):
                return self.remove(owner)
            return self.replace(stmt, stmt.with_changes(body=[cst.Pass()]))
        return self.remove(stmt)

    def _is_elif(self, node: cst.If) -> bool:
        above = self.ctx.ancestors[-6] if len(self.ctx.ancestors) >= 6 else None
        return isinstance(above, cst.If) and above.orelse is node


def _only_reads(test: cst.BaseExpression) -> bool:
    return not any(isinstance(n, (cst.Call, cst.Yield, cst.Await, cst.NamedExpr))
                   for n in astutil.walk(test, into_functions=True))
