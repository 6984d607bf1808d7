import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._devices import placement_expr
from ._tables import TORCH_XLA, imports_torch, tidy_args

# Keyword arguments of Tensor.cuda / Module.cuda that Tensor.to / Module.to also take.
_KEPT = ("non_blocking", "memory_format")


class CudaMethod(Rule):
    """
    ## What it does
    Rewrites `.cuda()`, `.cuda(gpu)`, `.cuda(device=gpu)` and `.cuda(non_blocking=True)` on
    tensors and modules to `.to(torch_xla.device())`, keeping `non_blocking` and
    `memory_format`.

    ## Why
    `.cuda()` needs a CUDA device, which a TPU host does not have. `.to(torch_xla.device())`
    moves a tensor (a copy, like `.cuda()`) or a module (in place, returning it, like
    `Module.cuda()`) to this process's XLA device; the CUDA index is not needed under PJRT.

    ## Fix safety
    Safe: same placement semantics on the XLA device. Only method calls named `cuda` in a file
    that imports torch are rewritten; `x.cuda` without a call (an attribute) is left alone.
    """

    code = "TX102"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-method"
    target = "torch-xla"
    summary = ".cuda() / .cuda(gpu, non_blocking=True) -> .to(torch_xla.device())"
    severity = Severity.ERROR
    needs_text = (".cuda(",)
    examples = [
        Example(
            """
            import torch

            model = Net().cuda()
            for images, target in loader:
                images = images.cuda(args.gpu, non_blocking=True)
                target = target.cuda(device=args.gpu)
            """,
            """
            import torch
            import torch_xla

            model = Net().to(torch_xla.device())
            for images, target in loader:
                images = images.to(torch_xla.device(), non_blocking=True)
                target = target.to(torch_xla.device())
            """,
        ),
    ]
    valid = [
        "import torch\nx = x.to(device)\n",
        "import torch\nif obj.cuda:\n    pass\n",
        "model.cuda()\n",  # not a torch file
        "import torch\nimport torch_xla\nx = x.to(torch_xla.device())\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "cuda"):
            return
        if not imports_torch(self.ctx):
            return
        receiver = self.ctx.qualname(func.value)
        if receiver is not None and not receiver.startswith("builtins."):
            return  # `torch.cuda(...)`, `cuda` of an imported module: not a tensor method
        if any(a.star for a in node.args):
            self.report(node, ".cuda(*args) on XLA: use .to(torch_xla.device())")
            return
        kept = [a for a in node.args if a.keyword is not None and a.keyword.value in _KEPT]
        unknown = [a for a in node.args if a.keyword is not None and a.keyword.value not in _KEPT + ("device",)]
        if unknown:
            self.report(node, ".cuda(...) on XLA: use .to(torch_xla.device(), ...)")
            return
        place = placement_expr(self.ctx)
        new = node.with_changes(
            func=func.with_changes(attr=cst.Name("to")),
            args=tidy_args([cst.Arg(place), *kept]),
        )
        self.report(
            node,
            ".cuda() needs a CUDA device: use .to(torch_xla.device())",
            Fix((self.replace(node, new),), imports=() if isinstance(place, cst.Name) else (TORCH_XLA,)),
        )
