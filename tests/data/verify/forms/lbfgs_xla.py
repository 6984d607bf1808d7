"""LBFGS: optimizer.step(closure) evaluates the loss (and its backward pass) several times."""
import torch
import torch_xla
import torch.nn as nn
import torch.nn.functional as F

device = torch_xla.device()
torch.manual_seed(0)
model = nn.Linear(6, 1).to(device)
x = torch.randn(64, 6, device=device)
y = x @ torch.arange(1.0, 7.0, device=device).unsqueeze(1) + 0.1 * torch.randn(64, 1, device=device)
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3, history_size=5)
for epoch in range(20):
    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss
    optimizer.step(closure)
    torch_xla.sync()
print("done")
