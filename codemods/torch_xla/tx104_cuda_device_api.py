import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from ._availability import foldable, is_count
from ._tables import CUDA_DEVICE_API, SET_DEVICE, as_spelled, cuda_qualname, removal_edits


class CudaDeviceApi(Rule):
    """
    ## What it does
    Handles the torch.cuda device-management calls:
    `torch.cuda.set_device(i)` statements are removed; `torch.cuda.device_count()` becomes
    `torch_xla.device_count()` (unsafe fix); `torch.cuda.current_device()` is reported.

    ## Why
    Under PJRT each process started by `torch_xla.launch` already owns its device:
    there is nothing to select, and `torch_xla.device()` returns it. `torch_xla.device_count()`
    (measured in 2.9: the number of XLA devices this process can address, 1 here) is the
    closest count, but unlike `torch.cuda.device_count()` it initializes the XLA runtime, and a
    process whose runtime is initialized can no longer `torch_xla.launch` workers.
    `torch.cuda.current_device()` means different things depending on whether `set_device`
    was called (0, or the local rank); its XLA counterparts are `torch_xla.device().index`,
    `xr.local_ordinal()` and `xr.global_ordinal()`, and a person has to pick.

    ## Fix safety
    Removing `set_device` is safe (it only selected the CUDA device; an `if flag:` whose test
    has no side effects goes when it is left empty, another block left empty gets `pass`; a
    call whose argument has side effects is reported instead). The `device_count` rewrite is
    unsafe: see above about the runtime initialization. A count compared with a number
    (`torch.cuda.device_count() > 1`) is TX107's: it folds the test.
    """

    code = "TX104"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-device-api"
    target = "torch-xla"
    summary = "torch.cuda.set_device removed, device_count -> torch_xla.device_count(), current_device reported"
    severity = Severity.ERROR
    needs_text = ("cuda", "accelerator")
    examples = [
        Example(
            """
            import torch

            def worker(gpu, args):
                torch.cuda.set_device(gpu)
                model = build()
                if args.distributed:
                    torch.cuda.set_device(args.gpu)
                return model
            """,
            """
            def worker(gpu, args):
                model = build()
                return model
            """,
            title="set_device removed, an `if flag:` it empties goes too",
        ),
        Example(
            """
            import torch

            def report():
                print("devices:", torch.cuda.device_count())
            """,
            """
            import torch_xla

            def report():
                print("devices:", torch_xla.device_count())
            """,
            unsafe=True,
        ),
        Example(
            """
            import torch

            rank = torch.cuda.current_device()
            """,
            None,
        ),
    ]
    valid = [
        "import torch_xla\nn = torch_xla.device_count()\n",
        "cuda.set_device(0)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = cuda_qualname(node.func, self.ctx)
        if name == SET_DEVICE:
            parent = self.ctx.parent
            edits = removal_edits(self.ctx, parent) if isinstance(parent, cst.Expr) else None
            if edits is None:
                self.report(node, "torch.cuda.set_device() has no XLA counterpart (each XLA process owns its device): remove it")
                return
            self.report(
                node,
                "torch.cuda.set_device() removed: each XLA process already owns its device (torch_xla.device())",
                Fix(edits),
            )
            return
        spec = CUDA_DEVICE_API.get(name or "")
        if spec is None:
            return
        if is_count(node, self.ctx):
            anc = self.ctx.ancestors
            comparison = anc[-3] if isinstance(self.ctx.parent, cst.ComparisonTarget) and len(anc) >= 3 else self.ctx.parent
            if comparison is not None and foldable(comparison, self.ctx):
                return  # a one-device-or-more test: TX107 folds it
        if spec.module is None or (node.args and not spec.keep_args):
            self.report(node, as_spelled(spec.message, node.func, self.ctx), severity=spec.severity)
            return
        alias = self.ctx.module_alias(spec.module)
        new = cst.parse_expression(f"{alias}.{spec.attr}()")
        self.report(node, as_spelled(spec.message, node.func, self.ctx), Fix((self.replace(node, new),), Safety.UNSAFE, imports=(spec.module,)), severity=Severity.WARNING)
