from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _nnx


class ParameterCount(Rule):
    """
    ## What it does
    Rewrites a count of a model's parameters, `sum(p.numel() for p in model.parameters())`
    (a generator or a list given to `sum`, `model.named_parameters()` with the name unread,
    `p.nelement()`, `torch.numel(p)`, an `if p.requires_grad` filter) or a loop adding the
    counts up (`for p in model.parameters(): total += p.numel()`), into the same count over
    the model's `nnx.Param` arrays: `jax.tree.leaves(nnx.state(model, nnx.Param))`.

    ## Why
    An NNX module has no `parameters()`; its parameters are the `nnx.Param` variables of its
    graph, which `nnx.state(model, nnx.Param)` collects. Like torch's `parameters()`, it holds
    a parameter shared by two layers (tied weights) once, so the count is torch's.

    ## Fix safety
    Safe: the same number. The `requires_grad` filter is dropped: the port trains every
    `nnx.Param` (a frozen torch parameter would be counted by the port).
    """

    code = "JX022"
    name = "jax-parameter-count"
    target = "jax"
    summary = "sum(p.numel() for p in model.parameters()) -> the count over nnx.state(model, nnx.Param)"
    severity = Severity.WARNING
    needs_text = ("parameters",)
    examples = [
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def num_params(self):
                    return sum(p.numel() for p in self.parameters())

            n = sum([p.nelement() for _, p in model.named_parameters() if p.requires_grad])
            """,
            """
            import torch.nn as nn
            import jax
            import flax.nnx as nnx

            class Net(nn.Module):
                def num_params(self):
                    return sum(p.numel() for p in jax.tree.leaves(nnx.state(self, nnx.Param)))

            n = sum([p.nelement() for p in jax.tree.leaves(nnx.state(model, nnx.Param))])
            """,
            title="counts in a method and in a script",
        ),
        Example(
            """
            total = 0
            for p in model.parameters():
                total += p.numel()
            """,
            """
            import jax
            import flax.nnx as nnx

            total = 0
            for p in jax.tree.leaves(nnx.state(model, nnx.Param)):
                total += p.numel()
            """,
            title="a loop adding the counts up",
        ),
    ]
    valid = [
        "shapes = [p.shape for p in model.parameters()]\n",
        "n = sum(p.numel() for name, p in model.named_parameters() if 'emb' not in name)\n",
        "n = sum(p.numel() for p in model.parameters() if not p.requires_grad)\n",
        "for p in model.parameters():\n    total += p.numel()\n    p.grad = None\n",
        "sizes = [p.numel() for p in model.parameters()]\n",
        "from timm import create_model\nmodel = create_model('resnet18').cuda()\nn = sum(p.numel() for p in model.parameters())\n",
    ]

    def visit_CompFor(self, node: cst.CompFor) -> None:
        outer = tuple(reversed(self.ctx.ancestors[-4:-1]))
        self._count(node, outer)

    def visit_For(self, node: cst.For) -> None:
        self._count(node, ())

    def _count(self, loop, outer: tuple) -> None:
        found = _nnx.parameter_count(loop, outer, self.ctx)
        if found is None:
            return
        handle, grad_ifs = found
        nnx = _nnx.nnx_name(self.ctx)
        jax = self.ctx.module_alias("jax")
        owner = _nnx.code(loop.iter.func.value)
        leaves = cst.parse_expression(f"{jax}.tree.leaves({nnx}.state({owner}, {nnx}.Param))")
        changes = {"iter": leaves, "target": cst.Name(handle)}
        if isinstance(loop, cst.CompFor):
            changes["ifs"] = [c for c in loop.ifs if c not in grad_ifs]
        self.report(loop.iter, f"{_nnx.code(loop.iter)}: the count over the model's nnx.Param arrays",
                    Fix((self.replace(loop, loop.with_changes(**changes)),), imports=("jax", "flax.nnx")))
