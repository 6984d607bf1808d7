"""Layers given as factories and models built by helper functions: a norm layer class as a
parameter default, assigned in __init__, wrapped in functools.partial and kept in an
attribute; activation classes passed positionally; a builder chain that passes on **kwargs
(`small_net(**kwargs)` -> `_net(cfg, **kwargs)` -> `Net(make_stem(cfg), **kwargs)`);
pooling with ceil_mode and an adaptive pool whose output size does not divide its input."""
from functools import partial
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin, cout, norm_layer=nn.BatchNorm2d, act=nn.ReLU):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), norm_layer(cout), act(inplace=True))


def make_stem(cfg, norm_layer=None):
    layers = []
    cin = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True))
        else:
            layers.append(conv_bn(cin, v, norm_layer or nn.BatchNorm2d))
            cin = v
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, c, norm_layer: Optional[Callable[..., nn.Module]] = None, activation_layer=nn.SiLU):
        super().__init__()
        if norm_layer is None:
            norm_layer = partial(nn.BatchNorm2d, eps=1e-3, momentum=0.2)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = norm_layer(c)
        self.act = activation_layer()

    def forward(self, x):
        return self.act(self.bn(self.conv(x))) + x


class Net(nn.Module):
    def __init__(self, stem, num_classes=10, norm_layer=None, head_norm=partial(nn.LayerNorm, eps=1e-6),
                 pool=nn.AvgPool2d):
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        self._norm_layer = norm_layer
        self.stem = stem
        self.pool = pool(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.layer = self._make(8, 2)
        self.avg = nn.AdaptiveAvgPool2d((3, 2))
        self.norm = head_norm(8 * 6)
        self.fc = nn.Linear(8 * 6, num_classes)

    def _make(self, c, n):
        norm_layer = self._norm_layer
        return nn.Sequential(*[Block(c, norm_layer, nn.GELU) for _ in range(n)])

    def forward(self, x):
        x = self.layer(self.pool(self.stem(x)))
        x = F.max_pool2d(x, 3, stride=1, padding=1, ceil_mode=True) + F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        x = torch.flatten(self.avg(x), 1)
        return self.fc(self.norm(x))


CFGS = {"small": [8, "M", 8]}


def _net(cfg, **kwargs):
    return Net(make_stem(CFGS[cfg]), **kwargs)


def small_net(**kwargs):
    return _net("small", **kwargs)
