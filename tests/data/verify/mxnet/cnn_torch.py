"""A hand-written torch equivalent of fixtures/mxnet/cnn_bn_dropout's ``ConvNet`` (for 1x28x28
inputs), with the torch names the MXNet side gives the Gluon model: it proves the name and
layout mapping (tests only). Gluon's BatchNorm momentum 0.9 is torch's 0.1, eps 1e-5 both."""
import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, num_classes=10, channels=16, hidden=64, dropout=0.5, in_channels=1, size=28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels, momentum=0.1, eps=1e-5)
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(channels, channels * 2, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels * 2, momentum=0.1, eps=1e-5)
        self.pool2 = nn.MaxPool2d(2, 2)
        self.dropout1 = nn.Dropout(dropout / 2)
        self.fc1 = nn.Linear(channels * 2 * (size // 4) ** 2, hidden)
        self.dropout2 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        x = self.dropout1(x)
        x = F.relu(self.fc1(torch.flatten(x, 1)))  # Gluon's Dense(flatten=True)
        x = self.dropout2(x)
        return self.fc2(x)
