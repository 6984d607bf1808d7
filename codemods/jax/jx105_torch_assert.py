from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

_ASSERT = ("torch._assert", "torch._assert_async")
_FX_WRAP = ("torch.fx.wrap", "torch.fx._symbolic_trace.wrap")


class TorchAssert(Rule):
    """
    ## What it does
    - `torch._assert(cond, msg)` as a statement -> `assert cond, msg` (`torch._assert(cond)`
      -> `assert cond`);
    - `torch.fx.wrap("name")` / `torch.fx.wrap(fn)` at module level, and `@torch.fx.wrap` on
      a function, are removed (a block left empty gets `pass`).

    A `torch._assert` whose value is used (inside an expression) is left to JX901.

    ## Why
    `torch._assert` is torch's symbolically traceable `assert` (torch.fx cannot trace a
    Python `assert`); in a JAX port the shape checks it guards (`x.ndim == 3`, `h ==
    self.image_size`) are plain Python values at trace time, and a Python `assert` checks
    them exactly as torch's eager run does. `torch.fx.wrap` only registers a function as a
    leaf for torch.fx's tracer: JAX never reads it.

    ## Fix safety
    Safe: the same condition is checked with the same message and raises the same
    `AssertionError` (torch._assert raises it too). A condition computed from array values
    inside `jax.jit` raises a `TracerBoolConversionError` at trace time instead of being
    checked: torchvision's checks are all on shapes. `python -O` drops a Python `assert`;
    torch._assert stays.
    """

    code = "JX105"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-torch-assert"
    target = "jax"
    summary = "torch._assert(cond, msg) -> assert cond, msg; torch.fx.wrap(...) removed"
    severity = Severity.ERROR
    needs_text = ("_assert", "wrap")
    examples = [
        Example(
            """
            import torch
            import torch.fx

            torch.fx.wrap("window_partition")

            def check(x, size):
                torch._assert(x.dim() == 4, f"expected NCHW, got {x.shape}")
                torch._assert(x.shape[-1] == size)
                return x
            """,
            """
            def check(x, size):
                assert x.dim() == 4, f"expected NCHW, got {x.shape}"
                assert x.shape[-1] == size
                return x
            """,
        ),
        Example(
            """
            import math
            from torch import _assert, fx

            @fx.wrap
            def pad(x):
                return x

            class Block:
                def forward(self, x):
                    _assert(x.shape[1] == 3, message="three channels")
                    return pad(x)
            """,
            """
            import math

            def pad(x):
                return x

            class Block:
                def forward(self, x):
                    assert x.shape[1] == 3, "three channels"
                    return pad(x)
            """,
            title="names imported from torch, a decorator, a keyword message",
        ),
    ]
    valid = [
        "import torch\nok = torch._assert\n",
        "import functools\n@functools.wraps(f)\ndef g():\n    pass\n",
        "def wrap(name):\n    pass\nwrap('x')\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr) or not isinstance(node.body[0].value, cst.Call):
            return
        call = node.body[0].value
        qual = self.ctx.qualname(call.func) or ""
        if qual in _FX_WRAP:
            self.report(node, f"{astutil.code(call.func)}(...) registers a torch.fx leaf: JAX never reads it",
                        Fix((self.remove_statement(node),), remove_imports=_FX_IMPORTS))
            return
        if qual not in _ASSERT or any(a.star for a in call.args):
            return
        cond = astutil.arg(call, "condition", 0)
        msg = astutil.arg(call, "message", 1)
        if cond is None or len(call.args) > 2:
            return
        stmt = cst.Assert(test=cond.value, msg=msg.value if msg is not None else None)
        self.report(node, f"{astutil.code(call.func)}(cond, msg) -> assert cond, msg",
                    Fix((self.replace(node, node.with_changes(body=[stmt])),),
                        remove_imports=(("torch", "_assert"), ("torch", "_assert_async"))))

    def visit_Decorator(self, node: cst.Decorator) -> None:
        if (self.ctx.qualname(node.decorator) or "") in _FX_WRAP:
            self.report(node, f"@{astutil.code(node.decorator)} registers a torch.fx leaf: JAX never reads it",
                        Fix((self.remove(node),), remove_imports=_FX_IMPORTS))


_FX_IMPORTS = (("torch.fx", None), ("torch", "fx"))
