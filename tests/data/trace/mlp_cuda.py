"""A GPU-style training script: the ORIGINAL side of a port (run with the CUDA shim)."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
torch.backends.cudnn.benchmark = True
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


x = torch.randn(100, 10)
y = 0.3 * x.sum(1, keepdim=True) + 0.1 * torch.randn(100, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, pin_memory=True)  # last batch: 4

model = MLP().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.MSELoss()

for epoch in range(args.epochs):
    model.train()
    for step, (xb, yb) in enumerate(loader):
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        xb = xb + 0.01 * torch.randn_like(xb)
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.5f}")
torch.cuda.synchronize()
print("max memory", torch.cuda.max_memory_allocated())
