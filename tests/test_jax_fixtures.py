"""The torch -> JAX port of every fixture under fixtures/jax/: byte-for-byte expected output,
idempotence, the original runs, and (slow) the port runs under JAX and matches the original.

The comparison (fixtures/jax/harness.py; fixtures/jax/README.md explains it): the original
runs on the CPU for 10 optimizer steps and exports its model's initial state dict at the first
backward pass; the port runs under JAX with that state dict converted by its own
``load_torch_state_dict`` just before its ``nnx.Optimizer`` is built. Both scripts get the
same arguments (port.toml ``run``: dropout 0) and generate the same data from the same seed,
with loaders shuffled by their own seeded generators. Then: the train step was compiled once
over the 10 steps (jit cache size 1), and the losses of the first 5 steps agree within 1e-4
relative.
"""
import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

from porter import engine, registry
from porter.fixtures import fixtures

from lanes import every_lane, fixture_slice

FIXTURES = fixtures("jax")
IDS = [f.name for f in FIXTURES]
HARNESS = Path(__file__).resolve().parents[1] / "fixtures" / "jax" / "harness.py"
FINAL = re.compile(r"^Final (?P<name>[^:]+): (?P<value>\S+)$")
STEPS = 10  # steps run (compile count)
COMPARED = 5  # steps whose losses are compared

# Ports that do not run yet, for what the rules leave to a person (each port's `# porter: manual`
# lines say the same); strict, so a rule that closes the gap makes these tests say so. Every
# fixture's port runs now.
PORT_GAPS: dict[str, str] = {}


def _gap(fx, gaps=PORT_GAPS):
    return pytest.param(fx, id=fx.name, marks=pytest.mark.xfail(reason=gaps[fx.name], strict=True)) \
        if fx.name in gaps else pytest.param(fx, id=fx.name)


RUNNING = [_gap(fx) for fx in FIXTURES]
# model-level verification (porter verify --model): what keeps a port that runs from verifying
MODEL_GAPS: dict[str, str] = {**PORT_GAPS}


def test_the_jax_fixtures_are_there():
    assert {"mlp", "mnist_cnn", "resnet18", "lstm_lm", "transformer_encoder", "vae", "toplevel_bilstm", "gan"} <= set(IDS), IDS


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_port_is_byte_identical_to_expected(fx):
    assert fx.target == "jax"
    assert fx.expected.is_file(), f"run `python -m porter.fixtures` and review {fx.expected}"
    assert fx.port() == fx.expected.read_text(encoding="utf-8"), f"port of {fx.name} changed: review, then `python -m porter.fixtures`"


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_port_is_idempotent_and_parses(fx):
    text = fx.expected.read_text(encoding="utf-8")
    cst.parse_module(text)
    compile(text, str(fx.expected), "exec")
    options = engine.Options(registry.select("jax"), unsafe_fixes=fx.unsafe)
    again = engine.fix(text, options)
    assert not again.changed, "porting the port again changed it"


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_port_has_a_jitted_train_step(fx):
    """The training loop became a module-level @nnx.jit train step (JX301)."""
    tree = ast.parse(fx.expected.read_text(encoding="utf-8"))
    steps = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("train_step")]
    assert steps, "no module-level train_step"
    for fn in steps:
        assert any("jit" in ast.unparse(d) for d in fn.decorator_list), fn.name
        assert "value_and_grad" in ast.unparse(fn) and ".update(" in ast.unparse(fn)
    assert ".backward(" not in fx.expected.read_text(encoding="utf-8")


@pytest.mark.slow
def test_cli_port_equals_expected(tmp_path):
    """The user's command, on one fixture: `porter migrate --to jax --out` writes the expected port."""
    fx = next(f for f in FIXTURES if f.name == "mnist_cnn")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "porter", "migrate", str(fx.original), "--to", "jax",
                           *fx.migrate, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (out / "train.py").read_text(encoding="utf-8") == fx.expected.read_text(encoding="utf-8")


def _settings(fx) -> dict:
    """port.toml keys this test reads beyond porter.fixtures.Fixture (zero_noise, model_class)."""
    return tomllib.loads((fx.folder / "port.toml").read_text(encoding="utf-8"))


def _classes(path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)}


def _model_class(fx) -> str:
    """The class (or factory function: `resnet18(...)`) that port.toml's model expression calls
    (port.toml's `model_class` for a fixture with no model-level check)."""
    if not fx.model:
        return _settings(fx)["model_class"]
    expr = ast.parse(fx.model, mode="eval").body
    func = expr.func if isinstance(expr, ast.Call) else expr
    return func.attr if isinstance(func, ast.Attribute) else func.id


