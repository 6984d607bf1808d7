"""Item assignment to tensors in module code (JX109): `x[idx] = v`, `x[idx] += v`, a comparison
mask (`logits[logits < v] = -inf`, nanoGPT's top-k filter) in several spellings, ported with the
whole JAX rule set and checked against torch on the same inputs."""
import textwrap

import numpy as np
import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

MODULE = '''
import torch
import torch.nn as nn


class Edit(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, v):
        y = self.fc(x)
        y[:, 0] = 0.5
        y[..., 1:3] += v[..., :2]
        y[:, -1] -= 1.0
        y[1] *= 2.0
        top, _ = torch.topk(y, 2)
        y[y < top[:, [-1]]] = -float('Inf')
        z = y.clone()
        z[~(z > 0)] = 0.0
        return y, z
'''


def ported() -> str:
    result = engine.fix(textwrap.dedent(MODULE).lstrip("\n"), JAX, "m.py")
    assert "JAX arrays are immutable" not in " ".join(f.message for f in result.remaining)
    return result.source


def test_every_spelling_becomes_a_functional_update():
    out = ported()
    for line in ("y = y.at[:, 0].set(0.5)", "y = y.at[..., 1:3].add(v[..., :2])", "y = y.at[:, -1].subtract(1.0)",
                 "y = y.at[1].multiply(2.0)", "y = jnp.where(y < top[:, [-1]], -float('Inf'), y)",
                 "z = jnp.where(~(z > 0), 0.0, z)"):
        assert line in out, out


@pytest.mark.jax
def test_the_port_computes_what_torch_computes(tmp_path):
    import sys

    import torch

    torch.manual_seed(0)
    namespace: dict = {}
    exec(textwrap.dedent(MODULE), namespace)
    original = namespace["Edit"]()
    x, v = torch.randn(3, 6), torch.randn(3, 6)
    with torch.no_grad():
        want = [t.numpy() for t in original(x, v)]
    path = tmp_path / "m_port.py"
    path.write_text(ported())
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        port = importlib.import_module("m_port")
        from flax import nnx

        model = port.Edit(rngs=nnx.Rngs(0))
        port.load_torch_state_dict(model, {k: t.detach().numpy() for k, t in original.state_dict().items()})
        got = [np.asarray(t) for t in model(x.numpy(), v.numpy())]
    finally:
        sys.path.remove(str(tmp_path))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
