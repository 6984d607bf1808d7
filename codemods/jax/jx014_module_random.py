from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _nnx
from ._nnx import RNGS_STREAM as STREAM
from ._nnx import module_method as _method
from ._nnx import sampler

class NnxModuleRandom(Rule):
    """
    ## What it does
    Random numbers drawn inside a module's methods (the reparameterisation trick of a VAE,
    noise injection) come from an `nnx.Rngs` the module keeps:

    - `torch.randn_like(std)` -> `jax.random.normal(self.rngs.noise(), std.shape, std.dtype)`,
      `torch.rand_like(x)` -> `jax.random.uniform(self.rngs.noise(), x.shape, x.dtype)`,
      `torch.randn(n, d)` / `torch.rand(n, d)` -> `jax.random.normal/uniform(self.rngs.noise(), (n, d))`
      (`dtype=` kept, `device=` dropped);
    - `__init__` keeps its `rngs` (`self.rngs = rngs`, its last statement), so every call
      draws a fresh key from the `noise` stream (the `default` stream when the model was
      built with `nnx.Rngs(seed)`).

    The stream's counter is module state: inside `@nnx.jit def train_step(model, ...)` it
    advances with every call, so each step draws new noise and the step still compiles once.

    ## Why
    torch draws from a hidden global generator; JAX needs an explicit key, and an NNX module
    carries its keys as state (nnx.Dropout does the same).

    ## Fix safety
    Safe: the same distributions. The numbers differ from torch's (another generator); to
    compare a port with its original, draw the noise alike on both sides (the verifier's JAX
    side feeds the port torch's numbers through `jax.random.normal`/`uniform`).
    """

    code = "JX014"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-module-random"
    target = "jax"
    summary = "torch.randn_like / rand_like / randn / rand in a module method -> jax.random with the module's nnx.Rngs"
    severity = Severity.ERROR
    needs_text = ("randn", "rand")
    examples = [
        Example(
            """
            import torch
            from flax import nnx

            class VAE(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.fc = nnx.Linear(4, 2, rngs=rngs)

                def reparameterize(self, mu, logvar):
                    std = torch.exp(0.5 * logvar)
                    eps = torch.randn_like(std)
                    return mu + eps * std
            """,
            """
            import torch
            from flax import nnx
            import jax

            class VAE(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.fc = nnx.Linear(4, 2, rngs=rngs)
                    self.rngs = rngs

                def reparameterize(self, mu, logvar):
                    std = torch.exp(0.5 * logvar)
                    eps = jax.random.normal(self.rngs.noise(), std.shape, std.dtype)
                    return mu + eps * std
            """,
        ),
    ]
    valid = [
        "import torch\nnoise = torch.randn(3)\n",
        "import torch\nimport torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n        self.w = torch.randn(3)\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._stored: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        spec = sampler(node, self.ctx)
        if spec is None:
            return
        cls, _ = _method(self.ctx)
        fn, shaped = spec
        positional = [a for a in node.args if a.keyword is None]
        dtype = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "dtype"), None)
        if shaped:
            if len(positional) == 1 and not isinstance(positional[0].value, (cst.Integer, cst.Name, cst.Attribute, cst.BinaryOperation)):
                shape = _nnx.code(positional[0].value)  # torch.randn(x.shape) / randn((n, d))
            elif len(positional) == 1:
                shape = f"({_nnx.code(positional[0].value)},)" if not isinstance(positional[0].value, cst.Attribute) \
                    else _nnx.code(positional[0].value)
            else:
                shape = f"({', '.join(_nnx.code(a.value) for a in positional)})"
            args = [shape]
            if dtype is not None:
                args.append(self._dtype(dtype))
        else:
            src = _nnx.code(positional[0].value)
            src = src if isinstance(positional[0].value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) else f"({src})"
            args = [f"{src}.shape", self._dtype(dtype) if dtype is not None else f"{src}.dtype"]
        jax = self.ctx.module_alias("jax")
        new = cst.parse_expression(f"{jax}.random.{fn}(self.{STREAM}.noise(), {', '.join(args)})")
        edits = [Edit(node, new)]
        init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is not None and not _nnx.stores_rngs(init) and id(init) not in self._stored:
            self._stored.add(id(init))
            edits.append(Edit(init.body, _nnx.appended(f"self.{STREAM} = rngs")))
        self.report(node, f"{_nnx.code(node.func)}: random numbers from the module's nnx.Rngs (self.{STREAM})",
                    Fix(tuple(edits), imports=("jax",)))

    def _dtype(self, node: cst.BaseExpression) -> str:
        from ._ops_table import DTYPES

        q = self.ctx.qualname(node) or ""
        if q in DTYPES:
            return DTYPES[q].replace("jnp.", self.ctx.module_alias("jax.numpy") + ".")
        return _nnx.code(node)

