"""`porter verify` with a Flax NNX port, from the user's side: hand-written ports that follow
the JAX target's contract pass (forward, gradients and 5 optimizer steps within float32
tolerance, the step compiled once); broken ports are caught with the right tensor named; a
step that calls back to the host fails the health check."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porter.verify import backends
from porter.verify.side_jax import PortError, model_expression

DATA = Path(__file__).parent / "data" / "verify" / "jax"
MLP = ("--model", "MLP()", "--input", "float32[8,16]")
CNN = ("--model", "SmallCNN()", "--input", "float32[4,3,16,16]")


def porter(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "porter", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PJRT_DEVICE": "CPU"})


def verify_json(original, port, *args):
    proc = porter("verify", original, port, *args, "--steps", "5", "--format", "json")
    return proc, json.loads(proc.stdout)


def variant(tmp_path, source: Path, name: str, old: str, new: str) -> Path:
    """A copy of a port with one deliberate change."""
    text = source.read_text()
    assert old in text, old
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def worst(report, phase):
    return max(t["max_abs"] for t in report["tensors"] if t["phase"] == phase)


# ---- fast: the pieces

def test_model_expression_gets_rngs():
    assert model_expression("Net(10)", "R") == "Net(10, rngs=R)"
    assert model_expression("Net", "R") == "Net(rngs=R)"
    assert model_expression("models.Net", "R") == "models.Net(rngs=R)"
    assert model_expression("Net(3, rngs=nnx.Rngs(1))", "R") == "Net(3, rngs=nnx.Rngs(1))"
    for bad in ("Net(", "[Net()]", "lambda: Net()"):
        with pytest.raises(PortError):
            model_expression(bad, "R")


def test_a_jax_port_gets_the_jax_backend(tmp_path):
    port = tmp_path / "p.py"
    port.write_text("import jax.numpy as jnp\nfrom flax import nnx\n")
    backend = backends.port_backend(port)
    assert backend.name == "jax" and backend.module == "porter.verify.side_jax"
    assert backend.environment()["JAX_PLATFORMS"]
    port.write_text("import torch\nimport torch_xla\n")
    assert backends.port_backend(port).name == "torch-xla"


def test_host_callbacks_found_in_nested_jaxprs():
    import jax
    import jax.numpy as jnp

    from porter.verify.side_jax import host_callbacks

    def clean(x):
        return jnp.sin(x).sum()

    def noisy(x):
        y = jax.lax.cond(x.sum() > 0, lambda v: v * 2, lambda v: v, x)
        jax.debug.print("y {}", y.sum())
        return jax.jit(lambda v: jax.pure_callback(np.cos, jax.ShapeDtypeStruct(v.shape, v.dtype), v))(y).sum()

    x = jnp.ones(3)
    assert host_callbacks(jax.make_jaxpr(clean)(x)) == {}
    assert host_callbacks(jax.make_jaxpr(noisy)(x)) == {"debug_print": 1, "pure_callback": 1}


@pytest.mark.slow  # eager NNX layers: one compilation per op
def test_nnx_paths_become_torch_names():
    import jax.numpy as jnp
    from flax import nnx

    from porter.verify.side_jax import LayerRecorder, torch_names

    class Net(nnx.Module):
        def __init__(self, *, rngs):
            self.body = nnx.Sequential(nnx.Linear(4, 4, rngs=rngs), nnx.relu, nnx.Linear(4, 2, rngs=rngs))
            self.blocks = nnx.List([nnx.Linear(2, 2, rngs=rngs)])
            self.act = nnx.tanh

        def __call__(self, x):
            return self.act(self.blocks[0](self.body(x)))

    net = Net(rngs=nnx.Rngs(0))
    assert sorted(n for n, _ in torch_names(net).values()) == ["blocks.0", "body", "body.0", "body.2"]
    torch_layers = {f"layer/{n}": () for n in ("body.0", "body.1", "body.2", "body", "blocks.0", "act")}
    with LayerRecorder(net, torch_layers) as rec:
        y = net(jnp.ones((3, 4)))
    assert [n for n, _, _ in rec.records] == ["body.0", "body.1", "body.2", "body", "blocks.0", "act"]
    assert net.act is nnx.tanh and net.body.layers[1] is nnx.relu  # put back
    assert np.array_equal(net(jnp.ones((3, 4))), y)


@pytest.mark.slow  # eager NNX layers: one compilation per op
def test_channels_last_outputs_are_recognised_by_what_the_layer_returns():
    import jax.numpy as jnp
    from flax import nnx

    from porter.verify.side_jax import LayerRecorder

    class ChannelsFirstConv(nnx.Conv):  # NCHW in and out, around nnx.Conv (as the port's TorchConv2d)
        def __call__(self, x):
            return jnp.moveaxis(super().__call__(jnp.moveaxis(x, 1, -1)), -1, 1)

    class Net(nnx.Module):
        def __init__(self, *, rngs):
            self.a = ChannelsFirstConv(4, 4, (1, 1), rngs=rngs)  # NCHW
            self.b = nnx.Conv(4, 4, (1, 1), rngs=rngs)  # NHWC
            self.c = nnx.BatchNorm(4, rngs=rngs)  # over the last axis: NHWC
            self.d = nnx.BatchNorm(4, axis=1, rngs=rngs)  # NCHW

        def __call__(self, x):  # x: (N, C, H, W), every shape the same: only the layout tells
            x = self.a(x)
            y = self.c(self.b(jnp.moveaxis(x, 1, -1)))
            return self.d(jnp.moveaxis(y, -1, 1))

    net = Net(rngs=nnx.Rngs(0))
    x = jnp.arange(2 * 4 * 4 * 4, dtype=jnp.float32).reshape(2, 4, 4, 4) / 100
    with LayerRecorder(net, {f"layer/{n}": (2, 4, 4, 4) for n in "abcd"}) as rec:
        net(x)
    notes: list = []
    arrays = dict(rec.arrays(notes))
    assert notes == ["outputs of channels-last NNX layers compared with the channels moved to axis 1: b, c"]
    a = np.asarray(net.a(x))
    np.testing.assert_allclose(arrays["layer/a"], a)
    np.testing.assert_allclose(arrays["layer/b"], np.moveaxis(np.asarray(net.b(jnp.moveaxis(a, 1, -1))), -1, 1))


@pytest.mark.slow
def test_optax_sgd_momentum_and_adam_equal_torch():
    """The comparison steps use optax on the port's side and torch.optim on the original's:
    SGD with momentum 0.9 and Adam with torch's defaults must be the same update. SGD agrees
    to float32 rounding; Adam to 1e-5: optax computes the bias corrections 1 - beta**t in
    float32 (1 - 0.999 is 1.3e-5 off there), torch in float64 on the host."""
    import jax.numpy as jnp
    import optax
    import torch

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(6).astype(np.float32)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(6)]
    for make_torch, tx, rtol in ((lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), optax.sgd(0.05, momentum=0.9), 1e-6),
                                 (lambda p: torch.optim.Adam(p, lr=0.05), optax.adam(0.05), 2e-5)):
        p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
        opt = make_torch([p])
        w = jnp.asarray(w0)
        state = tx.init(w)
        for g in grads:
            p.grad = torch.from_numpy(g)
            opt.step()
            updates, state = tx.update(jnp.asarray(g), state, w)
            w = optax.apply_updates(w, updates)
        np.testing.assert_allclose(np.asarray(w), p.detach().numpy(), rtol=rtol, atol=1e-7)


# ---- the CLI, as a user runs it

@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mlp_port_passes(optimizer):
    proc, report = verify_json(DATA / "mlp.py", DATA / "mlp_nnx.py", *MLP, "--optimizer", optimizer)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    assert report["port"]["backend"] == "jax"
    keys = [t["key"] for t in report["tensors"]]
    assert {"layer/fc1", "layer/act", "layer/fc2", "layer/drop", "layer/head", "output/0", "grad/fc1.weight",
            "step5/loss", "step5/param/head.bias"} <= set(keys)
    assert worst(report, "layer") <= 1e-4 and worst(report, "output") <= 1e-4 and worst(report, "gradient") <= 1e-4
    assert all(t["max_rel"] <= 1e-4 for t in report["tensors"] if t["phase"] == "loss")
    assert report["health"]["compiles_total"] == 1 and report["health"]["max_transfers_per_step"] == 0
    assert any("dropout switched off for the comparison in: drop" in n for n in report["notes"])


@pytest.mark.slow
def test_cnn_port_with_batchnorm_and_flatten_passes():
    proc, report = verify_json(DATA / "cnn.py", DATA / "cnn_nnx.py", *CNN)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    by_key = {t["key"]: t for t in report["tensors"]}
    # every layer of the original compared, channels-last ones in torch's NCHW
    for name in ("features.0", "features.1", "features.2", "features.3", "features", "conv2", "bn2", "drop", "fc"):
        assert by_key[f"layer/{name}"]["ok"], name
    assert by_key["layer/features.3"]["shape"] == [4, 8, 8, 8]
    assert worst(report, "layer") <= 1e-4 and worst(report, "output") <= 1e-4 and worst(report, "gradient") <= 1e-4
    assert all(t["max_rel"] <= 1e-4 for t in report["tensors"] if t["phase"] == "loss")
    for step in range(1, 6):
        assert by_key[f"step{step}/buffer/bn2.running_var"]["ok"]
    steps = report["health"]["steps"]
    assert [s["compiles"] for s in steps] == [1, 0, 0, 0, 0]
    assert all(s["transfers"] == 0 and s["executions"] == 1 for s in steps)
    assert any("channels moved to axis 1" in n and "features.3" in n for n in report["notes"])


@pytest.mark.slow
def test_flax_default_batchnorm_momentum_is_named(tmp_path):
    port = variant(tmp_path, DATA / "cnn_nnx.py", "cnn_nnx_momentum.py",
                   "BatchNorm(8, momentum=0.9, ", "BatchNorm(8, ")  # flax's default 0.99 = torch's 0.01
    proc, report = verify_json(DATA / "cnn.py", port, *CNN)
    assert proc.returncode == 1 and report["status"] == "diverged"
    assert report["first_divergence"]["where"] == "buffer features.1.running_mean at step 1"
    # the forward pass, the gradients and the first update do not depend on the momentum
    assert all(t["ok"] for t in report["tensors"] if t["phase"] in ("layer", "output", "gradient"))


@pytest.mark.slow
def test_plain_nnx_batchnorm_biased_running_variance_is_recognised(tmp_path):
    """nnx.BatchNorm updates the running variance with the biased batch variance, torch with the
    unbiased one (n/(n-1), here n = 4*8*8 values per channel): with momentum 0.9 that is the only
    difference, recognised as such from the original's statistics and noted, not blamed on the port."""
    port = variant(tmp_path, DATA / "cnn_nnx.py", "cnn_nnx_plain_bn.py",
                   "self.bn2 = BatchNorm(", "self.bn2 = nnx.BatchNorm(")
    proc, report = verify_json(DATA / "cnn.py", port, *CNN)
    assert proc.returncode == 0, report["summary"]
    by_key = {t["key"]: t for t in report["tensors"]}
    for step in range(1, 6):
        var = by_key[f"step{step}/buffer/bn2.running_var"]
        assert var["max_rel"] > 1e-4 and "biased batch variance" in var["note"] and "n=256" in var["note"]


