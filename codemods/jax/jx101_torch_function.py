import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity, module_fact

from . import _loop as lp
from . import _ops_table as ops
from ._nnx import dropout_call, fresh_random_draw, sampler


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
    data-loading rules. One exception for random numbers: in a script that seeds numpy's
    global generator (`np.random.seed(...)`), `torch.randn(shape)` / `torch.rand(shape)`
    outside a module (noise drawn in the training loop) becomes a float32 draw of numpy's
    generator on the host (`np.random.standard_normal(shape).astype(np.float32)`), handed
    to the jitted step like a batch (other values than torch's generator would draw: the
    same distribution). In other scripts a draw that runs on the host (`torch.randn`,
    `rand`, `randint`, `randperm`, `normal` at a script's top level, in a function the script
    only calls from code that runs once on the host (a data-building helper called from `main()`),
    or in a loop
    statement that no model value flows into, which JX301 keeps before the jitted step's
    call: a GAN's noise) stays torch's, handed to JAX as an array:
    `jnp.asarray(np.asarray(torch.randn(n, d)))`, the original's numbers for the same seed (one
    host-to-device transfer per draw, as a batch is). A draw in a module, a lambda, a
    function outside a loop or one fed by a forward value is marked for a manual port.

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
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
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
            from torch import autograd

            def prepare_sequence(seq, to_ix):
                idxs = [to_ix[w] for w in seq]
                return autograd.Variable(torch.LongTensor(idxs))

            def bag(n):
                total = torch.Tensor([0])
                return total, autograd.Variable(torch.zeros(n), volatile=True)
            """,
            """
            import jax.numpy as jnp
            import numpy as np

            def prepare_sequence(seq, to_ix):
                idxs = [to_ix[w] for w in seq]
                return np.asarray(idxs, dtype=np.int64)

            def bag(n):
                total = np.asarray([0], dtype=np.float32)
                return total, jnp.zeros(n)
            """,
            title="pre-0.4 code: a Variable is its tensor; the legacy typed constructors of data (a list the code builds) "
                  "become NumPy arrays",
        ),
        Example(
            """
            import torch

            def stats(x, device):
                z = torch.zeros(x.shape[0], 4, device=device, dtype=torch.float32)
                return z, torch.std(x, dim=0), torch.split(x, 2, dim=1)
            """,
            """
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

            def noise(n):
                return torch.randn(n, 8)
            """,
            """
            import torch

            def noise(n):
                return torch.randn(n, 8)  # porter: manual
            """,
            title="random numbers need a PRNG key: marked for a manual port",
        ),
        Example(
            """
            import torch

            x = torch.randn(10, 3)
            for images, _ in loader:
                z = torch.randn(images.shape[0], 64, device=device)
                idx = torch.randperm(64)
                fake = G(z[idx])
            """,
            """
            import torch
            import jax.numpy as jnp
            import numpy as np

            x = jnp.asarray(np.asarray(torch.randn(10, 3)))
            for images, _ in loader:
                z = jnp.asarray(np.asarray(torch.randn(images.shape[0], 64)))
                idx = jnp.asarray(np.asarray(torch.randperm(64)))
                fake = G(z[idx])
            """,
            title="draws of the host loop keep torch's generator (the original's numbers for the same seed)",
        ),
        Example(
            """
            import torch

            model = torch.nn.Linear(3, 4)
            for x in loader:
                out = model(x)
                noise = torch.randn(out.shape[0], 4)
            """,
            """
            import torch

            model = torch.nn.Linear(3, 4)
            for x in loader:
                out = model(x)
                noise = torch.randn(out.shape[0], 4)  # porter: manual
            """,
            title="a draw fed by a forward value may move into the jitted step: marked for a manual port",
        ),
        Example(
            """
            import numpy as np
            import torch

            np.random.seed(1)
            for data in loader:
                noise = torch.randn((data.shape[0], 16, 1, 1), device=device)
            """,
            """
            import numpy as np

            np.random.seed(1)
            for data in loader:
                noise = np.random.standard_normal((data.shape[0], 16, 1, 1)).astype(np.float32)
            """,
            title="noise in a script that seeds numpy: drawn on the host, as the batches are",
        ),
        Example(
            """
            import torch

            def train(model, opt, loader):
                data = torch.rand(64, 6)
                for x in loader:
                    noise = torch.randn_like(x)
                    loss = model(x + noise).sum()
                    loss.backward()
                    opt.step()
            """,
            """
            import torch
            import jax.numpy as jnp
            import numpy as np

            def train(model, opt, loader):
                data = jnp.asarray(np.asarray(torch.rand(64, 6)))
                for x in loader:
                    noise = jnp.asarray(np.asarray(torch.randn(x.shape)))
                    loss = model(x + noise).sum()
                    loss.backward()
                    opt.step()
            """,
            title="draws of the host outside the step (the trainer's set-up, the loop's noise): torch's generator, "
                  "handed to JAX",
        ),
        Example(
            """
            import numpy as np
            import torch

            def make_series(n):
                t = torch.arange(n, dtype=torch.float32)
                return torch.sin(t / 8.0) + 0.1 * torch.randn(n)

            def make_labels(n):
                return torch.randint(0, 3, (n,))

            def main():
                np.random.seed(0)
                series = make_series(512)
                labels = make_labels(512)

            if __name__ == "__main__":
                main()
            """,
            """
            import numpy as np
            import torch
            import jax.numpy as jnp

            def make_series(n):
                t = jnp.arange(n, dtype=jnp.float32)
                return jnp.sin(t / 8.0) + 0.1 * jnp.asarray(np.asarray(torch.randn(n)))

            def make_labels(n):
                return jnp.asarray(np.asarray(torch.randint(0, 3, (n,))))

            def main():
                np.random.seed(0)
                series = make_series(512)
                labels = make_labels(512)

            if __name__ == "__main__":
                main()
            """,
            title="data built by helpers the script calls once (from main(), from the __main__ guard): torch's "
                  "generator, the original's data, even where numpy is seeded",
        ),
    ]
    valid = [
        "import torch\nmodel = torch.nn.Linear(3, 4)\n",
        "import jax.numpy as jnp\ny = jnp.concatenate([a, b], axis=1)\n",
        "import torch\nclass D(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n        return torch.zeros(3)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        o = ops.function_op(node, self.ctx)
        if o is None or ops.in_data_pipeline(self.ctx) or lp.handed_to_torch(self.ctx, node):
            return
        if o.manual and sampler(node, self.ctx) is not None:
            return  # random numbers in a module method: JX014, from the module's nnx.Rngs
        if o.manual and fresh_random_draw(node, self.ctx):
            return  # random numbers where a module is built: JX108, from its rngs
        if o.manual and dropout_call(node, self.ctx) is not None:
            return  # F.dropout: JX107 (torch_dropout)
        if o.manual and self._host_noise(node):
            return
        if o.manual and self._host_draw(node):
            return
        ops.port_call(self, node, o, None)

    def _host_draw(self, node: cst.Call) -> bool:
        """A draw the port runs on the host (``lp.host_draw``: a script's top level, a loop
        statement no model value flows into) keeps torch's generator: the original's numbers
        for the same seed, handed to JAX as an array."""
        if not lp.host_draw(self.ctx, node):
            return False
        parent, grand = self.ctx.parent, self.ctx.enclosing(cst.Call)
        if (isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and grand.args and grand.args[0] is parent
                and self.ctx.qualname(grand.func) in ("numpy.asarray", "numpy.array")):
            return True  # `np.asarray(torch.randn(3))`: a NumPy array already
        args = [a for a in node.args if not (a.keyword is not None and a.keyword.value == "device")]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        draw = cst.Module([]).code_for_node(node.with_changes(args=args))
        like = lp.HOST_LIKE_DRAWS.get(self.ctx.qualname(node.func) or "")
        if like is not None:
            # `torch.randn_like(x)` -> `torch.randn(x.shape)`: the same numbers where x has the
            # default dtype, and x may be the port's array
            x = args[0].value
            shape = cst.Attribute(x if isinstance(x, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
                                  else x.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]), cst.Name("shape"))
            draw = f"{self.ctx.module_alias('torch')}.{like.rsplit('.', 1)[1]}({cst.Module([]).code_for_node(shape)})"
        jnp, np_ = self.ctx.module_alias("jax.numpy"), self.ctx.module_alias("numpy")
        new = cst.parse_expression(f"{jnp}.asarray({np_}.asarray({draw}))")
        self.report(node, f"{self.ctx.qualname(node.func)} runs on the host: torch's generator draws it (the original's "
                          "numbers for the same seed), JAX gets the array",
                    Fix((Edit(node, new),), imports=("jax.numpy", "numpy") + (("torch",) if like else ())))
        return True

    def _host_noise(self, node: cst.Call) -> bool:
        """``torch.randn(shape, device=d)`` / ``torch.rand`` in a script that seeds numpy's
        global generator (``np.random.seed(seed)``): drawn by numpy on the host, float32, like
        the batches the loader hands to the step (no PRNG key to thread through the loop)."""
        q = self.ctx.qualname(node.func)
        if q not in _HOST_NOISE or not self._seeds_numpy():
            return False
        fn = self.ctx.enclosing(cst.FunctionDef)
        if fn is not None and self.ctx.enclosing(cst.For, cst.While) is None and fn in lp.host_helpers(self.ctx):
            return False  # data a helper builds once: torch's generator (_host_draw), the original's data

        sizes = [a for a in node.args if a.keyword is None and a.star == ""]
        other = [a for a in node.args if a.keyword is not None and a.keyword.value not in ("device", "dtype")
                 or a.star != ""]
        dtype = astutil.arg(node, "dtype", len(node.args) + 1)
        if other or not sizes or (dtype is not None and self.ctx.qualname(dtype.value) != "torch.float32"):
            return False
        text = [cst.Module([]).code_for_node(a.value) for a in sizes]
        size = text[0] if len(text) == 1 else "(" + ", ".join(text) + ")"
        np_ = self.ctx.module_alias("numpy")
        new = cst.parse_expression(f"{np_}.random.{_HOST_NOISE[q]}({size}).astype({np_}.float32)")
        self.report(node, f"{q} in the script: drawn from numpy's seeded generator on the host (float32)",
                    Fix((Edit(node, new),), imports=("numpy",)))
        return True

    def _seeds_numpy(self) -> bool:
        return module_fact(self.ctx, _seeds_numpy)


def _seeds_numpy(ctx) -> bool:
    """Whether the file calls numpy.random.seed (a module fact, porter.rules.module_fact)."""
    return any(isinstance(n, cst.Call) and ctx.qualname(n.func) == "numpy.random.seed"
               for n in astutil.walk(ctx.module, into_functions=True))


_HOST_NOISE = {"torch.randn": "standard_normal", "torch.rand": "random_sample"}
