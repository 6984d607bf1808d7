from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx



class FreshRandomFill(Rule):
    """
    ## What it does
    A fresh tensor filled with random numbers where the code builds a module, as ViT's
    position embedding `nn.Parameter(torch.empty(1, n, d).normal_(std=0.02))`:

    - `torch.empty(*shape).normal_(mean=0, std=1)` -> `mean + std * jax.random.normal(rngs.params(), shape)`
    - `torch.empty(*shape).uniform_(a=0, b=1)` -> `jax.random.uniform(rngs.params(), shape, minval=a, maxval=b)`
    - `torch.randn(*shape)` -> `jax.random.normal(rngs.params(), shape)`, `torch.rand(*shape)` ->
      `jax.random.uniform(rngs.params(), shape)` (`nn.Parameter(torch.randn(d) * 0.02)`)

    (also on `torch.zeros` / `torch.ones` and their jnp ports, whose values the fill replaces;
    a `dtype=` of the constructor is kept), in a function that has the module's `rngs`
    (`__init__`, a function that builds layers: the module rules give it `rngs`).

    ## Why
    JAX has no global generator: the numbers come from the key stream of the `nnx.Rngs` the
    module is built with, as the NNX layers' own initializers do.

    ## Fix safety
    Safe: the same distribution (other numbers than torch's generator gives). A verification
    loads the original's weights into the port, so the numbers themselves do not matter there.
    """

    code = "JX108"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-fresh-random-fill"
    target = "jax"
    summary = "torch.empty(shape).normal_(std=s) / torch.randn(shape) in module construction -> jax.random.normal(rngs.params(), shape)"
    severity = Severity.ERROR
    needs_text = ("normal_", "uniform_", "randn", "rand")
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn
            from flax import nnx

            class Encoder(nnx.Module):
                def __init__(self, n, d, *, rngs: nnx.Rngs):
                    self.pos = nnx.Param(torch.empty(1, n, d).normal_(std=0.02))
                    self.scale = nnx.Param(torch.zeros((d,), dtype=torch.float32).uniform_(-0.1, 0.1))
                    self.shift = nnx.Param(torch.empty(d).normal_(1.0, 0.5))
                    self.cls = nnx.Param(torch.randn(1, 1, d) * 0.02)
                    self.gate = nnx.Param(torch.rand(()))
            """,
            """
            import torch
            import torch.nn as nn
            from flax import nnx
            import jax

            class Encoder(nnx.Module):
                def __init__(self, n, d, *, rngs: nnx.Rngs):
                    self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, n, d)))
                    self.scale = nnx.Param(jax.random.uniform(rngs.params(), (d,), torch.float32, minval=-0.1, maxval=0.1))
                    self.shift = nnx.Param(1.0 + 0.5 * jax.random.normal(rngs.params(), (d,)))
                    self.cls = nnx.Param(jax.random.normal(rngs.params(), (1, 1, d)) * 0.02)
                    self.gate = nnx.Param(jax.random.uniform(rngs.params(), ()))
            """,
        ),
    ]
    valid = [
        "import torch\nw = torch.empty(3).normal_()\n",  # no rngs here: JX102 reports it
        "import torch\nw = torch.randn(3)\n",  # no rngs here: JX101 reports it
        "import torch\nfrom flax import nnx\nclass M(nnx.Module):\n    def __init__(self, w, *, rngs: nnx.Rngs):\n        w.normal_()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if _nnx.fresh_random_draw(node, self.ctx):
            self._draw(node)
            return
        if not _nnx.fresh_random_fill(node, self.ctx):
            return
        func = node.func
        fresh = func.value
        shape = _shape(fresh)
        fill = _fill_args(node, _nnx.RANDOM_FILLS[func.attr.value])
        if shape is None or fill is None:
            astutil.report_manual(self, node, f"{astutil.code(func)}: a shape or argument porter cannot read (a generator=, "
                                              "a star argument): draw it with jax.random and the module's rngs by hand")
            return
        dtype = astutil.arg(fresh, "dtype")
        dtype_text = f", {astutil.code(dtype.value)}" if dtype is not None else ""
        jax = self.ctx.module_alias("jax")
        key = "rngs.params()"
        if func.attr.value == "normal_":
            mean, std = fill.get("mean", "0.0"), fill.get("std", "1.0")
            draw = f"{jax}.random.normal({key}, {shape}{dtype_text})"
            text = draw if std in ("1", "1.0") else f"{_atom(std)} * {draw}"
            text = text if mean in ("0", "0.0") else f"{_atom(mean)} + {text}"
        else:
            low, high = fill.get("from", "0.0"), fill.get("to", "1.0")
            text = f"{jax}.random.uniform({key}, {shape}{dtype_text}, minval={low}, maxval={high})"
        self.report(node, f"{astutil.code(fresh.func)}(...).{func.attr.value}(...): drawn from the module's rngs",
                    Fix((self.replace(node, astutil.parse_expression(text)),), imports=("jax",)))

    def _draw(self, node: cst.Call) -> None:
        """`torch.randn(*shape, dtype=)` / `torch.rand(...)`: the same distribution from the rngs."""
        shape = _shape(node)
        q = self.ctx.qualname(node.func)
        if shape is None:
            astutil.report_manual(self, node, f"{q}: a shape or argument porter cannot read (a generator=, a star "
                                              "argument): draw it with jax.random and the module's rngs by hand")
            return
        dtype = astutil.arg(node, "dtype")
        dtype_text = f", {astutil.code(dtype.value)}" if dtype is not None else ""
        text = f"{self.ctx.module_alias('jax')}.random.{_nnx.RANDOM_DRAWS[q]}(rngs.params(), {shape}{dtype_text})"
        self.report(node, f"{q}: drawn from the module's rngs",
                    Fix((self.replace(node, astutil.parse_expression(text)),), imports=("jax",)))


def _shape(call: cst.Call) -> Optional[str]:
    """The shape of `torch.empty(1, n, d)` / `torch.empty((1, n, d))` / `jnp.zeros((1, n, d))` as a tuple's code."""
    positional = [a for a in call.args if a.keyword is None]
    if not positional or any(a.star for a in call.args) or \
            any(a.keyword is not None and a.keyword.value not in ("dtype", "device", "requires_grad") for a in call.args):
        return None
    if len(positional) == 1:
        value = positional[0].value
        if isinstance(value, (cst.Tuple, cst.List)):
            return "(" + ", ".join(astutil.code(e.value) for e in value.elements) + ("," if len(value.elements) == 1 else "") + ")"
        if isinstance(value, (cst.Integer, cst.Name, cst.BinaryOperation)):
            return f"({astutil.code(value)},)"
        return None
    return "(" + ", ".join(astutil.code(a.value) for a in positional) + ")"


def _fill_args(call: cst.Call, names: tuple) -> Optional[dict]:
    out = {}
    for i, a in enumerate(call.args):
        if a.star:
            return None
        name = a.keyword.value if a.keyword is not None else (names[i] if i < len(names) else None)
        if name not in names:
            return None  # generator=: not ported here
        out[name] = astutil.code(a.value)
    return out


def _atom(text: str) -> str:
    node = astutil.parse_expression(text)
    return text if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.Attribute, cst.Call, cst.Subscript)) else f"({text})"
