"""Tied input/output embeddings (JX019) and a model's layer arrays read through attributes
(JX021), ported to Flax NNX and run against torch (real torch, real JAX).

Each model below ties a Linear head to an Embedding in another spelling (the embedding's
weight set to the head's, the head's to the embedding's, in a helper method, entries of an
nn.ModuleDict, a head with a bias) or computes its logits with the embedding's transpose read
through attributes. The port loads the original's state dict (both torch names of the one
array), its forward pass and the tied array's gradient (the sum of its two uses) match
torch's, `nnx.state` holds the array once, and `torch_state_dict` gives both names back.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from porter import engine, registry

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

MODELS = {
    # the embedding's weight set to the head's, entries of an nn.ModuleDict (nanoGPT's layout)
    "embedding_takes_head": """
class LM(nn.Module):
    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab, dim), ln=nn.LayerNorm(dim)))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, ids):
        return self.lm_head(self.transformer.ln(self.transformer.wte(ids)))
""",
    # the head's weight set to the embedding's in a method __init__ calls; the head has a bias
    "head_takes_embedding": """
class Decoder(nn.Module):
    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.encoder = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.decoder = nn.Linear(dim, vocab)
        self.tie_weights()

    def tie_weights(self):
        self.decoder.weight = self.encoder.weight

    def forward(self, ids):
        return self.decoder(torch.tanh(self.proj(self.encoder(ids))))
""",
    # no head: the logits are the embedding's transpose, read through attributes
    "transposed_embedding": """
class LM(nn.Module):
    def __init__(self, vocab=11, dim=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(5, dim)

    def forward(self, ids):
        h = self.emb(ids) + self.pos.weight[: ids.shape[1]]
        return F.linear(h, self.emb.weight) + h @ self.emb.weight.t()
""",
}


def _port(source: str) -> str:
    return engine.fix(source, engine.Options(registry.select("jax"))).source


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tied_model_port_matches_torch(name):
    source = _HEADER + MODELS[name]
    ported = _port(source)
    assert "porter: manual" not in ported, ported
    assert _port(ported) == ported
    original, port = _load(f"orig_{name}", source), _load(f"port_{name}", ported)
    cls = next(v for k, v in vars(original).items() if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == f"orig_{name}")
    torch.manual_seed(0)
    tmodel = cls()
    jmodel = getattr(port, cls.__name__)(rngs=nnx.Rngs(0))
    state = {k: v.detach().numpy().copy() for k, v in tmodel.state_dict().items()}
    port.load_torch_state_dict(jmodel, state)
    back = port.torch_state_dict(jmodel)
    assert sorted(back) == sorted(state)
    for key, value in state.items():
        np.testing.assert_array_equal(back[key], value, err_msg=key)
    # one array per torch Parameter (torch's parameters() lists a tied one once)
    assert len(jax.tree_util.tree_leaves(nnx.state(jmodel, nnx.Param))) == len(list(tmodel.parameters()))

    ids = np.random.default_rng(0).integers(0, 11, size=(2, 5))
    tout = tmodel(torch.from_numpy(ids))
    proj = np.random.default_rng(1).standard_normal(tuple(tout.shape)).astype(np.float32)
    (tout * torch.from_numpy(proj)).sum().backward()

    def loss(model):
        out = model(jnp.asarray(ids))
        return (out * proj).sum(), out

    (_, jout), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(jmodel)
    np.testing.assert_allclose(np.asarray(jout), tout.detach().numpy(), atol=1e-5)
    g = nnx.clone(jmodel)
    nnx.update(g, grads)
    jgrads = port.torch_state_dict(g)
    for pname, p in tmodel.named_parameters():
        np.testing.assert_allclose(jgrads[pname], p.grad.numpy(), atol=1e-5, err_msg=pname)
