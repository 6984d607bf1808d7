"""JAX ports of training scripts that use torch's automatic mixed precision: the GradScaler and
autocast go (JX320) and the plain step that is left becomes the jitted train step (JX301), in
several spellings of the AMP step; a scaler kept for a checkpoint is reported. One port is
verified against its original."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

SCRIPT = '''
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
{imports}

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 12), torch.randint(0, 3, (64,))), batch_size=16)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{scaler}
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
{step}
        print(f"loss {{loss.item():.6f}}")
'''

SPELLINGS = {
    "cuda.amp": dict(
        imports="",
        scaler="scaler = torch.cuda.amp.GradScaler(enabled=args.amp)",
        step="        with torch.cuda.amp.autocast(enabled=args.amp):\n            loss = F.cross_entropy(model(x), y)\n"
             "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()"),
    "torch.amp, unscale and clip": dict(
        imports="from torch.amp import GradScaler",
        scaler="scaler = GradScaler('cuda', enabled=args.amp)",
        step="        with torch.autocast(device_type='cuda', dtype=torch.float16, enabled=args.amp):\n"
             "            out = model(x)\n            loss = F.cross_entropy(out, y)\n"
             "        scaler.scale(loss).backward()\n        scaler.unscale_(optimizer)\n"
             "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
             "        scaler.step(optimizer)\n        scaler.update()"),
    "context as a value": dict(
        imports="from contextlib import nullcontext\nfrom torch.cuda.amp import GradScaler, autocast",
        scaler="ctx = autocast() if args.amp else nullcontext()\nscaler = GradScaler(enabled=args.amp)",
        step="        with ctx:\n            loss = F.cross_entropy(model(x), y)\n"
             "        loss = scaler.scale(loss)\n        loss.backward()\n        scaler.step(optimizer)\n"
             "        scaler.update()"),
}


def script(name: str) -> str:
    return textwrap.dedent(SCRIPT).lstrip("\n").format(**SPELLINGS[name])


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_the_amp_step_becomes_the_jitted_step(name):
    result = engine.fix(script(name), JAX, "train.py")
    out = result.source
    assert "scaler" not in out and "autocast" not in out and "GradScaler" not in out, out
    assert "@nnx.jit" in out and "loss = train_step(model, optimizer, x, y)" in out, out
    assert not [f for f in result.remaining if f.code in ("JX301", "JX901")], [f.message for f in result.remaining]


def test_a_scaler_saved_in_a_checkpoint_is_reported_and_kept():
    source = script("cuda.amp") + 'torch.save({"scaler": scaler.state_dict()}, "ckpt.pt")\n'
    result = engine.fix(source, JAX, "train.py")
    assert "scaler = torch.cuda.amp.GradScaler(enabled=args.amp)" in result.source
    assert "scaler.scale(" not in result.source and "loss = train_step(" in result.source
    assert any(f.code == "JX320" and "scaler.state_dict()" in f.message for f in result.remaining)


@pytest.mark.jax
def test_the_port_matches_the_original(tmp_path):
    original = tmp_path / "original.py"
    original.write_text(script("torch.amp, unscale and clip"))
    ported = tmp_path / "ported.py"
    ported.write_text(engine.fix(original.read_text(), JAX, "train.py").source)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original), str(ported),
                           "--steps", "3", "--format", "json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
