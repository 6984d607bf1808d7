"""The start of the small torch training scripts that the JAX step tests port and run
(tests/test_jax_grad_accum.py, test_jax_trainer_methods.py, test_jax_training_shapes.py): the
imports and a two-layer classifier `Net` (10 features, 4 classes), its class body open for the
methods a test adds."""

SMALL_NET = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.layers(x)
'''


def verify_json(folder, original: str, port: str, steps: int, port_name: str = "port.py", *options: str) -> dict:
    """`porter verify --script` (JSON report) of the sources ORIGINAL and PORT, written into
    FOLDER as original.py and PORT_NAME, over STEPS optimizer steps; OPTIONS go to verify."""
    import json
    import os
    import subprocess
    import sys

    (folder / "original.py").write_text(original)
    (folder / port_name).write_text(port)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(folder / "original.py"),
                           str(folder / port_name), "--steps", str(steps), "--format", "json", *options],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"},
                          cwd=folder)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout)
