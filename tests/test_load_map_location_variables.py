"""`torch.load(..., map_location=<variable>)` where the variable can only hold the accelerator
(`loc = 'cuda:{}'.format(gpu)`, `device = torch.device('cuda', rank)`, a CUDA-or-CPU choice):
after the port it holds the XLA device, onto which torch.load cannot restore, so the default
port loads on the CPU (TX105) and load_state_dict copies; a variable that may hold anything else
(a parameter, an option) is still only reported."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import run_script

DEFAULT = engine.Options(tuple(registry.rules_for("torch-xla")))

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn

    gpu = 0
    model = nn.Linear(4, 2).cuda(gpu)
    torch.save(model.state_dict(), "m.pth")
    loc = "cuda:{}".format(gpu)
    model.load_state_dict(torch.load("m.pth", map_location=loc))


    def resume(rank):
        device = torch.device("cuda", rank)
        state = torch.load("m.pth", map_location=device)
        return state


    def restore(path):
        where = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.load(path, map_location=where)


    def given(path, device):
        return torch.load(path, map_location=device)


    model.load_state_dict(resume(0))
    model.load_state_dict(restore("m.pth"))
    print("loaded", float(model.weight.sum()))
''')


def test_variables_that_hold_the_accelerator_load_on_the_cpu():
    result = engine.fix(SCRIPT, DEFAULT)
    port = result.source
    loads = [line.strip() for line in port.splitlines() if "torch.load(" in line]
    assert loads[:3] == ['model.load_state_dict(torch.load("m.pth", map_location="cpu"))',
                         'state = torch.load("m.pth", map_location="cpu")',
                         'return torch.load(path, map_location="cpu")'], loads
    # a parameter may hold anything: reported, left
    assert loads[3] == "return torch.load(path, map_location=device)"
    assert any(f.code == "TX105" and "map_location=<variable>" in f.message for f in result.remaining)


def test_a_variable_also_given_something_else_is_left():
    src = "import torch\n\ndevice = torch.device('cuda')\nif args.cpu:\n    device = args.device\nsd = torch.load('m.pth', map_location=device)\n"
    port = engine.fix(src, DEFAULT).source
    assert "map_location=device" in port, port


@pytest.mark.xla
@pytest.mark.slow
def test_the_port_saves_and_loads_on_xla(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(engine.fix(SCRIPT, DEFAULT).source)
    proc = run_script(path, [], tmp_path, xla=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("loaded "), proc.stdout
