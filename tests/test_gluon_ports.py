"""MXNet/Gluon originals (fixtures/mxnet/*) ported to torch_xla and to JAX in one engine run
(the Gluon front end's rules, then the target's):

- every port is byte-identical to fixtures/mxnet/<name>/expected_<target>.py, parses, and a
  second migrate changes nothing;
- the script-side rules compute what MXNet computes: tests/data/gluon/script_steps.py (per
  sample losses, trainer.step(n) on a ragged batch, clip_global_norm, SGD with momentum and
  wd, Adam with beta1 and wd, load/save_parameters) runs in real MXNet 1.9.1 and, ported, on
  torch (eager) and on torch_xla: the same losses and final weights;
- `porter verify` of each fixture (the original in real MXNet, the port on XLA, port.toml's
  model and inputs, 5 steps): forward within 1e-4 (max abs), the 5 step losses within 1e-4
  (relative), the XLA health budgets of the verifier;
- the torch_xla ports run their port.toml `run` arguments under porter's tracer: no
  compilation after the warm-up iterations, device-to-host transfers only in iterations that
  log.

- the JAX ports: see also tests/test_gluon_jax_scripts.py (script level) and
  tests/test_gluon_jax_models.py (lazy layers, Gluon's initialize in JAX form).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

import mxnethelp
from lanes import fixture_slice
from porter import engine, registry
from porter.fixtures import GLUON_TARGETS, gluon_fixtures

REPO = Path(__file__).resolve().parents[1]
CASES = [(t, fx) for t in GLUON_TARGETS for fx in gluon_fixtures(t)]
IDS = [f"{t}-{fx.name}" for t, fx in CASES]
FORWARD_ATOL = 1e-4
LOSS_RTOL = 1e-4


def test_there_are_five_gluon_fixtures_for_each_target():
    for target in GLUON_TARGETS:
        assert {fx.name for fx in gluon_fixtures(target)} >= {"mlp", "cnn_bn_dropout", "lstm_lm", "dcgan", "resnet"}


def _port_case(target, fx):
    # a JAX port of a whole Gluon script takes 7-10 s (the JAX rules' passes), a torch_xla one 1-3 s
    return pytest.param(target, fx, marks=[pytest.mark.slow] if target == "jax" else [], id=f"{target}-{fx.name}")


@pytest.mark.parametrize("target,fx", [_port_case(t, fx) for t, fx in CASES])
def test_port_is_byte_identical_to_expected(target, fx):
    assert fx.expected.is_file(), f"run `python -m porter.fixtures` and review {fx.expected}"
    assert fx.port() == fx.expected.read_text(encoding="utf-8"), \
        f"the {target} port of {fx.name} changed: review, then `python -m porter.fixtures`"


@pytest.mark.parametrize("target,fx", CASES, ids=IDS)
def test_port_parses_and_is_idempotent(target, fx):
    text = fx.expected.read_text(encoding="utf-8")
    cst.parse_module(text)
    compile(text, str(fx.expected), "exec")
    again = engine.fix(text, engine.Options(registry.select(target), unsafe_fixes=fx.unsafe))
    assert not again.changed


def test_cli_port_equals_expected(tmp_path):
    """What the user types: `porter migrate train.py --to torch-xla --unsafe-fixes --out DIR`."""
    fx = next(f for f in gluon_fixtures("torch-xla") if f.name == "mlp")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "porter", "migrate", str(fx.original), "--to", "torch-xla",
                           *fx.migrate, "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "train.py").read_text(encoding="utf-8") == fx.expected.read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------
# The script-side semantics, end to end: original in MXNet, port on torch and torch_xla
# --------------------------------------------------------------------------------------
SCRIPT = mxnethelp.SCRIPT_STEPS


@pytest.mark.slow
@pytest.mark.parametrize("target", ["torch", "torch-xla"])
def test_script_port_takes_the_original_steps(script_steps_mxnet, target, tmp_path):
    """The port (GL301-GL304, GL401, GL403, then the target's rules) from the same initial
    weights (read by the emitted converter) takes the same 6 steps: losses and final weights
    within 1e-5 (float32 kernels of two frameworks). Each (optimizer, loss) run is a process of
    its own; on torch-xla two of the four cover both optimizers and both losses."""
    folder, runs = script_steps_mxnet
    options = engine.Options(registry.select(target), unsafe_fixes=False)
    port = engine.fix(SCRIPT.read_text(encoding="utf-8"), options, str(SCRIPT)).source
    assert "mxnet" not in port
    script = tmp_path / "port.py"
    script.write_text(port, encoding="utf-8")
    read = _emitted_reader()
    import torch

    configs = sorted(runs)
    if target == "torch-xla":
        # on XLA each optimizer and each loss once, (adam, sigmoid) and (sgd, softmax): the torch
        # case takes all four with the same port less the XLA rules
        configs = fixture_slice(configs, 3)
        assert {o for o, _ in configs} == {o for o, _ in runs} and {l for _, l in configs} == {l for _, l in runs}
    for optimizer, loss in configs:
        losses, mx_params = runs[optimizer, loss]
        out = tmp_path / f"port_{optimizer}_{loss}.pt"
        proc = subprocess.run([sys.executable, str(script), str(folder / f"init_{loss}.params"), str(out), optimizer, loss],
                              capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        port_losses = [float(v) for v in proc.stdout.split()]
        np.testing.assert_allclose(port_losses, losses, rtol=1e-5, err_msg=f"{optimizer} {loss}")
        expected = read(str(mx_params))
        state = torch.load(out, map_location="cpu")
        assert sorted(state) == sorted(expected)
        for key in expected:
            np.testing.assert_allclose(state[key].cpu().numpy(), expected[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{optimizer} {loss} {key}")


def _emitted_reader():
    import math
    import re
    import struct

    import torch

    from porter.codemods.gluon import _script

    code = cst.Module(_script.render("gluon_weights.py.j2")).code
    namespace = {"np": np, "re": re, "struct": struct, "math": math, "torch": torch}
    exec(compile(code, "gluon_weights", "exec"), namespace)
    return namespace["read_gluon_parameters"]


# --------------------------------------------------------------------------------------
# The emitted Gluon weight converter in each port: a file MXNet wrote, loaded into the port's
# model with the port's load_gluon_parameters (the numpy reader; JAX: chained into the port's
# own load_torch_state_dict)
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gluon_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gluon_files")
    proc = subprocess.run([mxnethelp.mxnet_python(), str(REPO / "tests" / "data" / "gluon" / "mxnet_reference.py"), str(folder)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("target,fx", fixture_slice(CASES, 2), ids=fixture_slice(IDS, 2))
def test_port_loads_the_originals_parameter_file(gluon_files, target, fx, tmp_path):
    """In a fresh process: import the port (its __main__ block does not run), build port.toml's
    model, load the file MXNet's save_parameters wrote with the port's own code, and read back
    every array under its torch name."""
    code = f"""
import sys, importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("port", {str(fx.expected)!r})
port = importlib.util.module_from_spec(spec)
spec.loader.exec_module(port)
expected = dict(np.load({str(gluon_files / (fx.name + '.port.npz'))!r}))
path = {str(gluon_files / (fx.name + '.port.params'))!r}
if {target!r} == "jax":
    import flax.nnx as nnx
    model = eval({fx.model!r}[:-1] + ", rngs=nnx.Rngs(0))", {{**vars(port), "nnx": nnx}})
    port.load_gluon_parameters(model, path)
    got = port.torch_state_dict(model)
else:
    model = eval({fx.model!r}, vars(port))
    port.load_gluon_parameters(model, path)
    got = {{k: v.detach().cpu().numpy() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}}
assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=0, atol=0, err_msg=key)
print("ok", len(expected))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


