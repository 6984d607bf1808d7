"""A model whose input sizes are left to the first forward (torch's lazy layers), as ports of
Gluon code with deferred input sizes are. Used as both sides of a verification (tests only)."""
import torch
from torch import nn


class LazyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.LazyConv2d(4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.LazyLinear(5)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))
