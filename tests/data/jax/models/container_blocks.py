"""Container subclasses with their own forward and the torch-only calls around them:
a ModuleDict subclass filled by add_module, item assignment and update, read back through
items(), values() and self[key]; a ModuleList subclass filled by super().__init__(list),
append, extend and insert, read through iteration, negative indices and len; a Sequential
subclass with its own forward; torch._assert checks on shapes, torch.fx.wrap registrations,
torch.utils.checkpoint (a closure, a module, use_reentrant= either way) and F.dropout with
training=self.training in module code (keyword and positional spellings, p=0 here so that the
two sides compare) and in a module-level function called with training=self.training, in-place
updates of slices of a local tensor, and a parameter made by torch.empty(...).normal_(std=...), a Sequential of an OrderedDict filled
in a local name."""
from collections import OrderedDict

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _mix(x: Tensor, p: float, training: bool) -> Tensor:
    torch._assert(x.dim() == 4, f"expected NCHW, got {x.shape}")
    x = x.clone()
    x[:, :2].mul_(2.0)
    x[..., -1].zero_()
    return F.dropout(x, p=p, training=training) * 0.5


torch.fx.wrap("_mix")


class Layer(nn.Module):
    def __init__(self, cin, growth, drop_rate=0.0, memory_efficient=False):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, growth, 3, padding=1, bias=False)
        self.drop_rate = float(drop_rate)
        self.memory_efficient = memory_efficient

    def bottleneck(self, inputs):
        return self.conv(F.relu(torch.cat(inputs, 1)))

    def forward(self, inputs):
        # (BatchNorm outside the checkpointed part: torch's recomputation in the backward
        # updates the running statistics a second time, the port's single call once)
        inputs = [self.norm(torch.cat(inputs, 1))]
        if self.memory_efficient:
            def closure(*xs):
                return self.bottleneck(xs)

            out = cp.checkpoint(closure, *inputs, use_reentrant=False)
        else:
            out = self.bottleneck(inputs)
        if self.drop_rate > 0 or self.training:
            out = F.dropout(out, p=self.drop_rate, training=self.training)
        return nn.functional.dropout(out, self.drop_rate, self.training)


class Block(nn.ModuleDict):
    _version = 2

    def __init__(self, n, cin, growth, memory_efficient=False):
        super().__init__()
        for i in range(n - 1):
            self.add_module("layer%d" % (i + 1), Layer(cin + i * growth, growth, memory_efficient=memory_efficient))
        self[f"layer{n}"] = Layer(cin + (n - 1) * growth, growth)
        self.update({"tail": nn.Identity()})

    def forward(self, x):
        features = [x]
        for name, layer in self.items():
            if name != "tail":
                features.append(layer(features))
        torch._assert(len(self) == len(features), "one output per layer")
        return self["tail"](torch.cat(features, 1))


class Stages(nn.ModuleList):
    def __init__(self, c):
        super().__init__([nn.Conv2d(c, c, 1)])
        self.append(nn.BatchNorm2d(c))
        self.extend([nn.ReLU(), nn.Conv2d(c, c, 3, padding=1)])
        self.insert(1, nn.Conv2d(c, c, 1, bias=False))

    def forward(self, x):
        for i, stage in enumerate(self):
            x = stage(x) if i < len(self) - 1 else x + self[-1](x)
        return x


class Mixer(nn.Sequential):
    def __init__(self, c):
        super().__init__(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return _mix(x, 0.0, self.training)


class Net(nn.Module):
    def __init__(self, growth=4):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.block = Block(3, 8, growth, memory_efficient=True)
        c = 8 + 3 * growth
        self.proj = nn.Conv2d(c, c, 1)
        self.stages = Stages(c)
        self.mixer = Mixer(c)
        self.head = nn.Linear(c, 5)
        self.pos = nn.Parameter(torch.empty(1, c, 1, 1).normal_(std=0.02))
        named: OrderedDict[str, nn.Module] = OrderedDict()
        named["proj"] = nn.Conv2d(c, c, 1)
        named["act"] = nn.ReLU()
        self.tail = nn.Sequential(named)

    def forward(self, x):
        torch._assert(x.shape[1] == 3, "three channels")
        x = self.block(self.stem(x))
        x = checkpoint(self.proj, x, use_reentrant=True)
        x = self.tail(self.mixer(self.stages(x) + self.pos))
        return self.head(torch.mean(x, dim=(2, 3)))
