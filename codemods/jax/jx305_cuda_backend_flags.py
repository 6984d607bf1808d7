from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

_PREFIXES = ("torch.backends.cudnn.", "torch.backends.cuda.matmul.", "torch.backends.cuda.")


class CudaBackendFlags(Rule):
    """
    ## What it does
    Removes assignments to cuDNN / CUDA switches (`torch.backends.cudnn.benchmark`,
    `.deterministic`, `.enabled`, `torch.backends.cuda.matmul.allow_tf32`, ...). A block left
    empty gets `pass`; the `cudnn` import goes when nothing else uses it. An assignment
    whose value calls a function is left alone (the call may matter) and reported.

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
    summary = "remove torch.backends.cudnn.* / cuda.matmul.* switches"
    severity = Severity.INFO
    needs_text = ("cudnn", "allow_tf32")
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
            if args.deterministic:
                pass
            """,
        ),
    ]
    valid = ["import torch\nif torch.backends.cudnn.enabled:\n    pass\n"]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign):
            return
        assign = node.body[0]
        if not all((self.ctx.qualname(t.target) or "").startswith(_PREFIXES) for t in assign.targets):
            return
        if any(isinstance(n, cst.Call) for n in _walk(assign.value)):
            self.report(node, "a cuDNN/CUDA switch set from a call: JAX does not read it (the call is kept)",
                        severity=Severity.INFO)
            return
        parent = self.ctx.parent
        only = isinstance(parent, cst.IndentedBlock) and len(parent.body) == 1
        edit = self.replace(node, node.with_changes(body=[cst.Pass()])) if only else self.remove(node)
        self.report(node, "cuDNN/CUDA backend switch: JAX does not read it",
                    Fix((edit,), Safety.SAFE, remove_imports=(("torch.backends.cudnn", None), ("torch.backends", "cudnn"))))


def _walk(node):
    from porter import astutil

    return astutil.walk(node)
