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
