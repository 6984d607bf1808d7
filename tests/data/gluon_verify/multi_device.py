"""A Gluon training script for porter's tests of the MXNet side only: the batch is split over
--devices CPU contexts with gluon.utils.split_and_load, one loss per context, one backward
pass per loss (or autograd.backward over the list with --together), trainer.step(batch_size)."""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--together", action="store_true")
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    devices = [mx.cpu(i) for i in range(args.devices)]
    rng = np.random.RandomState(args.seed)
    x = rng.randn(48, 10).astype(np.float32)
    y = rng.randint(0, 4, size=48).astype(np.float32)
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=8, shuffle=True)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu"), nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=devices)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(2):
        for data, label in loader:
            parts = gluon.utils.split_and_load(data, devices)
            labels = gluon.utils.split_and_load(label, devices)
            with autograd.record():
                losses = [loss_fn(net(a), b) for a, b in zip(parts, labels)]
            if args.together:
                autograd.backward(losses)
            else:
                for loss in losses:
                    loss.backward()
            trainer.step(data.shape[0])
        print(f"epoch {epoch} loss={sum(loss.mean().asscalar() for loss in losses) / len(losses):.5f}")


if __name__ == "__main__":
    main()
