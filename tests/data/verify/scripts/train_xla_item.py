"""A port of train.py that reads the loss with .item() on every step (for a running mean in the
log line): a device-to-host transfer in steps that log nothing."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--drop-last", action="store_true", help="drop the ragged last batch")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch_xla.manual_seed(args.seed)
    device = torch_xla.device()
    n = 5 * args.batch_size + args.batch_size // 2
    x = torch.randn(n, 12)
    y = (x[:, :3].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(1, args.epochs + 1):
        total_loss = 0.0
        for batch_idx, (data, target) in enumerate(pl.MpDeviceLoader(loader, device)):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            total_loss += loss.item()
            if batch_idx % args.log_interval == 0:
                print(f"epoch {epoch} batch {batch_idx} loss {loss.item():.4f} mean {total_loss / (batch_idx + 1):.4f}")


if __name__ == "__main__":
    main()
