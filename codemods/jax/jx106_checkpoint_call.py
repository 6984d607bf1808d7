from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

_CHECKPOINT = ("torch.utils.checkpoint.checkpoint",)
# checkpoint's own keywords (torch 2.9): everything else goes to the function
_OWN = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug")


class CheckpointCall(Rule):
    """
    ## What it does
    `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)` (also as
    `cp.checkpoint`, `from torch.utils.checkpoint import checkpoint`) -> `fn(*args)`:
    checkpoint's own keywords (`use_reentrant`, `preserve_rng_state`, `determinism_check`,
    `debug`) are dropped, other keywords go to `fn` as torch passes them. A `context_fn=` is
    left alone (JX901 reports the call).

    ## Why
    Activation checkpointing trades memory for a second forward in the backward pass; the
    value and the gradient are those of `fn(*args)`. In the JAX port the function is called
    directly: `fn` is usually a closure over an NNX module whose BatchNorm updates its running
    statistics, which `jax.checkpoint` cannot trace over (state set inside the transform), and
    XLA decides on rematerialization itself. To get checkpointing's memory saving back, wrap
    a pure function in `jax.checkpoint` or a module call in `nnx.remat` by hand.

    ## Fix safety
    Safe: the same outputs and gradients (a checkpointed segment's recomputation gives the
    same numbers; torch's `preserve_rng_state` exists to make dropout in it draw the same mask
    twice). Only the peak memory of the backward pass changes, and one thing torch does
    differently: its recomputation in the backward runs a BatchNorm inside the checkpointed
    function again in training mode, which updates the running statistics a second time; the
    port updates them once, as torch without checkpointing does.
    """

    code = "JX106"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-checkpoint-call"
    target = "jax"
    summary = "torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=...) -> fn(*args)"
    severity = Severity.ERROR
    needs_text = ("checkpoint",)
    examples = [
        Example(
            """
            import torch
            import torch.utils.checkpoint as cp
            from torch.utils.checkpoint import checkpoint

            def bottleneck(self, inputs):
                def closure(*xs):
                    return self.conv(xs)

                y = cp.checkpoint(closure, *inputs, use_reentrant=False)
                return checkpoint(self.head, y, scale=2.0, preserve_rng_state=True)
            """,
            """
            import torch

            def bottleneck(self, inputs):
                def closure(*xs):
                    return self.conv(xs)

                y = closure(*inputs)
                return self.head(y, scale=2.0)
            """,
        ),
    ]
    valid = [
        "import torch\ntorch.save(model.state_dict(), 'checkpoint.pt')\n",
        "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x, context_fn=ctx)\n",
        "from torch.utils.checkpoint import checkpoint_sequential\ny = checkpoint_sequential(seq, 2, x)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if (self.ctx.qualname(node.func) or "") not in _CHECKPOINT or not node.args:
            return
        fn = node.args[0]
        if fn.keyword is not None or fn.star or astutil.has_kwarg(node, "context_fn") \
                or any(a.star == "**" for a in node.args):
            return
        args = [a for a in node.args[1:] if not (a.keyword is not None and a.keyword.value in _OWN)]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        new = cst.Call(func=fn.value, args=args)
        self.report(node, f"{astutil.code(node.func)}(fn, ...) -> fn(...): the same values; XLA decides on rematerialization",
                    Fix((self.replace(node, new),),
                        remove_imports=(("torch.utils.checkpoint", None), ("torch.utils.checkpoint", "checkpoint"),
                                        ("torch.utils", "checkpoint"))))
