"""Gluon convolutions whose arguments are known only when they run (porter's tests): a
helper's `**kwargs` with a literal beside them, a positional tuple unpacked with `*`, and a
dict unpacked in place with an activation among its keys; lazy and sized input channels."""
from mxnet.gluon import nn
from mxnet.gluon.nn import HybridBlock


def conv_bn(**kwargs):
    out = nn.HybridSequential(prefix='')
    out.add(nn.Conv2D(use_bias=False, **kwargs))
    out.add(nn.BatchNorm())
    return out


class ArgsNet(HybridBlock):
    def __init__(self, **kwargs):
        super(ArgsNet, self).__init__(**kwargs)
        spec = {'channels': 6, 'kernel_size': 3, 'padding': 1}
        self.a = conv_bn(**spec)
        strides_padding = (2, 1)
        self.b = nn.Conv2D(4, 3, *strides_padding, activation='relu', in_channels=6)
        self.c = nn.Conv2D(in_channels=4, **dict(channels=5, kernel_size=1, activation='tanh'))
        self.out = nn.Dense(3)

    def hybrid_forward(self, F, x):
        return self.out(self.c(self.b(self.a(x))))
