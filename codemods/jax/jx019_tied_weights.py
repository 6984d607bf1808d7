from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _loop as lp
from . import _nnx


class TiedWeights(Rule):
    """
    ## What it does
    In a module class, a Linear's weight tied to an Embedding's (the input and output
    embeddings of a language model share one array), in either direction:

    `self.wte.weight = self.head.weight` or `self.head.weight = self.wte.weight` ->
    `self.head = TorchTiedLinear(self.wte.embedding, self.head.bias)`

    The embedding keeps its array; the Linear becomes a `TorchTiedLinear` (JX011) that holds
    the same `nnx.Param` and computes `x @ weight.T` (what `nnx.Embed.attend` computes), plus
    the Linear's bias where it has one. The layers may be attributes of the model or entries of
    an `nnx.Dict`, and the statement may be in `__init__` or in a method it calls.

    ## Why
    torch ties by making both modules hold one Parameter. nnx.Linear's array is `.kernel`,
    (in, out), the transpose of the embedding's (num_embeddings, dim) table, so the torch
    statement fails on NNX (`'Linear' object has no attribute 'weight'`), and assigning one
    kernel to the other would tie the wrong layout. One NNX variable held by both layers is
    one array for NNX too: `nnx.state` lists it once, its gradient sums both uses, and
    `load_torch_state_dict` / `torch_state_dict` map both torch names to it.

    ## Fix safety
    Safe: the forward pass computes torch's `F.linear(x, weight, bias)` with the shared
    array, and the parameters are the original's (one tied array, the Linear's bias). The
    initial value is the embedding's where torch's tie keeps the Linear's
    (`emb.weight = head.weight`); a port loading the original's weights has the same array
    either way.
    """

    code = "JX019"
    name = "jax-tied-weights"
    target = "jax"
    summary = "emb.weight = head.weight (a tied Linear / Embedding) -> head = TorchTiedLinear(emb.embedding, head.bias)"
    severity = Severity.ERROR
    needs_text = (".weight",)
    examples = [
        Example(
            """
            import flax.nnx as nnx

            class LM(nnx.Module):
                def __init__(self, vocab, dim, *, rngs: nnx.Rngs):
                    self.transformer = nnx.Dict(dict(wte=nnx.Embed(vocab, dim, rngs=rngs)))
                    self.lm_head = nnx.Linear(dim, vocab, use_bias=False, rngs=rngs)
                    self.transformer.wte.weight = self.lm_head.weight

                def __call__(self, ids):
                    return self.lm_head(self.transformer.wte(ids))
            """,
            """
            import flax.nnx as nnx

            class LM(nnx.Module):
                def __init__(self, vocab, dim, *, rngs: nnx.Rngs):
                    self.transformer = nnx.Dict(dict(wte=nnx.Embed(vocab, dim, rngs=rngs)))
                    self.lm_head = nnx.Linear(dim, vocab, use_bias=False, rngs=rngs)
                    self.lm_head = TorchTiedLinear(self.transformer.wte.embedding, self.lm_head.bias)

                def __call__(self, ids):
                    return self.lm_head(self.transformer.wte(ids))
            """,
            title="the embedding's weight set to the head's (nnx.Dict entry)",
        ),
        Example(
            """
            import flax.nnx as nnx

            class Decoder(nnx.Module):
                def __init__(self, vocab, dim, *, rngs: nnx.Rngs):
                    self.emb = nnx.Embed(vocab, dim, rngs=rngs)
                    self.out = nnx.Linear(dim, vocab, rngs=rngs)
                    self.tie_weights()

                def tie_weights(self):
                    self.out.weight = self.emb.weight
            """,
            """
            import flax.nnx as nnx

            class Decoder(nnx.Module):
                def __init__(self, vocab, dim, *, rngs: nnx.Rngs):
                    self.emb = nnx.Embed(vocab, dim, rngs=rngs)
                    self.out = nnx.Linear(dim, vocab, rngs=rngs)
                    self.tie_weights()

                def tie_weights(self):
                    self.out = TorchTiedLinear(self.emb.embedding, self.out.bias)
            """,
            title="the head's weight set to the embedding's, in a helper method; the head has a bias",
        ),
    ]
    valid = [
        # two Linears (no embedding): not this tie
        "import flax.nnx as nnx\nclass M(nnx.Module):\n    def __init__(self, *, rngs):\n"
        "        self.a = nnx.Linear(4, 4, rngs=rngs)\n        self.b = nnx.Linear(4, 4, rngs=rngs)\n"
        "        self.a.weight = self.b.weight\n",
        # the head is assigned something else too: not known to be a Linear
        "import flax.nnx as nnx\nclass M(nnx.Module):\n    def __init__(self, head, *, rngs):\n"
        "        self.emb = nnx.Embed(10, 4, rngs=rngs)\n        self.head = nnx.Linear(4, 10, rngs=rngs)\n"
        "        if head is not None:\n            self.head = head\n        self.head.weight = self.emb.weight\n",
    ]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if _nnx.module_classes(self.ctx).get(node.name.value) is not node:
            return
        layers = lp.self_layer_kinds(node, self.ctx)
        if not layers:
            return
        for n in astutil.walk(node, into_functions=True):
            if not (isinstance(n, cst.Assign) and len(n.targets) == 1):
                continue
            target, value = n.targets[0].target, n.value
            if not (isinstance(target, cst.Attribute) and target.attr.value == "weight"
                    and isinstance(value, cst.Attribute) and value.attr.value == "weight"):
                continue
            paths = {layers.get(dotted_name(side.value) or ""): dotted_name(side.value) for side in (target, value)}
            embed, linear = paths.get("Embed"), paths.get("Linear")
            if embed is None or linear is None:
                continue
            new = cst.parse_statement(f"{linear} = TorchTiedLinear({embed}.embedding, {linear}.bias)\n")
            assert isinstance(new, cst.SimpleStatementLine)
            self.report(n, f"{lp.code(n)}: {linear} (an nnx.Linear) and {embed} (an nnx.Embed) share one array: "
                           f"the Linear becomes a TorchTiedLinear on the embedding's",
                        Fix((self.replace(n, new.body[0]),)))
