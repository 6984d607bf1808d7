import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from ._tables import in_availability_choice


class CudaIsAvailable(Rule):
    """
    ## What it does
    Handles `torch.cuda.is_available()` outside the device-selection idiom TX101 rewrites.
    Where it is one operand of an `and` with a user's choice
    (`use_cuda = not args.no_cuda and torch.cuda.is_available()`) the unsafe fix drops it,
    keeping the user's choice (`use_cuda = not args.no_cuda`). Anywhere else it is reported.

    ## Why
    On a TPU host `torch.cuda.is_available()` is False, so code guarded by it silently runs on
    the CPU. torch_xla has no "is an accelerator present" call that keeps the semantics: after
    `import torch_xla` a PJRT device is always selected (TPU, NEURON, else CPU; measured with
    `PJRT_DEVICE` unset: `xr.device_type()` is `'CPU'`), so the XLA device always exists.
    `torch_xla.device_count()` answers at least 1 and initializes the runtime (measured), which
    breaks a later `torch_xla.launch`. If the program must know whether a real accelerator is
    there, `xr.device_type() != 'CPU'` tells (it reads the selected PJRT device without
    initializing the runtime).

    ## Fix safety
    Unsafe: dropping the test makes the program use the XLA device wherever the user did not
    opt out, also on a host without TPU (where it is XLA on the CPU, not eager CPU). That is the
    port's intent, but it changes what that host runs.
    """

    code = "TX107"
    name = "cuda-is-available"
    target = "torch-xla"
    summary = "torch.cuda.is_available() is False on TPU: drop it from `flag and is_available()`, else report"
    severity = Severity.ERROR
    needs_text = ("is_available",)
    examples = [
        Example(
            """
            import torch

            use_cuda = not args.no_cuda and torch.cuda.is_available()
            device = torch.device("cuda" if use_cuda else "cpu")
            """,
            """
            import torch

            use_cuda = not args.no_cuda
            device = torch.device("cuda" if use_cuda else "cpu")
            """,
            unsafe=True,
        ),
        Example(
            """
            import torch

            if torch.cuda.is_available():
                model = torch.nn.DataParallel(model)
            """,
            None,
        ),
    ]
    valid = [
        "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "import torch\ndevice = 'cuda' if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 'cpu'\n",
        "import torch_xla.runtime as xr\nreal = xr.device_type() != 'CPU'\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.cuda.is_available" or node.args:
            return
        if in_availability_choice(self.ctx):
            return  # TX101 replaces the whole `'cuda' if ... else 'cpu'`
        parent = self.ctx.parent
        if isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And):
            other = parent.left if parent.right is node else parent.right
            kept = other
            if parent.lpar and not other.lpar:
                kept = other.with_changes(lpar=parent.lpar, rpar=parent.rpar)
            self.report(
                node,
                "torch.cuda.is_available() is False on a TPU host: keep only the user's choice "
                "(torch_xla always has a device; xr.device_type() != 'CPU' tells whether it is an accelerator)",
                Fix((self.replace(parent, kept),), Safety.UNSAFE),
            )
            return
        self.report(
            node,
            "torch.cuda.is_available() is False on a TPU host, so this CUDA branch never runs on XLA: decide what the "
            "XLA port needs (torch_xla always has a device; xr.device_type() != 'CPU' tells whether it is an accelerator)",
        )
