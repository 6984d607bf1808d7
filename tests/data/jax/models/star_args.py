"""Layers built with star arguments: a conv block forwarding `**kwargs` to `nn.Conv2d`
(kernel size, stride, padding, groups given by keyword at each call), a block forwarding
`*args` (positional kernel size and stride), pooling from a dict of keyword arguments; local
annotations naming `Tensor` and a namedtuple's `__annotations__` holding `Tensor` values; the
block classes given as a list (a parameter annotated `Optional[list[Callable[..., nn.Module]]]`
defaulting to a list literal, a tuple literal) and taken out by index."""
from collections import namedtuple
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
from torch import Tensor

Outputs = namedtuple("Outputs", ["logits", "features"])
Outputs.__annotations__ = {"logits": Tensor, "features": Optional[Tensor]}


class ConvBN(nn.Module):
    def __init__(self, cin: int, cout: int, **kwargs: Any) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x)))


class PosConv(nn.Module):
    def __init__(self, cin, cout, *args):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, *args)

    def forward(self, x):
        return self.conv(x)


class Net(nn.Module):
    def __init__(self, num_classes: int = 5, blocks: Optional[list[Callable[..., nn.Module]]] = None) -> None:
        super().__init__()
        if blocks is None:
            blocks = [ConvBN, PosConv]
        conv_block = blocks[0]
        pool = {"kernel_size": 3, "stride": 2, "ceil_mode": True}
        self.stem = conv_block(3, 8, kernel_size=3, stride=2, padding=1)
        self.pool = nn.MaxPool2d(**pool)
        pair = (ConvBN, PosConv)
        self.branch = pair[0](8, 8, kernel_size=(1, 3), padding=(0, 1), groups=2)
        mix_block = pair[1]
        self.mix = mix_block(16, 12, 3, 1, 1)
        self.avg = nn.AvgPool2d(**{"kernel_size": 2, "count_include_pad": False, "padding": 1})
        self.fc = nn.Linear(12, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(self.stem(x))
        y: Optional[Tensor] = self.branch(x)
        x = self.avg(self.mix(torch.cat([x, y], 1)))
        feats: Tensor = x.mean((2, 3))
        return Outputs(self.fc(feats), feats).logits
