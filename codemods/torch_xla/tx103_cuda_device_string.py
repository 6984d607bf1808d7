import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._devices import placement_expr
from ._tables import TORCH_XLA, imports_torch, is_cuda_string

# Tensor methods whose `device` argument places the result.
_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor")


class CudaDeviceString(Rule):
    """
    ## What it does
    Rewrites CUDA device strings where a device is passed: `.to('cuda')`, `.to('cuda:0')`,
    `.to(device='cuda')`, and `device='cuda'` in calls of torch functions
    (`torch.zeros/ones/randn/arange/tensor/empty/full/...`) and of tensor `new_*` methods,
    to `torch_xla.device()`. Other CUDA strings (`DEVICE = 'cuda'`, a default parameter
    `device='cuda'`, `device='cuda'` passed to a function of the program) are reported.

    ## Why
    A TPU host has no CUDA device. The XLA device of the process is `torch_xla.device()`.
    `torch.Generator(device='cuda')` is reported: an XLA device cannot hold a Generator
    (measured: `RuntimeError: XLA device type not an accelerator`).
    A string stored in a variable or a default parameter may also be compared or formatted
    elsewhere (`device == 'cuda'`), and `torch_xla.device()` in a default parameter would
    initialize the XLA runtime at import, so those are left to a person.

    ## Fix safety
    Safe: the tensor is created on / moved to the XLA device instead of the CUDA device.
    """

    code = "TX103"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-device-string"
    target = "torch-xla"
    summary = ".to('cuda') / device='cuda' in torch calls -> torch_xla.device()"
    severity = Severity.ERROR
    needs_text = ("cuda",)
    examples = [
        Example(
            """
            import torch

            x = torch.zeros(4, 4, device="cuda")
            y = torch.arange(10, device=f"cuda:{rank}")
            z = x.to("cuda:0", non_blocking=True)
            w = x.new_zeros(3, device="cuda")
            """,
            """
            import torch
            import torch_xla

            x = torch.zeros(4, 4, device=torch_xla.device())
            y = torch.arange(10, device=torch_xla.device())
            z = x.to(torch_xla.device(), non_blocking=True)
            w = x.new_zeros(3, device=torch_xla.device())
            """,
        ),
        Example(
            """
            import torch

            DEVICE = "cuda"

            def evaluate(model, device="cuda:0"):
                return build(device="cuda")

            gen = torch.Generator(device="cuda")
            """,
            None,
            title="strings that may be used as strings are reported",
        ),
    ]
    valid = [
        "import torch\nx = torch.zeros(3, device='cpu')\n",
        "import torch\ng = torch.Generator(device='cpu')\n",
        "import torch\nx = x.to(device)\n",
        "import torch\nx = x.to(torch.float16)\n",
        "import torch\nname = 'cuda_kernels'\n",
        "x = make(device='cuda')\n",  # not a torch file
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not imports_torch(self.ctx):
            return
        func = node.func
        name = self.ctx.qualname(func)
        is_method = isinstance(func, cst.Attribute) and func.attr.value in _METHODS and (name is None or not name.startswith("torch."))
        if is_method and func.attr.value == "to":  # type: ignore[union-attr]
            target = arg(node, "device", 0)
        elif is_method or (name is not None and name.startswith("torch.") and name not in ("torch.device", "torch.load")):
            target = arg(node, "device")
        else:
            target = None
            if name is None or not name.startswith("torch."):
                dev = arg(node, "device")
                if dev is not None and is_cuda_string(dev.value):
                    self.report(dev, "CUDA device string passed on: on XLA pass torch_xla.device() (check how the callee uses it)")
            return
        if target is None or not is_cuda_string(target.value):
            return
        if name == "torch.Generator":
            self.report(target.value, "torch.Generator(device='cuda'): XLA has no device generators (torch 2.9 / torch_xla 2.9: "
                                      "RuntimeError 'XLA device type not an accelerator'); use a CPU torch.Generator() and move "
                                      "the results, or seed the device with torch_xla.manual_seed()")
            return
        place = placement_expr(self.ctx)
        self.report(
            target.value,
            "CUDA device string: on XLA use torch_xla.device()",
            Fix((self.replace(target.value, place),), imports=() if isinstance(place, cst.Name) else (TORCH_XLA,)),
        )

    def visit_Assign(self, node: cst.Assign) -> None:
        if is_cuda_string(node.value) and imports_torch(self.ctx):
            self.report(node.value, "CUDA device string stored: on XLA the device is torch_xla.device() (call it where the device is used)")

    def visit_Param(self, node: cst.Param) -> None:
        if node.default is not None and is_cuda_string(node.default) and imports_torch(self.ctx):
            self.report(node.default, "CUDA default device: on XLA default to None and use torch_xla.device() in the body")
