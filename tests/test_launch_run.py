"""The launched path of the ddp_trainer fixture: the original starts its worker with
mp.spawn and trains with DDP over gloo on the CPU; the port (expected.py) starts it with
torch_xla.launch and trains with DDP over the xla:// process group (PJRT_DEVICE=CPU, one
process). The port must run to the end (no runtime started in the parent before the launch:
TX708 moved the seed into the worker) and log the same losses as the original.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "torch_xla" / "ddp_trainer"
LOSS = re.compile(r"Loss: (\S+)")
ARGS = ["--epochs", "1", "--dropout", "0", "--log-interval", "1", "--spawn"]

pytestmark = [pytest.mark.xla, pytest.mark.slow]


def _run(script, extra, env, cwd):
    proc = subprocess.run([sys.executable, str(script), *ARGS, *extra], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_launched_port_trains_like_the_spawned_original(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "p").mkdir()
    original = _run(FIXTURE / "train.py", ["--dist-backend", "gloo"], {"CUDA_VISIBLE_DEVICES": ""}, tmp_path / "o")
    port = _run(FIXTURE / "expected.py", [], {"PJRT_DEVICE": "CPU"}, tmp_path / "p")
    ours, theirs = [float(x) for x in LOSS.findall(original)], [float(x) for x in LOSS.findall(port)]
    assert len(ours) == 14 and len(theirs) == 14, (original, port)
    assert all(abs(a - b) <= 1e-4 + 1e-4 * abs(a) for a, b in zip(ours, theirs)), (ours, theirs)
    assert original.strip().splitlines()[-1] == port.strip().splitlines()[-1]
