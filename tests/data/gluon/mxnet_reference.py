"""Run in the MXNet venv by tests/test_gluon_script_rules.py: writes, for the checks of the
emitted Gluon code (weight converter, GluonAdam, metrics), what real MXNet 1.9.1 does.

usage: <mxnet python> mxnet_reference.py OUT_DIR
"""
import importlib.util
import json
import math
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

from porter.verify.side_mxnet import torch_style_names

REPO = Path(__file__).resolve().parents[3]
OUT = Path(sys.argv[1])
MODELS = {
    "mlp": ("get_mlp(hidden=16, num_classes=10)", (4, 784)),
    "cnn_bn_dropout": ("ConvNet(num_classes=10, channels=4, hidden=8)", (2, 1, 28, 28)),
    "lstm_lm": ("RNNModel(vocab_size=20, num_embed=8, num_hidden=8, num_layers=2)", (5, 3)),
    "dcgan": ("get_netG(nz=4, ngf=4, nc=3)", (2, 4, 1, 1)),
    "resnet": ("get_resnet(num_layers=8, classes=10, width=4)", (2, 3, 32, 32)),
}


def load(name):
    spec = importlib.util.spec_from_file_location(f"fx_{name}", REPO / "fixtures" / "mxnet" / name / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parameter_files():
    """Each fixture's model, initialized and run once (lazy shapes, BatchNorm statistics
    moved by one recorded step), saved with save_parameters; its arrays under the
    torch-style names of porter.verify.side_mxnet."""
    mx.random.seed(3)
    for name, (expr, shape) in MODELS.items():
        module = load(name)
        net = eval(expr, vars(module))
        net.initialize(mx.init.Normal(0.5))
        x = mx.nd.random.randint(0, 20, shape=shape).astype("float32") if name == "lstm_lm" else mx.nd.random.normal(shape=shape)
        with autograd.record():
            out = net(x)
            out = out[0] if isinstance(out, tuple) else out
        out.backward()  # BatchNorm's running statistics move in backward
        net.save_parameters(str(OUT / f"{name}.params"))
        arrays = {torch_name: p.data().asnumpy() for torch_name, p, _ in torch_style_names(net)}
        np.savez(OUT / f"{name}.npz", **arrays)
    # other dtypes and a bidirectional GRU, in the same file format
    mx.nd.save(str(OUT / "dtypes.params"), {"h": mx.nd.array([[1.5, -2]], dtype="float16"),
                                           "i": mx.nd.array([1, 2, 3], dtype="int64"),
                                           "u": mx.nd.array([7], dtype="uint8"),
                                           "d": mx.nd.array([0.1], dtype="float64")})
    gru = rnn.GRU(4, 2, bidirectional=True, input_size=3)
    gru.initialize()
    gru(mx.nd.ones((2, 1, 3)))
    gru.save_parameters(str(OUT / "gru.params"))
    np.savez(OUT / "gru.npz", **{n: p.data().asnumpy() for n, p, _ in torch_style_names(gru)})


def fixture_models():
    """Each fixture's model as port.toml names it (`model`, `inputs`), initialized, one
    recorded step, saved: `<name>.port.params` and the arrays under torch-style names."""
    import tomllib

    mx.random.seed(4)
    for name in MODELS:
        conf = tomllib.loads((REPO / "fixtures" / "mxnet" / name / "port.toml").read_text())
        module = load(name)
        net = eval(conf["model"], vars(module))
        net.initialize(mx.init.Normal(0.5))
        dtype, rest = conf["inputs"][0].split("[", 1)
        shape = tuple(int(d) for d in rest.split("]")[0].split(","))
        if dtype.startswith("int"):
            x = mx.nd.random.randint(0, int(rest.split("<")[1]), shape=shape).astype("float32")
        else:
            x = mx.nd.random.normal(shape=shape)
        with autograd.record():
            out = net(x)
            out = out[0] if isinstance(out, tuple) else out
        out.backward()
        net.save_parameters(str(OUT / f"{name}.port.params"))
        np.savez(OUT / f"{name}.port.npz", **{n: p.data().asnumpy() for n, p, _ in torch_style_names(net)})


def adam():
    """5 steps of gluon.Trainer's adam on a problem with small gradients (where epsilon's
    placement shows), from fixed weights and gradient scales."""
    rng = np.random.RandomState(0)
    w0 = rng.randn(64).astype(np.float32)
    scale = (10.0 ** rng.uniform(-9, 0, size=64)).astype(np.float32)
    target = rng.randn(64).astype(np.float32)
    w = gluon.Parameter("w", shape=(64,))
    w.initialize(mx.init.Constant(0))
    w.set_data(mx.nd.array(w0))
    trainer = gluon.Trainer([w], "adam", {"learning_rate": 0.01, "wd": 1e-3, "beta1": 0.8})
    out = []
    for _ in range(5):
        with autograd.record():
            loss = (mx.nd.array(scale) * (w.data() - mx.nd.array(target)) ** 2).sum()
        loss.backward()
        trainer.step(4)
        out.append(w.data().asnumpy().copy())
    np.savez(OUT / "adam.npz", w0=w0, scale=scale, target=target, steps=np.stack(out))


def discriminator_accuracy(label, pred):
    return ((pred.ravel() > 0) == (label.ravel() > 0.5)).mean()


def metrics():
    rng = np.random.RandomState(1)
    logits = rng.randn(3, 6, 5).astype(np.float32)
    labels = rng.randint(0, 5, size=(3, 6)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    acc, ppl, custom, lossm = mx.metric.Accuracy(), mx.metric.Perplexity(ignore_label=None), \
        mx.metric.CustomMetric(discriminator_accuracy, name="d_acc"), mx.metric.Loss()
    for b in range(3):
        acc.update([mx.nd.array(labels[b])], [mx.nd.array(logits[b])])
        ppl.update([mx.nd.array(labels[b])], [mx.nd.array(probs[b])])
        custom.update([mx.nd.array(labels[b] > 2)], [mx.nd.array(logits[b][:, 0])])
        lossm.update(None, [mx.nd.array(logits[b][:, 1])])
    np.savez(OUT / "metrics.npz", logits=logits, labels=labels, probs=probs)
    (OUT / "metrics.json").write_text(json.dumps({m.get()[0]: m.get()[1] for m in (acc, ppl, custom, lossm)}))


if __name__ == "__main__":
    parameter_files()
    fixture_models()
    adam()
    metrics()
