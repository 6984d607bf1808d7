"""A Gluon classifier on Fashion-MNIST whose dataset is bound to a name and given a
transform_first(fn) of its own, with accuracy read from the array methods argmax(axis=) and
astype (porter's own test script)."""
import argparse

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()


def to_chw(image):
    return image.transpose((2, 0, 1)).astype("float32") / 255


train_set = gluon.data.vision.FashionMNIST(train=True)
train_set = train_set.transform_first(to_chw)
train_loader = gluon.data.DataLoader(train_set, args.batch_size, shuffle=True, last_batch="discard")

net = nn.HybridSequential()
net.add(nn.Conv2D(4, kernel_size=5, activation="tanh"), nn.MaxPool2D(), nn.Flatten(), nn.Dense(10))
ctx = mx.gpu(0) if mx.context.num_gpus() > 0 else mx.cpu()
net.initialize(mx.init.Xavier(), ctx=ctx)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
softmax_ce = gluon.loss.SoftmaxCrossEntropyLoss()

for step, (images, labels) in enumerate(train_loader):
    images = images.as_in_context(ctx)
    labels = labels.as_in_context(ctx)
    with autograd.record():
        scores = net(images)
        loss = softmax_ce(scores, labels)
    loss.backward()
    trainer.step(images.shape[0])
    accuracy = (scores.argmax(axis=1) == labels.astype("float32")).mean()
    print(step, loss.mean().asscalar(), accuracy.asscalar())
    if step + 1 == args.steps:
        break
