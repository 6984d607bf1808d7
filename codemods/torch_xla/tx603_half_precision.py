from __future__ import annotations

import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Safety, Severity

from ._amp_dist import dtype_of, positional, torch_attr


class HalfPrecision(Rule):
    """
    ## What it does
    Reports models and tensors cast to float16 (`.half()`, `.to(torch.float16)`,
    `.to(device, torch.half)`, `.to(dtype=torch.float16)`). The unsafe fix casts to
    bfloat16 instead: `.half()` -> `.bfloat16()` (the same method on tensors and modules,
    `memory_format=` kept) and the float16 dtype argument of `.to(...)` -> `torch.bfloat16`.

    ## Why
    TPUs have no float16 fast path: float16 tensors on XLA are slow and, without a
    GradScaler, a float16 model underflows in its gradients. bfloat16 is the TPU's reduced
    precision (same exponent range as float32).

    ## Fix safety
    Unsafe. The whole model or tensor changes storage precision (8 instead of 11 mantissa
    bits): the weights, activations and every result change, and code that depends on the
    dtype (`x.dtype == torch.float16` checks, saving float16 checkpoints, numpy interop)
    sees bfloat16. Prefer float32 weights with `torch.autocast('xla', dtype=torch.bfloat16)`
    (TX601) where training stability matters; verify the port's numerics either way.
    """

    code = "TX603"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "half-precision"
    target = "torch-xla"
    summary = ".half() / .to(torch.float16) -> bfloat16 on TPU (unsafe)"
    severity = Severity.WARNING
    needs_text = ("half", "float16")
    examples = [
        Example(
            """
            import torch

            model = Net().cuda().half()
            input = input.half()
            x = x.to(device, torch.float16)
            y = y.to(dtype=torch.half, non_blocking=True)
            """,
            """
            import torch

            model = Net().cuda().bfloat16()
            input = input.bfloat16()
            x = x.to(device, torch.bfloat16)
            y = y.to(dtype=torch.bfloat16, non_blocking=True)
            """,
            unsafe=True,
        ),
    ]
    valid = [
        "import torch\nx = x.to(torch.bfloat16)\nm = m.bfloat16()\n",
        "import numpy as np\nz = np.half(3)\nw = np.half()\n",
        "import torch\nx = x.to(device)\nx = x.half_precision()\n",
        "import torch\nwith torch.autocast('cuda', dtype=torch.float16):\n    pass\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        # `np.half()` / `torch.half` are a scalar constructor and a dtype, not casts.
        owner = self.ctx.qualname(func.value)
        if owner is not None and not owner.startswith("builtins."):
            return
        method = func.attr.value
        if method == "half" and not positional(node):
            new = node.with_changes(func=func.with_changes(attr=cst.Name("bfloat16")))
            self.report(
                node,
                ".half() casts to float16, which TPUs do not compute fast: use .bfloat16() "
                "(or keep float32 weights under torch.autocast('xla', dtype=torch.bfloat16))",
                Fix((self.replace(node, new),), Safety.UNSAFE),
            )
        elif method == "to":
            target = arg(node, "dtype")
            if target is None:
                target = next((a for a in positional(node) if dtype_of(self.ctx, a.value) == "float16"), None)
            if target is None or dtype_of(self.ctx, target.value) != "float16":
                return
            new_arg = target.with_changes(value=torch_attr(self.ctx, "bfloat16"))
            new = node.with_changes(args=[new_arg if a is target else a for a in node.args])
            self.report(
                node,
                ".to(torch.float16): TPUs have no float16 fast path; use torch.bfloat16 "
                "(or keep float32 under torch.autocast('xla', dtype=torch.bfloat16))",
                Fix((self.replace(node, new),), Safety.UNSAFE, imports=("torch",)),
            )
