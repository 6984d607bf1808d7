from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from ._amp_dist import SPARSE_ADAM, has_star, positional, torch_attr


class SparseAdamToAdam(Rule):
    """
    ## What it does
    Reports `torch.optim.SparseAdam(params, lr=..., betas=..., eps=...)`; the unsafe fix
    makes it `torch.optim.Adam(params, lr=..., betas=..., eps=...)` (same argument names and
    order; `maximize=` passed by keyword is kept).

    ## Why
    SparseAdam only accepts sparse gradients, and XLA has none: once the embeddings are
    dense (TX901) SparseAdam raises on the first step.

    ## Fix safety
    Unsafe: Adam is not SparseAdam with dense gradients. SparseAdam is "lazy": a row absent
    from the batch is left alone, its moments and its value frozen. Adam updates every row
    at every step: a row absent from the batch gets a zero gradient, its first moment decays
    (m <- beta1*m) and its second moment decays (v <- beta2*v), and it still moves by
    lr * m_hat / (sqrt(v_hat) + eps), a step that does not vanish with the gradient. Rare
    tokens therefore drift between their occurrences, and every step touches the whole
    table. Training curves and final embeddings differ; verify the port, and write a masked
    (lazy) Adam step if the original behaviour matters.
    """

    code = "TX902"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "sparse-adam"
    target = "torch-xla"
    summary = "torch.optim.SparseAdam -> torch.optim.Adam (unsafe: rows absent from a batch still move)"
    severity = Severity.ERROR
    needs_text = ("SparseAdam",)
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn

            emb = nn.Embedding(50000, 128, sparse=True)
            sparse_opt = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-3, betas=(0.9, 0.99))
            """,
            """
            import torch
            import torch.nn as nn

            emb = nn.Embedding(50000, 128, sparse=True)
            sparse_opt = torch.optim.Adam(list(emb.parameters()), lr=1e-3, betas=(0.9, 0.99))
            """,
            unsafe=True,
        ),
        Example(
            """
            from torch.optim import SparseAdam

            opt = SparseAdam(params, 0.01)
            """,
            """
            import torch

            opt = torch.optim.Adam(params, 0.01)
            """,
            unsafe=True,
            title="imported by name",
        ),
        Example(
            """
            import torch

            opt = torch.optim.SparseAdam(params, 0.01, (0.9, 0.999), 1e-8, True)
            """,
            None,
            title="maximize passed by position is reported (keyword-only in Adam)",
        ),
    ]
    valid = [
        "import torch\nopt = torch.optim.Adam(params)\n",
        "class SparseAdam:\n    pass\nopt = SparseAdam()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in SPARSE_ADAM:
            return
        message = (
            "SparseAdam needs sparse gradients, which XLA does not have. Adam (with dense "
            "embeddings, TX901) is the runnable replacement but updates differently: rows absent "
            "from a batch keep moving with their decaying moments instead of staying frozen"
        )
        if has_star(node) or len(positional(node)) > 4:
            self.report(node, message + "; port this call by hand")
            return
        func = node.func
        if isinstance(func, cst.Attribute) and self.ctx.qualname(func) == "torch.optim.SparseAdam":
            new_func: cst.BaseExpression = func.with_changes(attr=cst.Name("Adam"))
            imports: tuple[str, ...] = ()
        else:
            new_func = torch_attr(self.ctx, "optim.Adam")
            imports = ("torch",)
        self.report(
            node,
            message,
            Fix((self.replace(node, node.with_changes(func=new_func)),), Safety.UNSAFE, imports=imports),
        )
