"""tv_train.py hand-ported to torch_xla (the PORTED side; run with PJRT_DEVICE=CPU)."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", choices=("mnist", "cifar10"), default="mnist")
parser.add_argument("--data", default="./data")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--digest-file", default=None)
args = parser.parse_args()

torch.manual_seed(1)
device = torch_xla.device()

if args.dataset == "mnist":
    channels, size = 1, 28
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(args.data, train=True, download=True, transform=transform)
else:
    channels, size = 3, 32
    transform = transforms.Compose([
        transforms.RandomCrop(32, padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    ])
    train_set = datasets.CIFAR10(root=args.data, train=True, download=True, transform=transform)
# every batch full: one compiled graph per step shape
loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=0, drop_last=True)


class Net(nn.Module):
    def __init__(self, channels, size, classes):
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3)
        self.fc = nn.Linear(8 * ((size - 2) // 2) ** 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


model = Net(channels, size, len(train_set.classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)


def digest(step, data, target):
    h = hashlib.sha256(data.float().numpy().tobytes() + target.numpy().tobytes()).hexdigest()
    with open(args.digest_file, "a") as f:
        f.write(f"port {step} {tuple(data.shape)} {h}\n")


def log(epoch, step, loss):
    print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


for epoch in range(args.epochs):
    model.train()
    for step, (data, target) in enumerate(loader):
        if args.digest_file:
            digest(step, data, target)  # on the host, before the batch goes to the device
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        if step % 10 == 0:
            xm.add_step_closure(log, args=(epoch, step, loss))
