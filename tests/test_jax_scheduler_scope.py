"""A per-epoch scheduler whose steps per epoch come from a loader the optimizer's own scope does
not see (a trainer built in __init__, the loader given to fit(self, loader)): the schedule is not
folded into the optimizer as `step // len(loader)` (a NameError at the first step, no finding) but
stepped by the script as torch steps it; where the loader is in scope (self.loader, a function's
loader) the fold stays. Each port runs and matches its original."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))

TRAINER = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(INIT_PARAMS):
        self.model = model
        INIT_LOADER
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)

    def fit(self, loader):
        for epoch in range(3):
            for xb, yb in LOOP_LOADER:
                self.opt.zero_grad()
                loss = F.cross_entropy(self.model(xb), yb)
                loss.backward()
                self.opt.step()
            self.sched.step()
            print(epoch, loss.item())


def main():
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8)
    TRAINER_CALL


if __name__ == "__main__":
    main()
'''

SPELLINGS = {
    "loader of fit": TRAINER.replace("INIT_PARAMS", "self, model").replace("INIT_LOADER\n        ", "")
    .replace("LOOP_LOADER", "loader").replace("TRAINER_CALL", "Trainer(nn.Linear(4, 2)).fit(loader)"),
    "self.loader": TRAINER.replace("INIT_PARAMS", "self, model, loader").replace("INIT_LOADER", "self.loader = loader")
    .replace("LOOP_LOADER", "self.loader").replace("TRAINER_CALL", "Trainer(nn.Linear(4, 2), loader).fit(loader)"),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_schedule_reads_only_what_is_in_scope(name):
    port = engine.fix(SPELLINGS[name], JAX).source
    init = port.split("def __init__", 1)[1].split("def fit", 1)[0]
    if name == "loader of fit":
        assert "len(loader)" not in port and "TorchLRScheduler(self.opt" in init, init
    else:
        assert "step // len(self.loader)" in init, init
    assert engine.fix(port, JAX).source == port


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_trainer_port_matches_its_original(tmp_path):
    original = textwrap.dedent(SPELLINGS["loader of fit"])
    report = verify_json(tmp_path, original, engine.fix(original, JAX).source, 12)
    assert report["status"] in ("passed", "over-budget"), (report["summary"], report["notes"])
    assert len(report["steps"]) == 12  # three epochs: the rate halves twice on both sides
