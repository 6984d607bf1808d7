"""Trains two steps, then fails: the trace must record the steps and the traceback."""

import torch


def broken_batch(step):
    if step == 2:
        raise ValueError(f"corrupt batch at step {step}")
    return torch.randn(4, 3), torch.randn(4, 1)


model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    xb, yb = broken_batch(step)
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
