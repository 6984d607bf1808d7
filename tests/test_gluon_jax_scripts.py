"""The JAX ports of the MXNet/Gluon fixtures (fixtures/mxnet/*) at script level: the Gluon
front end's rules and the JAX rules in one `porter migrate --to jax`, the port run as the user
runs it.

- the emitted helpers the script side adds: GluonAdam's optax form takes the steps of the
  torch GluonAdam (which tests/test_gluon_ports.py checks against MXNet), and the metrics'
  update() runs on JAX arrays without reading them (it traces under jax.jit);
- tests/data/gluon/script_steps.py (per-sample losses, trainer.step(n) on a ragged batch,
  clip_global_norm, SGD with momentum and wd or Adam with beta1 and wd, load_parameters of an
  MXNet file, a loss chosen by an `if` on the settings) ported to JAX takes MXNet's steps;
- every fixture's JAX port trains port.toml's `run` arguments to the end ("finished N steps")
  and saves a checkpoint that reads back; from the same initial weights, data order and noise
  as the PyTorch port (`--to torch`, the intermediate the torch_xla port is made from, which
  tests/test_gluon_ports.py verifies against MXNet) its first steps' losses agree within 1e-4
  (relative), each jitted train step compiles once, its lowered module has no host callback,
  and the training loop reads values on the host only in the iterations that log;
- against the MXNet original itself (all but dcgan, whose noise is MXNet's): from the
  original's initial weights and its data order, the JAX port prints the original's log lines.
"""
from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

import mxnethelp
from lanes import fixture_rest, fixture_slice
from porter import engine, registry
from porter.fixtures import gluon_fixtures

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "data" / "gluon" / "jax_harness.py"
SCRIPT = mxnethelp.SCRIPT_STEPS
FIXTURES = gluon_fixtures("jax")
COMPARED = 5  # iterations whose losses are compared (drop_last: 5 full batches of 16 in 88 samples)
RTOL = 1e-4


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _render(*templates: str, **values) -> str:
    from porter.codemods.gluon import _script

    return "".join(cst.Module(_script.render(t, **values)).code for t in templates)


# --------------------------------------------------------------------------------------
# The emitted helpers
# --------------------------------------------------------------------------------------
def test_gluon_adam_optax_takes_the_torch_gluon_adam_steps():
    """gluon_adam (the JAX port's GluonAdam) against the torch GluonAdam: 8 steps, with and
    without beta1/wd, the same weights within float32 rounding."""
    import jax
    import jax.numpy as jnp
    import optax
    import torch

    namespace = {"torch": torch, "math": math, "jax": jax, "jnp": jnp, "optax": optax}
    exec(_render("gluon_script_optim.py.j2", "gluon_script_optim_jax.py.j2"), namespace)
    rng = np.random.RandomState(0)
    w0 = rng.randn(5, 3).astype(np.float32)
    grads = [rng.randn(5, 3).astype(np.float32) for _ in range(8)]
    for b1, wd in ((0.9, 0.0), (0.5, 1e-2)):
        p = torch.nn.Parameter(torch.tensor(w0))
        opt = namespace["GluonAdam"]([p], lr=0.01, betas=(b1, 0.999), eps=1e-8, weight_decay=wd)
        tx = namespace["gluon_adam"](0.01, b1=b1, b2=0.999, eps=1e-8, weight_decay=wd)
        w = jnp.asarray(w0)
        state = tx.init(w)
        for g in grads:
            p.grad = torch.tensor(g)
            opt.step()
            updates, state = tx.update(jnp.asarray(g), state, w)
            w = optax.apply_updates(w, updates)
        moved = np.abs(p.detach().numpy() - w0).max()
        assert moved > 0.05, moved  # the steps did something
        np.testing.assert_allclose(np.asarray(w), p.detach().numpy(), rtol=0, atol=2e-6, err_msg=f"b1={b1} wd={wd}")


