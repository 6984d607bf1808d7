"""A trainer class that is given its optimizer and scheduler, built outside it
(`Trainer(model, loader, optimizer, scheduler)`, kept as `self.optimizer` / `self.sched`),
and steps both in its loop (`self.sched.step()` after `self.optimizer.step()`, or after
`scaler.step(self.optimizer)`): the JAX port folds the schedule into the optimizer (one update
per scheduler step), drops `self.sched.step()`, reads `get_last_lr()` from the optimizer's
update count, and removes the trainer's `self.device = next(model.parameters()).device` once
nothing reads it. Spellings: positional and keyword arguments, a LambdaLR and a per-batch
StepLR, a GradScaler step. The port runs and its losses are the original's."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from lanes import fixture_slice
from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

TRAINER = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader, optimizer, sched):
        self.model = model
        self.loader = loader
        self.optimizer = optimizer
        self.sched = sched
        self.device = next(model.parameters()).device
        self.scaler = torch.cuda.amp.GradScaler(enabled=False)

    def epoch(self, e):
        for i, (xb, yb) in enumerate(self.loader):
            xb, yb = xb.to(self.device), yb.to(self.device)
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(xb), yb)
            STEP
            self.sched.step()
            if i % 2 == 0:
                print(e, i, loss.item(), self.sched.get_last_lr()[0])


def main():
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = SCHEDULER
    trainer = CALL
    for e in range(2):
        trainer.epoch(e)


if __name__ == "__main__":
    main()
'''

_PLAIN = "loss.backward()\n            self.optimizer.step()"
_SCALER = "self.scaler.scale(loss).backward()\n            self.scaler.step(self.optimizer)\n            self.scaler.update()"
_LAMBDA = "torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.5 * s))"
_STEP = "torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)"


def _script(step: str, scheduler: str, call: str) -> str:
    return TRAINER.replace("STEP", step).replace("SCHEDULER", scheduler).replace("CALL", call)


SPELLINGS = {
    "positional lambda": _script(_PLAIN, _LAMBDA, "Trainer(model, loader, optimizer, scheduler)"),
    "keywords steplr": _script(_PLAIN, _STEP, "Trainer(model, loader, sched=scheduler, optimizer=optimizer)"),
    "grad scaler lambda": _script(_SCALER, _LAMBDA, "Trainer(model, loader, optimizer, scheduler)"),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_trainer_steps_the_folded_schedule(name):
    result = engine.fix(SPELLINGS[name], JAX)
    port = result.source
    assert [(f.code, f.message) for f in result.remaining] == []
    assert "self.sched.step()" not in port and "torch.optim" not in port, port
    assert "float(self.sched(self.optimizer.step[...]))" in port, port
    assert "self.device" not in port, port
    assert engine.fix(port, JAX).source == port


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("name", fixture_slice(["grad scaler lambda", "positional lambda"], 2))  # one per run of the suite
def test_the_trainer_port_matches_its_original(name, tmp_path):
    original = textwrap.dedent(SPELLINGS[name])
    report = verify_json(tmp_path, original, engine.fix(original, JAX).source, 6)
    assert report["status"] in ("passed", "over-budget"), (report["summary"], report["notes"])
    assert len(report["steps"]) == 6  # the rate changes at every step on both sides
