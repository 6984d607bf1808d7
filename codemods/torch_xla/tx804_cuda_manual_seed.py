import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import CUDA_SEEDS, TORCH_XLA


class CudaManualSeed(Rule):
    """
    ## What it does
    Rewrites `torch.cuda.manual_seed(s)` and `torch.cuda.manual_seed_all(s)` to
    `torch_xla.manual_seed(s)`.

    ## Why
    The XLA device has its own random generator, which `torch.manual_seed` does not seed:
    measured in torch_xla 2.9, two `torch.rand(3, device=torch_xla.device())` after the same
    `torch.manual_seed(7)` differ, after the same `torch_xla.manual_seed(7)` they are equal.
    `torch_xla.manual_seed(seed)` (it calls `xm.set_rng_state`) is the XLA counterpart of
    seeding the CUDA generator, so the call is mapped, not dropped.

    ## Fix safety
    Safe: it seeds the device generator the way the original seeded the CUDA one. Random
    streams differ from CUDA's anyway; reproducibility between runs is what is kept.
    """

    code = "TX804"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-manual-seed"
    target = "torch-xla"
    summary = "torch.cuda.manual_seed(_all)(s) -> torch_xla.manual_seed(s)"
    severity = Severity.WARNING
    needs_text = ("manual_seed",)
    examples = [
        Example(
            """
            import torch

            torch.manual_seed(args.seed)
            torch.cuda.manual_seed_all(args.seed)
            """,
            """
            import torch
            import torch_xla

            torch.manual_seed(args.seed)
            torch_xla.manual_seed(args.seed)
            """,
        ),
    ]
    valid = [
        "import torch\ntorch.manual_seed(0)\nimport torch_xla\ntorch_xla.manual_seed(0)\n",
        "import numpy as np\nnp.random.seed(0)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.qualname(node.func)
        if name not in CUDA_SEEDS:
            return
        short = name.rsplit(".", 1)[-1]
        if len(node.args) != 1 or node.args[0].star:
            self.report(node, f"torch.cuda.{short}() seeds the CUDA generator: use torch_xla.manual_seed(seed)")
            return
        new = cst.parse_expression(f"{self.ctx.module_alias(TORCH_XLA)}.manual_seed(_)").with_changes(
            args=[node.args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT, comma=cst.MaybeSentinel.DEFAULT)]
        )
        self.report(
            node,
            f"torch.cuda.{short}() seeds the CUDA generator; the XLA generator is seeded by torch_xla.manual_seed()",
            Fix((self.replace(node, new),), imports=(TORCH_XLA,)),
        )