# --------------------------------------------------------------------------------------
# Model-level verification against the original in MXNet
# --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target,fx", fixture_slice(CASES, 2, offset=1), ids=fixture_slice(IDS, 2, offset=1))
def test_verify_against_mxnet(target, fx):
    """Every other (target, fixture) pair; the others' weights are checked against MXNet's file
    above (PORTER_TEST_EVERY_FIXTURE=1: all of them, both ways)."""
    os.environ.setdefault("PORTER_MXNET_PYTHON", mxnethelp.mxnet_python())
    conf = tomllib.loads((fx.folder / "port.toml").read_text(encoding="utf-8"))
    tolerance = ["--atol", str(conf["verify_atol"])] if "verify_atol" in conf else []
    args = [sys.executable, "-m", "porter", "verify", str(fx.original), str(fx.expected), "--model", fx.model,
            *[a for spec in fx.inputs for a in ("--input", spec)], "--steps", "5", *tolerance, "--format", "json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    forward = [t["max_abs"] for t in report["tensors"] if t["phase"] in ("layer", "output")]
    losses = [t for t in report["tensors"] if t["phase"] == "loss"]
    assert forward and max(forward) <= FORWARD_ATOL, max(forward)
    assert sorted(t["step"] for t in losses) == [1, 2, 3, 4, 5]
    assert max(t["max_rel"] for t in losses) <= LOSS_RTOL
    health = report["health"]
    assert health is not None and health["within_budget"], health
    if target == "jax":  # the jitted step compiles once; the step calls back to the host never
        assert health["compiles_total"] == 1 and health["max_transfers_per_step"] == 0, health
        assert not health["problems"], health["problems"]


# --------------------------------------------------------------------------------------
# XLA health of the torch_xla ports at script level
# --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.xla
# the torch_xla ports test_port_loads_the_originals_parameter_file does not run in this run of the
# suite (all of them with PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("fx", fixture_slice(gluon_fixtures("torch-xla"), 2, offset=1), ids=lambda fx: fx.name)
def test_torch_xla_port_runs_healthy(fx, tmp_path):
    """port.toml's `run` arguments (one epoch, a few iterations) under the tracer the
    torch_xla fixtures use: the iterations after the warm-up compile nothing, and only
    iterations that log read values from the device."""
    from porter.verify.trace import trace_script

    run = trace_script(fx.expected, fx.run, cwd=tmp_path, timeout=900, env={"PJRT_DEVICE": "CPU"})
    assert run.get("status") == "ok", (run.get("exception"), run.get("output"))
    k = fx.optimizer_steps_per_iteration
    assert run["num_steps"] >= (fx.warmup_iterations + 2) * k, run["num_steps"]
    compiles = run["compiles_per_step"][:-1]  # the last record also holds the evaluation and the end
    transfers = run["transfers_per_step"][:-1]
    assert sum(compiles[fx.warmup_iterations * k:]) == 0, f"compilations after warm-up: {compiles}"
    # the Gluon fixtures count iterations from 1 (enumerate(..., start=1)) and log when i % interval == 0
    quiet = [s for s, t in enumerate(transfers) if t and (s // k + 1) % fx.log_interval != 0]
    assert not quiet, f"device-to-host transfers in steps that do not log: {quiet} (per step: {transfers})"
