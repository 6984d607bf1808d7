"""Parameter counts (JX022) ported to Flax NNX and run against torch (real torch, real JAX).

Each model below counts its parameters in another spelling (a generator over
`self.parameters()`, a list over `named_parameters()` filtered on `requires_grad`, a loop
adding `p.numel()` up, `torch.numel(p)`, `p.nelement()`); the module-level functions count a
model from outside. The models hold a tied embedding/head pair (torch counts the shared
array once), BatchNorm buffers (not parameters), nn.Sequential and nn.ModuleList children
and a bias-free layer: the port's counts are torch's.
"""
from __future__ import annotations

import sys
import types

import pytest

from porter import engine, registry

torch = pytest.importorskip("torch")
nnx = pytest.importorskip("flax.nnx")

SOURCE = '''
import torch
import torch.nn as nn


class Tied(nn.Module):
    def __init__(self, vocab=13, dim=6):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(7, dim)
        self.blocks = nn.ModuleList([nn.Linear(dim, dim) for _ in range(2)])
        self.head = nn.Linear(dim, vocab, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, ids):
        h = self.wte(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)

    def get_num_params(self, non_embedding=True):
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.wpe.weight.numel()
        return n_params


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1, bias=False))
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))

    def trainable(self):
        return sum([p.nelement() for _, p in self.named_parameters() if p.requires_grad])

    def counted(self):
        total = 0
        for p in self.parameters():
            total += torch.numel(p)
        return total


def count(model):
    return sum(p.numel() for p in model.parameters())


def count_named(model):
    return sum(param.numel() for name, param in model.named_parameters())


def count_loop(model):
    n = 0
    for q in model.parameters():
        n += q.numel()
    return n
'''


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def sides():
    ported = engine.fix(SOURCE, engine.Options(registry.select("jax"))).source
    return _load("pc_torch", SOURCE), _load("pc_jax", ported), ported


def test_the_counts_are_rewritten(sides):
    _, _, ported = sides
    assert ported.count("jax.tree.leaves(nnx.state(") == 6, ported
    assert "parameters()" not in ported and "requires_grad" not in ported, ported
    assert "porter: manual" not in ported, ported


@pytest.mark.parametrize("cls,methods", [("Tied", ("get_num_params",)), ("Conv", ("trainable", "counted"))])
def test_counts_match_torch(sides, cls, methods):
    original, port, _ = sides
    torch_model = getattr(original, cls)()
    jax_model = getattr(port, cls)(rngs=nnx.Rngs(0))
    for method in methods:
        assert getattr(jax_model, method)() == getattr(torch_model, method)(), method
    for fn in ("count", "count_named", "count_loop"):
        assert getattr(port, fn)(jax_model) == getattr(original, fn)(torch_model), fn
    if cls == "Tied":
        # the tied array is counted once, as torch does; without the subtraction the position table too
        assert jax_model.get_num_params(False) == torch_model.get_num_params(False) == 13 * 6 + 7 * 6 + 2 * (6 * 6 + 6)
