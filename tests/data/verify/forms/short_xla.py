"""short.py's port, with the partial last batch dropped (as drop_last=True does): one optimizer
step fewer than the original where --samples is not a multiple of 16."""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=40)
parser.add_argument("--end", choices=["none", "exit0"], default="none")
args = parser.parse_args()

device = torch_xla.device()
torch.manual_seed(0)
model = nn.Linear(8, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
xs = torch.randn(args.samples, 8)
ys = torch.randint(0, 2, (args.samples,))
for start in range(0, args.samples - 15, 16):
    x, y = xs[start:start + 16].to(device), ys[start:start + 16].to(device)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
print("trained")
if args.end == "exit0":
    sys.exit(0)
