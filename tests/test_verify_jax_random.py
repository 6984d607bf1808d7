"""`porter verify --script` of a JAX port: float64 on both sides when both run in it, and the
port's random draws (reparameterisation noise, dropout masks, uniform masks) taken from torch's
generator in the original's order, so that a model that draws in its step is compared exactly.

The original is a small VAE-style script written here: four spellings of a draw in the forward
(`torch.randn_like`, `nn.Dropout`, `F.dropout(training=self.training)`, a `torch.rand_like`
mask). porter ports it to JAX; the port must match the original to float64 rounding, and a port
changed by one part in ten thousand must be caught (float32's tolerances let it pass)."""
import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

pytestmark = pytest.mark.jax

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

ORIGINAL = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class NoisyAutoencoder(nn.Module):
        def __init__(self, features=12, hidden=16, latent=4):
            super().__init__()
            self.enc = nn.Linear(features, hidden)
            self.mu = nn.Linear(hidden, latent)
            self.log_var = nn.Linear(hidden, latent)
            self.dec = nn.Linear(latent, features)
            self.drop = nn.Dropout(0.3)

        def forward(self, x):
            h = self.drop(torch.relu(self.enc(x)))
            h = F.dropout(h, 0.2, training=self.training)
            keep = (torch.rand_like(h) > 0.1).float()
            h = h * keep
            mu, log_var = self.mu(h), self.log_var(h)
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
            return self.dec(z), mu, log_var


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--epochs', type=int, default=1)
        parser.add_argument('--cuda', action='store_true', default=False)
        args = parser.parse_args()
        device = torch.device('cuda' if args.cuda and torch.cuda.is_available() else 'cpu')
        torch.manual_seed(0)
        data = torch.randn(96, 12)
        loader = DataLoader(TensorDataset(data, data), batch_size=16, shuffle=True)
        model = NoisyAutoencoder().to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for epoch in range(args.epochs):
            model.train()
            for x, target in loader:
                x, target = x.to(device), target.to(device)
                recon, mu, log_var = model(x)
                kld = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())
                loss = F.mse_loss(recon, target, reduction='sum') + kld
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                print('loss', loss.item())


    if __name__ == '__main__':
        main()
''').lstrip("\n")


def _verify(tmp_path, port_source: str) -> dict:
    return verify_json(tmp_path, ORIGINAL, port_source, 4)


@pytest.fixture(scope="module")
def port_source() -> str:
    result = engine.fix(ORIGINAL, JAX, "train.py")
    assert "jax.random" in result.source, result.source  # the draws are the port's own
    return result.source


def test_random_draws_in_the_step_match_the_original_in_float64(tmp_path, port_source):
    report = _verify(tmp_path, port_source)
    assert report["passed"], report["summary"]
    assert report["settings"]["dtype"] == "float64"
    assert any("jax_enable_x64 on" in note for note in report["notes"]), report["notes"]
    worst = max(step["diff"] for step in report["steps"])
    assert len(report["steps"]) == 4 and worst < 1e-8, report["steps"]


def test_a_port_one_part_in_ten_thousand_off_is_caught(tmp_path, port_source):
    # the same port with its reparameterisation noise scaled by 1.0001: within float32's
    # tolerance (5e-4 of the loss), far outside float64's
    changed = port_source.replace("torch.exp(0.5 * log_var)", "torch.exp(0.5 * log_var) * 1.0001")
    if changed == port_source:
        changed = port_source.replace("jnp.exp(0.5 * log_var)", "jnp.exp(0.5 * log_var) * 1.0001")
    assert changed != port_source, port_source
    report = _verify(tmp_path, changed)
    assert not report["passed"] and report["status"] == "diverged", report["summary"]
    assert "step 1" in report["summary"], report["summary"]


def test_a_jax_port_that_still_trains_with_torch_is_not_ported(tmp_path):
    # a port that imports JAX but whose step stayed torch's (a torch library model, an
    # optimizer from another file's factory): its losses equal the original's, which says
    # nothing about a JAX port
    port = ORIGINAL.replace("import argparse\n", "import argparse\n\nimport jax\nimport flax.nnx as nnx\n", 1)
    report = _verify(tmp_path, port)
    assert not report["passed"] and report["status"] == "not-ported", report["summary"]
    assert "4 of its 4 optimizer steps were torch.optim steps" in report["summary"], report["summary"]


def test_a_torch_model_given_to_nnx_optimizer_fails_with_its_own_error(tmp_path):
    # the port's own error reaches the report (the verifier's float64 widening and its
    # parameter check skip a model that is no NNX module)
    port = ORIGINAL.replace("import argparse\n", "import argparse\n\nimport optax\nimport flax.nnx as nnx\n", 1)
    port = port.replace("torch.optim.Adam(model.parameters(), lr=1e-2)", "nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)")
    report = _verify(tmp_path, port)
    assert report["status"] == "side-failed", report["summary"]
    assert "the port could not run" in report["summary"] and "without a record" not in report["summary"], report["summary"]
