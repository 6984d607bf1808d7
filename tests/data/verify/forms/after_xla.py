"""Trains for --batches steps, then fails after its training loop (--end; `evaluate`: only the port
fails, in an evaluation of its own, where the original runs to its end)."""
import argparse
import sys

import torch
import torch_xla
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batches", type=int, default=4)
parser.add_argument("--end", choices=["reload", "exit", "evaluate"], default="reload")
args = parser.parse_args()

device = torch_xla.device()
torch.manual_seed(0)
model = nn.Linear(8, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
xs = torch.randn(args.batches, 16, 8)  # on the host: one batch goes to the device at a time
ys = torch.randint(0, 2, (args.batches, 16))
for i in range(args.batches):
    x, y = xs[i].to(device), ys[i].to(device)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
if args.end == "reload":
    torch.save(model, "model.pt")  # the whole pickled module
    model = torch.load("model.pt")  # torch >= 2.6: weights_only=True refuses it
elif args.end == "evaluate":
    print(model(xs[0]).argmax(1).tolist())  # a host batch into the XLA model: the port's own bug
else:
    sys.exit("no validation data")
print("done")
