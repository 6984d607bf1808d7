"""CUDA's own runtime objects (events for timing, streams, CUDA graphs, NVTX ranges, the device
context) have no XLA counterpart: every use is reported at its line (TX805, an error), and an
availability test that guards them is not folded to the accelerator path (TX107), so the default
port keeps skipping them as the original does without CUDA, and trains on XLA."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import run_script

DEFAULT = engine.Options(tuple(registry.rules_for("torch-xla")))

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_events = torch.cuda.is_available()
    model = nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        if use_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        x = torch.randn(4, 8, device=device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if use_events:
            end.record()
            torch.cuda.synchronize()
            print("ms", start.elapsed_time(end))
    if torch.cuda.is_available():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            y = model(x)
        torch.cuda.current_stream().wait_stream(side)
    print("done", loss.item())
''')

OTHERS = {
    "nvtx": "import torch\ntorch.cuda.nvtx.range_push('step')\nstep()\ntorch.cuda.nvtx.range_pop()\n",
    "device context": "import torch\nwith torch.cuda.device(args.gpu):\n    train()\n",
    "graph": "import torch\ng = torch.cuda.CUDAGraph()\nwith torch.cuda.graph(g):\n    out = model(x)\n",
}


def test_every_use_is_an_error_at_its_line_and_guards_stay():
    result = engine.fix(SCRIPT, DEFAULT)
    lines = {f.position.line for f in result.remaining if f.code == "TX805" and f.severity.name == "ERROR"}
    source = result.source.splitlines()
    for needle in ("torch.cuda.Event(", "torch.cuda.Stream()", "torch.cuda.stream(side)", "torch.cuda.current_stream()"):
        assert any(needle in source[n - 1] for n in lines), (needle, lines)
    assert "use_events = torch.cuda.is_available()" in result.source  # not folded: it guards events
    assert "if torch.cuda.is_available():" in result.source  # it guards a stream
    assert "torch_xla.device()" in result.source  # the device choice is still ported


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_runtime_objects_are_errors(name):
    result = engine.fix(OTHERS[name], DEFAULT)
    assert any(f.code == "TX805" and f.severity.name == "ERROR" for f in result.remaining), result.remaining


@pytest.mark.xla
@pytest.mark.slow
def test_the_default_port_trains_on_xla(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(engine.fix(SCRIPT, DEFAULT).source)
    proc = run_script(path, [], tmp_path, xla=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("done ") and int(lines[-1].split()[-1]) > 0, proc.stdout
