from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp

# what may follow the array without the read becoming a write or a torch-only use
_WRITES = ("data", "grad", "requires_grad", "requires_grad_", "retain_grad", "register_hook")


class LayerArrayReads(Rule):
    """
    ## What it does
    A read of a torch layer's array through the name the layer is bound to
    (`linear.weight`, `emb.weight`, `norm.bias`) becomes the NNX layer's array in torch's
    layout: `linear.weight` -> `linear.kernel[...].T` (nnx.Linear keeps the transpose),
    `emb.weight` -> `emb.embedding[...]`, `norm.weight` -> `norm.scale[...]`. The name must
    be bound to that layer everywhere in the file (`linear = nn.Linear(3, 2)`, or its port
    `nnx.Linear(...)`); `linear.bias` keeps its name. A layer of the model read through
    attributes (`self.fc.weight`, `self.transformer.wpe.weight`) is read the same way where every
    assignment of that attribute in the class is the one NNX layer (`self.fc = nnx.Linear(...)`,
    or an entry of `nnx.Dict(dict(wpe=nnx.Embed(...)))`).

    Left alone: a write (`linear.weight = ...`, a weight shared with another layer), an
    in-place use (`.data`, `.grad`, `.requires_grad_()`, `.copy_()` and the other in-place
    methods, `nn.init.*_(linear.weight)`), the array given to an optimizer; JX901 reports
    the attribute reads left.

    ## Why
    NNX layers name their arrays after their own conventions (`kernel`, `embedding`,
    `scale`), and nnx.Linear's kernel is (in, out) where torch's weight is (out, in): the port
    reading `.weight` fails with AttributeError, and one reading `.kernel` as if it were
    torch's weight gets the transpose.

    ## Fix safety
    Safe: the expression is the same array, in torch's layout, read at the same point.
    """

    code = "JX021"
    local = True
    name = "jax-layer-array-reads"
    target = "jax"
    summary = "linear.weight (a layer bound to a name) -> linear.kernel[...].T / emb.embedding[...]"
    severity = Severity.ERROR
    needs_text = (".weight", ".bias")
    examples = [
        Example(
            """
            import torch.nn as nn

            linear = nn.Linear(3, 2)
            emb = nn.Embedding(10, 4)
            print('w: ', linear.weight)
            w_norm = linear.weight.norm()
            table = emb.weight
            """,
            """
            import torch.nn as nn

            linear = nn.Linear(3, 2)
            emb = nn.Embedding(10, 4)
            print('w: ', linear.kernel[...].T)
            w_norm = linear.kernel[...].T.norm()
            table = emb.embedding[...]
            """,
            title="reads of a Linear's and an Embedding's weight",
        ),
        Example(
            """
            import flax.nnx as nnx

            class LM(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.transformer = nnx.Dict(dict(wpe=nnx.Embed(32, 8, rngs=rngs)))
                    self.head = nnx.Linear(8, 4, rngs=rngs)

                def num_position_params(self):
                    return self.transformer.wpe.weight.size

                def head_shape(self):
                    return self.head.weight.shape
            """,
            """
            import flax.nnx as nnx

            class LM(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.transformer = nnx.Dict(dict(wpe=nnx.Embed(32, 8, rngs=rngs)))
                    self.head = nnx.Linear(8, 4, rngs=rngs)

                def num_position_params(self):
                    return self.transformer.wpe.embedding[...].size

                def head_shape(self):
                    return self.head.kernel[...].T.shape
            """,
            title="a model's layers read through attributes (an nnx.Dict entry, an attribute)",
        ),
    ]
    valid = [
        "import torch.nn as nn\nlinear = nn.Linear(3, 2)\nlinear.weight.data.fill_(0)\n",
        "import torch.nn as nn\nlinear = nn.Linear(3, 2)\nnn.init.zeros_(linear.weight)\n",
        "import torch.nn as nn\nlinear = nn.Linear(3, 2)\nprint(linear.weight.grad)\n",
        "import torch.nn as nn\nlinear = nn.Linear(3, 2)\nother = nn.Linear(2, 3)\nother.weight = linear.weight\n",
        "import torch.nn as nn\nlinear = nn.Linear(3, 2)\nprint(linear.bias)\n",
        "import torch.nn as nn\nlinear = nn.Linear(3, 2)\nlinear = make()\nprint(linear.weight)\n",
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value not in ("weight", "bias"):
            return
        array = lp.layer_array(self.ctx, node)
        if array is None:
            return
        name, nnx_name, transposed = array
        if nnx_name == node.attr.value:
            return
        if not self._plain_read(node):
            return
        new = cst.parse_expression(f"{name}.{nnx_name}[...]" + (".T" if transposed else ""))
        self.report(node, f"{lp.code(node)}: {name} is an NNX layer whose array is .{nnx_name}"
                          + (" (torch's weight is its transpose)" if transposed else ""),
                    Fix((self.replace(node, new),), Safety.SAFE))

    def _plain_read(self, node: cst.Attribute) -> bool:
        ancestors = self.ctx.ancestors[:-1]  # the node's own is last
        parent = ancestors[-1] if ancestors else None
        if isinstance(parent, cst.Attribute) and parent.value is node:
            attr = parent.attr.value
            if attr in _WRITES or (attr.endswith("_") and not attr.startswith("_")):
                return False
        if isinstance(parent, cst.AssignTarget) or (isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node):
            return False
        if isinstance(parent, cst.Del):
            return False
        for anc in reversed(ancestors):
            if isinstance(anc, cst.Call):
                qual = self.ctx.qualname(anc.func) or ""
                if qual.startswith(("torch.nn.init.", "torch.optim.", "optax.")) or qual.startswith("flax.nnx.Optimizer"):
                    return False
            if isinstance(anc, cst.AssignTarget):
                return False
            if isinstance(anc, cst.Assign) and any(
                isinstance(t.target, cst.Attribute) and t.target.attr.value in ("weight", "bias") for t in anc.targets
            ):
                return False  # `other.weight = linear.weight`: a weight shared (tied), not a read
            if isinstance(anc, (cst.BaseStatement, cst.BaseSmallStatement)):
                break
        return True
