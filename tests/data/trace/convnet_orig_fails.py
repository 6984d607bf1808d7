"""An original whose model cannot run: model-level verification must stop the port, which was
started alongside it and waits for the original's weights."""
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        raise RuntimeError("the original's forward pass is broken")
