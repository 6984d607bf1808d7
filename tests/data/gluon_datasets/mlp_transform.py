"""A Gluon MLP on MNIST as Gluon's samples come: the dataset's transform(fn) flattens and scales
the HWC uint8 image (porter's own test script)."""
import argparse

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()


def flatten_and_scale(data, label):
    data = data.reshape((-1,)).astype(np.float32) / 255
    return data, label


train_data = gluon.data.DataLoader(
    gluon.data.vision.MNIST("./data", train=True).transform(flatten_and_scale),
    batch_size=args.batch_size, shuffle=True, last_batch="discard")

net = nn.Sequential()
net.add(nn.Dense(32, activation="relu"))
net.add(nn.Dense(10))
ctx = mx.gpu(0) if mx.context.num_gpus() > 0 else mx.cpu()
net.initialize(mx.init.Xavier(magnitude=2.24), ctx=ctx)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
metric = mx.metric.Accuracy()

for epoch in range(args.epochs):
    metric.reset()
    for i, (data, label) in enumerate(train_data):
        data = data.as_in_context(ctx)
        label = label.as_in_context(ctx)
        with autograd.record():
            output = net(data)
            loss = loss_fn(output, label)
        loss.backward()
        trainer.step(data.shape[0])
        metric.update([label], [output])
    print("epoch", epoch, *metric.get())
