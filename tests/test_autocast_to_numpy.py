"""A model's output computed under autocast goes to NumPy: on XLA the autocast is bfloat16
(TX601), which NumPy has no dtype for, so the default port inserts `.float()` before `.numpy()`
(TX605; `.numpy()` raised "Got unsupported ScalarType BFloat16" with no finding but TX403's), and
leaves values that keep their own dtype (an argmax, a value already made float)."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import run_script

DEFAULT = engine.Options(tuple(registry.rules_for("torch-xla")))

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 2)

        def predict(self, x):
            with torch.cuda.amp.autocast():
                logits = self.net(x)
            return logits.detach().cpu().numpy()


    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(8, 2).to(device)
    head = Head().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outs, labels = [], []
    for step in range(3):
        x = torch.randn(4, 8, device=device)
        with torch.autocast("cuda", dtype=torch.float16):
            pred = model(x)
            idx = pred.argmax(1)
        loss = pred.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        outs.append(pred.detach().cpu().numpy())
        labels.append(idx.cpu().numpy())
    print("ok", len(outs), outs[0].shape, head.predict(x).shape, labels[0].dtype)
''')


def test_model_outputs_get_float_and_others_stay():
    port = engine.fix(SCRIPT, DEFAULT).source
    assert "outs.append(pred.detach().cpu().float().numpy())" in port, port
    assert "return logits.detach().cpu().float().numpy()" in port, port
    assert "labels.append(idx.cpu().numpy())" in port  # an argmax: int64 on both sides
    assert engine.fix(port, DEFAULT).source == port


@pytest.mark.xla
@pytest.mark.slow
def test_the_default_port_runs_on_xla(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(engine.fix(SCRIPT, DEFAULT).source)
    proc = run_script(path, [], tmp_path, xla=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok 3 (4, 2) (4, 2) int64"), proc.stdout
