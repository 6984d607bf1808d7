"""The MXNet/Gluon originals in fixtures/mxnet/ are sound training scripts.

Each runs in the MXNet venv (scripts/bootstrap-mxnet; built here when missing) with the short
arguments of its port.toml, and must: take exactly the expected number of optimizer steps,
print a log line every ``log_interval`` iterations with finite values, say it finished, and
write its parameters file where ``--save-params`` points by default (the working directory).
That the steps trained is checked against a run with ``--lr 0`` and the same seed (the same
initialization and data; ``--epochs 0`` cannot save a net whose shapes Gluon infers at the first
forward): both save the same parameter names and shapes, and every trainable weight differs. A static check holds every script to the conventions of fixtures/mxnet/README.md.
"""
from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from porter.fixtures import fixtures

from lanes import fixture_slice

FIXTURES = {fx.name: fx for fx in fixtures("mxnet")}
# fixture -> optimizer-step iterations its port.toml run takes, and the names its log lines report
EXPECTED = {
    "mlp": (6, {"loss", "accuracy"}),
    "cnn_bn_dropout": (6, {"loss", "avg_loss", "accuracy"}),
    "lstm_lm": (6, {"loss", "ppl", "lr"}),
    "dcgan": (6, {"lossD", "lossG", "d_acc"}),
    "resnet": (6, {"loss", "accuracy", "lr"}),
}
LOG = re.compile(r"^\[epoch (?P<epoch>\d+) batch (?P<batch>\d+)\] step (?P<step>\d+) (?P<rest>.*)$")
VALUE = re.compile(r"(\w+)=(\S+)")
FINISHED = re.compile(r"^finished (\d+) steps in [\d.]+ s; parameters saved to (\S+)$")
FLAGS = {"--epochs", "--batch-size", "--lr", "--seed", "--log-interval", "--num-samples", "--save-params"}


def _run(python: str, args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    # one OpenMP thread: the runs are small, and the test machines are shared
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


_LOAD = """
import json, sys
import mxnet as mx
import numpy as np
out = {}
for name, arr in mx.nd.load(sys.argv[1]).items():
    a = arr.asnumpy()
    out[name] = {"shape": list(a.shape), "finite": bool(np.isfinite(a).all()), "values": a.ravel().tolist()}
print(json.dumps(out))
"""


def _load_params(python: str, path: Path, cwd: Path) -> dict:
    res = _run(python, ["-c", _LOAD, str(path)], cwd)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_every_fixture_is_listed():
    assert set(FIXTURES) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_conventions(name):
    fx = FIXTURES[name]
    source = fx.original.read_text(encoding="utf-8")
    tree = ast.parse(source)
    flags = {a.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", "") == "add_argument"
             for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    assert FLAGS <= flags, FLAGS - flags
    for needle in ("import mxnet as mx", "mx.gpu() if mx.context.num_gpus() else mx.cpu()",
                   "mx.random.seed(args.seed)", "np.random.seed(args.seed)", "gluon.data.ArrayDataset(",
                   "gluon.data.DataLoader(", "with autograd.record():", ".backward()", "step(",
                   ".asscalar()", "save_parameters(args.save_params", 'if __name__ == "__main__":'):
        assert needle in source, needle
    assert (fx.folder / "README.md").is_file()
    assert not fx.expected.exists()  # ports are made by porter's rules, not kept here
    assert fx.model and fx.inputs and fx.run
    assert fx.log_interval == 2


@pytest.mark.slow
# half of them per run of the suite (all with PORTER_TEST_EVERY_FIXTURE=1; every original also
# trains in MXNet as the reference of its ports' verification: tests/test_gluon_ports.py)
@pytest.mark.parametrize("name", fixture_slice(sorted(EXPECTED), 2))
def test_original_trains(name, mxnet_python, tmp_path):
    fx = FIXTURES[name]
    steps, names = EXPECTED[name]
    res = _run(mxnet_python, [str(fx.original), *fx.run], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()

    logs = [m for m in map(LOG.match, lines) if m]
    assert [int(m["step"]) for m in logs] == list(range(fx.log_interval, steps + 1, fx.log_interval))
    assert [int(m["batch"]) for m in logs] == [int(m["step"]) for m in logs]  # one epoch
    for m in logs:
        values = dict(VALUE.findall(m["rest"]))
        assert set(values) == names, m.group(0)
        for key, text in values.items():
            value = float(text)
            assert math.isfinite(value), m.group(0)
            if key.endswith("acc") or key == "accuracy":
                assert 0.0 <= value <= 1.0

    finished = FINISHED.match(lines[-1])
    assert finished, lines[-1]
    assert int(finished.group(1)) == steps
    saved = tmp_path / finished.group(2)
    assert saved.is_file() and saved.name == f"{name}.params"
    trained = _load_params(mxnet_python, saved, tmp_path)

    # the same seed and steps at learning rate 0: the initial weights, saved under the same names
    init_dir = tmp_path / "init"
    init_dir.mkdir()
    res0 = _run(mxnet_python, [str(fx.original), *fx.run, "--lr", "0"], init_dir)
    assert res0.returncode == 0, res0.stderr[-3000:]
    assert FINISHED.match(res0.stdout.splitlines()[-1]).group(1) == str(steps)
    initial = _load_params(mxnet_python, init_dir / saved.name, init_dir)
    assert set(trained) == set(initial) and trained
    moved = []
    for key, t in trained.items():
        assert t["shape"] == initial[key]["shape"], key
        assert t["finite"], key
        if t["values"] != initial[key]["values"]:
            moved.append(key)
    weights = {k for k in trained if k.endswith(("weight", "gamma", "beta", "bias"))}
    assert weights <= set(moved), f"not updated by {steps} steps: {sorted(weights - set(moved))}"
    if name == "dcgan":  # the discriminator is saved beside the generator
        assert (tmp_path / "dcgan-netD.params").is_file()
