"""torch.multinomial in a module's methods (JX014), ported to Flax NNX and checked against torch
by distribution (real torch, real JAX; the two generators differ, so no draw is the same).

The methods draw in several spellings: one sample per row (`num_samples=1`, nanoGPT's
`generate`), several without replacement (positional `n`, `replacement=False`), several with
replacement, from unnormalised weights, from a 1-D vector. For each, the port's result has
torch's shape, and over many rows its empirical distribution (of ordered tuples, for draws
without replacement) matches torch's within a few standard errors. The tensor methods left
by the same kind of code (`p.dim()`, `x.pin_memory()`) run too.
"""
from __future__ import annotations

import collections
import sys
import types

import numpy as np
import pytest

from porter import engine, registry

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Sampler(nn.Module):
    def __init__(self, vocab=4, dim=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        return self.head(self.emb(idx))

    def one(self, probs):
        return torch.multinomial(probs, num_samples=1)

    def without(self, probs):
        return torch.multinomial(probs, 2, replacement=False)

    def with_replacement(self, weights):
        return torch.multinomial(weights, 3, True)

    def unnormalised(self, weights):
        return torch.multinomial(input=weights * 10.0, num_samples=2)

    def vector(self, probs):
        return torch.multinomial(probs[0], 3)

    def generate(self, idx, steps, temperature=1.0):
        for _ in range(steps):
            logits = self(idx)[:, -1, :] / temperature
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    def rank(self, p):
        return p.dim()

    def pinned(self, x):
        return x.pin_memory() * 2 if torch.cuda.is_available() else x * 2
'''

P = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
ROWS = 6000


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def sides():
    ported = engine.fix(SOURCE, engine.Options(registry.select("jax"))).source
    original, port = _load("smp_torch", SOURCE), _load("smp_jax", ported)
    torch.manual_seed(0)
    return original.Sampler(), port.Sampler(rngs=nnx.Rngs(0)), ported


def _freq(rows: np.ndarray) -> dict:
    counts = collections.Counter(map(tuple, rows.reshape(len(rows), -1).tolist()))
    return {k: v / len(rows) for k, v in counts.items()}


def _close(a: dict, b: dict, tol: float):
    for key in set(a) | set(b):
        assert abs(a.get(key, 0.0) - b.get(key, 0.0)) < tol, (key, a.get(key), b.get(key))


def test_no_torch_sampling_is_left(sides):
    *_, ported = sides
    assert "multinomial" not in ported and "porter: manual" not in ported, ported
    assert "pin_memory" not in ported and ".ndim" in ported, ported


@pytest.mark.parametrize("method,weights", [
    ("one", P), ("without", P), ("with_replacement", P), ("unnormalised", P), ("vector", P),
    ("without", np.array([0.0, 0.5, 0.0, 0.5], np.float32)),  # zero weights: never drawn
])
def test_draws_match_torch_in_distribution(sides, method, weights):
    t_model, j_model, _ = sides
    table = np.tile(weights, (ROWS, 1))
    t = getattr(t_model, method)(torch.from_numpy(table)).numpy()
    j = np.asarray(getattr(j_model, method)(jax.numpy.asarray(table)))
    assert j.shape == t.shape
    if method == "vector":
        return  # one draw of three distinct indices: shape and distinctness only
    # a difference of two frequencies has a standard error of at most sqrt(2) * 0.5 / sqrt(ROWS): 4.2 of them
    _close(_freq(j), _freq(t), 6 * 0.5 / np.sqrt(ROWS))
    if method in ("without", "unnormalised"):
        assert all(len(set(r)) == len(r) for r in j.tolist())  # no index twice in a row
    if weights[0] == 0.0:
        assert set(np.unique(j)) <= {1, 3}


def test_vector_draws_are_distinct(sides):
    _, j_model, _ = sides
    draws = [np.asarray(j_model.vector(jax.numpy.asarray(P[None]))) for _ in range(20)]
    assert all(d.shape == (3,) and len(set(d.tolist())) == 3 for d in draws)
    assert len({tuple(d.tolist()) for d in draws}) > 1  # each call draws a fresh key


def test_generate_runs_and_draws_from_the_model(sides):
    t_model, j_model, _ = sides
    idx = np.zeros((2, 1), np.int64)
    t = t_model.generate(torch.from_numpy(idx), 5)
    j = np.asarray(j_model.generate(jax.numpy.asarray(idx), 5))
    assert j.shape == tuple(t.shape) == (2, 6)
    assert j.min() >= 0 and j.max() < 4 and (j[:, 0] == 0).all()


def test_dim_and_pin_memory(sides):
    t_model, j_model, _ = sides
    x = np.ones((2, 3), np.float32)
    assert j_model.rank(jax.numpy.asarray(x)) == t_model.rank(torch.from_numpy(x)) == 2
    assert np.array_equal(np.asarray(j_model.pinned(jax.numpy.asarray(x))), t_model.pinned(torch.from_numpy(x)).numpy())
