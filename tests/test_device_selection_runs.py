"""Device selection spelled in the ways scripts choose a device, ported in default mode (safe
fixes only) and run: the port trains on the XLA device (XLA graphs executed) and ends with the
loss the original reaches on the CPU; a user's own force-CPU flag keeps the port on the CPU.

Spellings: a function of the script that returns the device string (`if cuda: return "cuda"`,
with an MPS arm too; passed to a function of the script that prints it); a conditional expression of an opt-in `--cuda` flag (the CPU with the default
flags: the port trains on XLA with and without the flag; also read through a variable,
`use_cuda = args.cuda and torch.cuda.is_available()`) and of a force-CPU flag (kept);
torch 2.6+'s device-generic `torch.accelerator` (`current_accelerator()` after an
availability test and a user flag, its `.type` in a conditional expression, the device named
in an f-string), a device string chosen by an `if`/`elif` chain of opt-in flags (`--cuda`,
`--mps`: the default flags' `else: device = "cpu"` trains on XLA too) and then turned into
`torch.device(device)` (also passed on to the function that trains, or with a `--cpu` arm that
keeps the CPU), the same chain of `torch.device("cuda")` / `torch.device("cpu")` objects (one
`--cuda` flag; a `--force-cpu` arm, a CUDA and an MPS arm), and a CUDA device number kept in a variable (`device = 0`); a device string the script also
reads as text (`'cuda' in device`, `device.startswith(...)`, `device.split(':')`, `device[:4]`):
it stays a string ('xla'). Also a module moved to its device after an optimizer
over its parameters was built (a layer that builds its own optimizer, a script that builds the
optimizer first): the port keeps the parameters' identity on the move and trains.
"""
import textwrap
from pathlib import Path

import pytest
from scripthelp import run_script

from porter import engine, registry

from lanes import fixture_slice

pytestmark = [pytest.mark.xla, pytest.mark.slow]

_TRAIN = """
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,)))
loader = torch.utils.data.DataLoader(data, batch_size=8)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
print(f"final {loss.item():.5f}")
"""

