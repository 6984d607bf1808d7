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


def _running_var_of(key: str) -> Optional[tuple[int, str]]:
    """``stepK/buffer/<module>.running_var`` -> (K, <module>); None for other keys."""
    m = _STEP.match(key)
    if not m or m.group(2) != "buffer" or not (m.group(3) or "").endswith(".running_var"):
        return None
    return int(m.group(1)), m.group(3)[:-len(".running_var")]


def batchnorm_values_per_channel(key: str, original: Mapping[str, np.ndarray]) -> Optional[int]:
    """For ``stepK/buffer/<module>.running_var``: how many values per channel the BatchNorm
    layer ``<module>`` normalised (batch x spatial, from its recorded output ``layer/<module>``
    of shape (N, C, ...)); None for any other tensor."""
    found = _running_var_of(key)
    layer = original.get(f"layer/{found[1]}") if found else None
    if layer is None or layer.ndim < 2 or layer.shape[1] == 0:
        return None
    return int(layer.size // layer.shape[1])


def compare_running_var(key: str, original: Mapping[str, np.ndarray], port: Mapping[str, np.ndarray], n: int,
                        tol: Tolerance) -> TensorResult:
    """A BatchNorm running variance after step K, from the original and from the port.

    PyTorch updates ``running_var`` with the unbiased batch variance S*n/(n-1), torch_xla
    (measured: 2.9, CPU) and Flax's nnx.BatchNorm with the biased one S, n values per channel. The difference is
    accepted, with a note, only when it is exactly that: from the original's values (initial,
    step 1, ..., K), with the momentum m solved from step 1 per channel (it must be one value
    in (0, 1] for all channels), the port's biased update is predicted,
    ``p_K = (1-m) p_{K-1} + (o_K - (1-m) o_{K-1}) (n-1)/n``, and must match within tolerance.
    Anything else fails as usual (a wrong momentum also shows in running_mean, a wrong eps in
    the layer's output). Not told apart: a shift of every channel by the same amount at step 1,
    which reads as another momentum."""
    a, b = original[key], port[key]
    plain = compare_tensor(key, a, b, tol)
    step, module = _running_var_of(key)
    init = original.get(f"init/{module}.running_var")
    names = [f"step{k}/buffer/{module}.running_var" for k in range(1, step + 1)]
    if plain.ok or init is None or a.dtype.kind != "f" or any(k not in original or k not in port for k in names):
        return plain
    o = [init.astype(np.float64)] + [original[k].astype(np.float64) for k in names]
    p = [init.astype(np.float64)] + [port[k].astype(np.float64) for k in names]
    if any(x.shape != o[0].shape for x in o + p) or np.any(o[0] == 0):
        return plain
    with np.errstate(all="ignore"):
        per_channel = (o[0] - o[1] + n * (o[1] - p[1])) / o[0]  # m, solved from step 1
    if not np.all(np.isfinite(per_channel)):
        return plain
    m = float(np.median(per_channel))
    if not 0.0 < m <= 1.0:
        return plain
    predicted = (1 - m) * p[step - 1] + (o[step] - (1 - m) * o[step - 1]) * (n - 1) / n
    rtol, atol = tol.for_dtype(str(a.dtype))
    if not np.all(np.abs(p[step] - predicted) <= atol + rtol * np.abs(predicted)):
        return _running_var_to_reference(plain, original, module, step, m, n, p) or plain
    return TensorResult(plain.key, plain.phase, plain.name, plain.step, plain.shape, plain.dtype, plain.max_abs,
                        plain.max_rel, True,
                        f"the port updates running_var with the biased batch variance (as torch_xla 2.9 and Flax "
                        f"do), the original with the unbiased (n={n} values per channel, momentum {m:.3g}): the "
                        f"port's value is the biased update of the original's batch statistics")


# float32 rounding, measured against a float64 run of the original (``ref/<key>``): the port
# passes a tensor the elementwise tolerance fails when its largest error from the float64
# values is at most NOISE_FACTOR times the original's own, plus NOISE_FLOOR of the tensor's
# largest magnitude. Measured, torchvision resnet18 at 224x224, batch 2, first forward and
# backward: the eager CPU original is up to 0.19 of a gradient's largest value from float64
# (layer4's conv weights: BatchNorm's backward over 98 values per channel cancels), torch_xla
# at most 9x the original's error where that error is smallest (a BatchNorm's output, 6.4e-6
# vs 7.1e-7 of its largest value).
NOISE_FACTOR = 10.0
NOISE_FLOOR = 1e-5


def compare_to_reference(plain: TensorResult, a: np.ndarray, b: np.ndarray, ref: np.ndarray) -> TensorResult:
    """``plain`` (a failed elementwise comparison of original ``a`` and port ``b``) judged again
    against the float64 values ``ref``: within float32 rounding, or failed as before."""
    if plain.ok or ref.shape != a.shape or a.dtype.kind != "f" or not np.all(np.isfinite(ref)):
        return plain
    r = ref.astype(np.float64)
    scale = float(np.abs(r).max())
    if not np.all(np.isfinite(a)) or not np.all(np.isfinite(b)) or scale == 0.0:
        return plain
    err_port = float(np.abs(b.astype(np.float64) - r).max())
    err_orig = float(np.abs(a.astype(np.float64) - r).max())
    if err_port > NOISE_FACTOR * err_orig + NOISE_FLOOR * scale:
        return plain
    return TensorResult(plain.key, plain.phase, plain.name, plain.step, plain.shape, plain.dtype, plain.max_abs,
                        plain.max_rel, True,
                        f"float32 rounding: {err_port / scale:.2g} of the largest value from a float64 run of the "
                        f"original, which is {err_orig / scale:.2g} from it itself")


def _running_var_to_reference(plain: TensorResult, original: Mapping[str, np.ndarray], module: str, step: int,
                              m: float, n: int, p: list) -> Optional[TensorResult]:
    """A running variance after step K > 1, whose batch statistics at the later steps differ by
    the float32 rounding of the earlier steps' parameters: the port's biased update predicted
    from the float64 reference's running variances (``ref/stepK/buffer/...``, unbiased, as the
    original's) must be within NOISE_FACTOR x the original's own distance from the reference
    (``compare_to_reference``'s rule); None where there is no reference or it does not hold."""
    refs = [original.get(f"ref/step{k}/buffer/{module}.running_var") for k in range(1, step + 1)]
    if step < 2 or any(r is None or r.shape != p[0].shape for r in refs):
        return None
    r = [p[0]] + [x.astype(np.float64) for x in refs]
    q = r[0]
    for k in range(1, step + 1):
        q = (1 - m) * q + (r[k] - (1 - m) * r[k - 1]) * (n - 1) / n  # biased, from the reference's statistics
    scale = float(np.abs(r[step]).max())
    err_port = float(np.abs(p[step] - q).max())
    err_orig = float(np.abs(original[f"step{step}/buffer/{module}.running_var"].astype(np.float64) - r[step]).max())
    if scale == 0.0 or not np.isfinite(err_port) or err_port > NOISE_FACTOR * err_orig + NOISE_FLOOR * scale:
        return None
    return TensorResult(plain.key, plain.phase, plain.name, plain.step, plain.shape, plain.dtype, plain.max_abs,
                        plain.max_rel, True,
                        f"the port updates running_var with the biased batch variance (n={n} values per channel, "
                        f"momentum {m:.3g}), and its batch statistics carry the float32 rounding of the earlier "
                        f"steps: {err_port / scale:.2g} of the largest value from the biased update of a float64 "
                        f"run of the original, which is {err_orig / scale:.2g} from that run itself")


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
        n = batchnorm_values_per_channel(key, original)
        if n is not None and n > 1:
            results.append(compare_running_var(key, original, port, n, tol))
        else:
            results.append(compare_tensor(key, original[key], port[key], tol))
        if not results[-1].ok and f"ref/{key}" in original:
            results[-1] = compare_to_reference(results[-1], original[key], port[key], original[f"ref/{key}"])
    return results


def first_failure(results: Iterable[TensorResult]) -> Optional[TensorResult]:
    for r in results:
        if not r.ok:
            return r
    return None
