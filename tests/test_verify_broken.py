"""Deliberately broken ports are caught by `porter verify`, and the report names the culprit:
the layer whose output first differs (model level) or the first step whose loss differs
(script level). Each broken port differs from a port that passes by one realistic mistake
(tests/data/verify/broken/); the passing ports are checked too, so that a failure here is the
mistake's and not the setup's."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porter.verify.compare import Tolerance, compare_all

from lanes import fixture_slice

BROKEN = Path(__file__).parent / "data" / "verify" / "broken"

# model level: BatchNorm sees 32*8*8 = 2048 values per channel, so torch_xla's running_var
# update (biased batch variance; PyTorch's is unbiased) stays within float32 tolerance
MODEL = ("--model", "ConvNet()", "--input", "float32[32,3,8,8]", "--steps", "3")
# script level: the evaluation after step 3 builds its graph once (in step 3), a compilation the
# budget allows. The losses are compared in float64, where the port done right agrees to 1e-15:
# 1e-9 instead of the default 1e-5 lets the small first effect of a changed weight decay show.
SCRIPT = ("--steps", "5", "--max-compiles", "1", "--rtol", "1e-9", "--atol", "1e-9")


def verify(*args):
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--format", "json", *map(str, args)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.xla
@pytest.mark.slow
def test_model_level_port_done_right_passes():
    code, report = verify(BROKEN / "convnet.py", BROKEN / "convnet_xla.py", *MODEL)
    assert code == 0 and report["passed"], report["summary"]
    assert report["health"]["within_budget"]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("port,key,where", [
    # a Linear whose forward uses its weight transposed (fc2 is square, so it still loads)
    ("convnet_xla_transposed.py", "layer/fc2", "output of fc2"),
    # BatchNorm2d(eps=1e-3) instead of the default 1e-5
    ("convnet_xla_bn_eps.py", "layer/bn", "output of bn"),
])
def test_model_level_mistake_is_named(port, key, where):
    code, report = verify(BROKEN / "convnet.py", BROKEN / port, *MODEL)
    assert code == 1 and report["status"] == "diverged", report["summary"]
    first = report["first_divergence"]
    assert (first["key"], first["where"]) == (key, where)
    assert report["summary"].startswith(f"diverged first at {where}: ")
    # every layer before it matched
    keys = [t["key"] for t in report["tensors"]]
    assert all(t["ok"] for t in report["tensors"][:keys.index(key)])


@pytest.mark.xla
@pytest.mark.slow
def test_script_level_port_done_right_passes():
    code, report = verify("--script", BROKEN / "train.py", BROKEN / "train_xla.py", *SCRIPT)
    assert code == 0 and report["passed"], report["summary"]
    assert [s["ok"] for s in report["steps"]] == [True] * 5


@pytest.mark.xla
@pytest.mark.slow
# two of the three per run of the suite, all with PORTER_TEST_EVERY_FIXTURE=1
@pytest.mark.parametrize("port,step", fixture_slice([
    # evaluate() forgets model.train(): the evaluation after step 3 leaves dropout off from step 4 on
    ("train_xla_no_train_mode.py", 4),
    # cross_entropy(..., reduction="sum"): the very first loss differs
    ("train_xla_loss_sum.py", 1),
    # weight_decay=1e-2 instead of 1e-4: step 1's loss is computed before any update, so step 2
    # (by 8e-6; at the default tolerance 1e-5 it shows at step 3, by 8e-4)
    ("train_xla_weight_decay.py", 2),
], 2))
def test_script_level_mistake_is_named_by_its_step(port, step):
    code, report = verify("--script", BROKEN / "train.py", BROKEN / port, *SCRIPT)
    assert code == 1 and report["status"] == "diverged", report["summary"]
    assert report["first_divergence"]["where"] == f"loss at step {step}"
    assert report["first_divergence"]["step"] == step
    assert [s["ok"] for s in report["steps"][:step]] == [True] * (step - 1) + [False]


def _bn_run(port_update):
    """A recorded BatchNorm layer ``bn`` that normalised 4 x 2 x 2 = 16 values per channel
    (4 channels), and its running_var after step 1: the original's from PyTorch's update
    (momentum 0.1, unbiased batch variance), the port's from ``port_update(var)`` (var: the
    biased batch variance)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4, 2, 2)) * np.array([0.5, 1.0, 2.0, 3.0])[None, :, None, None]
    var = x.transpose(1, 0, 2, 3).reshape(4, -1).var(axis=1)
    original = {"init/bn.running_var": np.ones(4, np.float32), "layer/bn": x.astype(np.float32),
                "step1/buffer/bn.running_var": (0.9 + 0.1 * var * 16 / 15).astype(np.float32)}
    port = {"layer/bn": x.astype(np.float32), "step1/buffer/bn.running_var": port_update(var).astype(np.float32)}
    return compare_all(["layer/bn", "step1/buffer/bn.running_var"], original, port, Tolerance())


