import libcst as cst

from porter.rules import Example, Rule, Severity

from . import _ops_table as ops
from .jx014_module_random import sampler


class TorchFunction(Rule):
    """
    ## What it does
    Rewrites calls of torch functions (`torch.cat`, `torch.zeros`, `torch.softmax`,
    `F.relu`, `F.pad`, ...) to their jax.numpy / jax.nn / jax.lax counterparts, from porter's
    op table (docs/jax-ops.md lists every entry). Arguments are bound the way torch binds
    them, then renamed (`dim` -> `axis`, `keepdim` -> `keepdims`), reordered or recomputed
    where the JAX function means something else: `torch.split` sizes become `jnp.split`
    indices, `F.pad`'s last-dimension-first pairs become `jnp.pad` widths, `torch.std` gets
    torch's `ddof=1`, `F.gelu` spells out `approximate=False`. `device=` and
    `requires_grad=` are dropped. Calls porter cannot port with the same semantics (random
    numbers without a key, `F.dropout`, `F.interpolate`, data-dependent shapes such as
    `torch.nonzero`, an `out=` argument) stay in place, marked `# porter: manual`, with a
    finding saying why. Code in `torch.utils.data` Dataset/Sampler classes is left to the
    data-loading rules.

    ## Why
    A JAX port cannot call torch: every tensor operation has to become a JAX operation with
    the same result, including the arguments whose meaning differs between the libraries.

    ## Fix safety
    Safe: every table entry is checked against torch on random inputs
    (tests/test_jax_ops_run.py). Where the two differ only in what they reject
    (`jnp.squeeze` of a dimension that is not 1, `jnp.split` into unequal parts), JAX raises
    instead of computing something else; the notes in docs/jax-ops.md say where.
    """

    code = "JX101"
    name = "torch-function-to-jax"
    target = "jax"
    summary = "torch.* / F.* functions -> jax.numpy / jax.nn / jax.lax (op table)"
    severity = Severity.ERROR
    needs_text = ("torch",)
    examples = [
        Example(
            """
            import torch
            import torch.nn.functional as F

            def head(a, b):
                h = torch.cat([a, b], dim=1)
                h = F.relu(h)
                return torch.softmax(h.sum(), dim=-1)
            """,
            """
            import torch
            import jax
            import jax.numpy as jnp

            def head(a, b):
                h = jnp.concatenate([a, b], axis=1)
                h = jax.nn.relu(h)
                return jax.nn.softmax(h.sum(), axis=-1)
            """,
            title="dim -> axis",
        ),
        Example(
            """
            import torch

            def stats(x, device):
                z = torch.zeros(x.shape[0], 4, device=device, dtype=torch.float32)
                return z, torch.std(x, dim=0), torch.split(x, 2, dim=1)
            """,
            """
            import torch
            import jax.numpy as jnp

            def stats(x, device):
                z = jnp.zeros((x.shape[0], 4), dtype=jnp.float32)
                return z, jnp.std(x, axis=0, ddof=1), jnp.split(x, list(range(2, x.shape[1], 2)), axis=1)
            """,
            title="sizes as one shape, torch's unbiased std, split sizes as indices",
        ),
        Example(
            """
            import torch.nn.functional as F

            def forward(x):
                return F.pad(x, (1, 2, 0, 3), mode="replicate")
            """,
            """
            import jax.numpy as jnp

            def forward(x):
                return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, 3), (1, 2)], mode='edge')
            """,
            title="F.pad: torch lists the last dimension first",
        ),
        Example(
            """
            import torch

            noise = torch.randn(16, 8)
            """,
            """
            import torch

            noise = torch.randn(16, 8)  # porter: manual
            """,
            title="random numbers need a PRNG key: marked for a manual port",
        ),
    ]
    valid = [
        "import torch\nmodel = torch.nn.Linear(3, 4)\n",
        "import jax.numpy as jnp\ny = jnp.concatenate([a, b], axis=1)\n",
        "import torch\nclass D(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n        return torch.zeros(3)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        o = ops.function_op(node, self.ctx)
        if o is None or ops.in_data_pipeline(self.ctx):
            return
        if o.manual and sampler(node, self.ctx) is not None:
            return  # random numbers in a module method: JX014, from the module's nnx.Rngs
        ops.port_call(self, node, o, None)
