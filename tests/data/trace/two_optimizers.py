"""Two optimizers (a created first, then b) stepping in turn, two backward calls before one
step, a non-scalar backward, and a trailing backward with no step.
Writes the values it computed to the JSON file given as the first argument."""

import json
import sys

import torch

torch.manual_seed(3)
net_a = torch.nn.Linear(3, 1)
net_b = torch.nn.Linear(3, 2)
opt_a = torch.optim.SGD(net_a.parameters(), lr=0.1)  # index 0
opt_b = torch.optim.Adam(net_b.parameters(), lr=0.1)  # index 1
seen = []
for _ in range(2):
    x = torch.randn(5, 3)
    out_b = net_b(x)  # non-scalar: backward with an explicit gradient
    out_b.backward(torch.ones_like(out_b))
    opt_b.step()
    seen.append([out_b.sum().item()])
    first = net_a(x).pow(2).mean()
    second = net_a(x).abs().mean()
    first.backward()
    second.backward()
    opt_a.step()
    seen.append([first.item(), second.item()])
tail = net_a(torch.randn(5, 3)).mean()
tail.backward()
with open(sys.argv[1], "w") as f:
    json.dump({"steps": seen, "tail": tail.item()}, f)
sys.exit(0)  # SystemExit(0) is a success