@pytest.mark.slow
def test_a_torch_module_without_nnx_counterpart_is_skipped_with_a_note(tmp_path):
    """The port applies no dropout module at all (dropout is off in the comparison anyway): the
    original's `drop` has no NNX counterpart, so its output cannot be compared; the port's side
    says so instead of failing, and everything else is compared."""
    port = variant(tmp_path, DATA / "cnn_nnx.py", "cnn_nnx_no_dropout.py",
                   "        self.drop = nnx.Dropout(0.3, rngs=rngs)\n", "")
    port.write_text(port.read_text().replace("self.fc(self.drop(", "self.fc(("))
    proc, report = verify_json(DATA / "cnn.py", port, *CNN)
    assert any("corresponds to the original's drop" in n and "not compared" in n for n in report["notes"])
    assert "layer/drop" not in {t["key"] for t in report["tensors"]}
    assert proc.returncode == 0 and report["passed"] and all(t["ok"] for t in report["tensors"])


@pytest.mark.slow
def test_linear_kernel_not_transposed_is_named(tmp_path):
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_no_transpose.py",
                   "lambda w: w.T, lambda k: k.T", "lambda w: w, lambda k: k")
    proc, report = verify_json(DATA / "mlp.py", port, *MLP)
    assert proc.returncode == 1 and report["status"] == "diverged"
    assert report["summary"] == "weight fc1.weight has shape (32, 16) in the original and (16, 32) in the port"


