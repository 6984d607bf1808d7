"""`porter verify --script` with an MXNet/Gluon original (porter.verify.script.verify_mxnet_script,
porter.verify.trace_mxnet): the original runs in real MXNet 1.9.1 (the MXNet venv), its port
on real torch_xla or JAX, K optimizer steps each, losses compared step by step.

- the MXNet side records each step's loss as the loss whose gradient the step applies: a
  per-sample loss stepped with ``trainer.step(batch_size)`` as its mean (what the script logs
  with ``loss.mean().asscalar()``); the per-device losses of ``split_and_load`` over two
  contexts, one backward each or ``autograd.backward`` over the list, sum to the one-context
  loss; it stops after K steps and writes the initial weights by torch name; MXNet's random
  draws during training (dcgan's noise) are named, the initializers' are not;
- ports porter writes (tests/data/gluon_verify/split_and_load.py: ``split_and_load``, a
  ``DataLoader`` over an ``ArrayDataset``, BatchNorm, Adam) match their original on both
  targets (torch_xla: default mode; JAX: ``--unsafe-fixes``), starting from the original's
  weights;
- Gluon's single-process data parallelism (tests/data/gluon_verify/data_parallel.py: a
  context list of two CPU contexts, ``split_and_load(..., ctx_list=ctx, even_split=False)``,
  a backward per shard, ``trainer.step(batch_size)``, NAG named by a variable): the torch_xla
  port (default mode) keeps one device and the whole batch, and its steps match the original's,
  whose batches MXNet really splits in two;
- a wrong port (the MLP fixture's torch_xla port with twice the learning rate) matches at step 1
  (same weights, same data) and is reported diverged from step 2 on, exit status 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porter.verify.script import ScriptRequest, verify_script
from porter.verify.trace_mxnet import trace_mxnet_script

pytestmark = [pytest.mark.mxnet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "gluon_verify"
MLP = REPO / "fixtures" / "mxnet" / "mlp"
MLP_ARGS = ("--epochs", "1", "--batch-size", "16", "--num-samples", "88", "--num-val-samples", "32",
            "--log-interval", "2", "--dropout", "0")


@pytest.fixture(scope="module", autouse=True)
def _mxnet_venv(mxnet_python):
    previous = os.environ.get("PORTER_MXNET_PYTHON")
    os.environ["PORTER_MXNET_PYTHON"] = mxnet_python
    yield
    if previous is None:
        os.environ.pop("PORTER_MXNET_PYTHON", None)
    else:
        os.environ["PORTER_MXNET_PYTHON"] = previous


# --- the MXNet side alone ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi_device(tmp_path_factory):
    """The two-context script traced three ways: one context, two with a backward per loss,
    two with autograd.backward over the list."""
    runs = {}
    for name, args in (("one", ["--devices", "1"]), ("two", ["--devices", "2"]),
                       ("together", ["--devices", "2", "--together"])):
        folder = tmp_path_factory.mktemp(f"multi-{name}")
        runs[name] = trace_mxnet_script(DATA / "multi_device.py", args, seed=0, max_steps=4,
                                        export_weights=folder / "weights", no_shuffle=True, timeout=300,
                                        cwd=folder)
        runs[name]["weights"] = folder / "weights"
    return runs


def test_mxnet_side_stops_after_k_steps_and_records_each_backward(multi_device):
    for name, run in multi_device.items():
        assert run["status"] == "ok", (name, run.get("exception"), run.get("output"))
        assert run["num_steps"] == 4
    assert all(len(step) == 1 for step in multi_device["one"]["losses"])
    assert all(len(step) == 2 for step in multi_device["two"]["losses"])  # one loss per context
    assert all(len(step) == 2 for step in multi_device["together"]["losses"])


def test_per_device_losses_sum_to_the_one_context_loss(multi_device):
    one = [sum(s) for s in multi_device["one"]["losses"]]
    for name in ("two", "together"):
        two = [sum(s) for s in multi_device[name]["losses"]]
        np.testing.assert_allclose(two, one, rtol=1e-5)
    # the steps train: the loss of the first step differs from the fourth's
    assert abs(one[0] - one[3]) > 1e-4


def test_trainer_step_batch_size_records_the_mean_loss(tmp_path):
    run = trace_mxnet_script(MLP / "train.py", MLP_ARGS, seed=0, max_steps=3, no_shuffle=True, timeout=300,
                             cwd=tmp_path)
    assert run["status"] == "ok", run.get("output")
    # the script logs loss.mean().asscalar() after its second step
    logged = float(run["output"].split("step 2 loss=")[1].split()[0])
    assert run["losses"][1][0] == pytest.approx(logged, abs=2e-6)
    assert run["steps"][1]["scale"] == pytest.approx(1 / 16)
    # Xavier's draws at the deferred initialization are not random numbers of the training
    assert run["random_calls"] == {} and run["random_augmentations"] == []


def test_random_numbers_of_the_training_are_named(tmp_path):
    """dcgan draws its noise with mx.nd.random.normal in every iteration: a port cannot draw
    the same numbers, and the record says so (the verify notes carry it)."""
    run = trace_mxnet_script(REPO / "fixtures" / "mxnet" / "dcgan" / "train.py",
                             ("--epochs", "1", "--batch-size", "16", "--num-samples", "48", "--nz", "16", "--ngf", "8",
                              "--ndf", "8"), seed=0, max_steps=2, no_shuffle=True, timeout=300, cwd=tmp_path)
    assert run["status"] == "ok", run.get("output")
    # trainerG is made first (index 0), trainerD second: an iteration steps netD, then netG
    assert run["num_steps"] == 2 and [s["optimizer"] for s in run["steps"]] == [1, 0]
    assert run["random_calls"].get("mx.nd.random.normal", 0) >= 1


def test_initial_weights_are_written_by_torch_name(multi_device):
    with np.load(multi_device["one"]["weights"] / "weights_0.npz") as data:
        shapes = {k: data[k].shape for k in data.files}
    assert shapes == {"0.weight": (16, 10), "0.bias": (16,), "1.weight": (4, 16), "1.bias": (4,)}
    meta = json.loads((multi_device["one"]["weights"] / "weights_0.json").read_text())
    assert meta["class"] == "HybridSequential"


# --- original against port ---------------------------------------------------------------------


def _port(script: Path, target: str, out: Path, *options: str) -> Path:
    proc = subprocess.run([sys.executable, "-m", "porter", "migrate", str(script), "--to", target, "--out", str(out),
                           *options],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return out / script.name


@pytest.fixture(scope="module")
def split_and_load_reports(tmp_path_factory):
    reports = {}
    # the torch_xla port in the default (safe) mode; the JAX one with --unsafe-fixes, as the Gluon
    # fixtures' JAX ports (the JAX forms of porter's Gluon helpers are unsafe fixes, JX015)
    for target, options in (("torch-xla", ()), ("jax", ("--unsafe-fixes",))):
        port = _port(DATA / "split_and_load.py", target, tmp_path_factory.mktemp(f"port-{target}"), *options)
        reports[target] = verify_script(ScriptRequest(DATA / "split_and_load.py", port, 4,
                                                      ("--epochs", "1", "--batch-size", "8"), timeout=600))
    return reports


@pytest.mark.xla
def test_split_and_load_torch_xla_port_matches_its_original(split_and_load_reports):
    report = split_and_load_reports["torch-xla"]
    assert report.status == "passed", (report.summary, report.notes, report.port and report.port.log[-3000:])
    assert len(report.steps) == 4
    assert report.settings["original_backend"] == "mxnet" and report.settings["dtype"] == "float32"
    assert any("weights loaded into the port's" in n for n in report.notes), report.notes
    assert report.health["executions_total"] > 0


@pytest.mark.jax
def test_split_and_load_jax_port_matches_its_original(split_and_load_reports):
    report = split_and_load_reports["jax"]
    assert report.status == "passed", (report.summary, report.notes, report.port and report.port.log[-3000:])
    assert len(report.steps) == 4
    assert any("weights loaded into the port's" in n for n in report.notes), report.notes


DATA_PARALLEL_ARGS = ("--epochs", "1", "--batch-size", "16", "--num-samples", "96", "--num-val-samples", "32",
                      "--log-interval", "2", "--num-devices", "2")


@pytest.fixture(scope="module")
def data_parallel_report(tmp_path_factory):
    port = _port(DATA / "data_parallel.py", "torch-xla", tmp_path_factory.mktemp("port-data-parallel"))
    text = port.read_text(encoding="utf-8")
    report = verify_script(ScriptRequest(DATA / "data_parallel.py", port, 4, DATA_PARALLEL_ARGS, timeout=600))
    return text, report


@pytest.mark.xla
def test_data_parallel_torch_xla_port_matches_its_split_original(data_parallel_report):
    text, report = data_parallel_report
    assert "split_and_load(" not in text and "import mxnet" not in text
    assert "[torch_xla.device()]" in text
    assert "(sum(l.sum() for l in loss) / batch_size).backward()" in text
    assert report.status == "passed", (report.summary, report.notes, report.port and report.port.log[-3000:])
    assert len(report.steps) == 4
    assert any("weights loaded into the port's" in n for n in report.notes), report.notes
    # the original took two backward passes a step (two contexts), compared by their sum
    assert any("several backward passes" in n for n in report.notes), report.notes


@pytest.mark.xla
def test_a_wrong_port_is_reported_diverged(tmp_path):
    text = (MLP / "expected_torch_xla.py").read_text(encoding="utf-8")
    wrong = text.replace("torch.optim.SGD(net.parameters(), lr=args.lr,", "torch.optim.SGD(net.parameters(), lr=2 * args.lr,")
    assert wrong != text
    port = tmp_path / "wrong_port.py"
    port.write_text(wrong, encoding="utf-8")
    report = verify_script(ScriptRequest(MLP / "train.py", port, 3, MLP_ARGS, timeout=600))
    assert report.status == "diverged", report.summary
    assert report.exit_code == 1
    assert report.steps[0]["ok"]  # the same initial weights and data: step 1's loss matches
    assert report.first_divergence["step"] == 2
    assert "diverged first at loss at step 2" in report.summary