def _jax_metrics() -> dict:
    """The metric classes as a JAX port has them (the torch template through the JAX rules)."""
    import jax
    import jax.numpy as jnp

    torch_code = "import math\nimport torch\n\n\n" + _render(
        "gluon_script_metrics.py.j2", metrics=["accuracy", "custom", "perplexity", "loss"])
    port = engine.fix(torch_code, engine.Options(registry.select("jax"))).source
    assert "torch" not in port.replace("import torch\n", ""), port
    namespace = {"__name__": "metrics"}
    exec(compile(port, "metrics", "exec"), namespace)
    assert namespace["jnp"] is jnp and namespace["jax"] is jax
    return namespace


def test_metrics_update_on_jax_arrays_reads_nothing_back():
    """Each metric's update() traces under jax.jit with abstract arrays (a host read, float()
    or np.asarray, would fail), and get() afterwards gives MXNet's values."""
    import jax
    import jax.numpy as jnp

    m = _jax_metrics()
    rng = np.random.RandomState(0)
    logits = rng.randn(6, 4).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 1, 1], dtype=np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    losses = rng.rand(6).astype(np.float32)

    accuracy, perplexity, loss_metric = m["GluonAccuracy"](), m["GluonPerplexity"](), m["GluonLossMetric"]()

    @jax.jit
    def traced(label, pred, prob, loss):
        accuracy.update([label], [pred])
        perplexity.update([label], [prob])
        loss_metric.update(None, [loss])
        return accuracy.num_correct, perplexity.sum_metric, loss_metric.sum_metric

    correct, nll, total = traced(jnp.asarray(labels), jnp.asarray(logits), jnp.asarray(probs), jnp.asarray(losses))
    assert int(correct) == int((logits.argmax(1) == labels).sum())
    np.testing.assert_allclose(float(nll), -np.log(probs[np.arange(6), labels.astype(int)]).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(total), losses.sum(), rtol=1e-6)
    # eagerly, on the arrays the port's step returns: get() reads them
    for metric in (accuracy, perplexity, loss_metric):
        metric.reset()
    accuracy.update([labels], [jnp.asarray(logits)])
    perplexity.update([labels], [jnp.asarray(probs)])
    loss_metric.update(None, [jnp.asarray(losses)])
    assert accuracy.get() == ("accuracy", float((logits.argmax(1) == labels).mean()))
    np.testing.assert_allclose(perplexity.get()[1], math.exp(-np.log(probs[np.arange(6), labels.astype(int)]).mean()),
                               rtol=1e-5)
    np.testing.assert_allclose(loss_metric.get()[1], losses.mean(), rtol=1e-6)


def test_custom_metric_keeps_arrays_and_applies_feval_on_numpy_in_get():
    import jax
    import jax.numpy as jnp

    m = _jax_metrics()
    seen = []

    def feval(label, pred):
        seen.append((type(label), type(pred)))
        return ((pred.ravel() > 0) == (label.ravel() > 0.5)).mean()

    metric = m["GluonCustomMetric"](feval, name="d_acc")
    label = jnp.ones((4,))
    pred = jnp.asarray([0.5, -1.0, 2.0, 3.0])

    @jax.jit
    def traced(label, pred):  # update() only keeps the arrays: it traces
        metric.update([label], [pred])
        return pred

    traced(label, pred)
    metric.reset()
    metric.update([label], [pred])
    metric.update([jnp.zeros((4,))], [pred])
    assert seen == []  # nothing evaluated (nor read) before get()
    assert metric.get() == ("d_acc", (0.75 + 0.25) / 2)
    assert seen == [(np.ndarray, np.ndarray)] * 2


