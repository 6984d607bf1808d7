"""A torch lr_scheduler that the script steps where porter cannot count the optimizer's
updates between two of its steps (a function given the scheduler under another name, a step
under a phase's condition): the port keeps the rate in the optimizer's optax.inject_hyperparams
state and the scheduler becomes the port's host-side TorchLRScheduler, which sets the rate at
each `step()` as torch's does. One batch per epoch, so the rate changes between the compared
optimizer steps: the losses equal the original's (`porter verify --script`)."""
import json
import os
import subprocess
import sys

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

_HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(6, 5), torch.randint(0, 3, (6,))), batch_size=6)
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
'''

SCRIPTS = {
    "StepLR in the training function": _HEAD + '''

def fit(net, data, opt, sched, epochs):
    for epoch in range(epochs):
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            print(epoch, loss.item(), sched.get_last_lr()[0])
        sched.step()


optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
fit(model, loader, optimizer, scheduler, 4)
''',
    "MultiStepLR under a phase": _HEAD + '''

def run(net, data, opt, sched):
    for epoch in range(4):
        for phase in ["train", "val"]:
            for x, y in data:
                out = net(x)
                loss = F.cross_entropy(out, y)
                if phase == "train":
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            if phase == "train":
                sched.step()


optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1, 2], gamma=0.1)
run(model, loader, optimizer, scheduler)
''',
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_scheduler_becomes_the_host_side_one(name):
    result = engine.fix(SCRIPTS[name], JAX, "train.py")
    out = result.source
    assert "scheduler = TorchLRScheduler(optimizer, optax." in out and "optax.inject_hyperparams(" in out, out
    assert "class TorchLRScheduler" in out and "torch.optim.lr_scheduler." not in out, out
    assert not [f for f in result.remaining if f.code in ("JX201", "JX202", "JX301", "JX901")], \
        [(f.code, f.message) for f in result.remaining]


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_rates_follow_torch_and_the_losses_match(name, tmp_path):
    original = tmp_path / "original.py"
    original.write_text(SCRIPTS[name])
    ported = tmp_path / "ported.py"
    ported.write_text(engine.fix(SCRIPTS[name], JAX, "train.py").source)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original), str(ported),
                           "--steps", "4", "--format", "json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert report["status"] in ("passed", "over-budget") and "losses" in report["summary"], report["summary"]
    assert len(report["steps"]) == 4 and all(s["ok"] for s in report["steps"]), report["summary"]
