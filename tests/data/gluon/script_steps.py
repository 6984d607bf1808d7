"""A small Gluon training script whose port tests/test_gluon_ports.py runs against the
original: the script-side rules' semantics end to end (the per-sample loss, trainer.step(n)
on a ragged last batch, clip_global_norm before the step, SGD with momentum and wd or Adam
with beta1 and wd, load_parameters/save_parameters).

usage: python script_steps.py INIT.params OUT.params sgd|adam softmax|sigmoid
"""
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn


def build(outputs):
    net = nn.Sequential()
    net.add(nn.Dense(8, in_units=6, activation="relu"))
    net.add(nn.Dense(outputs, in_units=8))
    return net


def main():
    init_path, out_path, optimizer, loss_kind = sys.argv[1:5]
    ctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()
    rng = np.random.RandomState(0)
    x = rng.randn(10, 6).astype(np.float32)
    softmax_ce = gluon.loss.SoftmaxCrossEntropyLoss()
    sigmoid_bce = gluon.loss.SigmoidBinaryCrossEntropyLoss()
    if loss_kind == "softmax":
        y = rng.randint(0, 4, size=10).astype(np.float32)
        net = build(4)
    else:
        y = (rng.rand(10) > 0.5).astype(np.float32)
        net = build(1)
    net.load_parameters(init_path, ctx=ctx)
    if optimizer == "sgd":
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.9, "wd": 0.01})
    else:
        trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01, "wd": 0.01, "beta1": 0.8})
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=4, shuffle=False)  # 4, 4, 2
    losses = []
    for epoch in range(2):
        for data, label in loader:
            data = data.as_in_context(ctx)
            label = label.as_in_context(ctx)
            with autograd.record():
                output = net(data)
                if loss_kind == "softmax":
                    loss = softmax_ce(output, label)
                else:
                    loss = sigmoid_bce(output, label)
            loss.backward()
            grads = [p.grad(ctx) for p in params]
            gluon.utils.clip_global_norm(grads, 0.3 * data.shape[0])
            trainer.step(data.shape[0])
            losses.append(loss.mean().asscalar())
    net.save_parameters(out_path)
    print(" ".join(f"{value:.9g}" for value in losses))


if __name__ == "__main__":
    main()
