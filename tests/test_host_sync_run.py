"""End to end: a training loop with host syncs in the step, ported by the TX4xx rules alone,
run on torch_xla (PJRT_DEVICE=CPU) beside the original.

The program already puts its model and batches on the XLA device and marks the step with
``torch_xla.sync()`` by hand, so that only the host-sync rules are exercised. A probe in the
program records, after every step's sync, how many device-to-host transfers and compilations
torch_xla's metrics have counted so far.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

STEPS = 20
LOG_EVERY = 5
WARMUP = 2  # steps whose graphs may be new: step 0 (accumulators start as Python numbers) and step 1

PROGRAM = textwrap.dedent(
    """
    import json
    import sys

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch.utils.data import DataLoader, TensorDataset

    PROBES = []


    def probe():
        transfers = met.metric_data('TransferFromDeviceTime')
        compiles = met.metric_data('CompileTime')
        PROBES.append([transfers[0] if transfers else 0, compiles[0] if compiles else 0])


    def main():
        torch.manual_seed(0)
        device = torch_xla.device()
        inputs = torch.randn(STEPS * 16, 10)
        labels = (inputs.sum(dim=1) > 0).long()
        loader = DataLoader(TensorDataset(inputs, labels), batch_size=16, shuffle=False)
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        total_loss = 0.0
        correct = 0
        met.clear_all()
        for step, (data, target) in enumerate(loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            pred = output.argmax(dim=1)
            correct += pred.eq(target).sum().item()
            if step % LOG_EVERY == 0:
                print(f'step {step} loss {loss.item():.4f}')
            torch_xla.sync()
            probe()
        print(f'mean loss {total_loss / len(loader):.4f} accuracy {correct}/{len(loader.dataset)} {type(total_loss).__name__} {type(correct).__name__}')
        probe()
        with open(sys.argv[1], 'w') as f:
            json.dump(PROBES, f)


    if __name__ == '__main__':
        main()
    """
).replace("STEPS", str(STEPS)).replace("LOG_EVERY", str(LOG_EVERY))


# The language-model pattern: the running sum is read in the loop, in logging steps only.
LM_PROGRAM = textwrap.dedent(
    """
    import json
    import math
    import sys

    import torch
    import torch.nn as nn
    import torch_xla
    import torch_xla.debug.metrics as met

    PROBES = []


    def probe():
        transfers = met.metric_data('TransferFromDeviceTime')
        compiles = met.metric_data('CompileTime')
        PROBES.append([transfers[0] if transfers else 0, compiles[0] if compiles else 0])


    def main():
        torch.manual_seed(0)
        device = torch_xla.device()
        vocab, bptt, width = 50, 8, 4
        data = torch.randint(0, vocab, (STEPS * bptt + 1, width))
        model = nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab)).to(device)
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        total_loss = 0.
        met.clear_all()
        for batch, i in enumerate(range(0, STEPS * bptt, bptt)):
            x = data[i:i + bptt].to(device)
            y = data[i + 1:i + 1 + bptt].to(device)
            optimizer.zero_grad()
            output = model(x)
            loss = criterion(output.view(-1, vocab), y.reshape(-1))
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            if batch % LOG_EVERY == 0 and batch > 0:
                cur_loss = total_loss / LOG_EVERY
                print('| batch {:3d} | loss {:5.2f} | ppl {:8.2f}'.format(batch, cur_loss, math.exp(cur_loss)))
                total_loss = 0
            torch_xla.sync()
            probe()
        probe()
        with open(sys.argv[1], 'w') as f:
            json.dump(PROBES, f)


    if __name__ == '__main__':
        main()
    """
).replace("STEPS", str(STEPS)).replace("LOG_EVERY", str(LOG_EVERY))


def port(source: str) -> str:
    rules = registry.select("torch-xla", ("TX4",))
    result = engine.fix(source, engine.Options(rules, unsafe_fixes=True))
    assert result.changed
    return result.source


def run(path, probes):
    env = dict(os.environ, PJRT_DEVICE="CPU")
    proc = subprocess.run([sys.executable, str(path), str(probes)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(probes) as f:
        return proc.stdout, json.load(f)


def per_step(counts):
    """Increments of a cumulative counter: one number per step, then the part after the loop."""
    values = [0] + [c for c in counts]
    return [b - a for a, b in zip(values, values[1:])]


def run_both(tmp, program):
    pytest.importorskip("torch_xla")
    ported = port(program)
    (tmp / "original.py").write_text(program)
    (tmp / "ported.py").write_text(ported)
    return ported, run(tmp / "original.py", tmp / "original.json"), run(tmp / "ported.py", tmp / "ported.json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_both(tmp_path_factory.mktemp("hostsync"), PROGRAM)


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    return run_both(tmp_path_factory.mktemp("hostsync_lm"), LM_PROGRAM)


def test_port_is_what_the_rules_say(runs):
    ported, _, _ = runs
    assert "total_loss += loss.detach()" in ported
    assert "correct += pred.eq(target).sum()\n" in ported
    assert "xm.add_step_closure(lambda step, loss: print(f'step {step} loss {loss.item():.4f}'), args=(step, loss))" in ported
    # back to numbers after the loop, as .item() gave them (float sum from 0.0, count from 0)
    assert "\n    total_loss = float(total_loss)\n" in ported
    assert "\n    correct = int(correct)\n" in ported
    # a second run changes nothing
    assert engine.fix(ported, engine.Options(registry.select("torch-xla", ("TX4",)), unsafe_fixes=True)).changed is False


def test_same_printed_numbers(runs):
    _, (original_out, _), (ported_out, _) = runs
    assert original_out.count("\n") == STEPS // LOG_EVERY + 1
    assert ported_out == original_out
    assert original_out.rstrip().endswith("float int")


def test_transfers_only_in_logging_steps_and_once_after_the_loop(runs):
    _, (_, original), (_, ported) = runs
    orig_transfers = per_step([p[0] for p in original])
    port_transfers = per_step([p[0] for p in ported])
    assert len(port_transfers) == STEPS + 1
    logging = [s % LOG_EVERY == 0 for s in range(STEPS)]
    # the original copies to the host every step (loss and count), and once more to log
    assert orig_transfers[:STEPS] == [3 if log else 2 for log in logging]
    # the port: one copy per logging step (the printed loss), none otherwise
    assert port_transfers[:STEPS] == [1 if log else 0 for log in logging]
    # and once after the loop for each accumulator
    assert port_transfers[STEPS] == 2


def test_no_compilation_after_warmup(runs):
    _, (_, original), (_, ported) = runs
    port_compiles = per_step([p[1] for p in ported])
    assert sum(port_compiles[:WARMUP]) >= 1
    assert port_compiles[WARMUP:] == [0] * (STEPS + 1 - WARMUP)
    orig_compiles = per_step([p[1] for p in original])
    assert orig_compiles[WARMUP:] == [0] * (STEPS + 1 - WARMUP)


def test_lm_port_text(lm_runs):
    ported, _, _ = lm_runs
    assert "total_loss += loss.detach()" in ported
    # the print reads the device sum through cur_loss: it runs after the step, with this
    # step's values bound
    # step's values bound (a named local function: the line is too long for a lambda)
    assert ("def log_step(batch, cur_loss):\n"
            "                print('| batch {:3d} | loss {:5.2f} | ppl {:8.2f}'.format(batch, cur_loss, math.exp(cur_loss)))\n"
            "            xm.add_step_closure(log_step, args=(batch, cur_loss))") in ported
    # total_loss is not read after the loop: nothing to convert
    assert "isinstance(total_loss" not in ported


def test_lm_same_printed_numbers(lm_runs):
    _, (original_out, _), (ported_out, _) = lm_runs
    assert original_out.count("\n") == (STEPS - 1) // LOG_EVERY
    assert ported_out == original_out


def test_lm_transfers_only_in_logging_steps(lm_runs):
    _, (_, original), (_, ported) = lm_runs
    logging = [s % LOG_EVERY == 0 and s > 0 for s in range(STEPS)]
    assert per_step([p[0] for p in original])[:STEPS] == [1] * STEPS
    # the closure formats cur_loss and takes math.exp of it: two reads of a computed value
    assert per_step([p[0] for p in ported]) == [2 if log else 0 for log in logging] + [0]


def test_lm_no_compilation_after_the_first_logging_step(lm_runs):
    _, _, (_, ported) = lm_runs
    compiles = per_step([p[1] for p in ported])
    # new graphs: step 0 (sum starts as 0.0), step 1 (sum is a tensor), the first logging
    # step (its graph also computes cur_loss); after the reset to 0 the step-0 graph is reused
    assert compiles[LOG_EVERY + 1:] == [0] * (STEPS + 1 - LOG_EVERY - 1), compiles
