from __future__ import annotations

import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._amp_dist import dtype_of, has_star, keyword, quote_like, torch_attr, with_args

_NAMES = {
    "torch.cuda.amp.custom_fwd": "custom_fwd",
    "torch.cuda.amp.autocast_mode.custom_fwd": "custom_fwd",
    "torch.cuda.amp.custom_bwd": "custom_bwd",
    "torch.cuda.amp.autocast_mode.custom_bwd": "custom_bwd",
}


class XlaCustomFwd(Rule):
    """
    ## What it does
    Rewrites the CUDA autocast decorators of custom autograd functions to their XLA form:
    `@torch.cuda.amp.custom_fwd` -> `@torch.amp.custom_fwd(device_type='xla')`,
    `@torch.cuda.amp.custom_fwd(cast_inputs=torch.float16)` ->
    `@torch.amp.custom_fwd(device_type='xla', cast_inputs=torch.bfloat16)` and
    `@torch.cuda.amp.custom_bwd` -> `@torch.amp.custom_bwd(device_type='xla')`.

    ## Why
    These decorators consult the autocast state of their device. A `'cuda'` one sees
    autocast off inside an XLA autocast region: `cast_inputs=torch.float32` then casts
    nothing, and a forward meant to run in float32 runs in bfloat16 (measured: the output of
    a matmul in such a function is bfloat16 under `torch.autocast('xla')`, float32 with the
    `'xla'` decorator), and `custom_bwd` does not restore the forward's autocast state in
    the backward.

    ## Fix safety
    Safe: the function gets, on XLA, the casting its author asked for on CUDA. A
    `cast_inputs=torch.float16` becomes bfloat16, the XLA autocast dtype (see TX601); other
    dtypes are kept.
    """

    code = "TX604"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-custom-fwd"
    target = "torch-xla"
    summary = "@torch.cuda.amp.custom_fwd/custom_bwd -> @torch.amp.custom_fwd/custom_bwd(device_type='xla')"
    severity = Severity.ERROR
    needs_text = ("custom_fwd", "custom_bwd")
    examples = [
        Example(
            """
            import torch

            class MyMm(torch.autograd.Function):
                @staticmethod
                @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
                def forward(ctx, a, b):
                    return a.mm(b)

                @staticmethod
                @torch.cuda.amp.custom_bwd
                def backward(ctx, grad):
                    return grad, grad
            """,
            """
            import torch

            class MyMm(torch.autograd.Function):
                @staticmethod
                @torch.amp.custom_fwd(device_type='xla', cast_inputs=torch.float32)
                def forward(ctx, a, b):
                    return a.mm(b)

                @staticmethod
                @torch.amp.custom_bwd(device_type='xla')
                def backward(ctx, grad):
                    return grad, grad
            """,
        ),
        Example(
            """
            import torch
            from torch.cuda.amp import custom_fwd

            class Half(Function):
                @staticmethod
                @custom_fwd(cast_inputs=torch.float16)
                def forward(ctx, x):
                    return x

            forward = custom_fwd(forward)
            """,
            """
            import torch
            from torch.cuda.amp import custom_fwd

            class Half(Function):
                @staticmethod
                @torch.amp.custom_fwd(device_type='xla', cast_inputs=torch.bfloat16)
                def forward(ctx, x):
                    return x

            forward = torch.amp.custom_fwd(forward, device_type='xla')
            """,
            title="imported by name; float16 casts become bfloat16",
        ),
    ]
    valid = [
        "import torch\n@torch.amp.custom_fwd(device_type='xla')\ndef f(ctx, x):\n    return x\n",
        "def custom_fwd(f):\n    return f\n@custom_fwd\ndef g():\n    pass\n",
    ]

    def visit_Decorator(self, node: cst.Decorator) -> None:
        expr = node.decorator
        if isinstance(expr, cst.Call):
            return  # handled by visit_Call
        kind = _NAMES.get(self.ctx.qualname(expr) or "")
        if kind is None:
            return
        new = cst.Call(func=torch_attr(self.ctx, f"amp.{kind}"), args=[keyword("device_type", quote_like(None, "xla"))])
        self._report(expr, new, kind)

    def visit_Call(self, node: cst.Call) -> None:
        kind = _NAMES.get(self.ctx.qualname(node.func) or "")
        if kind is None or has_star(node):
            return
        args: list[cst.Arg] = []
        for a in node.args:
            if a.keyword is None:
                args.append(a)
        args.append(keyword("device_type", quote_like(None, "xla")))
        cast = arg(node, "cast_inputs")
        if cast is not None:
            value = cast.value
            if dtype_of(self.ctx, value) == "float16":
                value = torch_attr(self.ctx, "bfloat16")
            args.append(cast.with_changes(value=value))
        others = [a for a in node.args if a.keyword is not None and a.keyword.value != "cast_inputs"]
        args.extend(others)
        new = with_args(node.with_changes(func=torch_attr(self.ctx, f"amp.{kind}")), args)
        self._report(node, new, kind)

    def _report(self, node: cst.CSTNode, new: cst.CSTNode, kind: str) -> None:
        self.report(
            node,
            f"torch.cuda.amp.{kind} follows the CUDA autocast state, which is off inside an XLA autocast "
            f"region: use torch.amp.{kind}(device_type='xla')",
            Fix((self.replace(node, new),), imports=("torch",)),
        )
