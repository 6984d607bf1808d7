"""Named children: classes deriving from nn.Sequential (layers given to super().__init__, or
assigned as attributes after it), nn.Sequential(OrderedDict(...)), add_module with computed
names into a Sequential and into a module, register_module, and a Sequential subclass whose
own step calls the Sequential's."""
from collections import OrderedDict

import torch
import torch.nn as nn


class ConvBN(nn.Sequential):
    def __init__(self, cin, cout, stride=1):
        layers = [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
        super().__init__(*layers)
        self.out_channels = cout


class Transition(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, cout, kernel_size=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class Scaled(nn.Sequential):
    def forward(self, x):
        return super().forward(x) * 0.5


class Heads(nn.Module):
    def __init__(self, c, n):
        super().__init__()
        for i in range(n):
            self.add_module("head%d" % (i + 1), nn.Linear(c, 3))
        self.register_module("extra", nn.Linear(c, 3))
        self.n = n

    def forward(self, x):
        out = self.extra(x)
        for i in range(self.n):
            out = out + getattr(self, f"head{i + 1}")(x)
        return out


class Net(nn.Module):
    def __init__(self, widths=(8, 12)):
        super().__init__()
        self.features = nn.Sequential(OrderedDict([
            ("stem", ConvBN(3, widths[0], 2)),
            ("pool0", nn.MaxPool2d(3, 2, 1)),
        ]))
        c = widths[0]
        for i, w in enumerate(widths[1:]):
            self.features.add_module("block%d" % (i + 1), ConvBN(c, w))
            self.features.add_module(f"transition{i + 1}", Transition(w, w))
            c = w
        self.scaled = Scaled(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))
        self.heads = Heads(c, 2)

    def forward(self, x):
        x = self.scaled(self.features(x))
        return self.heads(torch.mean(x, dim=(2, 3)))
