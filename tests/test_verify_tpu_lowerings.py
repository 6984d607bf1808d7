"""Upsampling's backward (bilinear, nearest) is a CPU fallback of torch_xla on every device but a
TPU, one device-to-host transfer per call (porter.verify.tpu_lowerings): a verification on
XLA:CPU counts those transfers apart, says so in a note, and still catches a port's own
transfers. Model level and script level, each with several spellings of upsampling (nn.Upsample,
F.interpolate, mode given positionally or by keyword, align_corners either way)."""
import json
import os
import subprocess
import sys

import pytest

from porter.verify.model import Budgets, health_of
from porter.verify.script import script_health

UNET = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, padding=1)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.out = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        d = F.relu(self.down(x))
        m = F.relu(self.mid(F.max_pool2d(d, 2)))
        u = self.up(m)
        u2 = F.interpolate(F.max_pool2d(m, 2), scale_factor=4, mode="nearest")
        return self.out(torch.cat([u + u2, d], 1))
'''


def _record(transfers, off_tpu, printed=()):
    return {"steps": [{"optimizer": 0, "printed": i in printed,
                       "xla_delta": {"compiles": 1 if i < 2 else 0, "transfers": t, "executions": 1,
                                     "off_tpu_fallbacks": n}}
                      for i, (t, n) in enumerate(zip(transfers, off_tpu))],
            "ended_by": "stop", "xla": {"fallback_ops": ["aten::upsample_bilinear2d_backward"]}}


def test_script_health_counts_the_fallbacks_a_tpu_does_not_take_apart():
    health = script_health(_record([2, 2, 2], [2, 2, 2]), Budgets())
    assert health["within_budget"], health["problems"]
    assert [s["transfers"] for s in health["steps"]] == [0, 0, 0]
    assert "upsample_bilinear2d_backward" in health["notes"][0] and "step 3: 2" in health["notes"][0]
    # a transfer of the port's own on top of them is still over budget, at its step
    health = script_health(_record([2, 3, 2], [2, 2, 2]), Budgets())
    assert health["problems"] == ["device-to-host transfers in step(s) 2 that log nothing (budget 0 per step)"]
    # none of them: no note
    assert script_health(_record([0, 0, 0], [0, 0, 0]), Budgets())["notes"] == []


def test_model_health_counts_them_apart():
    steps = [{"compiles": int(i == 0), "transfers": 2, "executions": 1, "fallbacks": [], "off_tpu_fallbacks": 2}
             for i in range(3)]
    health = health_of(steps, Budgets())
    assert health["within_budget"] and health["max_transfers_per_step"] == 0, health["problems"]
    assert health["notes"] and "torch_xla lowers them only on a TPU" in health["notes"][0]
    worse = [dict(s, transfers=3) for s in steps]
    assert not health_of(worse, Budgets())["within_budget"]


def _porter(*args, cwd):
    return subprocess.run([sys.executable, "-m", "porter", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env={**os.environ, "PJRT_DEVICE": "CPU"})


@pytest.mark.xla
@pytest.mark.slow
def test_a_unet_verifies_at_model_level_on_xla_cpu(tmp_path):
    (tmp_path / "unet.py").write_text(UNET, encoding="utf-8")
    (tmp_path / "unet_xla.py").write_text("import torch_xla\n" + UNET, encoding="utf-8")
    proc = _porter("verify", "unet.py", "unet_xla.py", "--model", "TinyUNet()", "--input", "float32[2,3,8,8]",
                   "--steps", "3", "--format", "json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["status"] == "passed", report["summary"]
    assert any("torch_xla lowers them only on a TPU" in n for n in report["notes"]), report["notes"]


TRAIN = '''
import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from unet import TinyUNet

logging.basicConfig(level=logging.INFO, format="%(message)s")
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = TensorDataset(torch.randn(48, 3, 8, 8), (torch.rand(48, 1, 8, 8) > 0.5).float())
loader = DataLoader(data, batch_size=8, shuffle=True)
model = TinyUNet().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.BCEWithLogitsLoss()
for epoch in range(args.epochs):
    model.train()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 4 == 0:
            logging.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
'''


@pytest.mark.xla
@pytest.mark.slow
def test_a_segmentation_script_port_passes_at_script_level(tmp_path):
    """The default port of a training script whose model upsamples, and which logs through
    logging.basicConfig (TX009 makes that call take effect after torch_xla's import): its
    losses match and its quiet steps make no transfer of their own."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "unet.py").write_text(UNET, encoding="utf-8")
    (src / "train.py").write_text(TRAIN, encoding="utf-8")
    proc = _porter("migrate", src, "--to", "torch-xla", "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    port = (tmp_path / "out" / "train.py").read_text(encoding="utf-8")
    assert "force=True" in port, port
    proc = _porter("verify", "--script", src / "train.py", tmp_path / "out" / "train.py", "--steps", "5",
                   "--format", "json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["status"] == "passed", report["summary"]
    assert any("torch_xla lowers them only on a TPU" in n for n in report["notes"]), report["notes"]
