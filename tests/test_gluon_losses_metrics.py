"""Gluon's probability-label cross entropy and the regression / top-k metrics, ported to both
targets and compared with real MXNet 1.9.1.

One Gluon source (GLUON_SOURCE, written for these tests) is run as it is in the MXNet venv, and
its torch_xla and JAX ports (`porter migrate`'s pipeline, GL* then the target's rules) are run on
the same arrays: the per-sample losses of `SoftmaxCrossEntropyLoss(sparse_label=False)` in three
spellings, and the values of `TopKAccuracy`, `MAE`, `MSE`, `RMSE` over several batches (list and
single-array updates, 1-D and 2-D labels). The JAX port's metric updates also run under
`jax.jit`, which fails on any host read.
"""
from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import pytest

import mxnethelp
from porter import engine, registry

GLUON_SOURCE = textwrap.dedent('''
    import mxnet as mx
    from mxnet import gluon
    from mxnet.gluon.loss import SoftmaxCELoss

    soft_ce = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    soft_ce_alias = SoftmaxCELoss(sparse_label=False, axis=-1)
    soft_ce_full = mx.gluon.loss.SoftmaxCrossEntropyLoss(axis=-1, sparse_label=False, from_logits=False)


    def losses(pred, label):
        return [soft_ce(pred, label), soft_ce_alias(pred, label), soft_ce_full(pred, label)]


    def make_metrics():
        return [mx.metric.TopKAccuracy(3), mx.metric.TopKAccuracy(top_k=2, name="top"),
                mx.metric.MAE(), mx.metric.MSE(name="sq"), mx.metric.RMSE()]


    def update(found, label, pred, target, output):
        found[0].update([label], [pred])
        found[1].update(labels=[label], preds=[pred])
        found[2].update(target, output)
        found[3].update([target], [output])
        found[4].update([target, label / 6], [output, pred[:, 0]])
''')

# runs GLUON_SOURCE in the MXNet venv on the arrays of inputs.npz; prints the values as JSON
_MXNET_DRIVER = textwrap.dedent('''
    import json, sys, types
    import numpy as np
    import mxnet as mx
    module = types.ModuleType("gluon_source")
    exec(open(sys.argv[1]).read(), module.__dict__)
    data = np.load(sys.argv[2])
    losses = [l.asnumpy().tolist() for l in module.losses(mx.nd.array(data["logits"]), mx.nd.array(data["soft"]))]
    found = module.make_metrics()
    for b in range(data["labels"].shape[0]):
        module.update(found, *(mx.nd.array(data[k][b]) for k in ("labels", "scores", "targets", "outputs")))
    print(json.dumps({"losses": losses, "metrics": [list(m.get()) for m in found]}))
''')


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(7)
    logits = rng.randn(6, 5).astype(np.float32) * 2
    raw = rng.rand(6, 5).astype(np.float32)
    return {
        "logits": logits,
        "soft": raw / raw.sum(1, keepdims=True),  # mixup-style probability labels
        "labels": rng.randint(0, 6, size=(3, 8)).astype(np.float32),  # Gluon labels are float
        "scores": rng.randn(3, 8, 6).astype(np.float32),
        "targets": rng.rand(3, 8).astype(np.float32),  # 1-D: MXNet takes it as a column
        "outputs": rng.rand(3, 8, 4).astype(np.float32),  # broadcast against that column
    }


