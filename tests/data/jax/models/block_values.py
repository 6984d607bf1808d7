"""Module classes reached through values: stateless activation classes passed as arguments
(`gate=nn.Hardsigmoid` in functools.partial, a parameter default `gate=nn.Sigmoid`, then
`gate()`); the block class of each stage read from a config object (a dataclass field
annotated `Callable[..., nn.Module]`, a plain class's attribute set from a parameter whose
default is a module class) and called as `cfg.block(...)`; an optional shortcut that is
None in one branch and a module in the other."""
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch
import torch.nn as nn


class Gate(nn.Module):
    def __init__(self, c, squeeze, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.reduce = nn.Conv2d(c, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, c, 1)
        self.act = act()
        self.gate = gate()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class Plain(nn.Module):
    def __init__(self, cfg, gate_layer: Callable[..., nn.Module] = partial(Gate, gate=nn.Hardsigmoid)):
        super().__init__()
        self.conv = nn.Conv2d(cfg.cin, cfg.cout, 3, stride=cfg.stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cfg.cout)
        self.gate = gate_layer(cfg.cout, max(1, cfg.cout // 4))
        self.shortcut = None
        if cfg.stride != 1 or cfg.cin != cfg.cout:
            self.shortcut = nn.Conv2d(cfg.cin, cfg.cout, 1, stride=cfg.stride, bias=False)

    def forward(self, x):
        y = self.gate(torch.relu(self.bn(self.conv(x))))
        if self.shortcut is not None:
            return y + self.shortcut(x)
        return y + x


class Wide(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cfg.cin, cfg.cout * 2, 1, bias=False), nn.BatchNorm2d(cfg.cout * 2), nn.Hardswish(),
            nn.Conv2d(cfg.cout * 2, cfg.cout, 3, stride=cfg.stride, padding=1, bias=False), nn.BatchNorm2d(cfg.cout),
        )

    def forward(self, x):
        return self.body(x)


@dataclass
class StageConfig:
    cin: int
    cout: int
    stride: int
    block: Callable[..., nn.Module]


class LegacyConfig:
    def __init__(self, cin, cout, stride, block=Wide):
        self.cin, self.cout, self.stride = cin, cout, stride
        self.block = block


class Net(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        configs = [StageConfig(8, 8, 1, Plain), StageConfig(8, 12, 2, Plain), LegacyConfig(12, 16, 2),
                   StageConfig(16, 16, 1, Wide)]
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        stages = []
        for cfg in configs:
            stages.append(cfg.block(cfg))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(x.mean((2, 3)))
