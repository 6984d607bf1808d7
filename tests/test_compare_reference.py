"""compare_all with a float64 reference of the original (``ref/<key>``): float32 rounding that
the elementwise tolerance cannot tell from an error passes, a real difference still fails.

The tensors are real float32 computations (numpy), summed in different orders as two
backends' kernels do; the reference is the same computation in float64."""
from __future__ import annotations

import numpy as np
import pytest

from porter.verify.compare import Tolerance, compare_all


def _terms(seed: int, rows: int = 256, n: int = 4096) -> np.ndarray:
    """Rows of many terms whose sums partly cancel (a gradient summed over batch and pixels):
    the rounding error of a sum is far above the elementwise tolerance of the sums near 0."""
    return np.random.default_rng(seed).standard_normal((rows, n)) * 10.0


def _sums(t: np.ndarray, how: str) -> np.ndarray:
    t32 = t.astype(np.float32)
    if how == "sequential":
        out = np.zeros(t.shape[0], np.float32)
        for j in range(t.shape[1]):
            out += t32[:, j]
        return out
    if how == "reversed":
        out = np.zeros(t.shape[0], np.float32)
        for j in reversed(range(t.shape[1])):
            out += t32[:, j]
        return out
    if how == "blocked":  # partial sums of 8-wide blocks, as a vectorised kernel does
        return t32.reshape(t.shape[0], -1, 8).sum(axis=2, dtype=np.float32).sum(axis=1, dtype=np.float32)
    if how == "pairwise":
        return t32.sum(axis=1, dtype=np.float32)
    raise ValueError(how)


def _run(original: np.ndarray, port: np.ndarray, ref: np.ndarray | None, key: str = "grad/layer.weight"):
    a = {key: original}
    if ref is not None:
        a[f"ref/{key}"] = ref
    return compare_all([key], a, {key: port}, Tolerance())[0]


@pytest.mark.parametrize("orig_how,port_how", [("sequential", "pairwise"), ("pairwise", "blocked"),
                                               ("reversed", "sequential"), ("blocked", "reversed")])
def test_float32_rounding_passes_with_the_reference(orig_how, port_how):
    t = _terms(1)
    original, port, ref = _sums(t, orig_how), _sums(t, port_how), t.sum(axis=1)
    plain = _run(original, port, None)
    assert not plain.ok  # the elementwise tolerance calls this a divergence
    judged = _run(original, port, ref)
    assert judged.ok and judged.note.startswith("float32 rounding")
    assert (judged.max_abs, judged.max_rel) == (plain.max_abs, plain.max_rel)


@pytest.mark.parametrize("bug", ["one element", "scaled", "shifted", "sign"])
def test_a_real_difference_still_fails(bug):
    t = _terms(2)
    original, ref = _sums(t, "sequential"), t.sum(axis=1)
    port = _sums(t, "pairwise")
    scale = np.abs(ref).max()
    if bug == "one element":
        port[5] += 1e-3 * scale
    elif bug == "scaled":
        port = port * np.float32(1.01)
    elif bug == "shifted":
        port = port + np.float32(2e-4 * scale)
    else:
        port[:3] = -port[:3]
    assert not _run(original, port, ref).ok


def test_no_reference_or_a_passing_tensor_is_unchanged():
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    assert _run(x, x + np.float32(1e-7), x.astype(np.float64)).note == ""
    bad = _run(x, x + np.float32(1e-2), None)
    assert not bad.ok
    # the reference of another shape, or a non-finite port, is no excuse
    assert not _run(x, x + np.float32(1e-2), np.zeros(3)).ok
    y = x.copy()
    y[0] = np.nan
    assert not _run(x, y, x.astype(np.float64)).ok


def _bn_two_steps(port_noise: float, orig_noise: float, port_scale: float = 1.0):
    """running_var of a BatchNorm (8 channels, n = 2 x 2 x 2 = 8 values per channel, momentum
    0.1) over two steps: the float64 reference's batch variances v1, v2; the original's are
    those plus ``orig_noise`` at step 2 (float32 rounding carried from step 1's parameters), the
    port's plus ``port_noise``, updated with the biased variance (torch_xla), times
    ``port_scale`` at step 2 (a real difference)."""
    rng = np.random.default_rng(3)
    n, m = 8, 0.1
    x = rng.standard_normal((2, 8, 2, 2))
    v1 = x.transpose(1, 0, 2, 3).reshape(8, -1).var(axis=1)
    v2 = v1 * rng.uniform(0.8, 1.2, 8)
    init = np.ones(8)
    unbiased = n / (n - 1)
    ref1 = (1 - m) * init + m * v1 * unbiased
    ref2 = (1 - m) * ref1 + m * v2 * unbiased
    o1, o2 = ref1, (1 - m) * ref1 + m * (v2 + orig_noise * rng.standard_normal(8)) * unbiased
    p1 = (1 - m) * init + m * v1
    p2 = ((1 - m) * p1 + m * (v2 + port_noise * rng.standard_normal(8))) * port_scale
    k1, k2 = "step1/buffer/bn.running_var", "step2/buffer/bn.running_var"
    original = {"init/bn.running_var": init.astype(np.float32), "layer/bn": x.astype(np.float32),
                k1: o1.astype(np.float32), k2: o2.astype(np.float32), f"ref/{k1}": ref1, f"ref/{k2}": ref2}
    port = {"layer/bn": x.astype(np.float32), k1: p1.astype(np.float32), k2: p2.astype(np.float32)}
    return compare_all(["layer/bn", k1, k2], original, port, Tolerance())


def test_later_steps_running_var_biased_and_rounded_passes_with_the_reference():
    layer, step1, step2 = _bn_two_steps(port_noise=3e-3, orig_noise=1e-3)
    assert layer.ok and step1.ok and step2.ok, step2
    assert "biased batch variance" in step2.note and "float64 run" in step2.note


@pytest.mark.parametrize("port_noise,orig_noise,port_scale", [
    (3e-2, 1e-4, 1.0),  # the port's statistics 300x further from float64 than the original's
    (1e-3, 1e-3, 1.05),  # a running variance 5% off
])
def test_later_steps_running_var_real_difference_still_fails(port_noise, orig_noise, port_scale):
    _, step1, step2 = _bn_two_steps(port_noise, orig_noise, port_scale)
    assert step1.ok and not step2.ok and step2.where == "buffer bn.running_var at step 2"
