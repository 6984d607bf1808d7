from __future__ import annotations

import libcst as cst

from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _nnx
from ._nnx import RNGS_STREAM as STREAM


class FunctionalDropout(Rule):
    """
    ## What it does
    `F.dropout(x, p, training=self.training)` (positional or keyword arguments, also
    `nn.functional.dropout`, `torch.dropout(x, p, train)`) -> `torch_dropout(x, p, training,
    self.rngs)`, a function the port defines (JX011): in training each element is zeroed with
    probability p and the others scaled by 1 / (1 - p); the identity when not training or at
    p = 0; all zeros at p = 1; a ValueError for p outside [0, 1], as torch. The channel
    dropouts `F.dropout1d/2d/3d` -> `torch_dropout(..., spatial=1/2/3)`: whole channels are
    zeroed, one draw per (sample, channel) of a batched input, per channel of an unbatched one. In a module method
    (or a function nested in one) the key comes from the module's `nnx.Rngs`: `__init__` keeps
    it (`self.rngs = rngs`, as JX014 does), and each call draws from its "dropout" stream. In a
    function outside a module (a module-level helper called with `training=self.training`)
    there is no key: the port raises a ValueError when it would draw one (training with
    0 < p < 1), and runs at p = 0 or when not training.

    `self.training` itself becomes `not self.deterministic` (JX006), so `model.train()` /
    `model.eval()` switch the dropout as in torch.

    ## Why
    JAX has no global random generator: a dropout mask needs an explicit key, which an NNX
    module carries as state (nnx.Dropout does the same).

    ## Fix safety
    Safe: the same distribution and scaling; the masks are other numbers than torch's
    (another generator). Where no key is available the port fails loudly instead of
    computing something else.
    """

    code = "JX107"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-functional-dropout"
    target = "jax"
    summary = "F.dropout(x, p, training=self.training) -> torch_dropout(x, p, training, self.rngs)"
    severity = Severity.ERROR
    needs_text = ("dropout",)
    examples = [
        Example(
            """
            import torch.nn.functional as F
            from flax import nnx

            class Layer(nnx.Module):
                def __init__(self, p, *, rngs: nnx.Rngs):
                    self.p = p

                def __call__(self, x, training):
                    x = F.dropout(x, p=self.p, training=training)
                    return F.dropout(x, self.p)
            """,
            """
            from flax import nnx

            class Layer(nnx.Module):
                def __init__(self, p, *, rngs: nnx.Rngs):
                    self.p = p
                    self.rngs = rngs

                def __call__(self, x, training):
                    x = torch_dropout(x, self.p, training, self.rngs)
                    return torch_dropout(x, self.p, True, self.rngs)
            """,
        ),
        Example(
            """
            import torch
            from torch.nn import functional

            def attention(x, dropout: float, training: bool = True):
                x = torch.dropout(x, dropout, training)
                return functional.dropout(x, p=dropout, training=training, inplace=False)
            """,
            """
            def attention(x, dropout: float, training: bool = True):
                x = torch_dropout(x, dropout, training)
                return torch_dropout(x, dropout, training)
            """,
            title="outside a module: no key (the port raises where it would draw one)",
        ),
        Example(
            """
            import torch.nn.functional as F
            from flax import nnx
            class Block(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.p = 0.1
                    self.rngs = rngs
                def __call__(self, x, training):
                    return F.dropout2d(x, self.p, training=training)
            """,
            """
            from flax import nnx
            class Block(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.p = 0.1
                    self.rngs = rngs
                def __call__(self, x, training):
                    return torch_dropout(x, self.p, training, self.rngs, spatial=2)
            """,
            title="a channel dropout: whole channels zeroed",
        ),
    ]
    valid = [
        "import torch.nn as nn\ndrop = nn.Dropout(0.1)\n",
        "import torch.nn.functional as F\ny = F.dropout(*args)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "torch_dropout" and len(node.args) == 3:
            # the port's call outside a module, which has no key: said where it is left
            self.report(node, "torch_dropout outside a module has no PRNG key: the port raises where it draws a mask "
                              "(training, 0 < p < 1); pass the calling module's nnx.Rngs as its rngs",
                        severity=Severity.WARNING)
            return
        spec = _nnx.dropout_call(node, self.ctx)
        if spec is None:
            return
        args = [spec["input"], spec["p"], spec["training"]]
        edits: tuple = ()
        if spec["module"] is not None:
            cls, _ = spec["module"]
            keep = _nnx.keep_rngs(cls)
            if keep is None:
                return  # a module class without __init__ (JX001 adds one first)
            args.append(f"self.{STREAM}")
            edits = keep
        if spec["spatial"]:
            args.append(f"spatial={spec['spatial']}")
        new = cst.parse_expression(f"torch_dropout({', '.join(args)})")
        where = f"the module's nnx.Rngs (self.{STREAM})" if spec["module"] is not None else \
            "no key outside a module: the port raises if it has to draw a mask"
        self.report(node, f"{_nnx.code(node.func)}(...) -> torch_dropout(...): torch's dropout; its key from {where}",
                    Fix((Edit(node, new), *edits)))

