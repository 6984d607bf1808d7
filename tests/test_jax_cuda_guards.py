"""JAX ports of scripts that choose the device through CUDA flags and availability checks
(`if args.cuda: data, target = data.cuda(), target.cuda()`, `if use_gpu: model = model.cuda()`,
`torch.cuda.manual_seed`, `nn.DataParallel` under a device count): the port has nothing left to
do there on either path, so the statements go whole (no `if ...: pass`), a loop's batches become
NumPy arrays on every path (a conversion kept under the flag left torch tensors for the jitted
step wherever CUDA is absent, as on a TPU VM), and what stays torch on purpose (the input
pipeline, a flag named `args.cuda`) is not reported as torch code left."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

from lanes import fixture_slice

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

SCRIPT = '''
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def pad(batch):
    xs, ys = zip(*batch)
    return pad_sequence(list(xs), batch_first=True), torch.stack(ys)


parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true", default=False)
args = parser.parse_args()
{flag}
torch.manual_seed(0)
{seed}
train_set = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
loader = DataLoader(train_set, batch_size=8, shuffle=False, collate_fn=pad)
model = Net()
{place_model}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for data, target in loader:
{place_batch}
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        print(f"loss {{loss.item():.6f}}")
'''

SPELLINGS = {
    "args.cuda": dict(
        flag="args.cuda = not args.no_cuda and torch.cuda.is_available()",
        seed="if args.cuda:\n    torch.cuda.manual_seed(0)",
        place_model="if args.cuda:\n    model.cuda()",
        place_batch="        if args.cuda:\n            data, target = data.cuda(), target.cuda()"),
    "use_gpu": dict(
        flag="use_gpu = torch.cuda.is_available()",
        seed="torch.cuda.manual_seed_all(0)",
        place_model="if use_gpu:\n    model = model.cuda()\nif torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)",
        place_batch="        if use_gpu:\n            data = data.cuda(non_blocking=True)\n            target = target.cuda(non_blocking=True)"),
    "device, one line": dict(
        flag="use_cuda = not args.no_cuda and torch.cuda.is_available()\ndevice = torch.device('cuda' if use_cuda else 'cpu')",
        seed="if use_cuda: torch.cuda.manual_seed(0)",
        place_model="if use_cuda: model = model.to(device)",
        place_batch="        if use_cuda: data, target = data.to(device), target.to(device)"),
    "if/else": dict(
        flag="cuda = torch.cuda.is_available() and not args.no_cuda",
        seed="",
        place_model="if cuda:\n    model.cuda()",
        place_batch="        if cuda:\n            data, target = data.cuda(), target.cuda()\n        else:\n            data, target = data.to('cpu'), target.to('cpu')"),
    # torch 2.6+'s device-generic spelling
    "torch.accelerator": dict(
        flag="use_accel = not args.no_cuda and torch.accelerator.is_available()\nif use_accel:\n"
             "    device = torch.accelerator.current_accelerator()\n    torch.accelerator.set_device_index(0)\n"
             "else:\n    device = torch.device('cpu')",
        seed="torch.accelerator.empty_cache()",
        place_model="model = model.to(device)",
        place_batch="        data, target = data.to(device), target.to(device)"),
}


def script(**parts) -> str:
    return textwrap.dedent(SCRIPT).lstrip("\n").format(**parts)


def port(source: str):
    return engine.fix(source, JAX, "train.py")


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_placement_under_a_cuda_flag_goes_and_batches_convert_on_every_path(name):
    result = port(script(**SPELLINGS[name]))
    out = result.source
    assert "pass" not in out and ".cuda(" not in out and "DataParallel" not in out, out
    assert "torch.cuda.manual_seed" not in out
    # the batch conversion is unconditional: the first statement of the loop body
    body = out.split("for data, target in loader:\n", 1)[1]
    assert body.startswith("        data, target = data.numpy(), target.numpy()\n") or body.startswith(
        "        data = data.numpy()\n        target = target.numpy()\n"), body
    left = {f.code: f.message for f in result.remaining}
    # the flag `args.cuda`, the input pipeline's torch.randn/pad_sequence: torch on purpose
    assert not [f for f in result.remaining if f.code == "JX901"], [f.message for f in result.remaining]
    assert "train_step" in out, left


def test_a_placement_if_that_does_more_stays():
    source = script(**{**SPELLINGS["args.cuda"], "place_model": "if args.cuda:\n    model.cuda()\n    print('on the GPU')"})
    out = port(source).source
    assert "if args.cuda:\n    print('on the GPU')\noptimizer" in out, out


def test_a_condition_that_calls_stays():
    # the condition's call may matter: the statement keeps its `if` (the move inside goes)
    source = script(**{**SPELLINGS["args.cuda"], "place_model": "if setup_gpu(args):\n    model.cuda()"})
    out = port(source).source
    assert "if setup_gpu(args):" in out


@pytest.mark.jax
# two of the spellings per run of the suite (their ports: test_placement_under_a_cuda_flag_goes_...)
@pytest.mark.parametrize("name", fixture_slice(["args.cuda", "use_gpu", "torch.accelerator"], 2))
def test_the_default_port_trains_where_cuda_is_absent_and_matches(tmp_path, name):
    # the default port on a machine without CUDA (a TPU VM, this CPU), against the original
    original = tmp_path / "original.py"
    original.write_text(script(**SPELLINGS[name]))
    ported = tmp_path / "ported.py"
    ported.write_text(port(original.read_text()).source)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original), str(ported),
                           "--steps", "3", "--format", "json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    assert len(report["steps"]) == 3
