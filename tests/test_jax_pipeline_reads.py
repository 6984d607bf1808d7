"""Tensors of the torch input pipeline read as they are outside it (no `.to(device)`: a CPU
script evaluating on its whole training tensors, `model(X)`, `model(X[:8])`, `model(X).argmax(1)
== y`, `F.mse_loss(model(X), Y)`): the JAX port hands JAX NumPy arrays where the port computes with
its model or with JAX (a torch tensor there was a TypeError or a silent False, no finding), and
keeps them torch in the pipeline."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    X = torch.randn(48, 4)
    y = torch.randint(0, 3, (48,))
    Y = torch.randn(48, 3)
    loader = DataLoader(TensorDataset(X, y, Y), batch_size=8)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb, Yb in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb) + F.mse_loss(model(xb), Yb)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(X).argmax(1) == y).float().mean().item()
        first = model(X[:8]).sum().item()
        mse = F.mse_loss(model(X), Y).item()
        gap = (model(X) - Y).abs().max().item()
    print(acc, first, mse, gap)
''')


@pytest.fixture(scope="module")
def port() -> str:
    return engine.fix(SCRIPT, JAX).source


def test_reads_outside_the_pipeline_become_arrays(port):
    evaluation = port.split("model.eval()", 1)[1]
    for read in ("model(np.asarray(X))", "== np.asarray(y)", "model(np.asarray(X[:8]))", "np.asarray(Y)"):
        assert read in evaluation, (read, evaluation)
    assert "TensorDataset(X, y, Y)" in port  # the pipeline keeps its tensors
    assert engine.fix(port, JAX).source == port


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_port_evaluates_like_its_original(port, tmp_path):
    report = verify_json(tmp_path, SCRIPT, port, 8)  # (6 steps: the script ends, its evaluation runs)
    assert report["passed"], (report["summary"], report["notes"])
