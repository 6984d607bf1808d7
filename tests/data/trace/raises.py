"""Trains two steps, then fails (or exits with the code given as the first argument)."""

import sys

import torch


def batch(step):
    if step == 2:
        if len(sys.argv) > 1:
            sys.exit(int(sys.argv[1]))
        raise ValueError(f"corrupt batch at step {step}")
    return torch.randn(4, 3), torch.randn(4, 1)


model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    xb, yb = batch(step)
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
