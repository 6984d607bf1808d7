"""torch.split with chunk sizes known only when the code runs (a variable, an attribute, a
list), ported to JAX (the port's torch_split), gives torch's chunks (real torch, real JAX)."""
from __future__ import annotations

import numpy as np
import pytest

from porter import engine, registry

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")

SOURCE = """
import torch

class Cfg:
    width = 4

def chunks(x, n, sizes, cfg):
    a, *b = x.split(n, dim=1)
    c = torch.split(x, sizes)
    d = x.split(cfg.width, dim=-1)
    e = torch.split(x, split_size_or_sections=sizes, dim=0)
    return [a, *b, *c, *d, *e]
"""


def test_split_sizes_given_at_run_time_match_torch():
    ported = engine.fix(SOURCE, engine.Options(registry.select("jax"))).source
    assert "porter: manual" not in ported and ".split(" not in ported.split("def chunks")[1]
    original, port = {}, {}
    exec(compile(SOURCE, "orig", "exec"), original)
    exec(compile(ported, "port", "exec"), port)
    x = np.arange(5 * 10, dtype=np.float32).reshape(5, 10)
    for n, sizes in ((5, [2, 3]), (3, (1, 1, 3)), (4, [5])):
        expected = original["chunks"](torch.from_numpy(x), n, sizes, original["Cfg"]())
        got = port["chunks"](jnp.asarray(x), n, sizes, port["Cfg"]())
        assert [tuple(t.shape) for t in expected] == [tuple(g.shape) for g in got]
        for t, g in zip(expected, got):
            np.testing.assert_array_equal(np.asarray(g), t.numpy())