@pytest.mark.slow
@pytest.mark.parametrize("fx", fixture_slice(FIXTURES, 2), ids=lambda fx: fx.name)
def test_original_runs(fx, tmp_path):
    """The original trains one epoch on the CPU (its CUDA path falls back) and ends with its
    `Final <metric>: <value>` line."""
    proc = subprocess.run([sys.executable, str(fx.original), *fx.run], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=_env(CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = FINAL.match(last)
    assert m and np.isfinite(float(m.group("value"))), last


@pytest.mark.slow
# every third fixture per run of the suite (resnet18, the costliest epoch, in the every-fixture lane);
# every one is compared step by step below
@pytest.mark.parametrize("fx", fixture_slice(RUNNING, 3, offset=1))
def test_port_runs_to_the_end(fx, tmp_path):
    """The port, run as the user runs it (under JAX, CPU here), trains its epoch, evaluates
    (the jitted eval step, the sums on the device), saves its checkpoint and prints its
    `Final <metric>: <value>` line."""
    proc = subprocess.run([sys.executable, str(fx.expected), *fx.run, "--save-model"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=_env())
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "Error" in line]
        pytest.fail(f"the port failed: {errors[-1] if errors else ''}\n{proc.stderr[-4000:]}", pytrace=False)
    last = proc.stdout.strip().splitlines()[-1]
    m = FINAL.match(last)
    assert m and np.isfinite(float(m.group("value"))), last
    assert any(tmp_path.rglob("*.p*")), "no checkpoint written"


def _env(**extra):
    import os

    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", **extra)
    return env


def _harness(*args, cwd):
    proc = subprocess.run([sys.executable, str(HARNESS), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=_env())
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "Error" in line]
        pytest.fail(f"harness {args[0]} side failed: {errors[-1] if errors else ''}\n{proc.stderr[-6000:]}", pytrace=False)
    return proc


# every fixture but resnet18 per run of the suite (its 10 JAX steps on the CPU: 40-120 s on 2 cores;
# its port is verified at model level below in every run), all of them with PORTER_TEST_EVERY_FIXTURE=1
@pytest.mark.slow
@pytest.mark.parametrize("fx", [p for p in RUNNING if p.id != "resnet18"]
                         + every_lane([p for p in RUNNING if p.id == "resnet18"]))
def test_port_runs_under_jax_compiles_once_and_matches(fx, tmp_path):
    torch_out, jax_out = tmp_path / "torch.npz", tmp_path / "jax.json"
    noise = ["--zero-noise"] if _settings(fx).get("zero_noise") else []
    _harness("torch", str(fx.original), "--model-class", _model_class(fx), "--steps", str(STEPS),
             "--out", str(torch_out), *noise, "--", *fx.run, cwd=tmp_path)
    _harness("jax", str(fx.expected), "--weights", str(torch_out), "--steps", str(STEPS),
             "--out", str(jax_out), *noise, "--", *fx.run, cwd=tmp_path)
    with np.load(torch_out) as data:
        original = data["losses"]
    port = json.loads(jax_out.read_text())
    assert port["loaded"], "the torch weights did not reach the port's model"
    if set(_model_class(fx).split(",")) <= _classes(fx.original):  # a GAN: one model per optimizer
        assert port["loaded"] == _model_class(fx).split(","), port["loaded"]
    assert len(port["losses"]) == STEPS
    assert port["cache_sizes"] and all(n == 1 for n in port["cache_sizes"].values()), \
        f"train step compiled more than once over {STEPS} steps: {port['cache_sizes']}"
    k = fx.optimizer_steps_per_iteration
    got = np.array(port["losses"][:COMPARED * k])
    want = original[:COMPARED * k]
    assert len(want) == len(got)
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-12)
    assert rel.max() < 1e-4, f"losses differ: original {want.tolist()} port {got.tolist()} (relative {rel.tolist()})"


@pytest.mark.slow
@pytest.mark.parametrize("fx", fixture_slice([_gap(f, MODEL_GAPS) for f in FIXTURES if f.model], 2))
def test_model_level_verification(fx, tmp_path):
    """`porter verify ORIGINAL PORT --model EXPR --input SPEC`: every layer's output, the
    gradients and a few optimizer steps agree (the JAX side of the verifier). The suite runs
    every other fixture (the script-level test above compares every one's steps)."""
    args = [sys.executable, "-m", "porter", "verify", str(fx.original), str(fx.expected), "--model", fx.model]
    for spec in fx.inputs:
        args += ["--input", spec]
    proc = subprocess.run([*args, "--format", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=_env())
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    assert report is not None and report.get("passed"), (proc.stdout[-4000:], proc.stderr[-3000:])
    tensors = report["tensors"]
    forward = max(t["max_abs"] for t in tensors if t["phase"] in ("layer", "output"))
    gradients = max(t["max_abs"] for t in tensors if t["phase"] == "gradient")
    losses = max(t["max_rel"] for t in tensors if t["phase"] == "loss")
    assert forward <= 1e-4 and gradients <= 1e-4 and losses <= 1e-4, (forward, gradients, losses)
    steps = report["health"]["steps"]
    # one compilation for all the steps (jit cache size 1); no host callback in the step (each
    # would be a device-to-host transfer in every step)
    assert [s["compiles"] for s in steps] == [1] + [0] * (len(steps) - 1), steps
    assert all(s["transfers"] == 0 for s in steps) and not report["health"]["problems"], report["health"]
