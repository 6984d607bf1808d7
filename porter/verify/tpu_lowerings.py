"""CPU fallbacks that torch_xla takes only off TPU, so that a verification on an XLA:CPU (or
GPU) device does not charge a port with transfers it has none of on a TPU.

torch_xla 2.9 lowers ``aten::upsample_bilinear2d_backward`` and
``aten::upsample_nearest2d_backward`` (the backward of ``F.interpolate(mode='bilinear')``,
``nn.Upsample``, ``mode='nearest'``) to a custom call that only its TPU backend implements: on
any other device type it runs them as CPU fallbacks ("Only the XLA TPU backend for now
implements the CustomCall required by our XLA lowering", torch_xla/csrc/aten_xla_type.cpp).
Measured on PJRT_DEVICE=CPU: each call is one device-to-host transfer
(``TransferFromDeviceTime`` grows by exactly the op's counter: 1, 2, 3 calls -> 1, 2, 3
transfers). A step's transfers on the TPU are its transfers here less these calls; the health
report says so in a note instead of an over-budget finding.
"""
from __future__ import annotations

import functools
from typing import Any

# the op counters torch_xla.debug.metrics keeps for them (one per call)
OFF_TPU_FALLBACKS = ("aten::upsample_bilinear2d_backward", "aten::upsample_nearest2d_backward")


@functools.lru_cache(maxsize=1)
def on_tpu() -> bool:
    try:
        import torch_xla.runtime as xr

        return xr.device_type() == "TPU"
    except (ImportError, RuntimeError):  # no torch_xla or no runtime: not a TPU
        return False


def off_tpu_calls(met: Any) -> int:
    """Calls so far of the fallbacks a TPU would not take (0 on a TPU): each one device-to-host
    transfer that the port does not make there."""
    if on_tpu():
        return 0
    return sum(met.counter_value(op) or 0 for op in OFF_TPU_FALLBACKS)


def note(calls_per_step: list[int]) -> str:
    """The health report's note for steps whose transfers include such calls ("" for none)."""
    if not any(calls_per_step):
        return ""
    return (f"{', '.join(OFF_TPU_FALLBACKS)} ran as CPU fallbacks here ("
            + ", ".join(f"step {i + 1}: {n}" for i, n in enumerate(calls_per_step) if n)
            + "; one device-to-host transfer each, not counted): torch_xla lowers them only on a TPU")