_HEAD = """
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

# name -> (script, the port's arguments that train on the accelerator, the arguments that keep
#          it on the CPU (None: no way to), what the port's device selection reads)
SCRIPTS = {
    "device_function": (_HEAD + textwrap.dedent("""
        def get_device():
            if torch.cuda.is_available():
                return "cuda"
            return "cpu"
        device = get_device()
        """) + _TRAIN, [], None, 'return "xla"'),
    "device_function_passed_on": (_HEAD + textwrap.dedent("""
        def get_device():
            if not torch.cuda.is_available():
                return "cpu"
            return "cuda:0"
        def announce(device, steps):
            print(f"training {steps} steps on", device)
        device = get_device()
        announce(device, steps=4)
        """) + _TRAIN, [], None, 'return "xla"'),
    "device_function_three_ways": (_HEAD + textwrap.dedent("""
        def default_device():
            if torch.cuda.is_available():
                return "cuda:0"
            elif torch.backends.mps.is_available():
                return "mps"
            else:
                return "cpu"
        device = default_device()
        print("training on", device)
        """) + _TRAIN, [], None, 'return "xla"'),
    "opt_in_flag_expression": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true", help="train on the GPU")
        parser.add_argument("--gpu", type=int, default=0)
        args = parser.parse_args()
        device = torch.device(f"cuda:{args.gpu}" if args.cuda else "cpu")
        """) + _TRAIN, ["--cuda"], None, "device = torch_xla.device()"),
    # the flag read through a variable of its own, availability folded into it
    "opt_in_flag_variable": (_HEAD + textwrap.dedent("""
        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--cuda", action="store_true")
            args = parser.parse_args()
            use_accel = args.cuda and torch.cuda.is_available()
            return torch.device("cuda" if use_accel else "cpu")
        device = main()
        """) + _TRAIN, [], None, "return torch_xla.device()"),
    "force_cpu_flag_variable": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cpu", action="store_true", default=False)
        args = parser.parse_args()
        use_gpu = not args.cpu and torch.cuda.is_available()
        device = torch.device("cuda" if use_gpu else "cpu")
        """) + _TRAIN, [], ["--cpu"], 'device = torch_xla.device() if use_gpu else torch.device("cpu")'),
    "force_cpu_flag_expression": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cpu", action="store_true", help="force the CPU")
        args = parser.parse_args()
        device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
        """) + _TRAIN, [], ["--cpu"], "device = \"cpu\" if args.cpu else torch_xla.device()"),
    "accelerator_flag": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--no-accel", action="store_true")
        args = parser.parse_args()
        use_accel = not args.no_accel and torch.accelerator.is_available()
        if use_accel:
            device = torch.accelerator.current_accelerator()
        else:
            device = torch.device("cpu")
        """) + _TRAIN, [], ["--no-accel"], 'device = torch.device("xla")'),
    "accelerator_type": (_HEAD + textwrap.dedent("""
        device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
        print(f"Using {device} device")
        """) + _TRAIN, [], None, 'device = "xla"'),
    "accelerator_fstring": (_HEAD + textwrap.dedent("""
        if torch.accelerator.is_available() and torch.accelerator.device_count() > 0:
            acc = torch.accelerator.current_accelerator()
            device = torch.device(f"{acc}:0")
            torch.accelerator.set_device_index(0)
        else:
            device = torch.device("cpu")
        """) + _TRAIN, [], None, 'acc = torch.device("xla")'),
    "string_chain": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true")
        parser.add_argument("--mps", action="store_true")
        args = parser.parse_args()
        if args.cuda:
            device = "cuda"
        elif args.mps:
            device = "mps"
        else:
            device = "cpu"
        device = torch.device(device)
        """) + _TRAIN, [], None, 'device = "xla"'),
    "string_chain_cpu_flag": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cpu", action="store_true", default=False)
        parser.add_argument("--cuda", action="store_true")
        args = parser.parse_args()
        if args.cpu:
            device = "cpu"
        elif args.cuda:
            device = "cuda"
        else:
            device = "cpu"
        device = torch.device(device)
        """) + _TRAIN, [], ["--cpu"], 'device = "xla"'),
    "string_chain_passed_on": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true")
        parser.add_argument("--mps", action="store_true")
        args = parser.parse_args()
        if args.cuda and not args.mps:
            device = "cuda"
        elif args.mps and not args.cuda:
            device = "mps"
        else:
            device = "cpu"
        device = torch.device(device)


        def run(args, device):
        """) + textwrap.indent(_TRAIN, "    ") + "\n\nrun(args, device)\n", ["--cuda"], None, 'device = "xla"'),
    "device_object_chain": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true", default=False)
        args = parser.parse_args()
        if args.cuda:
            device = torch.device("cuda:0")
        else:
            device = torch.device("cpu")
        """) + _TRAIN, [], None, "device = torch_xla.device()"),
    "device_object_chain_cpu_flag": (_HEAD + textwrap.dedent("""
        parser = argparse.ArgumentParser()
        parser.add_argument("--force-cpu", action="store_true")
        parser.add_argument("--gpu", action="store_true")
        parser.add_argument("--mps", action="store_true")
        args = parser.parse_args()
        if args.force_cpu:
            device = torch.device("cpu")
        elif args.gpu:
            device = torch.device("cuda")
        elif args.mps:
            device = torch.device("mps")
        else:
            device = torch.device("cpu")
        """) + _TRAIN, [], ["--force-cpu"], "else:\n    device = torch_xla.device()"),
    "device_number": (_HEAD + textwrap.dedent("""
        device = 0
        torch.cuda.set_device(device)
        """) + _TRAIN, [], None, 'device = "xla"'),
    # a device string the script also reads as text (a torch.device has no `in`, startswith,
    # split or slicing): it stays a string, 'xla'
    "string_searched": (_HEAD + textwrap.dedent("""
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        device_type = 'cuda' if 'cuda' in device else 'cpu'
        amp = torch.autocast(device_type=device_type, enabled=False)
        """) + _TRAIN, [], None, "device = 'xla'"),
    "string_method": (_HEAD + textwrap.dedent("""
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            torch.backends.cudnn.benchmark = True
        print("device kind", device.split(":")[0])
        """) + _TRAIN, [], None, 'device = "xla"'),
    "string_sliced": (_HEAD + textwrap.dedent("""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        print("on", device[:4].upper())
        """) + _TRAIN, [], None, 'device = "xla"'),
}

def _port(source: str) -> str:
    options = engine.Options(registry.select("torch-xla"), unsafe_fixes=False)
    result = engine.fix(source, options, "train.py")
    # what is left for a human is the loader's last batch (TX302, unsafe), nothing about devices
    assert {f.code for f in result.remaining} <= {"TX302"}, [(f.code, f.message) for f in result.remaining]
    return result.source


def _run(script: Path, args, xla: bool) -> str:
    proc = run_script(script, args, script.parent, xla)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _final(stdout: str) -> float:
    return float(next(line for line in stdout.splitlines() if line.startswith("final ")).split()[1])


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> float:
    """The final loss of the training every script runs, on the CPU (the originals that choose
    a device run it there on a host without a GPU; `device = 0` needs one)."""
    reference = tmp_path_factory.mktemp("reference") / "cpu.py"
    reference.write_text(_HEAD + 'device = torch.device("cpu")\n' + _TRAIN, encoding="utf-8")
    return _final(_run(reference, [], xla=False))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_default_port_selects_the_xla_device(name):
    source, _, _, selected = SCRIPTS[name]
    ported = _port(source)
    assert selected in ported, ported
    assert "torch.accelerator" not in ported and "cuda" not in ported.replace("args.cuda", "").replace("--cuda", "")


@pytest.mark.parametrize("name", fixture_slice(sorted(SCRIPTS), 2))  # half of them per run of the suite
def test_default_port_trains_on_xla(name, expected, tmp_path):
    source, args, cpu_flag, _ = SCRIPTS[name]
    port = tmp_path / "port.py"
    port.write_text(_port(source), encoding="utf-8")
    out = _run(port, args, xla=True)
    assert int(out.strip().splitlines()[-1].split(": ")[1]) >= 2, out  # XLA graphs ran the steps
    assert _final(out) == pytest.approx(expected, abs=1e-4)
    if cpu_flag is not None:
        out = _run(port, cpu_flag, xla=True)
        assert out.strip().splitlines()[-1] == "XLA executions: 0", out
        assert _final(out) == pytest.approx(expected, abs=1e-5)


# a module moved to its device after an optimizer over its parameters was built (TX203): on XLA
# `.to()` gives the module new Parameter objects, and without the swap flag the optimizer updates
# the old CPU ones (the loss never changes)
_LAYER = """
class Layer(nn.Linear):
    def __init__(self, d_in, d_out):
        super().__init__(d_in, d_out)
        self.opt = torch.optim.SGD(self.parameters(), lr=0.1)

    def train_step(self, x, y):
        self.opt.zero_grad()
        loss = F.mse_loss(self(x), y)
        loss.backward()
        self.opt.step()
        return loss
