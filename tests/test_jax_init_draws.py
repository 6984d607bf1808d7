"""Random numbers where a model is built and where it runs, in JAX ports (default mode).

Where a module is built (`__init__`, which the JAX port gives the model's `rngs`), torch's random
factories become draws from `rngs.params()` (JX108): `nn.Parameter(torch.randn(()))`, a scaled
position embedding `torch.randn(1, n, d) * 0.02`, `torch.rand(d)` as a buffer, in the model's
class and in a submodule's. The ports run, and verify against their originals (the verifier
loads the original's weights, so the draws themselves need not match).

Where a module runs (a method the jitted step traces once), Python's and NumPy's generators would
be drawn once and frozen into the compiled step: each spelling is reported at its line (JX014),
the divergence the port would show predicted by a finding.
"""
import textwrap

import pytest
from scripthelp import verify_json

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Scale(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(d))

    def forward(self, x):
        return x * self.gain


class Net(nn.Module):
    def __init__(self, n=4, d=6):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(()))
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
        self.register_buffer("shift", torch.rand(d, dtype=torch.float32) - 0.5)
        self.scale = Scale(d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.scale(x + self.pos + self.shift)
        return self.head(h.mean(dim=1)) + self.bias
"""

TRAIN = """
torch.manual_seed(0)
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
x, y = torch.randn(8, 4, 6), torch.randint(0, 3, (8,))
for step in range(4):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print("loss", loss.item())
"""


def _port(source: str):
    return engine.fix(textwrap.dedent(source), JAX, "train.py")


@pytest.mark.jax
@pytest.mark.slow
def test_init_draws_come_from_the_rngs_and_the_port_verifies(tmp_path):
    original = MODEL + TRAIN
    result = _port(original)
    port = result.source
    for draw in ("nnx.Param(jax.random.normal(rngs.params(), ()))",
                 "nnx.Param(jax.random.normal(rngs.params(), (1, n, d)) * 0.02)",
                 "jax.random.uniform(rngs.params(), (d,), jnp.float32) - 0.5",
                 "nnx.Param(jax.random.uniform(rngs.params(), (d,)))"):
        assert draw in port, port
    assert "torch.rand" not in port.split("torch.manual_seed(0)")[0], port
    assert not [f for f in result.remaining if f.code in ("JX101", "JX901")], [str(f) for f in result.remaining]
    report = verify_json(tmp_path, original, port, 4, "train_jax.py")
    assert report["passed"], (report["summary"], report["notes"])
    assert len(report["steps"]) == 4


@pytest.mark.parametrize("draw", ["random.randint(1, 3)", "random.random() > 0.5", "np.random.rand() * 2",
                                  "np.random.choice([1, 2, 3])"])
def test_host_generators_in_a_module_method_are_reported_at_their_line(draw):
    source = f"""
import random

import numpy as np
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        k = {draw}
        return self.fc(x) * k
"""
    result = _port(source)
    found = [f for f in result.remaining if f.code == "JX014"]
    assert len(found) == 1, [str(f) for f in result.remaining]
    assert "drawn once and the same value is used at every step" in found[0].message
    # at the line of the draw, which is marked for a person
    assert result.source.splitlines()[found[0].position.line - 1].strip() == f"k = {draw}  # porter: manual"


def test_a_seed_and_the_scripts_own_draws_are_not_reported():
    source = """
import random

import numpy as np
import torch.nn as nn

random.seed(0)
np.random.seed(0)
noise = np.random.rand(3)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        random.seed(1)

    def forward(self, x):
        return self.fc(x)
"""
    result = _port(source)
    assert not [f for f in result.remaining if f.code == "JX014"], [str(f) for f in result.remaining]
