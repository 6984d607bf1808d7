"""Default mode (safe fixes only) ports a GPU script into one that trains on the XLA device.

The fixtures whose device comes from a user's flag and availability tests (`--no-cuda`,
`--cpu`, `use_cuda = not args.no_cuda and torch.cuda.is_available()`, CUDA/MPS chains) are
ported without --unsafe-fixes and run:

- with the script's defaults the port trains on the XLA device (every traced step executes
  XLA graphs) and its losses equal the original's, step by step (`porter verify --script`);
- with the user's force-CPU flag the port runs on the CPU (no XLA graph is executed) and ends
  with the same final metric as the original run with that flag; for a device kept as a
  configuration string (`device = 'cuda'`, set by `--device=cpu`) the same with that override.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scripthelp import run_script

from porter import engine, registry
from porter.fixtures import fixtures

from lanes import every_lane, fixture_slice

pytestmark = [pytest.mark.xla, pytest.mark.slow]

# fixture -> the flag with which the original (and the port) stays on the CPU
CPU_FLAGS = {"mnist_cnn": "--no-cuda", "vae": "--no-cuda", "dcgan": "--no-cuda",
             "device_chain": "--no-cuda", "cpu_flag_script": "--cpu"}
CPU_ONLY = ["cpu_only_regression"]  # places nothing on a device: the port must still train on XLA (TX109)
# fixture -> the configuration override with which it stays on the CPU (its device is a string, TX103)
CONFIG_CPU = {"device_string_config": "--device=cpu"}
# fixture -> the command-line options with which it stays on the CPU (they default to CUDA strings, TX103)
OPTION_CPU = {"device_option_default": ["--device", "cpu", "--eval-device", "cpu"]}
FIXTURES = {fx.name: fx for fx in fixtures()
            if fx.name in CPU_FLAGS or fx.name in CPU_ONLY or fx.name in CONFIG_CPU or fx.name in OPTION_CPU}
# the unsafe fixtures' default ports, and the safe fixtures (whose expected.py is the default port)
# that test_fixture_ports.py does not run over a whole epoch in this run of the suite (its SCRIPT_RUNS)
# (dcgan, the costliest epoch, in the every-fixture lane only: the other two are the same class)
VERIFIED = ["mnist_cnn", "vae", *every_lane(["dcgan"])] + [
    name for name in [*CPU_ONLY, *OPTION_CPU] if name not in {fx.name for fx in fixture_slice(fixtures(), 3, offset=1)}]

# Runs a script, then says how many XLA graphs were executed (0 when none).
@pytest.fixture(scope="module")
def ports(tmp_path_factory) -> dict[str, Path]:
    out = {}
    root = tmp_path_factory.mktemp("default_ports")
    options = engine.Options(registry.select("torch-xla"), unsafe_fixes=False)
    for name, fx in FIXTURES.items():
        result = engine.fix(fx.original.read_text(encoding="utf-8"), options, str(fx.original))
        path = root / name / "train.py"
        path.parent.mkdir()
        path.write_text(result.source, encoding="utf-8")
        out[name] = path
    return out


def test_the_fixtures_are_there():
    assert sorted(FIXTURES) == sorted([*CPU_FLAGS, *CPU_ONLY, *CONFIG_CPU, *OPTION_CPU])


def test_default_port_keeps_the_flag_and_drops_the_availability_tests(ports):
    for name, path in ports.items():
        if name not in CPU_FLAGS:
            continue
        text = path.read_text(encoding="utf-8")
        assert "is_available()" not in text, name
        assert CPU_FLAGS[name].lstrip("-").replace("-", "_") in text, name  # args.no_cuda / args.cpu still read
        assert "torch_xla.device()" in text, name


@pytest.mark.parametrize("name", VERIFIED)
def test_default_port_trains_on_xla_with_the_original_losses(name, ports):
    fx = FIXTURES[name]
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--format", "json", "--script", str(fx.original),
                           str(ports[name]), "--steps", "4", "--warmup-steps", "2", "--", *fx.run],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    # the losses: equal to the original's at every step (the XLA health budgets are the host-sync
    # rules' business: in default mode a per-step `.item()` stays, see TX401)
    assert report["status"] != "failed" or "losses match" in report["summary"], report["summary"]
    assert [s["step"] for s in report["steps"]] == [1, 2, 3, 4] and all(s["ok"] for s in report["steps"]), report["summary"]
    # it trained on the XLA device: XLA graphs were executed, one per iteration at least (an
    # iteration of the GAN makes two optimizer steps, marked once)
    executions = [s["executions"] for s in report["health"]["steps"]]
    assert sum(executions) >= len(executions) // fx.optimizer_steps_per_iteration and executions[-1] >= 1, executions


def _run(script: Path, args, cwd: Path, xla: bool) -> subprocess.CompletedProcess:
    return run_script(script, args, cwd, xla)


def test_default_port_makes_the_configuration_string_xla(ports):
    for name in CONFIG_CPU:
        text = ports[name].read_text(encoding="utf-8").split('"""', 2)[2]  # the code, not the docstring
        assert "device = 'xla'" in text and "'xla' in device" in text and "startswith('xla')" in text, name
        assert "'cuda' in device" not in text and "f'cuda:" not in text and "pin_memory()" not in text, name


def test_default_port_makes_the_device_options_default_to_xla(ports):
    for name in OPTION_CPU:
        text = ports[name].read_text(encoding="utf-8")
        assert "default='xla'" in text and 'default="xla"' in text, name
        assert "'cuda" not in text.split('"""', 2)[2].replace("('cuda', 'cuda:1', 'cpu', ...)", ""), name


@pytest.mark.parametrize("name", ["device_chain", "cpu_flag_script", *CONFIG_CPU, *OPTION_CPU])
def test_force_cpu_flag_keeps_the_port_on_the_cpu(name, ports, tmp_path):
    fx = FIXTURES[name]
    flags = {**CPU_FLAGS, **CONFIG_CPU, **OPTION_CPU}[name]
    args = ["--epochs", "1", "--dropout", "0", *([flags] if isinstance(flags, str) else flags)]
    original = _run(fx.original, args, tmp_path, xla=False)
    port = _run(ports[name], args, tmp_path, xla=True)
    assert original.returncode == 0, original.stderr[-3000:]
    assert port.returncode == 0, port.stderr[-3000:]
    lines = port.stdout.strip().splitlines()
    assert lines[-1] == "XLA executions: 0", lines[-3:]
    assert lines[-2] == original.stdout.strip().splitlines()[-1]
