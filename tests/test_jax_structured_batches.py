"""Batches that are dicts or tuples of tensors, handed whole to the training step (the dict a
Dataset's __getitem__ returns, read as batch["x"] in the step; a tuple read as batch[0]): the JAX
port converts every tensor in them (`jax.tree.map(np.asarray, batch)`; `.numpy()` of a dict was
an AttributeError with no finding), and trains as its original."""
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
    from torch.utils.data import DataLoader, Dataset, TensorDataset


    class Pairs(Dataset):
        def __init__(self):
            self.x, self.y = torch.randn(48, 4), torch.randint(0, 2, (48,))

        def __len__(self):
            return 48

        def __getitem__(self, i):
            return {"x": self.x[i], "y": self.y[i]}


    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
''')

LOOPS = {
    "dict read in the loop": '''
        loader = DataLoader(Pairs(), batch_size=8)
        for batch in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(batch["x"]), batch["y"])
            loss.backward()
            opt.step()
        print(loss.item())
    ''',
    "dict read by a loss helper": '''
        def compute_loss(model, batch):
            return F.cross_entropy(model(batch["x"]), batch["y"])


        loader = DataLoader(Pairs(), batch_size=8)
        for batch in loader:
            loss = compute_loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(loss.item())
    ''',
    "tuple indexed": '''
        loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randint(0, 2, (48,))), batch_size=8)
        for batch in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(batch[0]), batch[1])
            loss.backward()
            opt.step()
        print(loss.item())
    ''',
}


def script(name: str) -> str:
    return HEAD + textwrap.dedent(LOOPS[name])


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_the_batch_is_converted_whole(name):
    port = engine.fix(script(name), JAX).source
    assert "batch = jax.tree.map(np.asarray, batch)" in port, port
    assert "batch.numpy()" not in port
    assert engine.fix(port, JAX).source == port


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_port_trains_like_its_original(tmp_path):
    original = script("dict read in the loop")
    report = verify_json(tmp_path, original, engine.fix(original, JAX).source, 5)
    assert report["passed"], (report["summary"], report["notes"])
