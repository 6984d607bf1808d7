"""The float64 reference of the original side (porter.verify.side_torch._reference) holds every
optimizer step, not only the first forward and backward: each step's loss, parameters and
floating-point buffers, under the keys the float32 run records them, for SGD and Adam. Eager
torch only (the fast lane)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from porter.verify import side_torch  # noqa: E402
from porter.verify.compare import Tolerance, compare_all  # noqa: E402


def _net():
    torch.manual_seed(0)
    # no bias before the BatchNorm: its gradient is rounding alone, which Adam would make a full step
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 3))


def _float32_steps(model, x, w, steps, optimizer, lr):
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)
    out = {}
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = (model(x) * w).sum() / w.numel()
        loss.backward()
        opt.step()
        out[f"step{step}/loss"] = loss.detach().numpy().copy()
        for n, p in model.named_parameters():
            out[f"step{step}/param/{n}"] = p.detach().numpy().copy()
        for n, b in model.named_buffers():
            if b.is_floating_point():
                out[f"step{step}/buffer/{n}"] = b.detach().numpy().copy()
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_step_has_float64_values_near_the_float32_run(optimizer):
    model = _net().train()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    ref = side_torch._reference(copy.deepcopy(model), [x], [w], 3, optimizer, 0.05)
    run = _float32_steps(model, torch.from_numpy(x), torch.from_numpy(w), 3, optimizer, 0.05)
    assert {k[len("ref/"):] for k in ref if "/step" in k or k.startswith("ref/step")} == set(run)
    assert all(ref[k].dtype == np.float64 for k in ref)
    assert {"ref/output/0", "ref/grad/0.weight", "ref/layer/1"} <= set(ref)  # the first step's, as before
    for key, value in run.items():
        np.testing.assert_allclose(value, ref[f"ref/{key}"], rtol=1e-4, atol=1e-5, err_msg=key)
    # the parameters moved: the steps are really taken in the reference
    assert not np.allclose(ref["ref/step3/param/0.weight"], ref["ref/step1/param/0.weight"])


def test_a_step_value_off_by_more_than_rounding_still_fails():
    model = _net().train()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    ref = side_torch._reference(copy.deepcopy(model), [x], [w], 2, "sgd", 0.05)
    run = _float32_steps(model, torch.from_numpy(x), torch.from_numpy(w), 2, "sgd", 0.05)
    key = "step2/param/5.weight"
    original = {key: run[key], f"ref/{key}": ref[f"ref/{key}"]}
    noisy = run[key] + np.float32(1e-6) * np.sign(run[key])  # rounding-sized: elementwise tolerance passes
    assert compare_all([key], original, {key: noisy}, Tolerance())[0].ok
    wrong = run[key] * np.float32(1.01)  # a real difference: 1% of every weight
    result = compare_all([key], original, {key: wrong}, Tolerance())[0]
    assert not result.ok and result.where == "parameter 5.weight at step 2"
