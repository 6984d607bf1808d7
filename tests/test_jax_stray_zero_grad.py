"""`zero_grad()` outside the training steps a JAX port rewrote (before the loop, before a
gradient-accumulation loop, after each epoch, in a reset helper): an nnx.Optimizer has no
gradients to zero, so the statement goes (JX324; it raised AttributeError, reported only as a
step not rewritten). The port of the accumulation spelling trains as its original."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))

HEAD = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randint(0, 2, (48,))), batch_size=8)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
''')

LOOPS = {
    "before the loop": '''
        opt.zero_grad()
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
        print(loss.item())
    ''',
    "before accumulation": '''
        opt.zero_grad()
        for i, (xb, yb) in enumerate(loader):
            loss = F.cross_entropy(model(xb), yb) / 2
            loss.backward()
            if (i + 1) % 2 == 0:
                opt.step()
                opt.zero_grad()
        print(loss.item())
    ''',
    "after each epoch, in a helper": '''
        def reset():
            model.zero_grad()


        for epoch in range(2):
            for xb, yb in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            opt.zero_grad()
            reset()
        print(loss.item())
    ''',
}


def script(name: str) -> str:
    return HEAD + textwrap.dedent(LOOPS[name])


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_no_zero_grad_is_left(name):
    result = engine.fix(script(name), JAX)
    assert "zero_grad" not in result.source, result.source
    assert not [f for f in result.remaining if f.code == "JX901" and "zero_grad" in f.message]
    assert engine.fix(result.source, JAX).source == result.source


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_accumulation_port_matches_its_original(tmp_path):
    original = script("before accumulation")
    report = verify_json(tmp_path, original, engine.fix(original, JAX).source, 3)
    assert report["passed"], (report["summary"], report["notes"])
