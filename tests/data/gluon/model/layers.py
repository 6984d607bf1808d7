"""Gluon models covering the layers and arguments the five fixtures do not use (tests of the
Gluon model rules: tests/test_gluon_model_rules.py ports this file and compares each model's
forward with MXNet's)."""
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn, rnn


def conv1d_net():
    """(N, 4, 16) -> (N, 5)"""
    net = nn.HybridSequential()
    net.add(nn.Conv1D(8, 3, padding=1, in_channels=4), nn.Activation("softrelu"))  # (a BatchNorm here: MXNet 1.9.1 cannot read its gradients back)
    net.add(nn.AvgPool1D(2))
    net.add(nn.Conv1D(6, 3, strides=2, use_bias=False))
    net.add(nn.GlobalMaxPool1D())
    net.add(nn.Flatten())
    net.add(nn.Dense(5, activation="tanh"))
    return net


def conv2d_net():
    """(N, 4, 9, 9) -> (N, 3)"""
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Conv2D(8, kernel_size=(3, 3), strides=(1, 1), padding=(1, 1), in_channels=4, groups=2))
        net.add(nn.BatchNorm(momentum=0.8))
        net.add(nn.MaxPool2D(pool_size=3, strides=2, ceil_mode=True))
        net.add(nn.Conv2DTranspose(4, 3, strides=2, padding=1, output_padding=1))
        net.add(nn.AvgPool2D(pool_size=2, padding=1, count_include_pad=False))
        net.add(nn.Activation("softsign"))
        net.add(nn.GlobalAvgPool2D())
        net.add(nn.Dense(3))
    return net


class DenseBN(gluon.HybridBlock):
    """(N, 10) -> (N, 3): BatchNorm after a Dense (1-d), activations inside Dense."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fc1 = nn.Dense(16, in_units=10, activation="sigmoid")
        self.bn = nn.BatchNorm(momentum=0.8, epsilon=1e-3)
        self.act = nn.LeakyReLU(0.1)
        self.fc2 = nn.Dense(3, use_bias=False)

    def hybrid_forward(self, F, x):
        h = self.act(self.bn(self.fc1(x)))
        return F.softmax(self.fc2(h), axis=-1) + F.mean(h, axis=1, keepdims=True)


class GRUTagger(gluon.HybridBlock):
    """tokens (N, T) -> (N, T, 7): a bidirectional 2-layer GRU, batch first, called without
    states (Gluon returns the output alone)."""

    def __init__(self, vocab=20, **kwargs):
        super(GRUTagger, self).__init__(**kwargs)
        with self.name_scope():
            self.emb = nn.Embedding(vocab, 8)
            self.gru = rnn.GRU(12, num_layers=2, layout="NTC", input_size=8, bidirectional=True)
            self.proj = nn.Dense(7, flatten=False, in_units=24)

    def hybrid_forward(self, F, tokens):
        out = self.gru(self.emb(tokens))
        return F.Activation(self.proj(out), act_type="tanh")


class NormActs(gluon.HybridBlock):
    """(N, 6) -> (N, 6): LayerNorm after a Dense, PReLU with a channel each, ELU, SELU, GELU, Swish.
    (MXNet 1.9.1's SELU backward is wrong for negative inputs: `selu=False` puts an ELU there.)"""

    def __init__(self, selu=True, **kwargs):
        super(NormActs, self).__init__(**kwargs)
        self.fc = nn.Dense(6, in_units=6)
        self.ln = nn.LayerNorm(epsilon=1e-6)
        self.prelu = nn.PReLU(in_channels=6)
        self.elu = nn.ELU(0.5)
        self.selu = nn.SELU() if selu else nn.ELU()
        self.gelu = nn.GELU()
        self.swish = nn.Swish()

    def hybrid_forward(self, F, x):
        h = self.prelu(self.ln(self.fc(x)))
        return self.swish(self.gelu(self.selu(self.elu(h))))


def lenet():
    """(N, 1, 12, 12) -> (N, 10): convolutions with Gluon's activation= (one layer each)."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, activation="relu"))
    net.add(nn.MaxPool2D())
    net.add(nn.Conv2D(16, 3, activation="sigmoid", padding=1))
    net.add(nn.Flatten())
    net.add(nn.Dense(10))
    return net