def test_torch_xla_biased_running_var_is_accepted_and_said():
    # torch_xla 2.9 updates running_var with the biased batch variance (measured on the CPU)
    layer, buffer = _bn_run(lambda var: 0.9 + 0.1 * var)
    assert layer.ok and buffer.ok and buffer.max_rel > 1e-3
    assert "biased batch variance" in buffer.note and "n=16" in buffer.note and "momentum 0.1" in buffer.note


@pytest.mark.parametrize("wrong", [
    lambda var: 0.9 + 0.1 * var * 16 / 15 * 1.01,  # larger than the original's
    lambda var: 0.9 + 0.1 * var * 14 / 15,  # smaller, but not by torch_xla's 1/n
    lambda var: 0.8 + 0.2 * var,  # another momentum (even where running_mean cannot show it)
], ids=["larger", "smaller", "momentum"])
def test_other_running_var_differences_still_fail(wrong):
    layer, buffer = _bn_run(wrong)
    assert layer.ok and not buffer.ok and buffer.note == ""
    assert buffer.where == "buffer bn.running_var at step 1"


@pytest.mark.xla
@pytest.mark.slow
def test_a_port_that_raises_mid_run_is_named_by_its_step():
    """The same forgotten model.train() with BatchNorm instead of dropout: torch_xla 2.9 cannot run
    BatchNorm's backward pass in eval mode, so the port raises in step 4. The report says where,
    and that the steps before it matched."""
    code, report = verify("--script", BROKEN / "train_bn.py", BROKEN / "train_bn_xla_no_train_mode.py", *SCRIPT)
    assert code == 2 and report["status"] == "side-failed"
    assert report["summary"].startswith("the port could not run: RuntimeError: The size of mean should be compatible")
    assert report["summary"].endswith("(in step 4, after 3 optimizer steps; the losses of steps 1-3 match)")
    assert [s["ok"] for s in report["steps"]] == [True, True, True]
    assert report["first_divergence"] is None


def test_text_report_shows_the_losses_per_step():
    import io

    from rich.console import Console

    from porter.verify import render
    from porter.verify.model import Report, SideReport

    side = SideReport("original", "train.py", "torch", True, 1.0)
    steps = [{"step": 1, "original": [1.25], "port": [1.25], "diff": 0.0, "ok": True},
             {"step": 2, "original": [1.5], "port": [1.75], "diff": 0.25, "ok": False}]
    report = Report("script", False, "diverged", "diverged first at loss at step 2: |original - port| = 0.25",
                    side, side, steps=steps)
    console = Console(file=io.StringIO(), width=120)
    render.print_text(report, console)
    text = console.file.getvalue()
    assert "losses per optimizer step (2 compared)" in text
    row = next(line for line in text.splitlines() if "DIFF" in line).split()
    assert row == ["DIFF", "2", "1.5", "1.75", "0.25"]
