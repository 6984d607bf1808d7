from __future__ import annotations

import libcst as cst

from porter.astutil import arg
from porter.context import FileContext
from porter.rules import Example, Fix, Rule, Safety, Severity, module_fact

from ._amp_dist import is_literal, mentions_sparse_adam

# callable -> position of `sparse` among its positional parameters
_SPARSE_POSITION = {
    "torch.nn.Embedding": 6,
    "torch.nn.modules.sparse.Embedding": 6,
    "torch.nn.EmbeddingBag": 6,
    "torch.nn.modules.sparse.EmbeddingBag": 6,
    "torch.nn.Embedding.from_pretrained": 6,
    "torch.nn.modules.sparse.Embedding.from_pretrained": 6,
    "torch.nn.EmbeddingBag.from_pretrained": 6,
    "torch.nn.modules.sparse.EmbeddingBag.from_pretrained": 6,
    "torch.nn.functional.embedding": 6,
    "torch.nn.functional.embedding_bag": 7,
}


class DenseEmbedding(Rule):
    """
    ## What it does
    Rewrites `sparse=True` (or any value but `False`) to `sparse=False` in
    `nn.Embedding(...)`, `nn.EmbeddingBag(...)`, their `from_pretrained(...)`, and
    `F.embedding(...)` / `F.embedding_bag(...)`, keyword or positional.

    ## Why
    XLA has no sparse tensors: the sparse gradient of an embedding cannot be built on an
    XLA device. With `sparse=False` the embedding's gradient is a dense tensor of the
    table's shape, zero in the rows the batch did not use.

    ## Fix safety
    Safe when the file does not use `torch.optim.SparseAdam`: for SGD (with or without
    momentum) and Adagrad, a dense gradient with zero rows gives the same update as the
    sparse one (untouched rows get a zero gradient, and their momentum / accumulator
    evolves exactly as in the sparse case). The dense gradient costs memory and bandwidth
    of a full table per step: for very large tables, shard or keep the embedding on the host.

    Unsafe when the file uses `SparseAdam`: SparseAdam rejects dense gradients, so the
    embedding and the optimizer must change together, and replacing SparseAdam by Adam
    changes the updates (see TX902). Without `--unsafe-fixes` both are only reported and the
    code stays consistent; with it, both change.
    """

    code = "TX901"
    name = "dense-embedding"
    target = "torch-xla"
    summary = "nn.Embedding(..., sparse=True) -> sparse=False (XLA has no sparse gradients)"
    severity = Severity.ERROR
    needs_text = ("sparse",)
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    examples = [
        Example(
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.emb = nn.Embedding(10000, 64, sparse=True)
                    self.bag = nn.EmbeddingBag(10000, 64, mode="sum", sparse=True)

                def forward(self, ids, w):
                    return F.embedding(ids, w, None, None, 2.0, False, True)

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.emb = nn.Embedding(10000, 64, sparse=False)
                    self.bag = nn.EmbeddingBag(10000, 64, mode="sum", sparse=False)

                def forward(self, ids, w):
                    return F.embedding(ids, w, None, None, 2.0, False, False)

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
        ),
        Example(
            """
            import torch
            from torch import nn

            emb = nn.Embedding.from_pretrained(vectors, sparse=True)
            opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
            """,
            """
            import torch
            from torch import nn

            emb = nn.Embedding.from_pretrained(vectors, sparse=False)
            opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
            """,
            unsafe=True,
            title="with SparseAdam in the file: unsafe, goes together with TX902",
        ),
    ]
    valid = [
        "import torch.nn as nn\ne = nn.Embedding(10, 4)\n",
        "import torch.nn as nn\ne = nn.Embedding(10, 4, sparse=False)\n",
        "import torch\nx = torch.sparse_coo_tensor(i, v)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        position = _SPARSE_POSITION.get(self.ctx.qualname(node.func) or "")
        if position is None:
            return
        sparse = arg(node, "sparse", position)
        if sparse is None or is_literal(sparse.value, False):
            return
        with_sparse_adam = module_fact(self.ctx, _file_mentions_sparse_adam)
        new_arg = sparse.with_changes(value=cst.Name("False"))
        new = node.with_changes(args=[new_arg if a is sparse else a for a in node.args])
        message = (
            "sparse embedding gradients do not exist on XLA: use sparse=False (a dense gradient, "
            "the same SGD/Adagrad update; memory of the full table)"
        )
        if with_sparse_adam:
            message += (
                "; this file uses SparseAdam, which rejects dense gradients: change it together "
                "with TX902 (SparseAdam -> Adam changes the update)"
            )
        self.report(
            node,
            message,
            Fix((self.replace(node, new),), Safety.UNSAFE if with_sparse_adam else Safety.SAFE),
        )


def _file_mentions_sparse_adam(ctx: FileContext) -> bool:
    """Whether the file refers to SparseAdam, through the imports the file has at its start
    (those of its top-level statements), wherever the traversal is when it is asked."""
    return mentions_sparse_adam(FileContext(ctx.module, ctx.path), ctx.module)