@pytest.mark.slow
def test_square_kernel_not_transposed_diverges_at_that_layer(tmp_path):
    """A square kernel fits either way round: the values show it, at the layer's output."""
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_no_transpose.py",
                   "lambda w: w.T, lambda k: k.T",
                   "(lambda w: w) if m.in_features == m.out_features else (lambda w: w.T), "
                   "(lambda k: k) if m.in_features == m.out_features else (lambda k: k.T)")
    proc, report = verify_json(DATA / "mlp.py", port, "--model", "MLP(d_in=32)", "--input", "float32[8,32]")
    assert proc.returncode == 1
    assert report["first_divergence"]["where"] == "output of fc1"


@pytest.mark.slow
def test_outputs_of_another_shape_are_named_and_no_step_runs(tmp_path):
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_transposed_output.py",
                   "return self.head(self.drop(x))", "return self.head(self.drop(x)).T")
    proc, report = verify_json(DATA / "mlp.py", port, *MLP)
    assert proc.returncode == 1
    assert report["first_divergence"]["where"] == "model output"
    assert report["first_divergence"]["note"] == "shape (8, 10) in the original, (10, 8) in the port"
    assert all(t["ok"] for t in report["tensors"] if t["phase"] == "layer")
    assert any("no training step was run" in n for n in report["notes"])


