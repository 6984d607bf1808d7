"""Inputs built as float32 explicitly (--inputs): a float64 default dtype cannot run them."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--inputs", choices=["numpy", "dtype", "float"], default="numpy")
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
rng = np.random.default_rng(0)
for i in range(12):
    if args.inputs == "numpy":
        x = torch.from_numpy(rng.standard_normal((8, 1, 8, 8)).astype(np.float32))
    elif args.inputs == "dtype":
        x = torch.randn(8, 1, 8, 8, dtype=torch.float32)
    else:
        x = torch.tensor(rng.standard_normal((8, 1, 8, 8))).float()
    y = torch.from_numpy(rng.integers(0, 3, 8))
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
print("done")
