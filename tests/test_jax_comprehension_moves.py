"""A batch's tensors moved to the device one by one in a comprehension (`x, y = (t.to(device)
for t in batch)`, a list comprehension, `.cuda()`), in a trainer's step method or a script's loop:
a JAX port hands the jitted step NumPy arrays (before, the `.to()` went and torch tensors reached
the jitted step: a TypeError before the first step, no finding)."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))
HEAD = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(48, 8), torch.randint(0, 3, (48,))), batch_size=16)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    """)
STEP = "    opt.zero_grad()\n    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    opt.step()\n"
SPELLINGS = {
    "generator in a loop": "for batch in loader:\n    x, y = (t.to(device) for t in batch)\n" + STEP,
    "list in a loop": "for batch in loader:\n    x, y = [t.cuda() for t in batch]\n" + STEP,
    "generator in a trainer's method": (
        "class Trainer:\n    def __init__(self, model, opt):\n        self.model = model\n        self.opt = opt\n\n"
        "    def step(self, batch):\n        x, y = (t.to(device, non_blocking=True) for t in batch)\n"
        "        self.opt.zero_grad()\n        loss = F.cross_entropy(self.model(x), y)\n        loss.backward()\n"
        "        self.opt.step()\n        return loss\n\n    def fit(self, epochs):\n        for epoch in range(epochs):\n"
        "            for batch in loader:\n                loss = self.step(batch)\n            print(loss.item())\n\n\n"
        "Trainer(model, opt).fit(2)\n"),
    # the method called on an instance from module code: the loop hands it the whole batch
    "generator in a method called on an instance": (
        "class Trainer:\n    def __init__(self, model, opt):\n        self.model = model\n        self.opt = opt\n\n"
        "    def step(self, batch):\n        x, y = [t.to(device) for t in batch]\n"
        "        self.opt.zero_grad()\n        loss = F.cross_entropy(self.model(x), y)\n        loss.backward()\n"
        "        self.opt.step()\n        return loss\n\n\ntrainer = Trainer(model, opt)\n"
        "for epoch in range(2):\n    for batch in loader:\n        loss = trainer.step(batch)\n    print(loss.item())\n"),
}


def _port(name: str) -> str:
    return engine.fix(HEAD + SPELLINGS[name], JAX, "train.py").source


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_moved_elements_become_numpy_arrays(name):
    port = _port(name)
    assert "np.asarray(t) for t in batch" in port, port
    assert ".to(device" not in port and ".cuda()" not in port and "@nnx.jit" in port, port
    assert "batch = batch.numpy()" not in port, port  # the loop hands a list: taken apart in the method


@pytest.mark.jax
@pytest.mark.slow
def test_the_trainers_port_matches_its_original_in_verify(tmp_path):
    name = "generator in a trainer's method"
    report = verify_json(tmp_path, HEAD + SPELLINGS[name], _port(name), 4)
    assert report["status"] == "passed", (report["summary"], report["notes"])
