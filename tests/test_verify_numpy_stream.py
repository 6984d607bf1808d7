"""A script that seeds numpy's global generator and draws from it in its training loop (mixup's
np.random.beta, a permutation, a uniform crop offset) verifies against its torch-xla port:
torch_xla imports jax in its MpDeviceLoader's thread, and jax's import draws from numpy's global
generator; the verifier imports jax on both sides before the script seeds numpy
(porter.verify.trace._import_jax_first), so both sides draw the same numbers."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.xla, pytest.mark.slow]

SCRIPT = '''
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--alpha", type=float, default=1.0)
args = parser.parse_args()
np.random.seed(args.seed)
torch.manual_seed(args.seed)
device = "cuda" if torch.cuda.is_available() else "cpu"
data = TensorDataset(torch.randn(64, 12), torch.randint(0, 4, (64,)))
loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        lam = np.random.beta(args.alpha, args.alpha)
        index = torch.from_numpy(np.random.permutation(x.size(0))).to(device)
        shift = float(np.random.uniform(-0.1, 0.1))
        mixed = lam * x + (1 - lam) * x[index] + shift
        out = model(mixed)
        loss = lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_numpy_draws_in_the_loop_match_across_the_port(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, "-m", "porter", "migrate", str(src), "--to", "torch-xla", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MpDeviceLoader" in (tmp_path / "out" / "train.py").read_text(encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(src / "train.py"),
                           str(tmp_path / "out" / "train.py"), "--steps", "4", "--format", "json"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert report["status"] == "passed", report["summary"]
