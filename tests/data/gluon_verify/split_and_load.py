"""A Gluon training script for porter's tests: the batch goes through
gluon.utils.split_and_load on a list of contexts (one here), a DataLoader over an
ArrayDataset, BatchNorm, Adam and trainer.step(batch_size). Synthetic data from the seed; nothing downloaded."""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn


def build(hidden, classes):
    net = nn.HybridSequential()
    net.add(nn.Dense(hidden, in_units=20, activation="relu"))
    net.add(nn.BatchNorm(in_channels=hidden))
    net.add(nn.Dense(classes, in_units=hidden))
    return net


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    ctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()

    rng = np.random.RandomState(args.seed)
    x = rng.randn(64, 20).astype(np.float32)
    y = (x[:, :4].sum(axis=1) > 0).astype(np.float32) + (x[:, 4] > 1).astype(np.float32)
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=args.batch_size, shuffle=True)

    net = build(32, 3)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for epoch in range(args.epochs):
        for i, (data, label) in enumerate(loader):
            data = gluon.utils.split_and_load(data, [ctx])[0]
            label = gluon.utils.split_and_load(label, [ctx])[0]
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(data.shape[0])
            if i % 4 == 0:
                print(f"epoch {epoch} batch {i} loss={loss.mean().asscalar():.5f}")


if __name__ == "__main__":
    main()
