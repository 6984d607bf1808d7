from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _nnx
from ._nnx import RNGS_STREAM as STREAM
from ._nnx import module_method as _method
from ._nnx import sampler

# host generators: their draws in a traced method are made once, at trace time
_HOST_GENERATORS = ("random.", "numpy.random.")


class NnxModuleRandom(Rule):
    """
    ## What it does
    Random numbers drawn inside a module's methods (the reparameterisation trick of a VAE,
    noise injection) come from an `nnx.Rngs` the module keeps:

    - `torch.randn_like(std)` -> `jax.random.normal(self.rngs.noise(), std.shape, std.dtype)`,
      `torch.rand_like(x)` -> `jax.random.uniform(self.rngs.noise(), x.shape, x.dtype)`,
      `torch.randn(n, d)` / `torch.rand(n, d)` -> `jax.random.normal/uniform(self.rngs.noise(), (n, d))`
      (`dtype=` kept, `device=` dropped);
    - `torch.multinomial(probs, n)` (a sampling loop's `generate`) -> the `n` largest of
      `jnp.log(probs)` plus Gumbel noise (`jax.lax.top_k(...)[1]`: `n` distinct indices, drawn
      as torch's sequential draws without replacement are), and with `replacement=True`
      `n` draws of `jax.random.categorical` on the last axis; unnormalised weights as torch
      takes them;
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

    Python's and NumPy's generators in a module method (`random.randint(4, 6)` choosing how
    many terms a forward adds) are reported for a person: the jitted step traces the method
    once, so the port would draw once and repeat that value at every step.
    """

    code = "JX014"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-module-random"
    target = "jax"
    summary = "torch.randn_like / rand_like / randn / rand / multinomial in a module method -> jax.random with the module's nnx.Rngs"
    severity = Severity.ERROR
    needs_text = ("randn", "rand", "multinomial")
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
        Example(
            """
            import torch
            from flax import nnx

            class LM(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.head = nnx.Linear(4, 10, rngs=rngs)

                def sample(self, h):
                    probs = jax.nn.softmax(self.head(h), axis=-1)
                    return torch.multinomial(probs, num_samples=1)
            """,
            """
            from flax import nnx
            import jax
            import jax.numpy as jnp

            class LM(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.head = nnx.Linear(4, 10, rngs=rngs)
                    self.rngs = rngs

                def sample(self, h):
                    probs = jax.nn.softmax(self.head(h), axis=-1)
                    return jax.lax.top_k(jnp.log(probs) + jax.random.gumbel(self.rngs.noise(), probs.shape, probs.dtype), 1)[1]
            """,
            title="torch.multinomial: the Gumbel-top-k draw",
        ),
        Example(
            """
            import random
            from flax import nnx

            class Poly(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.e = nnx.Param(jax.numpy.ones(()))

                def __call__(self, x):
                    y = x
                    n = random.randint(4, 6)
                    for k in range(4, n):
                        y = y + self.e * x ** k
                    return y
            """,
            """
            import random
            from flax import nnx

            class Poly(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.e = nnx.Param(jax.numpy.ones(()))

                def __call__(self, x):
                    y = x
                    n = random.randint(4, 6)  # porter: manual
                    for k in range(4, n):
                        y = y + self.e * x ** k
                    return y
            """,
            title="Python's generator in a module method: reported (drawn once when the step is traced)",
        ),
    ]
    valid = [
        "import torch\nnoise = torch.randn(3)\n",
        "import torch\nimport torch.nn as nn\nclass M(nn.Module):\n    def __init__(self):\n        self.w = torch.randn(3)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        spec = sampler(node, self.ctx)
        if spec is None:
            self._host_generator(node)
            return
        cls, _ = _method(self.ctx)
        fn, shaped = spec
        jax = self.ctx.module_alias("jax")
        if fn == "multinomial":
            new = self._multinomial(node, jax)
        else:
            new = self._draw(node, fn, shaped, jax)
        edits = [Edit(node, new), *(_nnx.keep_rngs(cls) or ())]
        self.report(node, f"{_nnx.code(node.func)}: random numbers from the module's nnx.Rngs (self.{STREAM})",
                    Fix(tuple(edits), imports=("jax", "jax.numpy") if fn == "multinomial" else ("jax",)))

    def _host_generator(self, node: cst.Call) -> None:
        """Python's or NumPy's generator in a module method: the jitted step traces the method
        once, so the draw is made once and its value frozen into the compiled step."""
        q = self.ctx.qualname(node.func) or ""
        if not q.startswith(_HOST_GENERATORS) or q.endswith(".seed") or _method(self.ctx) is None:
            return
        astutil.report_manual(self, node, f"{q} in a module method: a jitted step traces the method once, so this is "
                                          "drawn once and the same value is used at every step (the original draws at "
                                          f"every call); draw from the module's nnx.Rngs with jax.random (self.{STREAM}), "
                                          "and where the value decides the structure (a loop count, a branch), make it "
                                          "a fixed structure (jax.lax.cond, a mask) or a static argument of the step")

    def _multinomial(self, node: cst.Call, jax: str) -> cst.BaseExpression:
        """torch.multinomial(p, n): without replacement, the n largest of log p + Gumbel noise (the
        Gumbel-top-k draw: n indices in the order sequential draws without replacement give);
        with replacement, n categorical draws moved to the last axis."""
        probs, n, replacement = _nnx.multinomial_args(node)
        jnp = self.ctx.module_alias("jax.numpy")
        raw = _nnx.code(probs)
        p = raw if isinstance(probs, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) else f"({raw})"
        key = f"self.{STREAM}.noise()"
        if replacement:
            text = (f"{jnp}.moveaxis({jax}.random.categorical({key}, {jnp}.log({raw}), axis=-1, "
                    f"shape=({_nnx.code(n)}, *{p}.shape[:-1])), 0, -1)")
        else:
            text = f"{jax}.lax.top_k({jnp}.log({raw}) + {jax}.random.gumbel({key}, {p}.shape, {p}.dtype), {_nnx.code(n)})[1]"
        return cst.parse_expression(text)

    def _draw(self, node: cst.Call, fn: str, shaped: bool, jax: str) -> cst.BaseExpression:
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
        return cst.parse_expression(f"{jax}.random.{fn}(self.{STREAM}.noise(), {', '.join(args)})")

    def _dtype(self, node: cst.BaseExpression) -> str:
        from ._ops_table import DTYPES

        q = self.ctx.qualname(node) or ""
        if q in DTYPES:
            return DTYPES[q].replace("jnp.", self.ctx.module_alias("jax.numpy") + ".")
        return _nnx.code(node)

