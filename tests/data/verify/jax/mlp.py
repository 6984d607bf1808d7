"""A small MLP with dropout, as it would be written for a GPU (the original)."""
import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=32, n_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.head(self.drop(x))


if __name__ == "__main__":
    print(MLP()(torch.randn(2, 16)).shape)