# --------------------------------------------------------------------------------------
# script_steps.py: the semantics of the Gluon training step, original (MXNet) vs JAX port
# --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_script_steps_jax_port_takes_mxnets_steps(script_steps_mxnet, tmp_path):
    """The JAX port of script_steps.py, from the MXNet file of initial weights (read by the
    emitted converter into load_torch_state_dict), takes MXNet's 6 steps (batches 4, 4, 2
    twice: the ragged batch compiles a second step, as the script's loader keeps it) with SGD
    and with Adam, softmax and sigmoid losses: the losses within 1e-5, and the checkpoint it
    saves reads back into a fresh model."""
    folder, runs = script_steps_mxnet
    port = engine.fix(SCRIPT.read_text(encoding="utf-8"), engine.Options(registry.select("jax")), str(SCRIPT)).source
    assert "mxnet" not in port and "load_torch_state_dict(model, state)" in port and "def gluon_adam" in port
    script = tmp_path / "port.py"
    script.write_text(port, encoding="utf-8")
    for (optimizer, loss), (want, _) in runs.items():
        args = [str(folder / f"init_{loss}.params"), f"out_{optimizer}_{loss}.params", optimizer, loss]
        jx = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env=_env())
        assert jx.returncode == 0, jx.stderr[-3000:]
        got = [float(v) for v in jx.stdout.split()]
        assert len(want) == len(got) == 6
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{optimizer} {loss}")
    # the port's checkpoint (JX307: a pickle of the model's pure state dict) reads back
    check = f"""
import importlib.util, pickle, sys
import flax.nnx as nnx
import numpy as np
spec = importlib.util.spec_from_file_location("port", {str(script)!r})
port = importlib.util.module_from_spec(spec)
spec.loader.exec_module(port)
model = port.build(4, rngs=nnx.Rngs(0))
with open("out_adam_softmax.params", "rb") as f:
    saved = pickle.load(f)
state = nnx.state(model)
nnx.replace_by_pure_dict(state, saved)
nnx.update(model, state)
again = nnx.to_pure_dict(nnx.state(model))
flat = lambda d, p="": {{k2: v2 for k, v in d.items() for k2, v2 in (flat(v, p + str(k) + ".").items() if isinstance(v, dict) else [(p + str(k), v)])}}
a, b = flat(saved), flat(again)
assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
print("ok", len(a))
"""
    proc = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


# --------------------------------------------------------------------------------------
# The fixtures' JAX ports at script level
# --------------------------------------------------------------------------------------
def _settings(fx) -> dict:
    return tomllib.loads((fx.folder / "port.toml").read_text(encoding="utf-8"))


def _ports(fx, folder: Path) -> tuple[Path, Path]:
    (folder / "jax").mkdir()
    (folder / "torch").mkdir()
    jax_port = folder / "jax" / "train.py"
    jax_port.write_text(fx.port(), encoding="utf-8")
    torch_port = folder / "torch" / "train.py"
    options = engine.Options(registry.select("torch"), unsafe_fixes=fx.unsafe)
    torch_port.write_text(engine.fix(fx.original.read_text(encoding="utf-8"), options, str(fx.original)).source,
                          encoding="utf-8")
    return jax_port, torch_port


_HOST_READS = ("item", "tolist", "asscalar")


def host_reads_outside_logging(source: str) -> list[str]:
    """Host reads (`.item()`, `float(...)`, `np.asarray(...)`, `print(...)`, `.get()` of a
    metric) in the body of each loop that calls a jitted train step, outside the `if` that
    logs (a test with a `%`)."""
    tree = ast.parse(source)
    found = []

    def visit(node, logging):
        if isinstance(node, ast.If):
            inner = logging or "%" in ast.unparse(node.test)
            for child in node.body:
                visit(child, inner)
            for child in node.orelse:
                visit(child, logging)
            return
        if isinstance(node, ast.Call) and not logging:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in (*_HOST_READS, "print", "float", "asarray", "get", "device_get"):
                found.append(ast.unparse(node))
        for child in ast.iter_child_nodes(node):
            visit(child, logging)

    for loop in ast.walk(tree):
        if isinstance(loop, (ast.For, ast.While)) and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id.startswith("train_step")
                for c in ast.walk(loop)) and not any(
                isinstance(inner, (ast.For, ast.While)) and inner is not loop for inner in ast.walk(loop)):
            for stmt in loop.body:
                visit(stmt, False)
    return found


def test_host_read_check_sees_a_read_per_step():
    source = ("for i, (x, y) in enumerate(loader):\n    loss = train_step(m, o, x, y)\n    total += loss.item()\n"
              "    if i % 10 == 0:\n        print(float(loss))\n")
    assert host_reads_outside_logging(source) == ["loss.item()"]


