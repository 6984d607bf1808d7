"""Data a JAX port's torch input pipeline reads, made in several statements: `y = x @ w + noise`
with `w = torch.randn(5, 1)`, a chain of tensors made from one another, the same in a function
that returns the dataset. Every statement the dataset's tensors are made from stays torch
(before, `w` became a JAX array and `x @ w` mixed a torch tensor with it: a TypeError before the
first step, no finding)."""
from __future__ import annotations


import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))
HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\ntorch.manual_seed(0)\n"
TRAIN = """
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(epoch, loss.item())
"""
# spelling -> (the data code, the statements that stay torch)
SPELLINGS = {
    "weights drawn apart": ("x = torch.randn(64, 5)\nw = torch.randn(5, 1)\ny = x @ w + 0.1 * torch.randn(64, 1)\n"
                            "loader = DataLoader(TensorDataset(x, y), batch_size=16)\n",
                            ["w = torch.randn(5, 1)", "y = x @ w + 0.1 * torch.randn(64, 1)"]),
    "a chain of tensors": ("base = torch.arange(64.0)\nx = base[:, None].repeat(1, 5) / 64\n"
                           "y = (x.sum(1, keepdim=True) > 2.5).float()\n"
                           "loader = DataLoader(TensorDataset(x, y), batch_size=16)\n",
                           ["base = torch.arange(64.0)", "x = base[:, None].repeat(1, 5) / 64"]),
    "made in a function": ("def make_data(n):\n    x = torch.randn(n, 5)\n    w = torch.linspace(0, 1, 5)[:, None]\n"
                           "    y = torch.sin(x @ w)\n    return TensorDataset(x, y)\n\n\n"
                           "loader = DataLoader(make_data(64), batch_size=16)\n",
                           ["    w = torch.linspace(0, 1, 5)[:, None]", "    y = torch.sin(x @ w)"]),
}


def _port(name: str) -> str:
    return engine.fix(HEAD + SPELLINGS[name][0] + TRAIN, JAX, "train.py").source


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_statements_the_data_is_made_from_stay_torch(name):
    port = _port(name)
    for line in SPELLINGS[name][1]:
        assert line in port, (line, port)
    assert "nnx.Optimizer(model" in port and "@nnx.jit" in port, port


@pytest.mark.jax
@pytest.mark.slow
def test_the_port_matches_its_original_in_verify(tmp_path):
    name = "weights drawn apart"
    report = verify_json(tmp_path, HEAD + SPELLINGS[name][0] + TRAIN, _port(name), 5)
    assert report["status"] == "passed", (report["summary"], report["notes"])