@pytest.fixture(scope="module")
def mxnet_values(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("gluon_losses_metrics")
    (folder / "source.py").write_text(GLUON_SOURCE)
    np.savez(folder / "inputs.npz", **_inputs())
    proc = subprocess.run([mxnethelp.mxnet_python(), "-c", _MXNET_DRIVER, "source.py", "inputs.npz"], cwd=folder,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _port(target: str) -> str:
    torch_code = engine.fix(GLUON_SOURCE, engine.Options(registry.select("torch"))).source
    return engine.fix(torch_code, engine.Options(registry.select(target))).source


def _run(source: str) -> dict:
    namespace: dict = {"__name__": "port"}
    exec(compile(source, "port", "exec"), namespace)
    return namespace


def test_torch_xla_port_matches_mxnet(mxnet_values):
    import torch

    port = _port("torch-xla")
    assert "mxnet" not in port and "# porter: manual" not in port, port
    assert port.count('torch.nn.CrossEntropyLoss(reduction="none")') == 3, port
    m = _run(port)
    data = _inputs()
    got = [t.numpy() for t in m["losses"](torch.tensor(data["logits"]), torch.tensor(data["soft"]))]
    for ours, theirs in zip(got, mxnet_values["losses"]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    found = m["make_metrics"]()
    for b in range(data["labels"].shape[0]):
        m["update"](found, *(torch.tensor(data[k][b]) for k in ("labels", "scores", "targets", "outputs")))
    for metric, (name, value) in zip(found, mxnet_values["metrics"]):
        assert metric.get()[0] == name
        assert metric.get()[1] == pytest.approx(value, rel=1e-5), name
        assert isinstance(metric.sum_metric, torch.Tensor), name  # counted on the device, read in get()


def test_jax_port_matches_mxnet_and_updates_under_jit(mxnet_values):
    import jax
    import jax.numpy as jnp

    port = _port("jax")
    assert "mxnet" not in port and "# porter: manual" not in port, port
    assert port.count("optax.softmax_cross_entropy(input, target, axis=1)") == 3, port  # class probabilities
    m = _run(port)
    data = _inputs()
    got = [np.asarray(a) for a in m["losses"](jnp.asarray(data["logits"]), jnp.asarray(data["soft"]))]
    for ours, theirs in zip(got, mxnet_values["losses"]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)

    batches = [[jnp.asarray(data[k][b]) for k in ("labels", "scores", "targets", "outputs")]
               for b in range(data["labels"].shape[0])]
    traced_metrics = m["make_metrics"]()

    @jax.jit
    def traced(*arrays):  # a host read (float(), np.asarray) of a tracer raises while tracing
        m["update"](traced_metrics, *arrays)
        return [metric.sum_metric for metric in traced_metrics]

    sums = traced(*batches[0])
    found = m["make_metrics"]()
    m["update"](found, *batches[0])  # eagerly: the same sums as the traced update
    for metric, value in zip(found, sums):
        np.testing.assert_allclose(np.asarray(value), np.asarray(metric.sum_metric), rtol=1e-6)
    for batch in batches[1:]:
        m["update"](found, *batch)
    for metric, (name, value) in zip(found, mxnet_values["metrics"]):
        assert metric.get() == (name, pytest.approx(value, rel=1e-5)), name


def test_probability_labels_differ_from_class_indices(mxnet_values):
    """The probability form is not the class-index form under another name: on these inputs the
    two losses differ (so the comparison above can fail)."""
    import torch

    data = _inputs()
    as_indices = torch.nn.CrossEntropyLoss(reduction="none")(torch.tensor(data["logits"]),
                                                             torch.tensor(data["soft"]).argmax(1))
    assert np.abs(as_indices.numpy() - np.asarray(mxnet_values["losses"][0])).max() > 0.1


@pytest.mark.parametrize("spelling", [
    "import mxnet as mx\nm = mx.gluon.metric.RMSE()\n",
    "from mxnet.gluon import metric\nm = metric.MAE(name='err')\n",
    "from mxnet.metric import TopKAccuracy\nm = TopKAccuracy(top_k=5)\n",
])
def test_metric_spellings_are_translated(spelling):
    out = engine.fix(spelling, engine.Options(registry.select("torch"))).source
    assert "mxnet" not in out and "class Gluon" in out and "m = Gluon" in out, out


@pytest.mark.parametrize("spelling", [
    "import mxnet as mx\nm = mx.metric.TopKAccuracy(k)\n",  # k computed at run time
    "import mxnet as mx\nm = mx.metric.TopKAccuracy(1)\n",  # MXNet refuses top_k=1
    "import mxnet as mx\nm = mx.metric.MAE('mae', ['out'])\n",  # output_names
    "import mxnet as mx\nm = mx.metric.F1()\n",
])
def test_metrics_left_for_a_person_are_reported(spelling):
    result = engine.fix(spelling, engine.Options(registry.select("torch")))
    assert "mx.metric." in result.source
    findings = engine.check(spelling, engine.Options(registry.select("torch")))
    assert any(f.code == "GL402" and f.position.line == 2 for f in findings.findings), findings.findings
