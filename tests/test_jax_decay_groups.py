"""Parameter groups that differ only in weight decay, split by a condition on the parameter
(nanoGPT's configure_optimizers), ported by JX201 to one optax transformation with a decay
mask over the nnx.State, and run against torch for a few steps (real torch, real JAX).

Spellings: the nanoGPT form (a dict from `named_parameters()`, a `requires_grad` filter, groups
by `p.dim() >= 2` / `< 2`, `**extra_args` holding only `fused=`, `betas` passed as a name) with
AdamW; `[p for p in self.parameters() if ...]` with `not` as the complement, the no-decay group
first, and Adam's coupled decay; the groups inline in the call with `len(p.shape) > 1` / `<= 1`
and SGD with momentum. The port starts from the original's weights; after each of 4 steps its
parameters (in torch's names and layouts) match torch's.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from porter import engine, registry

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

MODEL = '''
import inspect
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.fc = nn.Linear(4, 5)
        self.norm = nn.LayerNorm(5)
        self.out = nn.Linear(5, 3, bias=False)

    def forward(self, ids):
        return self.out(self.norm(self.fc(self.emb(ids))))

'''

CONFIGURE = {
    "nanogpt": '''
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters()}
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0}
        ]
        self.counts = (len(decay_params), sum(p.numel() for p in decay_params), len(nodecay_params))
        fused_available = 'fused' in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == 'cuda'
        extra_args = dict(fused=True) if use_fused else dict()
        optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)
        return optimizer
''',
    "adam_not": '''
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        plain = [q for q in self.parameters() if not q.ndim >= 2]
        decayed = [q for q in self.parameters() if q.ndim >= 2]
        self.counts = (len(decayed), sum(q.numel() for q in decayed), len(plain))
        groups = [{"params": plain, "weight_decay": 0}, {"params": decayed, "weight_decay": weight_decay}]
        opt = torch.optim.Adam(groups, lr=learning_rate, betas=betas, eps=1e-6)
        return opt
''',
    "sgd_inline": '''
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        big = [p for _, p in self.named_parameters() if len(p.shape) > 1]
        small = [p for _, p in self.named_parameters() if len(p.shape) <= 1]
        self.counts = (len(big), sum(p.numel() for p in big), len(small))
        optimizer = torch.optim.SGD([dict(params=big, weight_decay=weight_decay), dict(params=small, weight_decay=0.0)],
                                    lr=learning_rate, momentum=0.9)
        return optimizer
''',
}
STEPS = 4


def _load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("spelling", sorted(CONFIGURE))
def test_decay_groups_match_torch(spelling):
    source = MODEL + CONFIGURE[spelling]
    ported = engine.fix(source, engine.Options(registry.select("jax"))).source
    body = ported.split("def configure_optimizers", 1)[1].split("\ndef ", 1)[0]
    assert "porter: manual" not in body and "torch.optim" not in body.replace("inspect.signature(torch.optim.AdamW)", ""), body
    assert "mask" in body and "requires_grad" not in body, body
    original, port = _load(f"dg_torch_{spelling}", source), _load(f"dg_jax_{spelling}", ported)
    torch.manual_seed(0)
    t_model = original.Net()
    j_model = port.Net(rngs=nnx.Rngs(0))
    port.load_torch_state_dict(j_model, {k: v.detach().numpy() for k, v in t_model.state_dict().items()})
    t_opt = t_model.configure_optimizers(0.3, 0.05, (0.8, 0.95), "cpu")
    j_opt = j_model.configure_optimizers(0.3, 0.05, (0.8, 0.95), "cpu")
    assert j_model.counts == t_model.counts  # the groups' sizes, as the script reports them
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    target = np.linspace(-1, 1, 2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3)

    def loss_fn(model):
        return ((model(jax.numpy.asarray(ids)) - target) ** 2).mean()

    for step in range(STEPS):
        t_opt.zero_grad()
        loss = ((t_model(torch.from_numpy(ids)) - torch.from_numpy(target)) ** 2).mean()
        loss.backward()
        t_opt.step()
        grads = nnx.grad(loss_fn)(j_model)
        j_opt.update(j_model, grads)
        got = port.torch_state_dict(j_model)
        for name, value in t_model.state_dict().items():
            np.testing.assert_allclose(got[name], value.detach().numpy(), rtol=2e-5, atol=2e-6,
                                       err_msg=f"{name} after step {step + 1}")
