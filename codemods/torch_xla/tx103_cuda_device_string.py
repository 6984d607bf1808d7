import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Safety, Severity

from ._devices import PROVABLE, SPELLING, int_ordinal, placement_expr
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
    `device='cuda'`, `device='cuda'` passed to a function of the program, a command-line default
    `parser.add_argument('--device', default='cuda')`) are reported.

    Integer devices are CUDA device numbers: `.to(0)`, `.to(local_rank)`, `device=rank`. A
    literal, or a plain name every binding of which in its scope is an integer literal or a
    call of `int(...)` (`local_rank = int(os.environ['LOCAL_RANK'])`), `dist.get_rank()`,
    `xr.global_ordinal()`, is provably one: a safe fix. A parameter named `rank`, `local_rank`,
    `gpu`, `gpu_id`, `device_id`, `local_gpu` or `gpu_index` (say the `rank` of a function that
    `mp.spawn` starts), or such an attribute of the parsed arguments (`args.gpu`,
    `args.local_rank`), is read as one by its spelling alone: an unsafe fix. The device used is
    the script's device variable `device` where the code can read one (a parameter, an
    earlier `device = ...` in the function, a module-level one), else `torch_xla.device()`.

    ## Why
    A TPU host has no CUDA device. The XLA device of the process is `torch_xla.device()`.
    `torch.Generator(device='cuda')` is reported: an XLA device cannot hold a Generator
    (measured: `RuntimeError: XLA device type not an accelerator`).
    A string stored in a variable or a default parameter may also be compared or formatted
    elsewhere (`device == 'cuda'`), and `torch_xla.device()` in a default parameter would
    initialize the XLA runtime at import, so those are left to a person.

    ## Fix safety
    Safe: the tensor is created on / moved to the XLA device (or the script's device variable,
    so the tensor meets the model wherever the user's flag put it) instead of the CUDA device.
    Unsafe for an integer device known by its name's spelling only.
    """

    code = "TX103"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-device-string"
    target = "torch-xla"
    summary = ".to('cuda') / device='cuda' in torch calls -> torch_xla.device()"
    severity = Severity.ERROR
    needs_text = ("cuda", ".to(", "device=")
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
            import os
            import torch

            def worker(model, batch):
                local_rank = int(os.environ["LOCAL_RANK"])
                model = model.to(local_rank)
                mask = torch.ones(4, device=local_rank)
                return model(batch.to(0)) * mask

            def step(device, x):
                return x.to("cuda", non_blocking=True)
            """,
            """
            import os
            import torch
            import torch_xla

            def worker(model, batch):
                local_rank = int(os.environ["LOCAL_RANK"])
                model = model.to(torch_xla.device())
                mask = torch.ones(4, device=torch_xla.device())
                return model(batch.to(torch_xla.device())) * mask

            def step(device, x):
                return x.to(device, non_blocking=True)
            """,
            title="integer device numbers; the script's device variable where there is one",
        ),
        Example(
            """
            import torch

            def run(rank, args, model, x):
                model.to(rank)
                return model(x.to(args.gpu))
            """,
            """
            import torch
            import torch_xla

            def run(rank, args, model, x):
                model.to(torch_xla.device())
                return model(x.to(torch_xla.device()))
            """,
            unsafe=True,
            title="names that say GPU number by their spelling: unsafe",
        ),
        Example(
            """
            import torch

            DEVICE = "cuda"

            def evaluate(model, device="cuda:0"):
                return build(device="cuda")

            gen = torch.Generator(device="cuda")
            parser.add_argument("--device", default="cuda:0", help="device to train on")
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
        "import torch\nx = x.to(other)\n",
        "import torch\ndef f(x, n):\n    return x.to(n)\n",
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
                default = arg(node, "default")
                if isinstance(func, cst.Attribute) and func.attr.value == "add_argument" and default is not None \
                        and is_cuda_string(default.value):
                    self.report(default.value, "CUDA device string as a command-line default: the port runs with it "
                                "unless the user passes another device; on XLA default to 'xla' where every use of "
                                "the option is a device use (torch.device(...), .to(...)), or pass --device xla")
            return
        if target is None:
            return
        ordinal = int_ordinal(target.value, self.ctx) if not is_cuda_string(target.value) else None
        if ordinal is not None:
            place = placement_expr(self.ctx)
            message = "an integer device is a CUDA device number: on XLA use the process's device (torch_xla.device())"
            if ordinal == SPELLING:
                message += "; the unsafe fix reads the name as a GPU number by its spelling"
            self.report(target.value, message, Fix((self.replace(target.value, place),),
                                                   Safety.SAFE if ordinal == PROVABLE else Safety.UNSAFE,
                                                   imports=() if isinstance(place, cst.Name) else (TORCH_XLA,)))
            return
        if not is_cuda_string(target.value):
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