"""
_MOVED_AFTER = {
    "built_and_moved": _LAYER + "layer = Layer(6, 3).to(device)\n",
    "moved_by_name": _LAYER + "layer = Layer(6, 3)\nlayer.to(device)\n",
    "optimizer_first": "layer = nn.Linear(6, 3)\nopt = torch.optim.SGD(layer.parameters(), lr=0.1)\nlayer.cuda()\n"
                       "def train_step(x, y):\n    opt.zero_grad()\n    loss = F.mse_loss(layer(x), y)\n    loss.backward()\n"
                       "    opt.step()\n    return loss\nlayer.train_step = train_step\n",
}


@pytest.mark.parametrize("name", sorted(_MOVED_AFTER))
def test_a_module_moved_after_its_optimizer_trains_on_xla(name, tmp_path):
    body = _MOVED_AFTER[name] + textwrap.dedent("""
        x, y = torch.randn(16, 6).to(device), torch.randn(16, 3).to(device)
        for step in range(4):
            loss = layer.train_step(x, y)
        print(f"trained on {layer.weight.device.type}")
        print(f"final {loss.item():.5f}")
        """)
    source = _HEAD + "torch.manual_seed(0)\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n" + body
    cpu = tmp_path / "cpu.py"
    cpu.write_text(source.replace("layer.cuda()", "layer.cpu()"), encoding="utf-8")
    port = tmp_path / "port.py"
    ported = _port(source)
    assert "set_swap_module_params_on_conversion(True)" in ported, ported
    port.write_text(ported, encoding="utf-8")
    out = _run(port, [], xla=True)
    assert "trained on xla" in out, out  # the parameters the optimizer updated live on the XLA device
    assert _final(out) == pytest.approx(_final(_run(cpu, [], xla=False)), abs=1e-4)
