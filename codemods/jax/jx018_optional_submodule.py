from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx


_ARRAY_MAKERS = ("jax.numpy.", "numpy.", "jax.random.")


class NnxOptionalSubmodule(Rule):
    """
    ## What it does
    In a module class's `__init__`, an attribute first set to `None` and then, in the same
    `__init__` (often under an `if`), to a module (a construction that takes `rngs`, or an
    `nnx.*` one) starts as `nnx.data(None)`:

    `self.proj = None` ... `self.proj = Conv2dNormActivation(..., rngs=rngs)` ->
    `self.proj = nnx.data(None)` ...

    Likewise an attribute that holds a tuple or list of arrays, the state a module keeps between
    calls (a recurrent model's `self.hidden = self.init_hidden()`, where `init_hidden` returns
    `(jnp.zeros(...), jnp.zeros(...))`, or the tuple written in place), is declared data:
    `self.hidden = nnx.data(self.init_hidden())`.

    ## Why
    Flax NNX (0.12) raises `ValueError: Found data on value of type tuple assigned to static
    attribute` for a tuple of arrays assigned to a module attribute (an array alone is data by
    itself); under `nnx.jit` a data attribute the forward reassigns is carried out of the step,
    as torch keeps the module's attribute.

    Flax NNX (0.12) also makes an attribute first assigned `None` static; assigning a module to
    it later raises `ValueError: Cannot assign data value of type ... to static attribute`. torch
    allows it (an optional submodule). `nnx.data(None)` declares the attribute as data from the
    start, so the module can be assigned, and it stays None (no parameters) where it is not.

    ## Fix safety
    Safe: the attribute is None or the module, as in torch; only NNX's bookkeeping of the
    attribute changes. Attributes later set to other values (numbers, strings) are left static.
    """

    code = "JX018"
    name = "nnx-optional-submodule"
    target = "jax"
    summary = "self.x = None later replaced by a module, or a tuple of arrays, in __init__ -> nnx.data(...) (NNX's static attributes)"
    severity = Severity.ERROR
    needs_text = ("None", "np.")
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
        Example(
            """
            import flax.nnx as nnx
            import jax.numpy as jnp

            class Tagger(nnx.Module):
                def __init__(self, dim, *, rngs: nnx.Rngs):
                    self.dim = dim
                    self.lstm = TorchLSTM(dim, dim, rngs=rngs)
                    self.hidden = self.init_hidden()
                    self.last = [jnp.zeros(dim)]

                def init_hidden(self):
                    return (jnp.zeros((1, 1, self.dim)),
                            jnp.zeros((1, 1, self.dim)))

                def __call__(self, x):
                    out, self.hidden = self.lstm(x, self.hidden)
                    return out
            """,
            """
            import flax.nnx as nnx
            import jax.numpy as jnp

            class Tagger(nnx.Module):
                def __init__(self, dim, *, rngs: nnx.Rngs):
                    self.dim = dim
                    self.lstm = TorchLSTM(dim, dim, rngs=rngs)
                    self.hidden = nnx.data(self.init_hidden())
                    self.last = nnx.data([jnp.zeros(dim)])

                def init_hidden(self):
                    return (jnp.zeros((1, 1, self.dim)),
                            jnp.zeros((1, 1, self.dim)))

                def __call__(self, x):
                    out, self.hidden = self.lstm(x, self.hidden)
                    return out
            """,
            title="a recurrent state kept on the module: a tuple of arrays is data",
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
        for attr, stmt in first.items():
            if self._arrays(stmt.value, node):
                self.report(stmt.value, f"self.{attr} holds arrays in a tuple or list (state the module keeps): NNX "
                            "needs it declared as data (nnx.data(...))",
                            Fix((self.replace(stmt.value, cst.Call(cst.parse_expression(f"{nnx}.data"), [cst.Arg(stmt.value)])),),
                                imports=("flax.nnx",)))
        for attr in sorted(modules):
            stmt = first[attr]
            if isinstance(stmt.value, cst.Name) and stmt.value.value == "None":
                self.report(stmt.value, f"self.{attr} = None, later a module: NNX needs it declared as data (nnx.data(None))",
                            Fix((self.replace(stmt.value, cst.parse_expression(f"{nnx}.data(None)")),), imports=("flax.nnx",)))

    def _arrays(self, value: cst.BaseExpression, cls: cst.ClassDef, follow: bool = True) -> bool:
        """A tuple or list display of array-making calls (jnp./np./jax.random.), or a call of a
        method of ``cls`` whose every return is one."""
        if isinstance(value, (cst.Tuple, cst.List)):
            return bool(value.elements) and all(
                isinstance(e.value, cst.Call) and (self.ctx.qualname(e.value.func) or "").startswith(_ARRAY_MAKERS)
                for e in value.elements)
        if follow and isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                and isinstance(value.func.value, cst.Name) and value.func.value.value == "self":
            method = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef)
                           and s.name.value == value.func.attr.value), None)
            returns = [n.value for n in astutil.walk(method.body)
                       if isinstance(n, cst.Return)] if method is not None else []
            return bool(returns) and all(r is not None and self._arrays(r, cls, follow=False) for r in returns)
        return False

    def _builds_module(self, value: cst.BaseExpression) -> bool:
        if not isinstance(value, cst.Call):
            return False
        qual = self.ctx.qualname(value.func) or ""
        return _nnx.has_kwarg(value, "rngs") or (qual.startswith("flax.nnx.") and qual[len("flax.nnx."):][:1].isupper())
