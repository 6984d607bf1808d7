import libcst as cst

from porter.rules import Example, Rule, Severity

from . import _ops_table as ops
from ._nnx import fresh_random_fill, library_model_value


class TensorMethod(Rule):
    """
    ## What it does
    Rewrites tensor methods (`x.view(...)`, `x.permute(...)`, `x.transpose(a, b)`,
    `x.size(d)`, `x.max(dim)`, `x.masked_fill(...)`, `x.float()`, `x.detach()`, ...) to JAX
    expressions from porter's op table: `x.view(b, -1)` -> `x.reshape(b, -1)`,
    `x.transpose(1, 2)` -> `jnp.swapaxes(x, 1, 2)`, `x.size(0)` -> `x.shape[0]`,
    `x.repeat(2, 1)` -> `jnp.tile(x, (2, 1))`, `x.float()` -> `x.astype(jnp.float32)`,
    `x.detach()` -> `jax.lax.stop_gradient(x)`, `x.contiguous()` -> `x`. Torch's
    `(values, indices)` results (`max`/`min` with a dim, `sort`, `topk`) become the matching
    pair, or one part when the code takes `.values`/`.indices`/`[0]`/`[1]`.

    Methods are recognised by name. Names only tensors have (`view`, `permute`, `unsqueeze`,
    `masked_fill`, ...) are rewritten on any receiver but a module, a literal or `self`.
    Names other objects share (`split` and `size` and `float`, `sum`, `max`, `repeat`,
    `transpose`, `to`, ...) only when the receiver is known to be a tensor: a parameter of
    `forward`/`__call__` in a module class, a parameter annotated `Tensor`, a name assigned
    from a torch/JAX call or another tensor expression in the same function, or a tensor
    expression itself. `x.to(device)` is device placement and left to the loop rules.

    ## Why
    JAX arrays have a smaller method set with numpy's meanings (`reshape`, `transpose`
    permutes all axes, `repeat` interleaves), and no `view`, `size()`, `masked_fill`,
    `detach` or `float()`.

    ## Fix safety
    Safe: each entry is checked against torch on random inputs (tests/test_jax_ops_run.py).
    Calls that cannot keep torch's semantics are marked `# porter: manual` and reported.
    """

    code = "JX102"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "tensor-method-to-jax"
    target = "jax"
    summary = "tensor methods (x.view, x.permute, x.size, x.max(dim)...) -> JAX (op table)"
    severity = Severity.ERROR
    needs_text = ("torch",)
    examples = [
        Example(
            """
            import torch.nn as nn

            class Attention(nn.Module):
                def forward(self, x, mask):
                    b, t, c = x.size()
                    q = x.view(b, t, 4, c // 4).transpose(1, 2)
                    att = (q @ q.transpose(-2, -1)).masked_fill(mask == 0, float("-inf"))
                    return att.softmax(dim=-1).contiguous().view(b, -1)
            """,
            """
            import torch.nn as nn
            import jax
            import jax.numpy as jnp

            class Attention(nn.Module):
                def forward(self, x, mask):
                    b, t, c = x.shape
                    q = jnp.swapaxes(x.reshape(b, t, 4, c // 4), 1, 2)
                    att = jnp.where(mask == 0, float("-inf"), q @ jnp.swapaxes(q, -2, -1))
                    return jax.nn.softmax(att, axis=-1).reshape(b, -1)
            """,
            title="shape methods inside forward",
        ),
        Example(
            """
            import torch

            def accuracy(logits: torch.Tensor, y):
                pred = logits.max(1)[1]
                top, idx = logits.max(dim=1)
                return pred.eq(y).float().mean(), top.detach()
            """,
            """
            import torch
            import jax
            import jax.numpy as jnp

            def accuracy(logits: torch.Tensor, y):
                pred = jnp.argmax(logits, axis=1)
                top, idx = (jnp.max(logits, axis=1), jnp.argmax(logits, axis=1))
                return jnp.equal(pred, y).astype(jnp.float32).mean(), jax.lax.stop_gradient(top)
            """,
            title="max(dim) returns values and indices",
        ),
        Example(
            """
            import torch

            def parse(line, x: torch.Tensor):
                words = line.split(",")
                return words, x.split(2), x.size(-1)
            """,
            """
            import torch
            import jax.numpy as jnp

            def parse(line, x: torch.Tensor):
                words = line.split(",")
                return words, jnp.split(x, list(range(2, x.shape[0], 2)), axis=0), x.shape[-1]
            """,
            title="shared method names only on known tensors",
        ),
        Example(
            """
            import torch

            def f(x: torch.Tensor, sizes):
                return x.split(sizes, dim=1)
            """,
            """
            import torch

            def f(x: torch.Tensor, sizes):
                return torch_split(x, sizes, 1)
            """,
            title="split sizes known only at run time: the port's torch_split (JX011 defines it)",
        ),
        Example(
            """
            import torch


            def get(pending, feval):
                return [feval(label.cpu().numpy(), pred.cpu().numpy()) for label, pred in pending]
            """,
            """
            import torch
            import numpy as np


            def get(pending, feval):
                return [feval(np.asarray(label), np.asarray(pred)) for label, pred in pending]
            """,
            title='x.cpu().numpy(), a chain only tensors have, on any receiver',
        ),
    ]
    valid = [
        "import torch\nparts = 'a,b'.split(',')\n",
        "import torch\ndef f(line):\n    return line.split(',')\n",
        "import torch\ndef f(x, device):\n    return x.to(device)\n",
        "import numpy as np\nimport torch\ndef f(a):\n    return np.sum(a)\n",
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.reshape(3, 4)\n",
        "import torch\nfrom timm.models import create_model\nmodel = create_model('resnet18')\n"
        "print(sum([m.numel() for m in model.parameters()]))\nfor n, b in model.named_buffers():\n    print(b.float().mean())\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        o = ops.method_op(node, self.ctx)
        if o is None or ops.in_data_pipeline(self.ctx):
            return
        if library_model_value(node.func.value, self.ctx):
            return  # a torch library's model and its parameters stay torch (JX901 reports where it is built)
        if o.manual and fresh_random_fill(node, self.ctx):
            return  # a fresh tensor's random fill where a module is built: JX108, from the module's rngs
        ops.port_call(self, node, o, node.func.value)
