"""JAX ports of train/val loops that train in one phase only: the loop over a phase's loader
steps the optimizer under a condition it does not change (`with torch.set_grad_enabled(phase ==
'train'):` ... `if phase == 'train': loss.backward(); optimizer.step()`, or a `training` flag).
JX321 splits it into a training loop (whose step JX301 jits) and an evaluation loop; the
function gets the model and optimizer under its own parameter names; the best weights kept with
`copy.deepcopy(model.state_dict())` go through the port's torch_state_dict. The default port
trains in JAX and its losses equal the original's (`porter verify --script`)."""
import json
import os
import subprocess
import sys

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

_MODEL = '''
import copy
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


torch.manual_seed(0)
loaders = {p: DataLoader(TensorDataset(torch.randn(24, 8), torch.randint(0, 3, (24,))), batch_size=6)
           for p in ["train", "val"]}
'''

PHASES = _MODEL + '''

def train_model(model, criterion, optimizer, num_epochs=2):
    best = copy.deepcopy(model.state_dict())
    best_loss = float("inf")
    for epoch in range(num_epochs):
        for phase in ["train", "val"]:
            model.train() if phase == "train" else model.eval()
            running = 0.0
            for inputs, labels in loaders[phase]:
                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
                running += loss.item() * inputs.size(0)
            print(phase, running / 24)
            if phase == "val" and running < best_loss:
                best_loss = running
                best = copy.deepcopy(model.state_dict())
    model.load_state_dict(best)
    return model


net = Net()
criterion = nn.CrossEntropyLoss()
optimizer_ft = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
net = train_model(net, criterion, optimizer_ft)
'''

FLAG = _MODEL + '''

def run_epoch(net, opt, loader, training):
    total = 0.0
    for x, y in loader:
        out = net(x)
        loss = nn.functional.cross_entropy(out, y)
        if training:
            opt.zero_grad()
            loss.backward()
            opt.step()
        else:
            total += loss.item()
    return total


model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(2):
    run_epoch(model, optimizer, loaders["train"], True)
    print("val", run_epoch(model, optimizer, loaders["val"], False))
'''


@pytest.mark.parametrize("source", [PHASES, FLAG], ids=["set_grad_enabled", "flag"])
def test_the_loop_splits_and_its_training_step_is_jitted(source):
    result = engine.fix(source, JAX, "train.py")
    out = result.source
    assert "@nnx.jit" in out and "def train_step(" in out, out
    assert ".backward()" not in out and "zero_grad" not in out and "deepcopy(model.state_dict())" not in out, out
    assert not [f for f in result.remaining if f.code in ("JX301", "JX901")], [(f.code, f.message) for f in result.remaining]
    again = engine.fix(out, JAX, "train.py")
    assert not again.changed  # a second run changes nothing


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("source", [PHASES, FLAG], ids=["set_grad_enabled", "flag"])
def test_the_default_port_trains_in_jax_and_matches(source, tmp_path):
    original = tmp_path / "original.py"
    original.write_text(source)
    ported = tmp_path / "ported.py"
    ported.write_text(engine.fix(source, JAX, "train.py").source)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original), str(ported),
                           "--steps", "3", "--format", "json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    assert len(report["steps"]) == 3
