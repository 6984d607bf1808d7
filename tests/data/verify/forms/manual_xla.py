"""Manual SGD: the parameters are updated by hand after each backward pass."""
import argparse

import torch
import torch_xla
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--update", choices=["data_add", "isub", "copy"], default="data_add")
parser.add_argument("--batches", type=int, default=20)
args = parser.parse_args()

device = torch_xla.device()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
xs = torch.randn(args.batches, 32, 8)  # on the host: one batch goes to the device at a time
ys = torch.randn(args.batches, 32, 1)
lr = 0.05
for i in range(args.batches):
    x, y = xs[i].to(device), ys[i].to(device)
    loss = F.mse_loss(model(x), y)
    model.zero_grad()
    loss.backward()
    if args.update == "data_add":
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
    elif args.update == "isub":
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p - lr * p.grad)
    torch_xla.sync()
    if i % 5 == 0:
        print(f"batch {i} loss {loss.item():.4f}")
print("done")
