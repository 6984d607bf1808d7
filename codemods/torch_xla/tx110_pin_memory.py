import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import imports_torch


class PinMemory(Rule):
    """
    ## What it does
    Drops `.pin_memory()` where its result is moved at once: `x.pin_memory().to(device)`,
    `x.pin_memory().to(device, non_blocking=True)` become `x.to(device)`,
    `x.to(device, non_blocking=True)`. A `.pin_memory()` whose result is kept
    (`x = x.pin_memory()`) is reported.

    ## Why
    Pinned (page-locked) host memory is CUDA's: without a CUDA driver, as on a TPU host,
    `Tensor.pin_memory()` raises (measured, torch 2.9 CPU build: `RuntimeError: Found no NVIDIA
    driver on your system`). It only speeds up an asynchronous host-to-GPU copy; the XLA
    transfer of `.to(torch_xla.device())` reads ordinary host memory.

    ## Fix safety
    Safe: `x.pin_memory()` is a copy of `x` with the same values, and `.to(...)` makes its own
    copy on the device either way; only the host buffer the copy starts from differs.
    """

    code = "TX110"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "pin-memory"
    target = "torch-xla"
    summary = "x.pin_memory().to(device) -> x.to(device) (pinned memory needs CUDA)"
    severity = Severity.ERROR
    needs_text = ("pin_memory(",)
    examples = [
        Example(
            """
            import torch

            def get_batch(x, y, device):
                x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
                return x, y

            z = torch.zeros(4).pin_memory().to(device=device)
            """,
            """
            import torch

            def get_batch(x, y, device):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                return x, y

            z = torch.zeros(4).to(device=device)
            """,
        ),
        Example(
            """
            import torch

            batch = batch.pin_memory()
            """,
            None,
            title="a pinned tensor that is kept is reported",
        ),
    ]
    valid = [
        "import torch\nloader = torch.utils.data.DataLoader(ds, pin_memory=True)\n",
        "import torch\nx = x.to(device)\n",
        "x = x.pin_memory()\n",  # not a torch file
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "pin_memory" or node.args:
            return
        if not imports_torch(self.ctx):
            return
        parent = self.ctx.parent
        grand = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "to" \
                and isinstance(grand, cst.Call) and grand.func is parent:
            self.report(node, "pinned host memory needs CUDA (Tensor.pin_memory() raises without a CUDA driver): "
                        "the XLA transfer does not need it", Fix((self.replace(node, func.value),)))
            return
        self.report(node, "pinned host memory needs CUDA (Tensor.pin_memory() raises without a CUDA driver): on XLA "
                    "keep the tensor as it is")
