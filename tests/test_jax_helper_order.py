"""Helpers a JAX port emits (the torch.nn.init helpers, the weight converter) are defined before
the module-level code that runs them: a script that initialises a model between two model
classes (`netA.apply(weights_init)`, an init function of its own, one that applies another) used to
call `init_normal_` before the helper block placed after the last class (NameError)."""
import os
import subprocess
import sys

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

HEAD = '''
import torch
import torch.nn as nn


def weights_init(m):
    if isinstance(m, nn.Conv2d):
        nn.init.normal_(m.weight, 0.0, 0.02)


def init_params(net):
    nn.init.zeros_(net.conv.bias)


def reset(net):
    net.apply(weights_init)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


encoder = Encoder()
'''

INITS = {
    "apply": "encoder.apply(weights_init)\n",
    "function of the file": "init_params(encoder)\n",
    # two levels down: a function of the file that applies another
    "function applying another": "reset(encoder)\n",
}

TAIL = '''

class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 1, 3)

    def forward(self, x):
        return self.conv(x)


decoder = Decoder()
decoder.apply(weights_init)
print("out", decoder(encoder(torch.ones(2, 1, 8, 8))).shape)
'''


@pytest.mark.jax
@pytest.mark.parametrize("spelling", list(INITS))
def test_helpers_are_defined_before_module_level_code_runs_them(tmp_path, spelling):
    source = HEAD + "\n" + INITS[spelling] + TAIL
    result = engine.fix(source, JAX, "train.py")
    path = tmp_path / "port.py"
    path.write_text(result.source)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:] + "\n" + result.source
    assert "out (2, 1, 4, 4)" in proc.stdout, proc.stdout
