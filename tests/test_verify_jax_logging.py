"""A JAX port's health at script level: the step functions' recompilations are their jit caches'
growth; the eager operations of the code that logs or evaluates (a loss formatted for a log
line, an evaluation at the end of an epoch) compile the first time each runs. With every step
function holding one program, compilations in steps that log are said in a note and are not over
budget (before, a port whose epoch ended inside the compared steps, evaluating there, was
"over-budget" though its train step compiled once); compilations in a step that logs nothing,
a step function compiled twice, or a torch_xla port's graphs still count."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json
from porter.verify.model import Budgets
from porter.verify.script import _port_health


def _record(compiles, logged, jit=None):
    steps = [{"optimizer": "train_step" if jit is not None else 0, "printed": p, "xla_delta": {"compiles": c}}
             for c, p in zip(compiles, logged)]
    record = {"steps": steps, "ended_by": "stop", "xla": {"fallback_ops": []}}
    if jit is not None:
        record["jax"] = {"jit_cache_sizes": {"train_step": jit}, "host_callbacks": {}}
    return record


def _health(record, jax_port=True):
    notes: list[str] = []
    return _port_health(record, Budgets(), jax_port, notes), notes


def test_compilations_of_a_step_that_logs_are_the_logging_codes_first_run():
    health, notes = _health(_record([40, 0, 0, 10, 0], [True, False, False, True, False], jit=1))
    assert health["within_budget"], health["problems"]
    assert any("step 4: 10" in n for n in notes), notes


@pytest.mark.parametrize("compiles, logged, jit, jax_port", [
    ([40, 0, 3, 0, 0], [True, False, False, True, False], 1, True),  # a step that logs nothing compiled
    ([40, 0, 0, 10, 0], [True, False, False, True, False], 2, True),  # the step function compiled again
    ([40, 0, 0, 10, 0], [True, False, False, True, False], None, False),  # a torch_xla port's graph
])
def test_other_compilations_after_the_warm_up_are_over_budget(compiles, logged, jit, jax_port):
    health, notes = _health(_record(compiles, logged, jit), jax_port)
    assert not health["within_budget"] and not notes, (health["problems"], notes)


SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = (x.sum(1) > 0).long()
    train = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=16)
    test = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=16)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in train:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        correct = 0
        with torch.no_grad():
            for xb, yb in test:
                correct += (model(xb).argmax(1) == yb).sum().item()
        print(f"epoch {epoch} loss {loss.item():.4f} accuracy {correct / 16:.3f}")
    """)


@pytest.mark.jax
@pytest.mark.slow
def test_an_epoch_end_evaluation_in_the_compared_steps_passes(tmp_path):
    report = verify_json(tmp_path, SCRIPT, engine.fix(SCRIPT, engine.Options(tuple(registry.rules_for("jax"))),
                                                      "train.py").source, 5)
    assert report["status"] == "passed", (report["summary"], report["notes"])
    assert report["health"]["jit_cache_sizes"] == {"train_step": 1}
