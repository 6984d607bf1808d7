from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx


class NnxOptionalSubmodule(Rule):
    """
    ## What it does
    In a module class's `__init__`, an attribute first set to `None` and then, in the same
    `__init__` (often under an `if`), to a module (a construction that takes `rngs`, or an
    `nnx.*` one) starts as `nnx.data(None)`:

    `self.proj = None` ... `self.proj = Conv2dNormActivation(..., rngs=rngs)` ->
    `self.proj = nnx.data(None)` ...

    ## Why
    Flax NNX (0.12) makes an attribute first assigned `None` static; assigning a module to it
    later raises `ValueError: Cannot assign data value of type ... to static attribute`. torch
    allows it (an optional submodule). `nnx.data(None)` declares the attribute as data from the
    start, so the module can be assigned, and it stays None (no parameters) where it is not.

    ## Fix safety
    Safe: the attribute is None or the module, as in torch; only NNX's bookkeeping of the
    attribute changes. Attributes later set to other values (numbers, strings) are left static.
    """

    code = "JX018"
    name = "nnx-optional-submodule"
    target = "jax"
    summary = "self.x = None later replaced by a module in __init__ -> self.x = nnx.data(None) (NNX's static attributes)"
    severity = Severity.ERROR
    needs_text = ("None",)
    examples = [
        Example(
            """
            import flax.nnx as nnx

            class Block(nnx.Module):
                def __init__(self, cin, cout, *, rngs: nnx.Rngs):
                    self.proj = None
                    self.scale = None
                    if cin != cout:
                        self.proj = nnx.Linear(cin, cout, rngs=rngs)
                        self.scale = 2.0

                def __call__(self, x):
                    return x if self.proj is None else self.proj(x)
            """,
            """
            import flax.nnx as nnx

            class Block(nnx.Module):
                def __init__(self, cin, cout, *, rngs: nnx.Rngs):
                    self.proj = nnx.data(None)
                    self.scale = None
                    if cin != cout:
                        self.proj = nnx.Linear(cin, cout, rngs=rngs)
                        self.scale = 2.0

                def __call__(self, x):
                    return x if self.proj is None else self.proj(x)
            """,
            title="an optional submodule; an optional number stays static",
        ),
    ]
    valid = [
        "import flax.nnx as nnx\nclass M(nnx.Module):\n    def __init__(self, *, rngs):\n        self.a = None\n",
    ]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if _nnx.module_classes(self.ctx).get(node.name.value) is not node:
            return
        init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is None:
            return
        first: dict[str, cst.Assign] = {}
        modules: set[str] = set()
        for n in astutil.walk(init.body):
            if not isinstance(n, cst.Assign) or len(n.targets) != 1:
                continue
            target = n.targets[0].target
            if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"):
                continue
            attr = target.attr.value
            if attr not in first:
                first[attr] = n
            elif self._builds_module(n.value):
                modules.add(attr)
        nnx = _nnx.nnx_name(self.ctx)
        for attr in sorted(modules):
            stmt = first[attr]
            if isinstance(stmt.value, cst.Name) and stmt.value.value == "None":
                self.report(stmt.value, f"self.{attr} = None, later a module: NNX needs it declared as data (nnx.data(None))",
                            Fix((self.replace(stmt.value, cst.parse_expression(f"{nnx}.data(None)")),), imports=("flax.nnx",)))

    def _builds_module(self, value: cst.BaseExpression) -> bool:
        if not isinstance(value, cst.Call):
            return False
        qual = self.ctx.qualname(value.func) or ""
        return _nnx.has_kwarg(value, "rngs") or (qual.startswith("flax.nnx.") and qual[len("flax.nnx."):][:1].isupper())
