"""Tensor-by-tensor comparison with dtype-aware tolerances; pure numpy."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

# (rtol, atol) per dtype: a value passes when |port - original| <= atol + rtol * |original|
DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


@dataclass(frozen=True)
class Tolerance:
    rtol: Optional[float] = None
    atol: Optional[float] = None

    def for_dtype(self, dtype: str) -> tuple[float, float]:
        rtol, atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
        return (self.rtol if self.rtol is not None else rtol, self.atol if self.atol is not None else atol)


@dataclass(frozen=True)
class TensorResult:
    key: str  # e.g. "step3/param/layer2.0.bn1.running_var"
    phase: str  # layer, output, gradient, loss, parameter, buffer
    name: str  # as the user names it
    step: Optional[int]
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def where(self) -> str:
        label = {"layer": "output of", "output": "model output", "gradient": "gradient of",
                 "loss": "loss", "parameter": "parameter", "buffer": "buffer"}[self.phase]
        at = f" at step {self.step}" if self.step is not None else ""
        name = "" if self.phase in ("loss",) or (self.phase == "output" and self.name == "0") else f" {self.name}"
        return f"{label}{name}{at}"


_STEP = re.compile(r"^step(\d+)/(loss|param|buffer)(?:/(.*))?$")


def describe(key: str) -> tuple[str, str, Optional[int]]:
    m = _STEP.match(key)
    if m:
        kind = {"loss": "loss", "param": "parameter", "buffer": "buffer"}[m.group(2)]
        return kind, m.group(3) or "loss", int(m.group(1))
    head, _, rest = key.partition("/")
    phase = {"layer": "layer", "output": "output", "grad": "gradient"}.get(head, head)
    return phase, rest, None


def compare_tensor(key: str, a: np.ndarray, b: np.ndarray, tol: Tolerance) -> TensorResult:
    """``a``: the original's value, ``b``: the port's."""
    phase, name, step = describe(key)
    dtype = str(a.dtype)
    if a.shape != b.shape:
        return TensorResult(key, phase, name, step, tuple(a.shape), dtype, float("inf"), float("inf"), False,
                            f"shape {tuple(a.shape)} in the original, {tuple(b.shape)} in the port")
    if a.size == 0:
        return TensorResult(key, phase, name, step, tuple(a.shape), dtype, 0.0, 0.0, True)
    if a.dtype.kind not in "fc":
        equal = bool(np.array_equal(a, b))
        diff = 0.0 if equal else float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        return TensorResult(key, phase, name, step, tuple(a.shape), dtype, diff, 0.0 if equal else float("inf"), equal)
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    finite_a, finite_b = np.isfinite(a64), np.isfinite(b64)
    if not np.array_equal(finite_a, finite_b):
        return TensorResult(key, phase, name, step, tuple(a.shape), dtype, float("inf"), float("inf"), False,
                            "non-finite values (nan/inf) in one side only")
    diff = np.abs(np.where(finite_a, a64 - b64, 0.0))
    scale = np.abs(np.where(finite_a, a64, 0.0))
    rtol, atol = tol.for_dtype(dtype)
    ok = bool(np.all(diff <= atol + rtol * scale)) and bool(np.array_equal(a64[~finite_a], b64[~finite_b]))
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(scale, np.finfo(np.float64).tiny)).max()) if max_abs else 0.0
    return TensorResult(key, phase, name, step, tuple(a.shape), dtype, max_abs, max_rel, ok)


def compare_all(order: Sequence[str], original: Mapping[str, np.ndarray], port: Mapping[str, np.ndarray],
                tol: Tolerance) -> list[TensorResult]:
    """Compare in the original's recording order (layers in execution order, outputs,
    gradients in parameter order, then step by step), so the first failure is the earliest."""
    results = []
    for key in order:
        if key not in port:
            phase, name, step = describe(key)
            results.append(TensorResult(key, phase, name, step, tuple(original[key].shape), str(original[key].dtype),
                                        float("inf"), float("inf"), False, "missing in the port"))
            continue
        results.append(compare_tensor(key, original[key], port[key], tol))
    return results


def first_failure(results: Iterable[TensorResult]) -> Optional[TensorResult]:
    for r in results:
        if not r.ok:
            return r
    return None
