"""A GAN-shaped Gluon step (porter's own test script): the discriminator's loss is computed in
two autograd.record() blocks (the real batch's, then the generated batch's) before its one
backward pass; the generator's step is one block. No random draws during training: the
generator's input is made from the batch."""
import argparse

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()

rng = np.random.RandomState(0)
dataset = gluon.data.ArrayDataset(rng.rand(64, 6).astype("float32"), np.zeros(64, dtype="float32"))
loader = gluon.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=False)

netD = nn.Sequential()
netD.add(nn.Dense(8, activation="relu", in_units=6), nn.Dense(2, in_units=8))
netG = nn.Sequential()
netG.add(nn.Dense(6, activation="tanh", in_units=3))
ctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()
netD.initialize(mx.init.Normal(0.1), ctx=ctx)
netG.initialize(mx.init.Normal(0.1), ctx=ctx)
trainerD = gluon.Trainer(netD.collect_params(), "sgd", {"learning_rate": 0.05})
trainerG = gluon.Trainer(netG.collect_params(), "sgd", {"learning_rate": 0.05})
loss = gluon.loss.SoftmaxCrossEntropyLoss()

for data, _ in loader:
    data = data.as_in_context(ctx)
    real_label = nd.ones((data.shape[0],), ctx=ctx)
    fake_label = nd.zeros((data.shape[0],), ctx=ctx)
    noise = data[:, :3] * 2 - 1

    with autograd.record():
        err_real = loss(netD(data), real_label)

    with autograd.record():
        fake = netG(noise)
        err_fake = loss(netD(fake.detach()), fake_label)
        errD = err_real + err_fake
    errD.backward()
    trainerD.step(data.shape[0])

    with autograd.record():
        errG = loss(netD(fake), real_label)
    errG.backward()
    trainerG.step(data.shape[0])
    print(errD.mean().asscalar(), errG.mean().asscalar())
