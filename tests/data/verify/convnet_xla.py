"""A small CNN with BatchNorm and dropout, as it would be written for a GPU."""
import torch
import torch_xla
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ConvNet(nn.Module):
    def __init__(self, num_classes=10, width=8):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.layer1 = nn.Sequential(Block(width, width), Block(width, width))
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        x = self.layer1(F.relu(self.stem(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(self.drop(x))


def example_inputs():
    return (torch.randn(4, 3, 16, 16),)


if __name__ == "__main__":
    model = ConvNet().to(torch_xla.device())
    print(model(torch.randn(2, 3, 16, 16).to(torch_xla.device())).shape)
