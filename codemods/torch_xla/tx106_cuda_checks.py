import libcst as cst

from porter.rules import Example, Rule, Severity

from ._tables import imports_torch, is_string


class CudaChecks(Rule):
    """
    ## What it does
    Reports code that asks whether a tensor or device is CUDA: `x.is_cuda`,
    `device.type == 'cuda'`, `x.device.type != 'cuda'`, `device == 'cuda'`.

    ## Why
    On XLA these tests are always false (measured: an XLA tensor has `is_cuda == False` and
    `device.type == 'xla'`), so after the port the CUDA branch silently stops running: moves
    to the device, `pin_memory`, AMP switches, synchronizations. Which branch the port needs
    depends on what the branch does, so a person decides (usually: take the accelerator
    branch, testing `x.device.type == 'xla'`).
    """

    code = "TX106"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-checks"
    target = "torch-xla"
    summary = "report .is_cuda and device.type == 'cuda' tests (always false on XLA)"
    severity = Severity.WARNING
    needs_text = ("cuda",)
    examples = [
        Example(
            """
            import torch

            def prepare(x, device):
                if not x.is_cuda:
                    x = x.pin_memory()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                return x
            """,
            None,
        ),
    ]
    valid = [
        "import torch\nif x.device.type == 'xla':\n    pass\n",
        "if cfg.is_cuda:\n    pass\n",  # not a torch file
        "import torch\nmode = 'cuda_graphs'\nif mode == 'fast':\n    pass\n",
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "is_cuda" or not imports_torch(self.ctx):
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        self.report(node, ".is_cuda is always False on XLA: decide what this branch should do on the XLA device (x.device.type == 'xla')")

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if not imports_torch(self.ctx):
            return
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if not any(is_string(o, "cuda") for o in operands):
            return
        if not any(isinstance(c.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)) for c in node.comparisons):
            return
        if not any(self._device_like(o) for o in operands):
            return
        self.report(node, "a test for the CUDA device is always false on XLA (the device type is 'xla'): decide what this branch should do")

    @staticmethod
    def _device_like(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Attribute):
            return node.attr.value == "type" or "device" in node.attr.value.lower()
        if isinstance(node, cst.Name):
            return "device" in node.value.lower() or node.value.lower() in ("dev", "map_location")
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "str":
            return True
        return False
