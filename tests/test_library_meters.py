"""TX406 / TX403 on meters of other modules: a class the script imports (from an installed
library, a package on the path, a module beside the script) is read from its source, found as
`import` would find it, and moved to the device as a meter class of the file is; one porter
cannot read is reported at its line with the rewrite."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

RULES = registry.select("torch-xla", ("TX403", "TX406"))

ARITHMETIC = '''
class AverageMeter:
    """Computes and stores the average and current value"""
    def __init__(self):
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0
'''

CONVERTS = '''
class HistoryMeter:
    def __init__(self):
        self.values = []

    def update(self, val, n=1):
        self.values.append(float(val))
'''


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def library(root, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text))


def step(imports: str, meter: str, update: str) -> str:
    return dedent(f"""
        import torch
        {imports}

        def train(model, loader, optimizer, accum_steps):
            losses_m = {meter}
            for x, y in loader:
                loss = model(x, y)
                loss.backward()
                optimizer.step()
                {update}
            return losses_m.avg
        """)


def run(source: str, unsafe: bool = True, path: str = "<string>"):
    return engine.fix(source, engine.Options(RULES, unsafe_fixes=unsafe), path)


def check(source: str, path: str = "<string>"):
    return engine.check(source, engine.Options(RULES), path).findings


def codes(findings) -> list[str]:
    return [f.code for f in findings]


@pytest.fixture
def meterkit(tmp_path, monkeypatch):
    """An installed-like package: the class in a submodule, re-exported by the package."""
    library(tmp_path / "site", {
        "meterkit/__init__.py": "from .utils import *\nfrom . import utils\n",
        "meterkit/utils/__init__.py": "from .metrics import AverageMeter, accuracy\nfrom .history import HistoryMeter as History\n",
        "meterkit/utils/metrics.py": ARITHMETIC + "\n\ndef accuracy(a, b):\n    return a\n",
        "meterkit/utils/history.py": CONVERTS,
    })
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path


@pytest.mark.parametrize("imports, meter, update, fixed", [
    ("from meterkit import utils", "utils.AverageMeter()", "losses_m.update(loss.item(), x.size(0))",
     "losses_m.update(loss.detach(), x.size(0))"),
    ("import meterkit.utils as mu", "mu.AverageMeter()", "losses_m.update(loss.item() * accum_steps, x.size(0))",
     "losses_m.update(loss.detach() * accum_steps, x.size(0))"),
    ("from meterkit.utils.metrics import AverageMeter as Avg", "Avg()", "losses_m.update(-(loss.item() / accum_steps))",
     "losses_m.update(-(loss.detach() / accum_steps))"),
    ("import meterkit", "meterkit.utils.AverageMeter()", "losses_m.update(accum_steps * loss.item(), len(x))",
     "losses_m.update(accum_steps * loss.detach(), len(x))"),
])
def test_an_imported_meter_that_only_does_arithmetic_sums_on_the_device(meterkit, imports, meter, update, fixed):
    source = step(imports, meter, update)
    result = run(source)
    assert fixed in result.source
    findings = check(source)
    assert codes(findings) == ["TX406"]
    assert "an imported class, read in its source" in findings[0].message
    assert not run(result.source).changed
    # an unsafe fix: the default mode leaves the line
    assert not run(source, unsafe=False).changed


def test_an_imported_meter_that_converts_the_value_keeps_item_and_is_reported(meterkit):
    source = step("from meterkit.utils import History", "History()", "losses_m.update(loss.item(), x.size(0))")
    assert not run(source).changed
    findings = check(source)
    assert codes(findings) == ["TX403"]
    assert "cannot read" not in findings[0].message


@pytest.mark.parametrize("imports, meter", [
    ("from porter_test_absent_lib import AverageMeter", "AverageMeter()"),
    ("import porter_test_absent_lib.meters as meters", "meters.AverageMeter(':6.2f')"),
    ("from meterkit import Missing", "Missing()"),  # the module is there, the class is not
])
def test_a_meter_porter_cannot_read_is_reported_at_its_line_with_the_rewrite(meterkit, imports, meter):
    source = step(imports, meter, "losses_m.update(loss.item(), x.size(0))")
    assert not run(source).changed
    [finding] = check(source)
    assert finding.code == "TX403" and finding.position.line == source.splitlines().index(
        "        losses_m.update(loss.item(), x.size(0))") + 1
    assert "porter cannot read its source" in finding.message and "`loss.detach()`" in finding.message


def test_a_module_beside_the_script_is_read(tmp_path):
    library(tmp_path, {"utils.py": ARITHMETIC})
    script = tmp_path / "train.py"
    source = step("from utils import AverageMeter", "AverageMeter()", "losses_m.update(loss.item(), x.size(0))")
    script.write_text(source)
    assert "losses_m.update(loss.detach(), x.size(0))" in run(source, path=str(script)).source
    # the same text elsewhere: porter does not find that module
    elsewhere = tmp_path / "elsewhere" / "train.py"
    elsewhere.parent.mkdir()
    elsewhere.write_text(source)
    assert codes(check(source, str(elsewhere))) == ["TX403"]


def test_a_rebound_or_unknown_receiver_is_left_alone(meterkit):
    source = step("from meterkit import utils", "utils.AverageMeter() if accum_steps else None",
                  "losses_m.update(loss.item(), x.size(0))")
    assert not run(source).changed
    findings = check(source)
    assert codes(findings) == ["TX403"]
    assert "cannot read" not in findings[0].message


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="timm is not installed")
def test_timms_average_meter():
    source = step("from timm import utils", "utils.AverageMeter()",
                  "losses_m.update(loss.item() * accum_steps, x.size(0))")
    assert "losses_m.update(loss.detach() * accum_steps, x.size(0))" in run(source).source


PROGRAM = '''
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
import torch_xla.debug.metrics as met
from meters import AverageMeter


def transfers():
    data = met.metric_data('TransferFromDeviceTime')
    return data[0] if data else 0


def train(model, batches, optimizer, device, accum_steps):
    losses = AverageMeter()
    counts = []
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.update(loss.item() * accum_steps, x.size(0))
        torch_xla.sync()
        counts.append(transfers())
    return losses, counts


def main():
    torch.manual_seed(0)
    device = torch_xla.device()
    model = nn.Linear(6, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(4, 6), torch.randint(0, 3, (4,))) for _ in range(8)]
    losses, counts = train(model, batches, optimizer, device, 2)
    print(f"avg {float(losses.avg):.6f} count {losses.count}")
    print("per-step", [b - a for a, b in zip(counts, counts[1:])])


main()
'''


@pytest.mark.xla
def test_a_library_meter_ported_sums_on_the_device_and_averages_the_same(tmp_path):
    library(tmp_path, {"meters/__init__.py": "from .average import AverageMeter\n", "meters/average.py": ARITHMETIC})
    original = tmp_path / "train.py"
    original.write_text(dedent(PROGRAM))
    ported = tmp_path / "ported.py"
    ported.write_text(run(original.read_text(), path=str(original)).source)
    assert "losses.update(loss.detach() * accum_steps, x.size(0))" in ported.read_text()
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    outs = [subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
            for p in (original, ported)]
    for proc in outs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    (avg_o, steps_o), (avg_p, steps_p) = (p.stdout.splitlines() for p in outs)
    assert avg_o.split()[2:] == avg_p.split()[2:]  # the same count
    assert abs(float(avg_o.split()[1]) - float(avg_p.split()[1])) < 1e-5
    assert steps_o == "per-step [1, 1, 1, 1, 1, 1, 1]"  # the original's .item() in every step
    assert steps_p == "per-step [0, 0, 0, 0, 0, 0, 0]"
