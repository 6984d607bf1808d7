from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp

_PREFIXES = lp.CUDA_SWITCH_PREFIXES


class CudaBackendFlags(Rule):
    """
    ## What it does
    Removes assignments to cuDNN / CUDA switches (`torch.backends.cudnn.benchmark`,
    `.deterministic`, `.enabled`, `torch.backends.cuda.matmul.allow_tf32`, ...) and the calls
    that only touch CUDA's own state (`torch.cuda.manual_seed(seed)`, `manual_seed_all`,
    `empty_cache()`). An `if` whose branches hold nothing else, under a condition that only
    reads (`if args.cuda:`, `if args.deterministic:`), goes whole; another block left empty
    gets `pass`; the `cudnn` import goes when nothing else uses it. An assignment whose value
    calls a function is left alone (the call may matter) and reported.

    ## Why
    JAX never reads them: XLA picks its own kernels. Left in, they suggest an effect
    (autotuning, determinism, TF32) the port does not have. JAX's matmul precision knob is
    `jax.default_matmul_precision` / the `jax_default_matmul_precision` flag.

    ## Fix safety
    Safe: the statements have no effect on JAX computations.
    """

    code = "JX305"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-cuda-backend-flags"
    target = "jax"
    summary = "remove torch.backends.cudnn.* / cuda.matmul.* switches, torch.cuda.manual_seed / empty_cache"
    severity = Severity.INFO
    needs_text = ("cudnn", "allow_tf32", "torch.cuda.", "torch.accelerator.")
    examples = [
        Example(
            """
            import torch
            import torch.backends.cudnn as cudnn

            torch.manual_seed(1)
            cudnn.benchmark = True
            if args.deterministic:
                torch.backends.cudnn.deterministic = True
            """,
            """
            import torch

            torch.manual_seed(1)
            """,
            title="switches go, and an `if` left with nothing to do",
        ),
        Example(
            """
            import torch

            args.cuda = not args.no_cuda and torch.cuda.is_available()
            torch.manual_seed(args.seed)
            torch.cuda.manual_seed_all(args.seed)
            if args.cuda:
                torch.cuda.manual_seed(args.seed)
            for epoch in range(epochs):
                train(epoch)
                torch.cuda.empty_cache()
            """,
            """
            import torch

            args.cuda = not args.no_cuda and torch.cuda.is_available()
            torch.manual_seed(args.seed)
            for epoch in range(epochs):
                train(epoch)
            """,
            title="CUDA's own seed and cache",
        ),
    ]
    valid = ["import torch\nif torch.backends.cudnn.enabled:\n    pass\n"]

    def visit_If(self, node: cst.If) -> None:
        # `if args.deterministic: cudnn.deterministic = True`: nothing is left in the port on either
        # path, so the statement goes whole (JX303 takes an `if` that also places on a device)
        if not lp.placement_if(node, self.ctx) or lp.in_placement_if(self.ctx):
            return
        if lp.places(node, self.ctx):
            return  # JX303's
        self.report(node, "only CUDA switches or CUDA's own state under this condition: JAX has neither "
                          "(the statement goes)",
                    Fix((self.remove(node),), Safety.SAFE, remove_imports=_CUDNN_IMPORTS))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if lp.in_placement_if(self.ctx):
            return  # visit_If (here or JX303's) removes the whole statement
        if len(node.body) == 1 and isinstance(node.body[0], cst.Expr):
            call = node.body[0].value
            if lp.placement_only(node.body[0], self.ctx) and lp.device_move(call, self.ctx) is None:
                # torch.cuda.manual_seed(seed) / empty_cache(): CUDA's own RNG and cache
                self.report(node, f"{self.ctx.qualname(call.func)}: CUDA's own state; JAX has no CUDA "
                                  "(random numbers come from the model's nnx.Rngs)",
                            Fix((self.remove_statement(node),), Safety.SAFE))
            return
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign):
            return
        assign = node.body[0]
        if not all((self.ctx.qualname(t.target) or "").startswith(_PREFIXES) for t in assign.targets):
            return
        if any(isinstance(n, cst.Call) for n in _walk(assign.value)):
            self.report(node, "a cuDNN/CUDA switch set from a call: JAX does not read it (the call is kept)",
                        severity=Severity.INFO)
            return
        self.report(node, "cuDNN/CUDA backend switch: JAX does not read it",
                    Fix((self.remove_statement(node),), Safety.SAFE, remove_imports=_CUDNN_IMPORTS))


_CUDNN_IMPORTS = (("torch.backends.cudnn", None), ("torch.backends", "cudnn"))


def _walk(node):
    from porter import astutil

    return astutil.walk(node)
