"""Gradient accumulation (two backward passes per optimizer step) and a clamp of the weights
after each step (as a WGAN critic does): neither is a manual optimizer step."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(10):
    for micro in range(2):
        loss = F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)) / 2
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    for p in model.parameters():
        p.data.clamp_(-0.5, 0.5)
print("done")