@pytest.mark.slow
def test_debug_print_in_the_step_fails_health(tmp_path):
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_print.py",
                   "        x = self.act(self.fc2(x))\n",
                   "        x = self.act(self.fc2(x))\n        jax.debug.print('hidden mean {m}', m=x.mean())\n")
    port.write_text("import jax\n" + port.read_text())
    proc, report = verify_json(DATA / "mlp.py", port, *MLP)
    assert proc.returncode == 1 and report["status"] == "over-budget", report["summary"]
    assert all(t["ok"] for t in report["tensors"])  # the numbers are right; the step is not
    assert [s["transfers"] for s in report["health"]["steps"]] == [1] * 5
    assert any("jax.debug.print" in n and "calls back to the host" in n for n in report["notes"])


@pytest.mark.slow
def test_a_python_attribute_changed_in_the_forward_recompiles_every_step(tmp_path):
    """An int attribute of an NNX module is static structure: changing it in __call__ makes
    every step a new program."""
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_counter.py",
                   "        self.head = nnx.Linear(hidden, n_out, rngs=rngs)\n",
                   "        self.head = nnx.Linear(hidden, n_out, rngs=rngs)\n        self.calls = 0\n")
    port.write_text(port.read_text().replace("    def __call__(self, x):\n",
                                             "    def __call__(self, x):\n        self.calls += 1\n", 1))
    proc, report = verify_json(DATA / "mlp.py", port, *MLP)
    assert proc.returncode == 1 and report["status"] == "over-budget", report["summary"]
    assert [s["compiles"] for s in report["health"]["steps"]] == [1] * 5
    assert any("the train step was compiled 5 times" in n for n in report["notes"])


