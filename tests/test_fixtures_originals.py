"""The unported fixture scripts in fixtures/torch_xla/ are sound programs.

Each GPU-style fixture runs for one epoch with plain torch on the CPU (CUDA hidden, dropout
off) and must end with its `Final <metric>: <value>` line. The torch_xla 1.x fixture
(xla_deprecated) must fail on torch_xla 2.9 exactly because of the removed names, and run to
the end once those two names are put back as the aliases torch_xla 2.6 had.
A static check holds every fixture to the command-line conventions of fixtures/torch_xla/README.md.
"""
from __future__ import annotations

import ast
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lanes import fixture_slice

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "torch_xla"
FINAL = re.compile(r"^Final (?P<name>[^:]+): (?P<value>\S+)$")

# fixture -> the metric its last line reports
GPU_FIXTURES = {
    "mnist_cnn": "test accuracy",
    "imagenet_amp_ddp": "val acc1",
    "word_lm_lstm": "test ppl",
    "dcgan": "D accuracy",
    "vae": "test loss",
    "transformer_classifier": "valid accuracy",
    "recommender_sparse": "HR@10",
    "device_chain": "test accuracy",
    "cpu_flag_script": "eval mse",
    "ddp_trainer": "eval accuracy",
    "device_type_autocast": "eval mse",
    "cpu_only_regression": "eval mse",
    "device_string_config": "eval mse",
    "device_option_default": "eval mse",
}
# fixtures whose device is a configuration string with no CPU fallback: the CPU run sets it
CPU_OVERRIDES = {"device_string_config": ["--device=cpu"],
                 "device_option_default": ["--device", "cpu", "--eval-device", "cpu"]}
ALL_FIXTURES = [*GPU_FIXTURES, "xla_deprecated"]
COMMON_FLAGS = {"--epochs", "--batch-size", "--lr", "--seed", "--log-interval", "--dropout",
                "--num-samples", "--save-model"}


def _run(args, cwd, env_extra, timeout=600):
    # one intra-op thread: the runs are small, and the test machines are shared
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _final(stdout: str):
    lines = stdout.strip().splitlines()
    assert lines, "no output"
    match = FINAL.match(lines[-1])
    assert match, f"last line is not a Final metric line: {lines[-1]!r}"
    return match.group("name"), float(match.group("value"))


def _cli_defaults(script: Path) -> dict[str, object]:
    """Option string -> default expression value for every parser.add_argument(...) call."""
    options: dict[str, object] = {}
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            # defaults are literals or constant arithmetic such as `13 * 32 + 16`
            value = eval(compile(ast.Expression(default), str(script), "eval"), {"__builtins__": {}}) if default is not None else None
            for name in names:
                options[name] = value
    return options


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_fixture_follows_cli_conventions(name):
    script = FIXTURES / name / "train.py"
    options = _cli_defaults(script)
    missing = COMMON_FLAGS - options.keys()
    assert not missing, f"{name} lacks {sorted(missing)}"
    assert options["--seed"] == 1
    assert options["--save-model"] is False
    assert options["--dropout"] > 0
    assert options["--epochs"] >= 2
    batch, samples = options["--batch-size"], options["--num-samples"]
    if name == "word_lm_lstm":
        # samples are tokens: rows of the batchified stream, walked `bptt` rows at a time
        rows, bptt = samples // batch, options["--bptt"]
        windows, ragged = divmod(rows - 1, bptt)
    else:
        windows, ragged = divmod(samples, batch)
    assert windows >= 12 and ragged > 0, f"{name}: {windows} full batches, last one of {ragged}"


@pytest.mark.slow
@pytest.mark.parametrize("name", fixture_slice(list(GPU_FIXTURES), 2))  # half of them per run of the suite
def test_gpu_fixture_runs_on_cpu(name, tmp_path):
    proc = _run([str(FIXTURES / name / "train.py"), "--epochs", "1", "--dropout", "0", "--save-model",
                 *CPU_OVERRIDES.get(name, [])],
                cwd=tmp_path, env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-4000:]
    metric, value = _final(proc.stdout)
    assert metric == GPU_FIXTURES[name]
    assert math.isfinite(value)
    assert any(tmp_path.rglob("*.p*")), f"--save-model wrote nothing in {list(tmp_path.rglob('*'))}"


@pytest.mark.slow
def test_cpu_run_is_deterministic(tmp_path):
    """Same seed, dropout off: two runs report the same metric to every printed digit."""
    script = str(FIXTURES / "vae" / "train.py")
    outputs = [_run([script, "--epochs", "1", "--dropout", "0"], cwd=tmp_path,
                    env_extra={"CUDA_VISIBLE_DEVICES": ""}) for _ in range(2)]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr[-4000:]
    assert _final(outputs[0].stdout) == _final(outputs[1].stdout)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_deprecated_stops_on_removed_names(tmp_path):
    proc = _run([str(FIXTURES / "xla_deprecated" / "train.py"), "--epochs", "1", "--dropout", "0"],
                cwd=tmp_path, env_extra={"PJRT_DEVICE": "CPU"})
    assert proc.returncode != 0
    assert "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'xrt_world_size'" in proc.stderr


# torch_xla 2.6 defined these two names as deprecated aliases of the runtime functions; 2.7
# removed them. Restoring exactly those aliases shows the rest of the old script is sound.
_OLD_ALIASES = """\
import runpy, sys
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
xm.xrt_world_size = xr.world_size
xm.get_ordinal = xr.global_ordinal
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.xla
@pytest.mark.slow
def test_xla_deprecated_runs_with_old_aliases(tmp_path):
    wrapper = tmp_path / "with_old_aliases.py"
    wrapper.write_text(_OLD_ALIASES, encoding="utf-8")
    proc = _run([str(wrapper), str(FIXTURES / "xla_deprecated" / "train.py"), "--epochs", "1",
                 "--dropout", "0", "--save-model"], cwd=tmp_path, env_extra={"PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    metric, value = _final(proc.stdout)
    assert metric == "test accuracy" and 0.0 <= value <= 100.0
    # the deprecated-but-present names still warn in 2.9
    assert "Use torch_xla.device instead" in proc.stderr
    assert "Use torch_xla.sync instead" in proc.stderr
    assert (tmp_path / "cifar_cnn_xla.pt").is_file()
