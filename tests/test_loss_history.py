"""A per-step history of the loss kept in a list (`history.append(loss.item())`,
`losses.append(loss.detach().cpu().numpy())`), and a dict of running sums, one per loss of a
multi-task model (`meters[k] += v.item()` over `losses.items()`): with --unsafe-fixes TX401
keeps the device tensors (`loss.detach()`) and converts the list or the dict once after the
loop, so the step copies nothing to the host and the code after the loop reads what it read
before. The dict may be formatted in the loop's log line (`f"{k}={v / n:.4f}" for k, v in
meters.items()`) and cleared; a list or dict read in the step otherwise (`history[-1]` in a log
line) is left as it is (TX403 reports the copy). The ports verify with the original's losses
and no host transfer in the steps that log nothing."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from lanes import fixture_slice
from scripthelp import verify_json

UNSAFE = engine.Options(registry.select("torch-xla"), unsafe_fixes=True)

_HEAD = '''
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data, labels = torch.randn(6, 8, 5), torch.randint(0, 2, (6, 8))
'''

SPELLINGS = {
    "item": _HEAD + textwrap.dedent('''
        history = []
        for step in range(6):
            x, y = data[step].to(device), labels[step].to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss.item())
        print("mean of the last three", sum(history[-3:]) / 3)
        '''),
    "numpy": _HEAD + textwrap.dedent('''
        def train_epoch():
            losses = []
            for step in range(6):
                x, y = data[step].to(device), labels[step].to(device)
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.detach().cpu().numpy())
            return float(np.mean(losses))

        print("epoch loss", train_epoch())
        '''),
    "cpu item, never read after": _HEAD + textwrap.dedent('''
        trace = []
        for step in range(6):
            x, y = data[step].to(device), labels[step].to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            trace.append(loss.cpu().item())
        '''),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_history_keeps_device_tensors(name):
    result = engine.fix(SPELLINGS[name], UNSAFE, "train.py")
    port = result.source
    assert ".append(loss.detach())" in port, port
    assert "TX403" not in {f.code for f in result.remaining}, port
    converted = "[:] = [v." in port
    assert converted == (name != "cpu item, never read after"), port
    assert engine.fix(port, UNSAFE, "train.py").source == port


def test_a_history_read_in_the_step_is_left():
    source = SPELLINGS["item"].replace("    history.append(loss.item())\n",
                                       "    history.append(loss.item())\n    print(history[-1])\n")
    result = engine.fix(source, UNSAFE, "train.py")
    assert "history.append(loss.item())" in result.source
    assert any(f.code == "TX403" for f in result.remaining)


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("name", fixture_slice(["numpy", "item"], 2))  # one per run of the suite
def test_the_port_copies_nothing_in_its_steps(name, tmp_path):
    original = textwrap.dedent(SPELLINGS[name])
    report = verify_json(tmp_path, original, engine.fix(original, UNSAFE, "train.py").source, 4)
    assert report["status"] == "passed", (report["summary"], report["notes"])


_MULTI = _HEAD + textwrap.dedent('''
    from collections import defaultdict

    def losses_of(out, y):
        return {"ce": F.cross_entropy(out, y), "l2": out.pow(2).mean()}

    def epoch():
        meters = defaultdict(float)
        for step in range(6):
            x, y = data[step].to(device), labels[step].to(device)
            losses = losses_of(model(x), y)
            loss = sum(losses.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
            for k, v in losses.items():
                meters[k] += v.item()
            LOG
        return {k: v / 6 for k, v in meters.items()}

    print("averages", epoch())
    ''')

METERS = {
    "formatted and cleared": _MULTI.replace("LOG", "if (step + 1) % 2 == 0:\n"
                                            "            print(' '.join(f'{k}={v / 2:.4f}' for k, v in meters.items()))\n"
                                            "            meters.clear()"),
    "read after the loop": _MULTI.replace("LOG", "pass"),
}


@pytest.mark.parametrize("name", sorted(METERS))
def test_the_meters_sum_on_the_device(name):
    result = engine.fix(METERS[name], UNSAFE, "train.py")
    port = result.source
    assert "meters[k] += v.detach()" in port, port
    assert "meters.update({k: v.item() if isinstance(v, torch.Tensor) else v for k, v in meters.items()})" in port, port
    assert engine.fix(port, UNSAFE, "train.py").source == port


def test_meters_printed_whole_are_left():
    source = METERS["read after the loop"].replace("        pass\n", "        print(meters)\n")
    assert "print(meters)" in source
    assert "meters[k] += v.item()" in engine.fix(source, UNSAFE, "train.py").source


@pytest.mark.xla
@pytest.mark.slow
def test_the_meters_port_copies_nothing_in_its_steps(tmp_path):
    original = textwrap.dedent(METERS["formatted and cleared"])
    report = verify_json(tmp_path, original, engine.fix(original, UNSAFE, "train.py").source, 4)
    assert report["status"] == "passed", (report["summary"], report["notes"])
