"""mlp_cuda.py hand-ported to torch_xla (the PORTED side; run with PJRT_DEVICE=CPU)."""

import argparse

import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--keep-last", action="store_true", help="no drop_last: a ragged last batch")
parser.add_argument("--item-every-step", action="store_true", help="read loss.item() every step")
parser.add_argument("--report-metrics", help="write the script's own torch_xla counters here at the end")
args = parser.parse_args()

torch.manual_seed(0)
device = torch_xla.device()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


x = torch.randn(100, 10)
y = 0.3 * x.sum(1, keepdim=True) + 0.1 * torch.randn(100, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, drop_last=not args.keep_last)
train_loader = pl.MpDeviceLoader(loader, device)

model = MLP().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.MSELoss()


def log(epoch, step, loss):
    print(f"epoch {epoch} step {step} loss {loss.item():.5f}")


running = 0.0
for epoch in range(args.epochs):
    model.train()
    for step, (xb, yb) in enumerate(train_loader):
        xb = xb + 0.01 * torch.randn_like(xb)
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        xm.optimizer_step(optimizer)
        if args.item_every_step:
            running += loss.item()
        if step % 5 == 0:
            xm.add_step_closure(log, args=(epoch, step, loss))
xm.wait_device_ops()

if args.report_metrics:  # host-side counters: reading them transfers nothing
    import json

    import torch_xla.debug.metrics as met

    counts = {
        "compiles": met.metric_data("CompileTime")[0],
        "transfers": (met.metric_data("TransferFromDeviceTime") or [0])[0],
        "executions": met.counter_value("CachedCompile") + met.counter_value("UncachedCompile"),
    }
    with open(args.report_metrics, "w") as f:
        json.dump(counts, f)
