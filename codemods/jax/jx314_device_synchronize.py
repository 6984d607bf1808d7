from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

# the accelerator barriers of torch: each waits for the work queued on its device
_SYNCHRONIZE = (
    "torch.cuda.synchronize", "torch.xpu.synchronize", "torch.mps.synchronize", "torch.accelerator.synchronize",
    "torch.cuda.current_stream.synchronize",
)


class DeviceSynchronize(Rule):
    """
    ## What it does
    Rewrites torch's device barriers (`torch.cuda.synchronize()`, `torch.cuda.synchronize(device)`,
    `torch.xpu.synchronize()`, `torch.mps.synchronize()`, `torch.accelerator.synchronize()`) to
    `jax.effects_barrier()`. A device argument goes with the call where it only reads names
    (a call in it is kept, and the line reported).

    ## Why
    A JAX port has no CUDA device: `torch.cuda.synchronize()` raises "Found no NVIDIA driver"
    on a machine without one (and on a TPU VM). Scripts call it around a timed region, so
    that the clock stops after the queued work. JAX dispatches asynchronously too;
    `jax.effects_barrier()` (JAX 0.4.x and later) waits for the work already dispatched to
    finish its effects; `jax.block_until_ready(x)` on the last result is the exact barrier
    for one value, which the port's author may prefer where that value is at hand. A host
    read (`loss.item()`, `float(loss)`) in the timed loop waits as well.

    ## Fix safety
    Safe: the barrier returns None, as torch's does, and changes no value; the time it waits
    is the JAX port's own.
    """

    code = "JX314"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-device-synchronize"
    target = "jax"
    summary = "torch.cuda.synchronize() / xpu / mps -> jax.effects_barrier()"
    severity = Severity.INFO
    needs_text = ("synchronize",)
    examples = [
        Example(
            """
            import time
            import torch

            torch.cuda.synchronize()
            t0 = time.time()
            run(model)
            torch.cuda.synchronize(device)
            dt = time.time() - t0
            """,
            """
            import time
            import jax

            jax.effects_barrier()
            t0 = time.time()
            run(model)
            jax.effects_barrier()
            dt = time.time() - t0
            """,
            title="a timed region",
        ),
        Example(
            """
            from torch import cuda, mps
            import torch

            def timed(fn):
                if torch.backends.mps.is_available():
                    mps.synchronize()
                else:
                    cuda.synchronize(device=args.device)
                return fn()
            """,
            """
            from torch import mps
            import torch
            import jax

            def timed(fn):
                if torch.backends.mps.is_available():
                    jax.effects_barrier()
                else:
                    jax.effects_barrier()
                return fn()
            """,
            title="imported names, a keyword device",
        ),
    ]
    valid = [
        "import torch\nx = torch.zeros(3)\n",
        "import threading\nlock.synchronize()\n",
        "import jax\njax.effects_barrier()\n",
        "import torch.distributed as dist\ndist.barrier()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func) or ""
        if qual not in _SYNCHRONIZE:
            inner = node.func.value if isinstance(node.func, cst.Attribute) and node.func.attr.value == "synchronize" \
                else None
            # torch.cuda.current_stream().synchronize(): the current stream's barrier
            if not (isinstance(inner, cst.Call) and not inner.args
                    and self.ctx.qualname(inner.func) in ("torch.cuda.current_stream", "torch.cuda.default_stream")):
                return
            qual = f"{self.ctx.qualname(inner.func)}().synchronize"
        if any(isinstance(n, cst.Call) for a in node.args for n in astutil.walk(a.value, into_functions=True)):
            self.report(node, f"{qual}(...) with a call in its argument: in a JAX port the barrier is "
                              "jax.effects_barrier() (or jax.block_until_ready(x) on the last result); port by hand "
                              "(the argument's call may matter)")
            return
        self.report(node, f"{qual}: the JAX port has no CUDA device (torch's barrier raises without one): "
                          "jax.effects_barrier() waits for the work JAX has dispatched",
                    Fix((self.replace(node, astutil.parse_expression("jax.effects_barrier()")),), imports=("jax",)))
