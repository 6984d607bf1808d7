"""XLA health budgets at script level, through `porter verify --script`: ports whose losses match
the original but that make the device wait (a `.item()` every step) or recompile (a ragged
last batch) fail with exit 1 and the step named; the same ports fixed pass.

The original (tests/data/verify/scripts/train.py) has 5 full batches and a ragged one per
epoch and logs on batches 0 and 5 of each epoch (--log-interval 5)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "data" / "verify" / "scripts"

pytestmark = [pytest.mark.xla, pytest.mark.slow]


def verify(port, steps, *script_args):
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(SCRIPTS / "train.py"),
                           str(SCRIPTS / port), "--steps", str(steps), "--format", "json", "--", *script_args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_item_every_step_fails_the_transfer_budget():
    # --drop-last: 5 batches an epoch, so step 6 is the first batch of epoch 2 and logs
    code, report = verify("train_xla_item.py", 6, "--drop-last")
    assert code == 1 and report["status"] == "over-budget", report["summary"]
    assert all(s["ok"] for s in report["steps"])  # the losses match: only the health is wrong
    health = report["health"]
    assert health["problems"] == ["device-to-host transfers in step(s) 2, 3, 4, 5 that log nothing (budget 0 per step)"]
    assert [s["transfers"] > 0 for s in health["steps"][:5]] == [True] * 5
    assert [s["logged"] for s in health["steps"]] == [True, False, False, False, False, True]
    assert health["compiles_after_warmup"] == 0


def test_ragged_last_batch_fails_the_compile_budget():
    # without --drop-last, step 6 is the ragged batch: a new shape, a new graph
    code, report = verify("train_xla_ragged.py", 8)
    assert code == 1 and report["status"] == "over-budget", report["summary"]
    assert all(s["ok"] for s in report["steps"])
    health = report["health"]
    assert health["problems"] == ["1 compilation(s) after the 2 warm-up steps (at step 6; budget 0)"]
    assert [s["compiles"] for s in health["steps"][:7]] == [1, 1, 0, 0, 0, 1, 0]


def test_the_last_compared_step_is_judged_too():
    # --steps 6 stops the port at its 6th step, the ragged batch: that step is a step like the
    # others (not the script's end, whose record would also hold what ran after it)
    code, report = verify("train_xla_ragged.py", 6)
    assert code == 1 and report["status"] == "over-budget", report["summary"]
    assert report["health"]["problems"] == ["1 compilation(s) after the 2 warm-up steps (at step 6; budget 0)"]


@pytest.mark.parametrize("port", ["train_xla_fixed.py", "train_xla_closure.py"])
def test_fixed_ports_pass(port):
    # drop_last=True in the port, --drop-last for the original: the same batches on both sides
    code, report = verify(port, 8, "--drop-last")
    assert code == 0 and report["passed"], report["summary"]
    health = report["health"]
    assert health["within_budget"] and health["compiles_after_warmup"] == 0 and health["max_transfers_per_step"] == 0
    assert len(report["steps"]) == 8


def test_a_port_that_stays_on_the_cpu_is_over_budget():
    # the original as its own "port": it never imports torch_xla and trains on the CPU; its
    # losses match, but no XLA computation ran
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(SCRIPTS / "train.py"),
                           str(SCRIPTS / "train.py"), "--steps", "3", "--format", "json"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["status"] == "over-budget", report["summary"]
    assert all(s["ok"] for s in report["steps"])
    assert report["health"]["problems"] == ["no XLA computation ran in the optimizer steps: the port trained on the CPU"]
    assert report["health"]["executions_total"] == 0
