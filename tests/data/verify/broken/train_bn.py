"""train.py with BatchNorm in place of dropout: the original of train_bn_xla_no_train_mode.py."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, features=16, hidden=32, num_classes=4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def synthetic(n, features, num_classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return x, x[:, :num_classes].argmax(dim=1)


def evaluate(model, data, target):
    model.eval()
    with torch.no_grad():
        loss = F.cross_entropy(model(data), target)
    print(f"eval loss {loss.item():.4f}")
    model.train()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--eval-interval", type=int, default=3)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = synthetic(args.steps * args.batch_size, 16, 4, args.seed)
    val_x, val_y = synthetic(64, 16, 4, args.seed + 1)
    val_x, val_y = val_x.to(device), val_y.to(device)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay)
    model.train()
    for step in range(1, args.steps + 1):
        batch = slice((step - 1) * args.batch_size, step * args.batch_size)
        data, target = x[batch].to(device), y[batch].to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if step % args.log_interval == 0:
            print(f"step {step} loss {loss.item():.4f}")
        if step % args.eval_interval == 0:
            evaluate(model, val_x, val_y)


if __name__ == "__main__":
    main()
