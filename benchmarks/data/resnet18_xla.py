"""resnet18.py ported to torch_xla: the port side of the verify benchmark.

The model itself is device-agnostic, so the classes are those of the original; as a script
it does the same "direct" work as the original on the XLA device, with ``torch_xla.sync()``
closing each step and one read of the loss at the end.

    PJRT_DEVICE=CPU python benchmarks/data/resnet18_xla.py --steps 5
"""
import argparse
import time

import torch
import torch.nn.functional as F
import torch_xla

from resnet18 import BasicBlock, ResNet, ResNet18  # noqa: F401  (the port's model is the original's)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    t0 = time.perf_counter()
    device = torch_xla.device()
    torch.manual_seed(0)
    model = ResNet18().to(device)
    model.train()
    x = torch.randn(args.batch, 3, 32, 32).to(device)
    y = torch.randint(0, 10, (args.batch,)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
    print(f"loss {loss.item():.5f} after {args.steps} steps; {time.perf_counter() - t0:.2f} s after imports")
