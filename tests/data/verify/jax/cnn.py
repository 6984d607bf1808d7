"""A small CNN with BatchNorm, dropout and a Linear after flatten (the original)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(16 * 4 * 4, num_classes)

    def forward(self, x):  # x: (N, 3, 16, 16)
        x = self.features(x)  # (N, 8, 8, 8)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # (N, 16, 4, 4)
        return self.fc(self.drop(x.flatten(1)))


def example_inputs():
    return (torch.randn(4, 3, 16, 16),)


if __name__ == "__main__":
    print(SmallCNN()(*example_inputs()).shape)