# dcgan draws its noise from MXNet's generator in the original: no common noise to give both
MXNET_COMPARED = [fx for fx in FIXTURES if fx.name != "dcgan"]
# the suite compares half of them with MXNet's log lines (a run of the port to its end) and runs
# the others to the end on their own: each fixture's port runs to its end once
LOGS_COMPARED = fixture_slice(MXNET_COMPARED, 2, offset=1)
TO_THE_END = [fx for fx in FIXTURES if fx not in LOGS_COMPARED] if LOGS_COMPARED != MXNET_COMPARED else FIXTURES


@pytest.mark.slow
# the two runs below take complementary halves of TO_THE_END (all of both with
# PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("fx", fixture_slice(TO_THE_END, 2), ids=lambda fx: fx.name)
def test_jax_port_trains_to_the_end(fx, tmp_path):
    """port.toml's `run` arguments, as the user types them: the port prints its log lines and
    "finished N steps" (drop_last: the full batches) and writes its checkpoint."""
    jax_port, _ = _ports(fx, tmp_path)
    proc = subprocess.run([sys.executable, str(jax_port), *fx.run], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env=_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.match(r"finished (\d+) steps", last)
    assert m and int(m.group(1)) >= COMPARED, last
    assert any(tmp_path.glob("*.params")), "no checkpoint written"
    assert "porter: manual" not in jax_port.read_text(encoding="utf-8").split("def main", 1)[-1]
    assert host_reads_outside_logging(jax_port.read_text(encoding="utf-8")) == []


def _harness(*args, cwd, env):
    proc = subprocess.run([sys.executable, str(HARNESS), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "Error" in line]
        pytest.fail(f"harness {args[0]} side failed: {errors[-1] if errors else ''}\n{proc.stderr[-5000:]}", pytrace=False)


def _compiled_once(report: dict, ir: Path) -> None:
    """Each jitted step traced once, lowered once, with no host callback in it."""
    assert report["cache_sizes"] and all(n == 1 for n in report["cache_sizes"].values()), report["cache_sizes"]
    lowered = sorted(ir.glob("*jit_train_step*"))
    assert len(lowered) == len(report["cache_sizes"]), [p.name for p in lowered]
    for module in lowered:
        text = module.read_text(encoding="utf-8")
        assert "callback" not in text.lower(), f"{module.name} has a host callback"


@pytest.mark.slow
@pytest.mark.parametrize("fx", fixture_rest(TO_THE_END, 2), ids=lambda fx: fx.name)
def test_jax_port_takes_the_pytorch_ports_steps_compiled_once(fx, tmp_path):
    """Against the PyTorch port's steps, from its weights; the fixtures whose log lines are
    compared with MXNet's (the test below, which checks the compilation too) are not run here."""
    jax_port, torch_port = _ports(fx, tmp_path)
    k = fx.optimizer_steps_per_iteration
    steps = str(COMPARED * k)
    noise = ["--same-noise"] if fx.name == "dcgan" else []
    torch_out, jax_out, ir = tmp_path / "torch.npz", tmp_path / "jax.json", tmp_path / "ir"
    _harness("torch", str(torch_port), "--steps", steps, "--out", str(torch_out), *noise, "--", *fx.run,
             cwd=tmp_path, env=_env())
    _harness("jax", str(jax_port), "--weights", str(torch_out), "--steps", steps, "--out", str(jax_out), *noise,
             "--", *fx.run, cwd=tmp_path, env=_env(JAX_DUMP_IR_TO=str(ir)))
    with np.load(torch_out) as data:
        want = data["losses"][:COMPARED * k]
    report = json.loads(jax_out.read_text(encoding="utf-8"))
    assert len(report["loaded"]) == (2 if fx.name == "dcgan" else 1), report["loaded"]
    got = np.array(report["losses"])
    assert len(got) == len(want) == COMPARED * k, (got, want)
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-12)
    assert rel.max() < RTOL, f"losses differ: PyTorch port {want.tolist()} JAX port {got.tolist()}"
    _compiled_once(report, ir)


# --------------------------------------------------------------------------------------
# Against the MXNet original itself: its initial weights, its data order
# --------------------------------------------------------------------------------------
_LOG = re.compile(r"^\[epoch \d+ batch \d+\].*$", re.M)
_NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+")


@pytest.mark.slow
@pytest.mark.parametrize("fx", LOGS_COMPARED, ids=lambda fx: fx.name)
def test_jax_port_prints_the_mxnet_originals_log_lines(fx, tmp_path):
    """The MXNet original runs port.toml's arguments and saves its initial weights
    (tests/data/gluon/mxnet_initial_weights.py); the JAX port starts from them (read by its
    own read_gluon_parameters, loaded by its load_torch_state_dict) and its loaders shuffle
    with Gluon's permutation of numpy's generator (seeded by the script's np.random.seed):
    every log line both print (the JAX port drops the ragged last batch) has the same words
    and the same numbers within 1e-5 (they are printed with 4 or 6 decimals); each train step is
    compiled once, with no host callback."""
    python = mxnethelp.mxnet_python()
    init = tmp_path / "init.params"
    mx = subprocess.run([python, str(REPO / "tests" / "data" / "gluon" / "mxnet_initial_weights.py"), str(fx.original),
                         *fx.run], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "MX_INIT": str(init)})
    assert mx.returncode == 0, mx.stderr[-3000:]
    jax_port, _ = _ports(fx, tmp_path)
    convert = (f"import importlib.util, numpy as np\n"
               f"spec = importlib.util.spec_from_file_location('port', {str(jax_port)!r})\n"
               f"port = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(port)\n"
               f"state = port.read_gluon_parameters({str(init)!r})\n"
               f"np.savez('weights.npz', losses=np.zeros(0), **{{'state0/' + k: v for k, v in state.items()}})\n")
    proc = subprocess.run([sys.executable, "-c", convert], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, str(HARNESS), "jax", str(jax_port), "--numpy-shuffle", "--weights", "weights.npz",
                           "--steps", "1000", "--out", "jax.json", "--", *fx.run], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900, env=_env(JAX_DUMP_IR_TO=str(tmp_path / "ir")))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _compiled_once(json.loads((tmp_path / "jax.json").read_text(encoding="utf-8")), tmp_path / "ir")
    want, got = _LOG.findall(mx.stdout), _LOG.findall(proc.stdout)
    assert len(got) >= 2 and want[:len(got)] and len(want) >= len(got), (want, got)
    for a, b in zip(want, got):
        assert _NUMBER.sub("#", a) == _NUMBER.sub("#", b), (a, b)
        np.testing.assert_allclose([float(x) for x in _NUMBER.findall(b)], [float(x) for x in _NUMBER.findall(a)],
                                   rtol=1e-5, atol=2e-6, err_msg=f"MXNet: {a}\nJAX port: {b}")


@pytest.mark.slow
def test_resnet_jax_port_decays_its_learning_rate_without_recompiling(tmp_path):
    """resnet's `trainer.set_learning_rate(trainer.learning_rate * lr_decay)` at the decay
    epochs: the JAX port keeps the rate in the optimizer's state (inject_hyperparams), the
    log prints Gluon's rates (0.1, 0.01, 0.001) and the train step is lowered once."""
    fx = next(f for f in FIXTURES if f.name == "resnet")
    jax_port, _ = _ports(fx, tmp_path)
    args = [*fx.run, "--epochs", "3", "--lr-decay-epoch", "2,3"]
    proc = subprocess.run([sys.executable, str(jax_port), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env=_env(JAX_DUMP_IR_TO=str(tmp_path / "ir")))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rates = re.findall(r"^\[epoch (\d) batch \d+\].* lr=(\S+)$", proc.stdout, re.M)
    assert {(int(e), float(r)) for e, r in rates} == {(1, 0.1), (2, 0.01), (3, 0.001)}, rates
    assert len(list((tmp_path / "ir").glob("*jit_train_step*"))) == 1
