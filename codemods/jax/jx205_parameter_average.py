from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _params


class ParameterAverage(Rule):
    """
    ## What it does
    Rewrites a loop that walks two models' parameters side by side and updates one of them in
    place from both: an exponential moving average of the weights (EMA), a target network's
    soft update, a teacher that follows its student:

        for s, p in zip(ema.parameters(), model.parameters()):
            s.mul_(decay).add_(p.detach(), alpha=1 - decay)

    becomes one update of the whole model over the two models' NNX states:

        nnx.update(ema, jax.tree.map(lambda s, p: jnp.multiply(s, decay) + (1 - decay) * p,
                                     nnx.state(ema, nnx.Param), nnx.state(model, nnx.Param)))

    The body may be a chain of in-place calls (`mul_`, `add_(x, alpha=)`, `sub_`, `lerp_`,
    `copy_`... from porter's op table), several such statements on the same parameter, or
    `s.data = expr`; `.data` and `.detach()` of the pair are the arrays themselves. Pairs of
    `.buffers()` walk `nnx.BatchStat` (BatchNorm's running statistics). A loop that only
    freezes a model no optimizer of the file is built over (`for p in ema.parameters():
    p.requires_grad_(False)`, `p.requires_grad = False`) goes: JAX differentiates only what
    `nnx.value_and_grad` is given.

    ## Why
    NNX modules have no `parameters()` and JAX arrays no in-place methods: the loop cannot run
    in the port, and a rewrite element by element would be slow. `jax.tree.map` over the two
    states (the same structure for two instances of one model, as `zip` over their
    parameters pairs them in torch) computes every new value at once, and `nnx.update` writes
    them into the model.

    ## Fix safety
    Safe: the same arithmetic on the same pairs (torch's `parameters()` order is the modules'
    order, and `zip` pairs them by position; NNX's states pair them by path, which is the same
    pairing for two models of one architecture, and fails loudly when the structures differ).
    """

    code = "JX205"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-parameter-average"
    target = "jax"
    summary = "for s, p in zip(ema.parameters(), model.parameters()): s.mul_(d).add_(...) -> nnx.update(ema, jax.tree.map(...))"
    severity = Severity.ERROR
    needs_text = ("parameters()", "buffers()")
    examples = [
        Example(
            """
            import copy
            import torch

            class EMA:
                def __init__(self, model, decay=0.999):
                    self.shadow = copy.deepcopy(model)
                    self.decay = decay
                    for p in self.shadow.parameters():
                        p.requires_grad_(False)

                def update(self, model):
                    for s, p in zip(self.shadow.parameters(), model.parameters()):
                        s.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)
            """,
            """
            import copy
            import torch
            import jax
            import flax.nnx as nnx
            import jax.numpy as jnp

            class EMA:
                def __init__(self, model, decay=0.999):
                    self.shadow = copy.deepcopy(model)
                    self.decay = decay

                def update(self, model):
                    nnx.update(self.shadow, jax.tree.map(lambda s, p: jnp.multiply(s, self.decay) + (1 - self.decay) * p, nnx.state(self.shadow, nnx.Param), nnx.state(model, nnx.Param)))
            """,
            title="an exponential moving average of the weights, and the freezing of its copy",
        ),
        Example(
            """
            def soft_update(target, online, tau):
                for t, o in zip(target.parameters(), online.parameters()):
                    t.data.copy_(tau * o.data + (1.0 - tau) * t.data)
                for t, o in zip(target.buffers(), online.buffers()):
                    t.data = o.data
            """,
            """
            import jax
            import flax.nnx as nnx
            import jax.numpy as jnp

            def soft_update(target, online, tau):
                nnx.update(target, jax.tree.map(lambda t, o: jnp.broadcast_to(tau * o + (1.0 - tau) * t, t.shape).astype(t.dtype), nnx.state(target, nnx.Param), nnx.state(online, nnx.Param)))
                nnx.update(target, jax.tree.map(lambda t, o: o, nnx.state(target, nnx.BatchStat), nnx.state(online, nnx.BatchStat)))
            """,
            title="a target network's soft update (copy_ keeps the target's shape and dtype), and its buffers",
        ),
    ]
    valid = [
        # one model's parameters alone: not an average
        "import torch\nfor p in model.parameters():\n    p.data.mul_(0.5)\n",
        # the loop's name rebound: the model is unchanged
        "import torch\nfor s, p in zip(a.parameters(), b.parameters()):\n    s = 0.5 * s + 0.5 * p\n",
        # a loop that also does something else
        "import torch\nfor s, p in zip(a.parameters(), b.parameters()):\n    s.mul_(0.5)\n    print(s)\n",
        # a model the optimizer trains: its freezing stays (reported by JX901)
        "import torch\nfor p in backbone.parameters():\n    p.requires_grad = False\n"
        "opt = torch.optim.SGD(backbone.parameters(), lr=0.1)\n",
    ]

    def visit_For(self, node: cst.For) -> None:
        built = _params.average_update(node, self.ctx)
        if built is not None:
            text, used = built
            new = cst.SimpleStatementLine([cst.Expr(astutil.parse_expression(text))], leading_lines=node.leading_lines)
            self.report(node, "a parameter-wise average of two models (EMA, a soft update): one nnx.update over their "
                              "NNX states", Fix((self.replace(node, new),), imports=tuple(sorted(used))))
            return
        model = _params.freezing_loop(node, self.ctx)
        if model is not None:
            parent = self.ctx.parent
            only = isinstance(parent, cst.IndentedBlock) and len(parent.body) == 1
            self.report(node, f"{model} is frozen here and no optimizer trains it: JAX differentiates only what "
                              "nnx.value_and_grad is given, nothing to switch off",
                        Fix((self.replace(node, cst.SimpleStatementLine([cst.Pass()], leading_lines=node.leading_lines))
                             if only else self.remove(node),)))
