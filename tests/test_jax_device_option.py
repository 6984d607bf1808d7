"""JX312 on scripts whose device comes from a command-line option defaulting to CUDA: the JAX
port defaults it to 'cpu' (the torch code that stays runs on the host, JAX places its arrays
itself) as a safe fix where every read of the option is a torch device use, text or a use
porter knows, and as an unsafe one, with the read quoted, where it is not."""
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

JX312 = registry.select("jax", ("JX312",))


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def fix(source: str, unsafe: bool = False):
    return engine.fix(dedent(source), engine.Options(JX312, unsafe_fixes=unsafe))


def finding(source: str):
    [found] = engine.check(dedent(source), engine.Options(JX312)).findings
    return found


READS = """
args = parser.parse_args()
device = torch.device(args.device)
model.to(args.device)
x = torch.zeros(3, device=args.device)
print(f"training on {args.device}")
"""


@pytest.mark.parametrize("option, after", [
    ("parser.add_argument('--device', default='cuda')", "parser.add_argument('--device', default='cpu')"),
    ('parser.add_argument("-d", "--device", type=str, default="cuda:0")',
     'parser.add_argument("-d", "--device", type=str, default="cpu")'),
    ("parser.add_argument('--device', default=f'cuda:{0}', choices=['cuda:0', 'cpu'])",
     "parser.add_argument('--device', default='cpu', choices=['cuda:0', 'cpu'])"),
    ("parser.add_argument('--accel', dest='device', default='cuda')",
     "parser.add_argument('--accel', dest='device', default='cpu')"),
    ("grp = parser.add_argument_group('Device')\ngrp.add_argument('--device', default='cuda')",
     "grp = parser.add_argument_group('Device')\ngrp.add_argument('--device', default='cpu')"),
])
def test_an_option_read_only_as_a_torch_device_defaults_to_cpu(option, after):
    source = "import argparse\nimport torch\nparser = argparse.ArgumentParser()\n" + option + "\n" + READS
    result = fix(source)
    assert result.changed and after in result.source, result.source
    assert not fix(result.source).changed


def test_the_namespace_followed_into_the_files_functions_and_a_library_setup():
    source = """
        import argparse
        import torch
        from timm import utils

        def get_args():
            parser = argparse.ArgumentParser()
            parser.add_argument('--device', default='cuda')
            return parser.parse_args()

        def batches(cfg, data):
            for x in data:
                yield x.to(cfg.device, non_blocking=True)

        def main():
            args = get_args()
            device = utils.init_distributed_device(args)
            for x in batches(args, []):
                pass
        """
    assert "default='cpu'" in fix(source).source


@pytest.mark.parametrize("reads, quoted", [
    ("args = parser.parse_args()\nif args.device == 'cuda':\n    torch.backends.cudnn.benchmark = True\n",
     "args.device == 'cuda'"),
    ("args = parser.parse_args()\nsetup_everything(args)\n", "setup_everything(args)"),
    ("args = parser.parse_args()\nname = args.device\n", "name = args.device"),
])
def test_an_option_read_otherwise_gets_an_unsafe_fix_that_quotes_the_read(reads, quoted):
    source = "import argparse\nimport torch\nparser = argparse.ArgumentParser()\n" \
             "parser.add_argument('--device', default='cuda')\n" + reads
    assert not fix(source).changed
    assert "default='cpu'" in fix(source, unsafe=True).source
    assert quoted in finding(source).message


def test_choices_without_cpu_keep_the_fix_unsafe():
    source = "import argparse\nimport torch\nparser = argparse.ArgumentParser()\n" \
             "parser.add_argument('--device', default='cuda', choices=['cuda', 'mps'])\n" + READS
    assert not fix(source).changed
    assert "has no 'cpu'" in finding(source).message


@pytest.mark.parametrize("option", [
    "parser.add_argument('--backend', default='cuda')",  # not a device option by its name
    "parser.add_argument('--device', default='cpu')",
    "parser.add_argument('--device', default=os.environ.get('DEVICE', 'cuda'))",
])
def test_other_options_are_left(option):
    source = "import argparse\nimport os\nimport torch\nparser = argparse.ArgumentParser()\n" + option + "\n" + READS
    assert not engine.check(dedent(source), engine.Options(JX312)).findings


SCRIPT = '''
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def init_device(name):
    device = torch.device(name)
    if device.type == "cuda":
        assert torch.cuda.is_available(), "CUDA is not available but cuda was specified."
    return device


parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda", type=str)
parser.add_argument("--epochs", default=1, type=int)
args = parser.parse_args()
device = init_device(torch.device(args.device))
print(f"device {args.device}")
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,))), batch_size=8)
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.6f}")
'''


@pytest.mark.jax
def test_the_default_port_runs_where_cuda_is_absent(tmp_path):
    # the original stops on this machine (no CUDA) with its default; the default JAX port trains
    original = tmp_path / "original.py"
    original.write_text(dedent(SCRIPT))
    env = {**os.environ, "PJRT_DEVICE": "CPU", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    before = subprocess.run([sys.executable, str(original)], capture_output=True, text=True, timeout=300, env=env)
    assert before.returncode != 0 and "CUDA is not available" in before.stderr
    result = engine.fix(original.read_text(), engine.Options(tuple(registry.rules_for("jax"))), "train.py")
    assert 'parser.add_argument("--device", default="cpu", type=str)' in result.source
    ported = tmp_path / "ported.py"
    ported.write_text(result.source)
    proc = subprocess.run([sys.executable, str(ported)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("loss ") == 4 and "device cpu" in proc.stdout
