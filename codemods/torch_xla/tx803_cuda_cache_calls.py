import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import CUDA_NOOP_CALLS, cuda_qualname, removal_edits


class CudaCacheCalls(Rule):
    """
    ## What it does
    Removes statements calling the CUDA caching allocator and IPC helpers:
    `torch.cuda.empty_cache()`, `reset_peak_memory_stats()`, `reset_max_memory_allocated()`,
    `reset_max_memory_cached()`, `reset_accumulated_memory_stats()`, `ipc_collect()`.

    ## Why
    They act on CUDA's caching allocator, which XLA does not use; XLA device memory is managed
    by the PJRT runtime. Called without CUDA they fail or do nothing.

    ## Fix safety
    Safe: nothing on XLA depends on them. An `if flag:` left empty goes (its test has no side
    effects), another block left empty gets `pass`. A call used as a
    value, or with an argument that calls a function, is reported instead.
    """

    code = "TX803"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-cache-calls"
    target = "torch-xla"
    summary = "remove torch.cuda.empty_cache() and other CUDA allocator calls"
    severity = Severity.WARNING
    needs_text = ("cuda", "accelerator")
    examples = [
        Example(
            """
            import torch

            for epoch in range(epochs):
                train(epoch)
                torch.cuda.empty_cache()
            with torch.no_grad():
                torch.cuda.reset_peak_memory_stats()
            if big: torch.cuda.empty_cache()
            """,
            """
            import torch

            for epoch in range(epochs):
                train(epoch)
            with torch.no_grad():
                pass
            """,
        ),
        Example(
            """
            import torch

            x = 1; torch.cuda.empty_cache()
            try:
                torch.cuda.empty_cache()
            finally:
                torch.cuda.ipc_collect()
            """,
            """
            x = 1
            try:
                pass
            finally:
                pass
            """,
            title="semicolons and try/finally stay valid",
        ),
        Example(
            """
            import torch

            stats = [torch.cuda.empty_cache(), torch.cuda.memory_allocated()]
            """,
            None,
            title="a call used as a value is reported",
        ),
    ]
    valid = [
        "import torch\nx = torch.empty(3)\n",
        "empty_cache()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = cuda_qualname(node.func, self.ctx)
        if name not in CUDA_NOOP_CALLS:
            return
        parent = self.ctx.parent
        edits = removal_edits(self.ctx, parent) if isinstance(parent, cst.Expr) else None
        short = name.rsplit(".", 1)[-1]
        if edits is None:
            self.report(node, f"torch.cuda.{short}() manages the CUDA allocator; it has no XLA counterpart: remove it")
            return
        self.report(node, f"torch.cuda.{short}() manages the CUDA allocator; removed (XLA memory is managed by PJRT)", Fix(edits))
