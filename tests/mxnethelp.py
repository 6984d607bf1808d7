"""Shared by the tests that run real MXNet 1.9.1: the MXNet venv's python, and the original
runs of tests/data/gluon/script_steps.py that its ports are compared with."""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT_STEPS = REPO / "tests" / "data" / "gluon" / "script_steps.py"
OPTIMIZERS = ("sgd", "adam")
LOSSES = ("softmax", "sigmoid")

# the initial weights each run starts from: init_<loss>.params in the working folder
_INIT = """
import sys
sys.path.insert(0, sys.argv[1])
import mxnet as mx
import script_steps
for kind, outputs in (("softmax", 4), ("sigmoid", 1)):
    net = script_steps.build(outputs)
    net.initialize(mx.init.Normal(0.5))
    net.save_parameters(f"init_{kind}.params")
"""


@functools.lru_cache(maxsize=None)
def mxnet_python() -> str:
    """The MXNet venv's python: PORTER_MXNET_PYTHON, else the one scripts/bootstrap-mxnet builds
    (once per lock hash; it prints the path)."""
    if os.environ.get("PORTER_MXNET_PYTHON"):
        return os.environ["PORTER_MXNET_PYTHON"]
    out = subprocess.run([str(REPO / "scripts" / "bootstrap-mxnet")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def run_script_steps(folder: Path) -> dict[tuple[str, str], tuple[list[float], Path]]:
    """script_steps.py in MXNet, for each optimizer and loss, from the initial weights it writes
    into ``folder`` (init_<loss>.params): (optimizer, loss) -> (the 6 step losses, the file of
    final parameters)."""
    python = mxnet_python()
    proc = subprocess.run([python, "-c", _INIT, str(SCRIPT_STEPS.parent)], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = {}
    for optimizer in OPTIMIZERS:
        for loss in LOSSES:
            out = folder / f"mx_{optimizer}_{loss}.params"
            proc = subprocess.run([python, str(SCRIPT_STEPS), f"init_{loss}.params", str(out), optimizer, loss],
                                  cwd=folder, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            runs[optimizer, loss] = ([float(v) for v in proc.stdout.split()], out)
    return runs
