"""A command-line option's CUDA-or-CPU default (`parser.add_argument('--device', default='cuda' if
torch.cuda.is_available() else 'cpu')`) is a string like the values the option takes, and
scripts use it as one (`args.device.startswith('cuda')`, `'cuda' in args.device`, an f-string):
the default port gives the string 'xla' (TX101), not a torch.device, and trains on XLA; `--device
cpu` still runs on the CPU."""
from __future__ import annotations

import pytest

from porter import engine, registry

from scripthelp import run_script

DEFAULT = engine.Options(tuple(registry.rules_for("torch-xla")))

SPELLINGS = {
    "plain": "parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')",
    "typed, parenthesised": 'parser.add_argument("--device", type=str, default=("cuda" if torch.cuda.is_available() '
                            'else "cpu"), help="where to train")',
    "cpu first": "parser.add_argument('--device', default='cpu' if not torch.cuda.is_available() else 'cuda:0')",
}

SCRIPT = '''
import argparse
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
OPTION
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Linear(4, 1).to(args.device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 4).to(args.device)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if args.device.startswith("cuda") or "cuda" in args.device:
    torch.backends.cudnn.benchmark = True
print(f"trained on {args.device.upper()}: {loss.item():.6f}")
'''


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_default_becomes_the_string_xla(name):
    port = engine.fix(SCRIPT.replace("OPTION", SPELLINGS[name]), DEFAULT).source
    line = next(li for li in port.splitlines() if "add_argument" in li)
    assert "default='xla'" in line or 'default="xla"' in line or "default=('xla')" in line or 'default=("xla")' in line, line
    assert "is_available" not in line and "torch_xla.device()" not in line, line


@pytest.mark.xla
@pytest.mark.slow
def test_the_port_trains_on_xla_and_the_option_still_picks_the_cpu(tmp_path):
    original = SCRIPT.replace("OPTION", SPELLINGS["plain"])
    path = tmp_path / "train.py"
    path.write_text(engine.fix(original, DEFAULT).source)
    on_xla = run_script(path, [], tmp_path, xla=True)
    assert on_xla.returncode == 0, on_xla.stderr[-3000:]
    lines = on_xla.stdout.strip().splitlines()
    assert lines[0].startswith("trained on XLA: ") and int(lines[-1].split()[-1]) > 0, on_xla.stdout  # XLA graphs ran
    on_cpu = run_script(path, ["--device", "cpu"], tmp_path, xla=True)
    assert on_cpu.returncode == 0, on_cpu.stderr[-3000:]
    lines = on_cpu.stdout.strip().splitlines()
    assert lines[0].startswith("trained on CPU: ") and int(lines[-1].split()[-1]) == 0, on_cpu.stdout
