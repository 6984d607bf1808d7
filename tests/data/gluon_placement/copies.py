"""Gluon placement spellings in one small training script (tests/test_gluon_placement.py): the
context given by keyword, copyto onto a context and into an existing array, a label moved to
its batch's context."""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

mx.random.seed(0)
ctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()
features = nd.array(np.random.RandomState(0).normal(size=(64, 8)), dtype="float32")
labels = nd.arange(64) % 4
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(features, labels), batch_size=16)
net = nn.HybridSequential()
net.add(nn.Dense(16, activation="relu"), nn.Dense(4))
net.initialize(mx.init.Xavier(), ctx=ctx)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
scores = nd.zeros((16, 4), ctx=ctx)
for epoch in range(2):
    for data, label in loader:
        data = data.as_in_context(context=ctx)
        label = label.as_in_context(data.context)
        shifted = data.copyto(ctx) + 1
        with autograd.record():
            out = net(data) + 0.1 * net(shifted)
            loss = loss_fn(out, label)
        loss.backward()
        trainer.step(data.shape[0])
        out.copyto(scores)
    print(f"epoch {epoch} loss {loss.mean().asscalar():.6f} score {scores.sum().asscalar():.4f}")
