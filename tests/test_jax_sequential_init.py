"""`net.apply(weights_init)` in a script whose model is built from torch's layers alone
(`nn.Sequential(...)`, no module class of its own): the init function is ported (JX012/JX016)
as in a file with module classes; before, it was left testing `isinstance(m, nn.Linear)`, False
for every NNX layer, so the port trained from Flax's default init with no finding but JX901's."""
from __future__ import annotations

import subprocess
import sys

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")))

INITS = {
    "nn.init": "        nn.init.normal_(m.weight, 0.0, 0.02)\n        nn.init.zeros_(m.bias)\n",
    "tensor methods": "        m.weight.data.normal_(0.0, 0.02)\n        m.bias.data.fill_(0)\n",
}

SCRIPT = '''
import torch
import torch.nn as nn


def weights_init(m):
    if isinstance(m, nn.Linear):
INIT

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))
net.apply(weights_init)
print(float(net[0].weight.std()), float(net[0].bias.abs().max()))
'''


@pytest.mark.parametrize("name", sorted(INITS))
def test_the_init_function_is_ported(name):
    port = engine.fix(SCRIPT.replace("INIT\n", INITS[name]), JAX).source
    init = port.split("def weights_init", 1)[1].split("torch.manual_seed", 1)[0]
    assert "isinstance(m, nnx.Linear)" in init and "nn.init" not in init and ".data" not in init, init
    assert engine.fix(port, JAX).source == port


@pytest.mark.jax
def test_the_ported_init_draws_what_torch_draws(tmp_path):
    original = SCRIPT.replace("INIT\n", INITS["nn.init"]).rsplit("print(", 1)[0]
    port = engine.fix(original, JAX).source + \
        "print(float(net.layers[0].kernel[...].std()), float(abs(net.layers[0].bias[...]).max()))\n"
    (tmp_path / "port.py").write_text(port)
    proc = subprocess.run([sys.executable, str(tmp_path / "port.py")], capture_output=True, text=True, timeout=300,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    std, bias = map(float, proc.stdout.split())
    assert abs(std - 0.02) < 0.002 and bias == 0.0, proc.stdout  # Flax's default would be ~0.125 and 0
