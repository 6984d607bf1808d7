import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import XM, cuda_qualname


class CudaSynchronize(Rule):
    """
    ## What it does
    Rewrites `torch.cuda.synchronize()` (with or without a device) to `xm.wait_device_ops()`.

    ## Why
    `torch.cuda.synchronize()` needs CUDA. `xm.wait_device_ops()` blocks until every
    computation already sent to the local XLA devices has finished, the XLA counterpart
    (it exists in 2.9 and runs on the CPU backend, checked). Unlike CUDA kernels, XLA
    operations are not sent until the graph is cut: to time a step, call `torch_xla.sync()`
    before it (a step marker the training loop usually already has).

    ## Fix safety
    Safe: both only wait; no value changes. The device argument is dropped: the XLA call waits
    for all local devices, a superset.
    """

    code = "TX801"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-synchronize"
    target = "torch-xla"
    summary = "torch.cuda.synchronize() -> xm.wait_device_ops()"
    severity = Severity.ERROR
    needs_text = ("synchronize",)
    examples = [
        Example(
            """
            import time
            import torch

            torch.cuda.synchronize()
            start = time.time()
            """,
            """
            import time
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()
            start = time.time()
            """,
        ),
    ]
    valid = [
        "import torch_xla.core.xla_model as xm\nxm.wait_device_ops()\n",
        "import torch\nevent.synchronize()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if cuda_qualname(node.func, self.ctx) != "torch.cuda.synchronize":
            return
        xm = self.ctx.module_alias(XM)
        self.report(
            node,
            "torch.cuda.synchronize() needs CUDA: use xm.wait_device_ops() (after torch_xla.sync() to include pending ops)",
            Fix((self.replace(node, cst.parse_expression(f"{xm}.wait_device_ops()")),), imports=(XM,)),
        )
