import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import CUDA_QUERIES, as_spelled, cuda_qualname


class CudaQueries(Rule):
    """
    ## What it does
    Handles CUDA memory and device queries. `torch.cuda.get_device_name(...)` becomes
    `xm.xla_device_kind()`, `torch.cuda.is_bf16_supported()` becomes
    `torch_xla.runtime.is_bf16_supported()`; `memory_allocated`, `max_memory_allocated`, `memory_reserved`,
    `memory_stats`, `memory_summary`, `mem_get_info`, `get_device_properties`,
    `get_device_capability` and `utilization` are reported with their XLA counterpart.

    ## Why
    They query CUDA and fail without it. `xm.xla_device_kind()` returns the device kind string
    (checked on 2.9: `'cpu'` on the CPU backend; a TPU name such as `'TPU v4'` on TPU). For
    memory, `xm.get_memory_info(device)` returns `bytes_used`, `bytes_limit` and
    `peak_bytes_used` on TPU, but on the CPU PJRT backend it raises
    `UNIMPLEMENTED: GetAllocatorStats is not supported` (measured), so a mechanical rewrite
    would crash the port wherever it is checked on CPU: those are left to a person.

    ## Fix safety
    Safe for `get_device_name`: both return a descriptive string (used for logs); the device
    argument is dropped (the current XLA device is described). Safe for `is_bf16_supported`:
    without CUDA `torch.cuda.is_bf16_supported()` answers False (torch 2.9: "If CUDA is not
    available, than it does not support bf16 either"), so a script that picks its precision by
    it (`dtype = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'`) would choose
    float16 on a TPU; the XLA query makes a bfloat16 tensor on the XLA device (it starts the
    XLA runtime where it is called).
    """

    code = "TX805"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-queries"
    target = "torch-xla"
    summary = "torch.cuda.get_device_name() -> xm.xla_device_kind(), is_bf16_supported() -> xr.is_bf16_supported(); report CUDA memory queries"
    severity = Severity.WARNING
    needs_text = ("cuda", "accelerator")
    examples = [
        Example(
            """
            import torch

            print("running on", torch.cuda.get_device_name(0))
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
            """,
            """
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr

            print("running on", xm.xla_device_kind())
            dtype = "bfloat16" if xr.is_bf16_supported() else "float16"
            """,
        ),
        Example(
            """
            import torch

            peak = torch.cuda.max_memory_allocated() / 2**20
            """,
            None,
        ),
    ]
    valid = [
        "import torch_xla.core.xla_model as xm\nkind = xm.xla_device_kind()\n",
        "import torch\nn = torch.numel(x)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = cuda_qualname(node.func, self.ctx)
        spec = CUDA_QUERIES.get(name or "")
        if spec is None:
            return
        if spec.module is None or any(a.star for a in node.args):
            self.report(node, as_spelled(spec.message, node.func, self.ctx), severity=spec.severity)
            return
        alias = self.ctx.module_alias(spec.module)
        new = cst.parse_expression(f"{alias}.{spec.attr}()")
        self.report(node, as_spelled(spec.message, node.func, self.ctx), Fix((self.replace(node, new),), imports=(spec.module,)))
