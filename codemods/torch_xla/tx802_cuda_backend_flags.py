import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._imports import pairs_in
from ._tables import CUDA_BACKEND_FLAGS, removal_edits


class CudaBackendFlags(Rule):
    """
    ## What it does
    Removes assignments to cuDNN / CUDA-matmul switches:
    `torch.backends.cudnn.benchmark`, `.deterministic`, `.enabled`, `.allow_tf32` and
    `torch.backends.cuda.matmul.allow_tf32` (and the reduced-precision-reduction flags).

    ## Why
    These only configure cuDNN and cuBLAS; XLA never reads them. Left in, they suggest a
    behaviour (autotuning, determinism, TF32) the port does not have. On TPU the matmul
    precision knob is `torch_xla.backends.set_mat_mul_precision(...)`.

    ## Fix safety
    Safe: the statements have no effect on XLA. An `if flag:` left empty goes (its test has no side
    effects), another block left empty gets `pass`; an assignment
    whose value calls a function is reported instead (the call may matter). An import the
    removed lines used (`import torch.backends.cudnn as cudnn`) goes when nothing else in the
    file uses it.
    """

    code = "TX802"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-backend-flags"
    target = "torch-xla"
    summary = "remove torch.backends.cudnn.benchmark/deterministic/enabled and TF32 switches"
    severity = Severity.INFO
    needs_text = ("cudnn", "allow_tf32", "matmul")
    examples = [
        Example(
            """
            import torch
            import torch.backends.cudnn as cudnn

            torch.backends.cudnn.deterministic = True
            cudnn.benchmark = not args.deterministic
            if args.tf32:
                torch.backends.cuda.matmul.allow_tf32 = True
            model = torch.nn.Linear(4, 2)
            """,
            """
            import torch
            model = torch.nn.Linear(4, 2)
            """,
            title="the cudnn import goes with its last use; torch is still used",
        ),
        Example(
            """
            from torch.backends import cudnn

            cudnn.benchmark = True
            print(cudnn.version())
            """,
            """
            from torch.backends import cudnn

            print(cudnn.version())
            """,
            title="an import still used elsewhere stays",
        ),
        Example(
            """
            import torch

            torch.backends.cudnn.benchmark = choose_benchmark()
            """,
            None,
            title="a value with a call is reported",
        ),
    ]
    valid = [
        "import torch\nif torch.backends.cudnn.enabled:\n    pass\n",
        "cudnn.benchmark = True\n",  # not resolved through an import
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        names = [self.ctx.qualname(t.target) for t in node.targets]
        if not any(n in CUDA_BACKEND_FLAGS for n in names):
            return
        edits = removal_edits(self.ctx, node)
        message = f"{next(n for n in names if n in CUDA_BACKEND_FLAGS)} only configures CUDA/cuDNN; XLA ignores it"
        if edits is None:
            self.report(node, message + ": remove it (the value calls a function, check it is not needed)")
            return
        self.report(node, message + ": removed", Fix(edits, remove_imports=pairs_in(self.ctx, [node])))
