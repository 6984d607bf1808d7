from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._amp_dist import (
    dtype_of,
    has_star,
    is_string,
    keyword,
    positional,
    quote_like,
    source_of,
    torch_attr,
    with_args,
)
from ._imports import import_pairs

_CUDA_AMP = ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast")
_GENERIC = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")


class XlaAutocast(Rule):
    """
    ## What it does
    Rewrites CUDA autocast regions to XLA autocast in bfloat16:
    `torch.cuda.amp.autocast(...)`, `torch.autocast('cuda', ...)`,
    `torch.autocast(device_type='cuda', dtype=torch.float16)` and `torch.amp.autocast('cuda')`
    become `torch.autocast('xla', dtype=torch.bfloat16, ...)`. `enabled=` and
    `cache_enabled=` are kept (positional arguments of `torch.cuda.amp.autocast` become
    keywords, since its argument order differs from `torch.autocast`). An XLA autocast that
    asks for float16 gets bfloat16.

    ## Why
    On a TPU host a `'cuda'` autocast is silently disabled (there is no CUDA device), so the
    port would run in float32 and the mixed precision the author asked for would be lost.
    TPUs compute in bfloat16, not float16. `torch_xla.amp.autocast(device)` fails on the CPU
    backend in torch_xla 2.9; `torch.autocast('xla', dtype=torch.bfloat16)` works everywhere.

    ## Fix safety
    Safe. The region stays a mixed-precision region with the same `enabled` switch; only the
    low-precision dtype becomes bfloat16, which is the only fast reduced precision on a TPU.
    bfloat16 has float32's exponent range (so it cannot overflow where float16 did not, which
    is why the GradScaler goes too, see TX602) and 8 instead of 11 mantissa bits: results
    differ from a float16 GPU run in the last bits, as any port to TPU does, and
    `porter verify` measures the difference. An autocast whose dtype is computed at run time
    keeps its expression (only the device changes) and the message asks to check it is
    bfloat16; one whose device is computed at run time is only reported when it asks for
    float16. `from torch.cuda.amp import autocast` (or `import torch.cuda.amp as amp`) is
    removed once no use of it is left; an import still used elsewhere stays.
    """

    code = "TX601"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-autocast"
    target = "torch-xla"
    summary = "CUDA autocast (float16) -> torch.autocast('xla', dtype=torch.bfloat16)"
    severity = Severity.WARNING
    needs_text = ("autocast",)
    examples = [
        Example(
            """
            import torch

            with torch.cuda.amp.autocast():
                out = model(x)
            """,
            """
            import torch

            with torch.autocast('xla', dtype=torch.bfloat16):
                out = model(x)
            """,
            title="torch.cuda.amp.autocast",
        ),
        Example(
            """
            from torch.cuda.amp import autocast

            def step(model, x, args):
                with autocast(enabled=args.amp):
                    return model(x)
            """,
            """
            import torch

            def step(model, x, args):
                with torch.autocast('xla', dtype=torch.bfloat16, enabled=args.amp):
                    return model(x)
            """,
            title="imported autocast with enabled=; the unused import goes",
        ),
        Example(
            """
            from torch.cuda.amp import autocast

            with autocast():
                y = net(x)
            REGION = autocast
            """,
            """
            from torch.cuda.amp import autocast
            import torch

            with torch.autocast('xla', dtype=torch.bfloat16):
                y = net(x)
            REGION = autocast
            """,
            title="an import still used elsewhere stays",
        ),
        Example(
            """
            import torch

            with torch.autocast(device_type="cuda", dtype=torch.float16, cache_enabled=False):
                y = net(x)
            with torch.amp.autocast('cuda'):
                z = net(x)
            """,
            """
            import torch

            with torch.autocast(device_type="xla", dtype=torch.bfloat16, cache_enabled=False):
                y = net(x)
            with torch.amp.autocast('xla', dtype=torch.bfloat16):
                z = net(x)
            """,
            title="torch.autocast / torch.amp.autocast on 'cuda'",
        ),
        Example(
            """
            import torch as t

            @t.cuda.amp.autocast(False, t.float16)
            def forward(x):
                return x
            """,
            """
            import torch as t

            @t.autocast('xla', dtype=t.bfloat16, enabled=False)
            def forward(x):
                return x
            """,
            title="positional arguments of torch.cuda.amp.autocast become keywords",
        ),
        Example(
            """
            import torch

            with torch.autocast("cuda", dtype=ptdtype):
                logits = model(x)
            """,
            """
            import torch

            with torch.autocast("xla", dtype=ptdtype):
                logits = model(x)
            """,
            title="dtype computed at run time: only the device changes",
        ),
        Example(
            """
            import torch

            with torch.autocast(device_type=device.type, dtype=torch.float16):
                y = net(x)
            """,
            None,
            title="device computed at run time with float16: reported",
        ),
    ]
    valid = [
        "import torch\nwith torch.autocast('xla', dtype=torch.bfloat16):\n    pass\n",
        "import torch\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n    pass\n",
        "import torch\nwith torch.autocast(device_type=device.type):\n    pass\n",
        "import torch\nwith torch.autocast('xla', dtype=torch.bfloat16, enabled=False):\n    pass\n",
        "import torch_xla\nwith autocast():\n    pass\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.qualname(node.func)
        if name in _CUDA_AMP:
            self._cuda_amp(node)
        elif name in _GENERIC:
            self._generic(node)

    # torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)
    def _cuda_amp(self, node: cst.Call) -> None:
        if has_star(node) or len(positional(node)) > 3:
            self.report(node, "torch.cuda.amp.autocast: use torch.autocast('xla', dtype=torch.bfloat16) on XLA")
            return
        enabled = arg(node, "enabled", 0)
        dtype = arg(node, "dtype", 1)
        cache = arg(node, "cache_enabled", 2)
        new_dtype, note = self._dtype(dtype)
        args = [cst.Arg(quote_like(None, "xla")), keyword("dtype", new_dtype)]
        if enabled is not None:
            args.append(keyword("enabled", enabled.value))
        if cache is not None:
            args.append(keyword("cache_enabled", cache.value))
        new = with_args(node.with_changes(func=torch_attr(self.ctx, "autocast")), args)
        self.report(
            node,
            "torch.cuda.amp.autocast is CUDA-only (disabled on TPU): use torch.autocast('xla', dtype=torch.bfloat16)" + note,
            Fix((self.replace(node, new),), imports=("torch",), remove_imports=import_pairs(self.ctx, node.func)),
        )

    # torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)
    def _generic(self, node: cst.Call) -> None:
        if has_star(node):
            return
        device = arg(node, "device_type", 0)
        dtype = arg(node, "dtype", 1)
        if device is None:
            return
        if not is_string(device.value):
            if dtype is not None and dtype_of(self.ctx, dtype.value) == "float16":
                self.report(
                    node,
                    "autocast in float16: TPUs have no float16 fast path; on XLA use dtype=torch.bfloat16",
                )
            return
        is_cuda = is_string(device.value, "cuda")
        is_xla = is_string(device.value, "xla")
        current = dtype_of(self.ctx, dtype.value) if dtype is not None else None
        if not is_cuda and not (is_xla and current == "float16"):
            return
        new_dtype, note = self._dtype(dtype)
        args = []
        dtype_done = False
        for a in node.args:
            if a is device:
                a = a.with_changes(value=quote_like(device.value, "xla"))
            elif a is dtype:
                a = a.with_changes(value=new_dtype)
                dtype_done = True
            args.append(a)
        if not dtype_done:
            args.insert(args.index(_same(args, device)) + 1, keyword("dtype", new_dtype))
        new = with_args(node, args)
        what = "autocast on 'cuda' is disabled on TPU" if is_cuda else "float16 autocast on XLA"
        self.report(
            node,
            f"{what}: use torch.autocast('xla', dtype=torch.bfloat16)" + note,
            Fix((self.replace(node, new),), imports=("torch",) if dtype is None or new_dtype is not dtype.value else ()),
        )

    def _dtype(self, dtype: Optional[cst.Arg]) -> tuple[cst.BaseExpression, str]:
        """The dtype expression of the port, and a note for the message."""
        if dtype is None or (isinstance(dtype.value, cst.Name) and dtype.value.value == "None"):
            return torch_attr(self.ctx, "bfloat16"), ""
        name = dtype_of(self.ctx, dtype.value)
        if name == "bfloat16":
            return dtype.value, ""
        if name is None:
            return dtype.value, (
                f" (dtype `{source_of(dtype.value)}` is computed at run time: make sure it is "
                "torch.bfloat16 on TPU, float16 has no fast path there)"
            )
        if name != "float16":
            return dtype.value, f" (dtype {name} kept)"
        return torch_attr(self.ctx, "bfloat16"), ""


def _same(args: list[cst.Arg], original: cst.Arg) -> cst.Arg:
    """The argument of ``args`` that replaced ``original`` (the device one)."""
    for a in args:
        if a.keyword is not None and original.keyword is not None and a.keyword.value == original.keyword.value:
            return a
    return next(a for a in args if a.keyword is None)
