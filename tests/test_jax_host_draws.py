"""Random numbers a training script draws on the host, outside its step: JX101 keeps torch's
generator for them and hands the arrays to JAX (`jnp.asarray(np.asarray(torch.rand(...)))`), so
the port draws the original's numbers. Spellings: synthetic data drawn in the set-up of the
function that trains (not only at a script's top level), the step's noise drawn in the loop with
`torch.randn_like(x)` / `torch.rand_like(x)` (as `torch.randn(x.shape)`), timesteps with
`torch.randint(..., device=...)`. A draw in a function the step calls (an augmentation inside
the loss) still needs a key, and is reported there. The diffusion-style port runs and its
losses are the original's."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

DENOISER = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Denoiser(nn.Module):
    def __init__(self, d=6, steps=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d + 1, 16), nn.SiLU(), nn.Linear(16, d))
        self.steps = steps

    def forward(self, x, t):
        return self.net(torch.cat([x, t[:, None].float() / self.steps], dim=1))


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = torch.rand(64, 6) * 2 - 1
    betas = torch.linspace(1e-3, 0.2, 10)
    keep = torch.cumprod(1 - betas, 0).to(device)
    model = Denoiser().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for it in range(6):
        x0 = data[torch.randint(0, 64, (16,))].to(device)
        t = torch.randint(0, 10, (16,), device=device)
        noise = NOISE
        a = keep[t].view(-1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        loss = F.mse_loss(model(xt, t), noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(it, loss.item())


if __name__ == "__main__":
    main()
'''

SPELLINGS = {
    "randn_like": DENOISER.replace("NOISE", "torch.randn_like(x0)"),
    "rand_like": DENOISER.replace("NOISE", "torch.rand_like(x0) - 0.5"),
    "randn of the shape": DENOISER.replace("NOISE", "torch.randn(x0.shape, device=device)"),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_host_draws_keep_torch_s_generator(name):
    result = engine.fix(SPELLINGS[name], JAX)
    port = result.source
    assert [(f.code, f.message) for f in result.remaining] == [], port
    assert "data = jnp.asarray(np.asarray(torch.rand(64, 6))) * 2 - 1" in port, port
    assert "noise = jnp.asarray(np.asarray(torch.rand" in port, port
    assert "_like(" not in port, port
    assert engine.fix(port, JAX).source == port


def test_a_draw_in_a_function_the_step_calls_is_reported():
    source = textwrap.dedent('''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        def augment(x):
            return x + 0.1 * torch.randn_like(x)

        def main():
            model = nn.Linear(4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            data = torch.randn(8, 4)
            for _ in range(3):
                loss = F.mse_loss(model(augment(data)), data)
                opt.zero_grad()
                loss.backward()
                opt.step()
        ''')
    result = engine.fix(source, JAX)
    found = [f for f in result.remaining if f.code == "JX101"]
    assert len(found) == 1 and "randn_like" in found[0].message, [(f.code, f.message) for f in result.remaining]
    assert "data = jnp.asarray(np.asarray(torch.randn(8, 4)))" in result.source, result.source


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_denoiser_port_matches_its_original(tmp_path):
    original = textwrap.dedent(SPELLINGS["randn_like"])
    report = verify_json(tmp_path, original, engine.fix(original, JAX).source, 4)
    assert report["status"] in ("passed", "over-budget"), (report["summary"], report["notes"])
    assert len(report["steps"]) == 4
