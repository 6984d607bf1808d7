"""An MLP classifier on synthetic blobs, shuffled by the global generator."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--debug-print", action="store_true")  # the port's option; nothing here
args = parser.parse_args()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
rng = np.random.default_rng(0)
features = torch.from_numpy(rng.standard_normal((256, 10)).astype(np.float32))
labels = torch.from_numpy(rng.integers(0, 3, 256))
loader = DataLoader(TensorDataset(features, labels), batch_size=32, shuffle=True, drop_last=True)
model = MLP().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(args.epochs):
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if i % 4 == 0:
            print(f"epoch {epoch} batch {i} loss {loss.item():.4f}")
print("done")
