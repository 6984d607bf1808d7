"""Port a small training script with the training-loop (TX2xx) and data (TX3xx) rules only,
then run the original on CPU torch and the port on torch_xla (PJRT_DEVICE=CPU) in
subprocesses and compare what they compute and how often XLA compiles.

The device edits of the TX1xx family are "done by hand": the script takes its device as an
argument (CPU for the original, ``torch_xla.device()`` for the port), so the test depends on
no other rule family.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from porter import engine, registry

ORIGINAL = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.optim as optim
    from torch.utils.data import DataLoader, TensorDataset


    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(20, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))


    def train(model, device, train_loader, optimizer, losses, on_step):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            on_step("train")
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())


    def test(model, device, test_loader):
        model.eval()
        correct = torch.zeros((), dtype=torch.long, device=device)
        with torch.no_grad():
            for data, target in test_loader:
                data = data.to(device)
                target = target.to(device)
                correct += (model(data).argmax(dim=1) == target).sum()
        return correct


    def finetune(model, device, X, Y, optimizer, losses, on_step, bs=8):
        # a loop over pre-built tensors, as a language model's bptt loop: no DataLoader. The
        # tensors stay on the CPU and each slice is moved: slicing a device tensor at a
        # loop-varying offset would compile one graph per offset (TX306).
        model.train()
        for i in range(0, X.size(0) - bs + 1, bs):
            on_step("finetune")
            x, y = X[i:i + bs].to(device), Y[i:i + bs].to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())


    def run(device, on_step=lambda phase: None, epochs=3):
        torch.manual_seed(0)
        X = torch.randn(100, 20)
        Y = (X[:, :4].argmax(dim=1) + (X[:, 4] > 1).long()) % 4
        train_loader = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True,
                                  generator=torch.Generator().manual_seed(1))
        test_loader = DataLoader(TensorDataset(X, Y), batch_size=25)
        model = MLP().to(device)
        optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for epoch in range(epochs):
            train(model, device, train_loader, optimizer, losses, on_step)
        correct = test(model, device, test_loader)
        finetune(model, device, X[:96], Y[:96], optimizer, losses, on_step)
        return losses, correct
    '''
).lstrip()

# Runs a script's run(device) and prints, once everything ran, the per-step losses read in
# one transfer, and (on XLA) the compilation / transfer counts seen at the start of each step.
HARNESS = textwrap.dedent(
    '''
    import importlib.util, json, sys
    import torch
    spec = importlib.util.spec_from_file_location("script", sys.argv[1])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    steps = []
    if sys.argv[2] == "xla":
        import torch_xla
        import torch_xla.debug.metrics as met
        def on_step(phase):
            compiles = met.metric_data("CompileTime")
            transfers = met.metric_data("TransferFromDeviceTime")
            steps.append([phase, compiles[0] if compiles else 0, transfers[0] if transfers else 0])
        device = torch_xla.device()
    else:
        on_step = lambda phase: None
        device = torch.device("cpu")
    losses, correct = script.run(device, on_step)
    if sys.argv[2] == "xla":
        torch_xla.sync()
        on_step("end")
    values = torch.stack(losses).cpu().tolist()
    print("RESULT " + json.dumps({"losses": [repr(v) for v in values], "correct": int(correct.cpu()), "steps": steps}))
    '''
).lstrip()


def _rules(prefixes):
    return tuple(r for r in registry.all_rules() if r.code.startswith(prefixes))


def _port(source, unsafe, prefixes=("TX2", "TX3")):
    return engine.fix(source, engine.Options(_rules(prefixes), unsafe_fixes=unsafe)).source


def _run(tmp_path: Path, name: str, source: str, backend: str) -> dict:
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    env = dict(os.environ, PJRT_DEVICE="CPU", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(harness), str(script), backend],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    out["losses"] = [float(v) for v in out["losses"]]
    return out


def _compiles_during(steps, phase):
    """Compilations seen at each step of ``phase``: entry i holds those of step i-1's graph
    (the device loader / sync of step i-1 ran it before step i started)."""
    out = []
    for a, b in zip(steps, steps[1:]):
        if a[0] == phase and b[0] == phase:
            out.append(b[1] - a[1])
    return out


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("orig"), "original", ORIGINAL, "cpu")


def test_port_text():
    ported = _port(ORIGINAL, unsafe=True)
    # `device` is a parameter whose callers the file does not show: the loaders are wrapped
    # only when it is the XLA device (TX301's fix is safe whatever the device holds)
    assert 'enumerate(pl.MpDeviceLoader(train_loader, device) if torch.device(device).type == "xla" else train_loader)' in ported
    assert 'for data, target in (pl.MpDeviceLoader(test_loader, device) if torch.device(device).type == "xla" else test_loader):' in ported
    assert "data.to(device)" not in ported and "target.to(device)" not in ported
    assert ported.count("xm.optimizer_step(optimizer)") == 2
    assert "generator=torch.Generator().manual_seed(1),\n                              drop_last=True)" in ported
    assert ported.count("drop_last") == 1  # the evaluation loader keeps every sample
    # the pre-built-tensor loop gets a step marker, the loader loops do not
    finetune = ported[ported.index("def finetune"):ported.index("def run")]
    assert finetune.count("torch_xla.sync()") == 1
    assert "torch_xla.sync()" not in ported[ported.index("def train"):ported.index("def finetune")]
    # a second port changes nothing
    assert _port(ported, unsafe=True) == ported
    # safe fixes only: no drop_last
    assert "drop_last" not in _port(ORIGINAL, unsafe=False)


def test_safe_port_same_losses_and_compiles_stop(original, tmp_path):
    ported = _port(ORIGINAL, unsafe=False)
    xla = _run(tmp_path, "ported_safe", ported, "xla")
    assert len(xla["losses"]) == len(original["losses"]) == 3 * 13 + 12
    diff = max(abs(a - b) for a, b in zip(xla["losses"], original["losses"]))
    assert diff <= 1e-5, diff
    assert xla["correct"] == original["correct"]
    train = _compiles_during(xla["steps"], "train")
    # epoch 1 compiles the first steps and the ragged last batch; later epochs compile nothing
    assert sum(train[:13]) >= 2
    assert sum(train[13:]) == 0, train
    fine = _compiles_during(xla["steps"], "finetune")
    assert sum(fine[2:]) == 0, fine
    # no device-to-host transfer while training (only the final read-out)
    assert all(s[2] == 0 for s in xla["steps"]), xla["steps"]


def test_unsafe_port_one_graph_per_step(tmp_path):
    # The reference for drop_last=True is the original with that one change, on CPU torch.
    reference_src = _port(ORIGINAL, unsafe=True, prefixes=("TX302",))
    assert reference_src != ORIGINAL and "drop_last=True" in reference_src
    reference = _run(tmp_path, "reference", reference_src, "cpu")
    xla = _run(tmp_path, "ported_unsafe", _port(ORIGINAL, unsafe=True), "xla")
    assert len(xla["losses"]) == len(reference["losses"]) == 3 * 12 + 12
    diff = max(abs(a - b) for a, b in zip(xla["losses"], reference["losses"]))
    assert diff <= 1e-5, diff
    train = _compiles_during(xla["steps"], "train")
    # warm-up: the first step, and the second (momentum buffers exist from then on)
    assert sum(train[2:]) == 0, train
    fine = _compiles_during(xla["steps"], "finetune")
    assert sum(fine[2:]) == 0, fine
    assert all(s[2] == 0 for s in xla["steps"]), xla["steps"]
