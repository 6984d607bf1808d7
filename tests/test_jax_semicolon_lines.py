"""Statements joined by `;` in a JAX port (JX323): the loop rules read a training step and the
input pipeline's tensors statement by statement, so a line of torch statements is split first;
the port of a script written that way trains as its original. Lines of plain Python stay."""
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
    X = torch.randn(48, 4); y = torch.randint(0, 3, (48,))  # the data
    loader = DataLoader(TensorDataset(X, y), batch_size=8)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9); lr = 0.1
    for epoch in range(2):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(); loss.backward(); opt.step()
        noise = torch.randn(8, 4); print(epoch, loss.item())
''')


@pytest.fixture(scope="module")
def port() -> str:
    return engine.fix(SCRIPT, JAX).source


def test_torch_lines_are_split_and_plain_ones_stay(port):
    assert "X = torch.randn(48, 4)\ny = torch.randint(0, 3, (48,))  # the data\n" in port, port
    assert ";" not in port.split("lr = 0.1")[-1], port  # the step, the draw and its print
    assert "zero_grad" not in port and ".backward()" not in port and "train_step(" in port, port
    assert engine.fix("import torch\na = 1; b = 2\n", JAX).source == "import torch\na = 1; b = 2\n"
    assert engine.fix(port, JAX).source == port


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_port_trains_like_its_original(port, tmp_path):
    report = verify_json(tmp_path, SCRIPT, port, 6)
    assert report["passed"], (report["summary"], report["notes"])