@pytest.mark.slow
def test_a_host_read_in_the_forward_is_a_side_error_saying_so(tmp_path):
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_item.py",
                   "        return self.head(self.drop(x))\n",
                   "        if float(x.mean()) > 100:\n            x = x / 2\n        return self.head(self.drop(x))\n")
    proc = porter("verify", DATA / "mlp.py", port, *MLP, "--steps", "2")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 2
    assert "the model reads a value on the host inside the jitted train step" in text
    assert "ConcretizationTypeError" in text


@pytest.mark.slow
def test_a_port_without_the_weight_converter_is_a_side_error(tmp_path):
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_no_converter.py",
                   "def load_torch_state_dict(", "def load_weights(")
    proc = porter("verify", DATA / "mlp.py", port, *MLP, "--steps", "2")
    assert proc.returncode == 2
    text = " ".join(proc.stdout.split())
    assert "the port could not run" in text and "defines no load_torch_state_dict()" in text


@pytest.mark.slow
def test_a_model_that_is_not_an_nnx_module_is_a_side_error(tmp_path):
    port = variant(tmp_path, DATA / "mlp_nnx.py", "mlp_nnx_factory.py", "class MLP(nnx.Module):",
                   "def MLP(*, rngs):\n    return object()\n\n\nclass Net(nnx.Module):")
    proc = porter("verify", DATA / "mlp.py", port, *MLP, "--steps", "2")
    assert proc.returncode == 2 and "not an nnx.Module" in " ".join(proc.stdout.split())


# ---- a forward that draws random numbers (the VAE fixture's reparameterisation)

VAE = Path(__file__).resolve().parents[1] / "fixtures" / "jax" / "vae"


@pytest.mark.slow
def test_random_numbers_of_the_forward_are_fed_torchs():
    """The port draws its noise with jax.random.normal(self.rngs.noise(), ...) (JX014); the
    JAX side feeds it the numbers the original's torch.randn_like draws, so the forward, the
    gradients and the steps compare as for a deterministic model, and the step compiles once."""
    proc, report = verify_json(VAE / "train.py", VAE / "expected.py", "--model", "VAE()", "--input", "float32[8,1,28,28]")
    assert proc.returncode == 0 and report["passed"], report["summary"]
    assert any("fed torch's" in n and "jax.random.normal[8, 20]" in n for n in report["notes"]), report["notes"]
    assert worst(report, "layer") <= 1e-4 and worst(report, "output") <= 1e-4 and worst(report, "gradient") <= 1e-4
    assert all(t["max_rel"] <= 1e-4 for t in report["tensors"] if t["phase"] == "loss")
    assert [s["compiles"] for s in report["health"]["steps"]] == [1, 0, 0, 0, 0]


@pytest.mark.slow
def test_noise_used_otherwise_than_torch_diverges_after_the_draw(tmp_path):
    """Fed torch's numbers, a port that uses them otherwise (here: negated) is caught at the
    first layer after the draw: the comparison is not vacuous."""
    port = variant(tmp_path, VAE / "expected.py", "vae_negated.py",
                   "eps = jax.random.normal(", "eps = -jax.random.normal(")
    proc, report = verify_json(VAE / "train.py", port, "--model", "VAE()", "--input", "float32[8,1,28,28]")
    assert proc.returncode == 1 and not report["passed"]
    assert report["first_divergence"]["key"] == "layer/fc3", report["first_divergence"]
