"""Helper functions of a script (`def accuracy(output, target)`) whose parameters are tensors
because every call gives them tensors, including calls in the script's top-level loop: torch's
methods that other types share (`.float()`, `.eq()`, `.sum()`, `.max(1)`) are ported inside them,
and the port runs and matches its original."""
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


    def accuracy(output, target):
        return (output.argmax(1) == target).float().mean()


    def correct(logits, labels):
        _, predicted = logits.max(1)
        return predicted.eq(labels).sum()


    def smooth_l1(pred, goal):
        diff = (pred - goal).abs()
        return torch.where(diff < 1, 0.5 * diff ** 2, diff - 0.5).float().mean()


    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(8, 4)
        y = torch.randint(0, 3, (8,))
        out = model(x)
        loss = F.cross_entropy(out, y) + 0.1 * smooth_l1(out, F.one_hot(y, 3).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, loss.item(), accuracy(out, y).item(), correct(out, y).item())
''')


@pytest.fixture(scope="module")
def port() -> str:
    return engine.fix(SCRIPT, JAX).source


def test_the_helpers_methods_are_ported(port):
    helpers = port.split("def accuracy", 1)[1].split("torch.manual_seed", 1)[0]
    assert ".float()" not in helpers and ".eq(" not in helpers and ".max(1)" not in helpers, helpers
    assert "astype(jnp.float32)" in helpers, helpers


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_port_runs_like_its_original(port, tmp_path):
    report = verify_json(tmp_path, SCRIPT, port, 4)
    assert report["passed"], (report["summary"], report["notes"])
