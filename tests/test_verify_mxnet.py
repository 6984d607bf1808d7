"""The MXNet side of `porter verify` (porter.verify.side_mxnet), run as model.py runs a side:
``<mxnet python> -m porter.verify.side_mxnet REQUEST.json`` in the MXNet venv.

- its imports stay within the standard library, numpy and mxnet (that venv has numpy 1.23.5
  and no torch, jax, typer or rich);
- on every fixture's model (port.toml's model and inputs) it writes the whole protocol, under
  the torch-style names of the Gluon block structure;
- it is deterministic: two runs give identical arrays, and a run loading the first one's
  weights, inputs and projection (``shared``) too;
- the name and layout mapping holds: hand-written torch equivalents of the MLP and CNN
  fixtures' models, run by the real torch side with the MXNet side's file, agree within the
  float32 tolerances (forward within 1e-4, 5 SGD or Adam steps within 1e-4 relative); one
  whose names do not fit is reported as a mismatch;
- what it cannot do is a clear error: a parameter no attribute reaches, a model that is not
  a Gluon block; and porter finds the venv (porter.verify.mxnet_env).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from porter.fixtures import fixtures
from porter.verify import backends, mxnet_env
from porter.verify.compare import Tolerance, compare_all

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "verify" / "mxnet"
FIXTURES = {fx.name: fx for fx in fixtures("mxnet")}

# some torch-style names each fixture's model must have (init/), and which are buffers
NAMES = {
    "mlp": ["0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"],
    "cnn_bn_dropout": ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                       "conv2.weight", "bn2.running_var", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    "lstm_lm": ["encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0",
                "rnn.weight_ih_l1", "rnn.weight_hh_l1", "rnn.bias_ih_l1", "rnn.bias_hh_l1",
                "decoder.weight", "decoder.bias"],
    "dcgan": ["0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var", "3.weight", "4.weight",
              "6.weight"],
    "resnet": ["features.0.weight", "features.1.0.body.0.weight", "features.1.0.body.1.weight",
               "features.1.0.body.1.running_var", "features.2.0.downsample.0.weight",
               "features.2.0.downsample.1.bias", "features.3.0.body.4.running_mean", "output.weight",
               "output.bias"],
}
LAYERS = {
    "mlp": ["0", "1", "2", "3"],
    "cnn_bn_dropout": ["conv1", "bn1", "pool1", "conv2", "bn2", "pool2", "dropout1", "fc1", "dropout2", "fc2"],
    "lstm_lm": ["encoder", "drop", "rnn.0", "rnn.1.0", "rnn.1.1", "drop", "decoder"],
    "dcgan": ["0", "1", "2", "3", "4", "5", "6", "7"],
    "resnet": ["features.0", "features.1.0.body.0", "features.1.0.body", "features.1.0", "features.2.0.downsample",
               "features.2.0", "features.4", "features", "output"],
}
OUTPUTS = {"lstm_lm": ["0", "1.0", "1.1"]}


def _mxnet_backend(python: str) -> backends.Backend:
    return backends.Backend("mxnet", "porter.verify.side_mxnet", "cpu", python=python, env={"OMP_NUM_THREADS": "1"})


def _request(file: Path, model: str, inputs, steps=2, optimizer="sgd", **extra) -> dict:
    # as model.verify_model builds it; _run adds device, meta and out
    return dict({"model": model, "inputs": list(inputs), "steps": steps, "optimizer": optimizer, "lr": 0.01,
                 "seed": 0, "cuda_shim": True, "file": str(file)}, **extra)


def _run(backend: backends.Backend, request: dict, work: Path, role: str):
    """One side, as model.py starts it: ``python -m MODULE REQUEST.json`` in the backend's
    interpreter and environment, the request completed with device, meta and out."""
    request = dict(request, device=backend.device, meta=str(work / f"{role}.meta.json"), out=str(work / f"{role}.npz"))
    req_path = work / f"{role}.request.json"
    req_path.write_text(json.dumps(request))
    proc = subprocess.run([backend.python, "-m", backend.module, str(req_path)], env=backend.environment(),
                          capture_output=True, text=True, timeout=300)
    meta_path = Path(request["meta"])
    return proc, (json.loads(meta_path.read_text()) if meta_path.is_file() else {})


def _side(backend, request, work: Path, role: str):
    proc, meta = _run(backend, request, work, role)
    assert proc.returncode == 0 and meta.get("ok"), f"{role}: {meta.get('error')}\n{proc.stderr[-3000:]}"
    return meta, np.load(work / f"{role}.npz")


def test_side_imports_no_torch_jax_typer_rich(mxnet_python):
    code = ("import sys, numpy; import porter.verify.side_mxnet, porter.verify.specs, porter.verify.mxnet_env; "
            "bad = sorted({'torch', 'torch_xla', 'jax', 'flax', 'typer', 'rich', 'libcst', 'psutil'} & set(sys.modules)); "
            "print(numpy.__version__, bad)")
    res = subprocess.run([mxnet_python, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_mxnet_backend(mxnet_python).environment())
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1.23.5", "[]"]


def test_mxnet_env_finds_the_venv(mxnet_python, monkeypatch, tmp_path):
    monkeypatch.delenv(mxnet_env.ENV_VAR, raising=False)
    if Path(mxnet_python).resolve().parent.parent.name.startswith("mxnet-"):  # built by scripts/bootstrap-mxnet
        assert mxnet_env.mxnet_python() == mxnet_python
        assert Path(mxnet_python).parent.parent == mxnet_env.venv_dir()
    monkeypatch.setenv(mxnet_env.ENV_VAR, mxnet_python)
    assert mxnet_env.mxnet_python() == mxnet_python
    monkeypatch.setenv(mxnet_env.ENV_VAR, str(tmp_path / "nothing"))
    with pytest.raises(mxnet_env.MXNetEnvError, match="not an executable"):
        mxnet_env.mxnet_python()
    monkeypatch.delenv(mxnet_env.ENV_VAR)
    monkeypatch.setenv("PORTER_CACHE", str(tmp_path))
    with pytest.raises(mxnet_env.MXNetEnvError, match="bootstrap-mxnet"):
        mxnet_env.mxnet_python()
    # the script's hash rule: sha256sum of the lock file, 16 hex digits
    digest = subprocess.run(["sha256sum", str(mxnet_env.LOCK)], capture_output=True, text=True).stdout[:16]
    assert mxnet_env.lock_hash() == digest


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMES))
def test_side_writes_the_protocol(name, mxnet_python, tmp_path):
    fx = FIXTURES[name]
    meta, data = _side(_mxnet_backend(mxnet_python), _request(fx.original, fx.model, fx.inputs), tmp_path, "original")
    keys = set(data.files)
    init = {k[len("init/"):] for k in keys if k.startswith("init/")}
    assert set(NAMES[name]) <= init
    buffers = {n for n in init if n.endswith(("running_mean", "running_var"))}
    params = init - buffers - {n for n in init if n.endswith("num_batches_tracked")}
    assert {n[: -len(".num_batches_tracked")] for n in init if n.endswith("num_batches_tracked")} == \
        {n[: -len(".running_mean")] for n in buffers if n.endswith(".running_mean")}
    n_inputs = int(data["n_inputs"])
    assert n_inputs == len(fx.inputs)
    for i in range(n_inputs):
        assert data[f"input/{i}"].dtype == np.dtype(fx.inputs[i].split("[")[0])
    outputs = OUTPUTS.get(name, ["0"])
    assert {k for k in keys if k.startswith("projection/")} == {f"projection/{i}" for i in range(len(outputs))}
    assert set(meta["order"]) <= keys
    layers = [k[len("layer/"):] for k in meta["order"] if k.startswith("layer/")]
    for layer in LAYERS[name]:
        assert layer in layers, layer
    assert [k for k in meta["order"] if k.startswith("output/")] == [f"output/{o}" for o in outputs]
    assert {k[len("grad/"):] for k in keys if k.startswith("grad/")} == params
    for step in (1, 2):
        assert data[f"step{step}/loss"].shape == ()
        assert np.isfinite(data[f"step{step}/loss"])
        assert {k.split("/", 2)[2] for k in keys if k.startswith(f"step{step}/param/")} == params
        assert {k.split("/", 2)[2] for k in keys if k.startswith(f"step{step}/buffer/")} == buffers
    for n in params:
        grad = data[f"grad/{n}"]
        assert grad.shape == data[f"init/{n}"].shape and np.isfinite(grad).all()
        # SGD with momentum: step 1 moves every parameter by -lr * grad
        np.testing.assert_allclose(data[f"step1/param/{n}"], data[f"init/{n}"] - 0.01 * grad, rtol=1e-5, atol=1e-7)
    assert any(np.abs(data[f"grad/{n}"]).max() > 0 for n in params)
    for n in buffers:  # BatchNorm's statistics moved in training mode
        assert not np.array_equal(data[f"step1/buffer/{n}"], data[f"init/{n}"]), n
    if "dropout" in fx.original.read_text() or "Dropout" in fx.original.read_text():
        assert any(note.startswith("dropout switched off") for note in meta["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "cnn_bn_dropout"])
def test_side_is_deterministic(name, mxnet_python, tmp_path):
    fx = FIXTURES[name]
    backend = _mxnet_backend(mxnet_python)
    request = _request(fx.original, fx.model, fx.inputs, steps=3)
    meta_a, a = _side(backend, request, tmp_path, "first")
    meta_b, b = _side(backend, request, tmp_path, "second")
    assert a.files == b.files and meta_a["order"] == meta_b["order"]
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    # loading the first run's weights, inputs and projection gives the same run
    meta_c, c = _side(backend, dict(request, shared=str(tmp_path / "first.npz"), cuda_shim=False), tmp_path, "shared")
    assert meta_c["order"] == meta_a["order"]
    for k in meta_a["order"]:
        assert np.array_equal(a[k], c[k]), k


def _torch_side(request, work: Path):
    return _side(backends.BACKENDS["torch"], request, work, "port")


@pytest.mark.slow
@pytest.mark.parametrize("name, torch_file, model, inputs, optimizer", [
    ("mlp", "mlp_torch.py", "get_mlp(hidden=128, num_classes=10)", ["float32[16,784]"], "sgd"),
    ("mlp", "mlp_torch.py", "get_mlp(hidden=128, num_classes=10)", ["float32[16,784]"], "adam"),
    ("cnn_bn_dropout", "cnn_torch.py", "ConvNet(num_classes=10)", ["float32[16,1,28,28]"], "sgd"),
])
def test_torch_equivalent_agrees(name, torch_file, model, inputs, optimizer, mxnet_python, tmp_path):
    fx = FIXTURES[name]
    assert (fx.model, list(fx.inputs)) == (model, inputs)
    base = _request(fx.original, model, inputs, steps=5, optimizer=optimizer)
    meta_o, a = _side(_mxnet_backend(mxnet_python), base, tmp_path, "original")
    meta_p, b = _torch_side(dict(base, file=str(DATA / torch_file), shared=str(tmp_path / "original.npz"),
                                 cuda_shim=False), tmp_path)
    assert "mismatch" not in meta_p
    results = compare_all(meta_o["order"], a, b, Tolerance())
    bad = [f"{r.where}: {r.max_abs:.3g} ({r.note})" for r in results if not r.ok]
    assert not bad, bad
    forward = [r for r in results if r.phase in ("layer", "output")]
    assert forward and max(r.max_abs for r in forward) <= 1e-4
    losses = [r for r in results if r.phase == "loss"]
    assert len(losses) == 5 and all(r.max_rel <= 1e-4 for r in losses)
    assert len([r for r in results if r.phase == "gradient"]) == len([k for k in a.files if k.startswith("grad/")])
    if optimizer == "adam":
        assert any("adam" in note for note in meta_o["notes"])


@pytest.mark.slow
def test_names_that_do_not_fit_are_a_mismatch(mxnet_python, tmp_path):
    fx = FIXTURES["mlp"]
    base = _request(fx.original, fx.model, fx.inputs, steps=1)
    _side(_mxnet_backend(mxnet_python), base, tmp_path, "original")
    proc, meta_p = _run(backends.BACKENDS["torch"],
                        dict(base, file=str(DATA / "mlp_torch.py"), model="get_mlp_without_dropout()",
                             shared=str(tmp_path / "original.npz"), cuda_shim=False), tmp_path, "port")
    assert proc.returncode == 0 and meta_p["ok"], proc.stderr[-3000:]
    assert meta_p["mismatch"]["unexpected"] == ["3.bias", "3.weight"]
    assert "1.weight" in meta_p["mismatch"]["missing"]


@pytest.mark.slow
@pytest.mark.parametrize("file, model, message", [
    ("unnamed_param.py", "Scale()", "no attribute of the model reaches"),
    ("not_a_block.py", "make()", "not a gluon.Block"),
])
def test_clear_errors(file, model, message, mxnet_python, tmp_path):
    backend = _mxnet_backend(mxnet_python)
    proc, meta = _run(backend, _request(DATA / file, model, ["float32[2,3]"]), tmp_path, "original")
    assert proc.returncode == 3 and meta["ok"] is False
    assert message in meta["error"]
    assert not (tmp_path / "original.npz").exists()


@pytest.mark.slow
def test_porter_verify_mxnet_original_against_xla_port(mxnet_python, monkeypatch):
    """The whole model-level verification: the original in MXNet 1.9.1 (picked by
    backends.original_backend for a file importing mxnet), the (hand-written) port on the XLA
    backend."""
    from porter.verify.model import ModelRequest, verify_model

    assert backends.original_backend(FIXTURES["mlp"].original).python == mxnet_python
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name, torch_file in (("mlp", "mlp_torch.py"), ("cnn_bn_dropout", "cnn_torch.py")):
        fx = FIXTURES[name]
        report = verify_model(ModelRequest(fx.original, DATA / torch_file, fx.model, tuple(fx.inputs)))
        assert report.original.backend == "mxnet" and report.port.backend == "torch-xla"
        assert report.original.ok and report.port.ok, (report.original.error, report.port.error)
        forward = [t for t in report.tensors if t["phase"] in ("layer", "output")]
        losses = [t for t in report.tensors if t["phase"] == "loss"]
        # the requirement: forward max abs error <= 1e-4 (float32), 5 steps within 1e-4 relative
        assert forward and max(t["max_abs"] for t in forward) <= 1e-4, report.summary
        assert len(losses) == 5 and max(t["max_rel"] for t in losses) <= 1e-4, report.summary
        if name == "mlp":
            assert report.passed, report.summary
