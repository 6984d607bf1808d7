"""A Gluon CNN on CIFAR-10 with a lambda as the dataset's transform (NDArray methods on the HWC
image), the batch read as a list, and a block that flattens with the array's method (porter's
own test script)."""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn
from mxnet.gluon.data.vision import CIFAR10

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()


class SmallConv(gluon.HybridBlock):
    def __init__(self, classes=10, **kwargs):
        super(SmallConv, self).__init__(**kwargs)
        with self.name_scope():
            self.conv = nn.Conv2D(8, kernel_size=3, padding=1, activation="relu")
            self.pool = nn.MaxPool2D(pool_size=2)
            self.out = nn.Dense(classes, flatten=False)

    def hybrid_forward(self, F, x):
        x = self.pool(self.conv(x))
        return self.out(x.flatten())


train_set = CIFAR10(train=True).transform(
    lambda img, lbl: (nd.transpose(img.astype("float32"), (2, 0, 1)) / 128.0 - 1, lbl))
loader = gluon.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True, last_batch="discard")

ctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()
net = SmallConv()
net.initialize(mx.init.Normal(0.05), ctx=ctx)
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr})
criterion = gluon.loss.SoftmaxCrossEntropyLoss()

for batch in loader:
    data = batch[0].as_in_context(ctx)
    label = batch[1].as_in_context(ctx)
    with autograd.record():
        loss = criterion(net(data), label)
    loss.backward()
    trainer.step(args.batch_size)
    print("loss", loss.mean().asscalar())
