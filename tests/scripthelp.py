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


# Runs a script as __main__ (argv as given) and then prints how many XLA graphs ran.
XLA_RUNNER = """
import runpy, sys
path = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(path, run_name='__main__')
import torch_xla.debug.metrics as met
data = met.metric_data('ExecuteTime')
print('XLA executions:', data[0] if data else 0)
"""


def run_script(script, args, cwd, xla: bool):
    """Runs ``script`` with ``args`` in ``cwd``: on torch_xla's CPU device through XLA_RUNNER
    (its last line counts the XLA executions) when ``xla``, else with CUDA hidden. Returns the
    finished process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if xla:
        env["PJRT_DEVICE"] = "CPU"
        command = [sys.executable, "-c", XLA_RUNNER, str(script), *args]
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        command = [sys.executable, str(script), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
