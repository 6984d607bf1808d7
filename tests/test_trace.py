"""The run harness: CUDA shim on the CPU, per-step losses, and torch_xla health counts.

Each traced run is a real subprocess (``trace_script``); the XLA ones import torch_xla and
run on PJRT_DEVICE=CPU. Runs are shared between tests through module-scoped fixtures.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from porter.verify.trace import HostRandomMode, _split_argv, compare_losses, trace_script

DATA = Path(__file__).parent / "data" / "trace"
XLA_ENV = {"PJRT_DEVICE": "CPU"}
TIMEOUT = 400


def _has_torch_xla() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_xla") is not None


needs_xla = pytest.mark.skipif(not _has_torch_xla(), reason="torch_xla is not installed")
slow = pytest.mark.slow  # starts a subprocess that imports torch (and torch_xla for the XLA ones)


def _ok(record: dict) -> dict:
    assert record["status"] == "ok", record.get("exception") or record.get("output")
    assert record["returncode"] == 0
    return record


# --- pure helpers ------------------------------------------------------------------


def test_compare_losses_finds_first_differing_step():
    assert compare_losses([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) is None
    assert compare_losses([1.0, 2.0, 3.0], [1.0, 2.5, 9.0]) == 1
    assert compare_losses([1.0, 2.0], [1.0, 2.0 + 5e-6], rtol=0, atol=1e-5) is None
    assert compare_losses([1.0, 2.0], [1.0, 2.0 + 5e-5], rtol=0, atol=1e-5) == 1
    # only the common steps count; per-step lists must match in length
    assert compare_losses([1.0, 2.0, 3.0], [1.0, 2.0]) is None
    assert compare_losses([[1.0, 2.0]], [[1.0]]) == 0
    assert compare_losses({"losses": [[1.0], [float("nan")]]}, [[1.0], [float("nan")]]) is None
    assert compare_losses([[1.0], [float("nan")]], [[1.0], [2.0]]) == 1
    assert compare_losses([[None]], [[1.0]]) == 0


def test_split_argv_separates_script_arguments():
    assert _split_argv(["--out", "r.json", "s.py", "--", "--epochs", "2", "--"]) == (
        ["--out", "r.json", "s.py"],
        ["--epochs", "2", "--"],
    )
    assert _split_argv(["--out", "r.json", "s.py"]) == (["--out", "r.json", "s.py"], [])


def test_host_random_leaves_cpu_sampling_alone():
    torch.manual_seed(7)
    expected = [torch.randn(4), torch.rand(2, 3), torch.randint(0, 9, (5,)), torch.empty(3).normal_(1.0, 2.0)]
    torch.manual_seed(7)
    with HostRandomMode():
        got = [torch.randn(4), torch.rand(2, 3), torch.randint(0, 9, (5,)), torch.empty(3).normal_(1.0, 2.0)]
    for left, right in zip(expected, got):
        assert torch.equal(left, right)


def test_host_random_draws_off_host_tensors_from_the_cpu_generator():
    # A 'meta' tensor stands in for a device tensor: its values are not kept, but each draw
    # must come from (and advance) the CPU default generator exactly as the CPU draw would.
    torch.manual_seed(11)
    torch.randn(6)
    torch.rand(2)
    torch.randint(0, 10, (3,))
    torch.randint(2, 7, (3,))
    torch.empty(4).normal_()
    torch.empty(2).uniform_(0, 2)
    torch.empty(3).bernoulli_(0.3)
    torch.randperm(5)
    torch.normal(0.0, 1.0, (3,))
    following = torch.randn(3)
    torch.manual_seed(11)
    meta = torch.device("meta")
    with HostRandomMode():
        made = [
            torch.randn(6, device=meta),
            torch.rand_like(torch.empty(2, device=meta)),
            torch.randint_like(torch.empty(3, device=meta), 10),
            torch.randint_like(torch.empty(3, device=meta), 2, 7),
            torch.empty(4, device=meta).normal_(),
            torch.empty(2, device=meta).uniform_(0, 2),
            torch.empty(3, device=meta).bernoulli_(0.3),
            torch.randperm(5, device=meta),
            torch.normal(0.0, 1.0, (3,), device=meta),
        ]
    assert {t.device.type for t in made} == {"meta"}
    assert torch.equal(torch.randn(3), following)


def test_host_random_rewrites_tensor_parameter_sampling_on_every_device():
    probs = torch.tensor([0.1, 0.5, 0.9, 0.3])
    torch.manual_seed(5)
    noise = torch.rand(4)
    x = torch.ones(4)
    torch.manual_seed(5)
    with HostRandomMode():
        sample = torch.bernoulli(probs)
    assert torch.equal(sample, (noise < probs).float())
    torch.manual_seed(5)
    with HostRandomMode():
        dropped = torch.nn.functional.dropout(x, p=0.5, training=True)
        kept = torch.nn.functional.dropout(x, p=0.5, training=False)
    assert torch.equal(dropped, x * (noise >= 0.5).float() / 0.5)
    assert kept is x


# --- the GPU original on the CPU vs. the torch_xla port on XLA:CPU -----------------


@pytest.fixture(scope="module")
def original():
    """(a) the GPU-style script, run on the CPU through the CUDA shim."""
    return _ok(trace_script(DATA / "mlp_cuda.py", ["--epochs", "2"], cuda_shim=True, host_random=True, timeout=TIMEOUT))


@pytest.fixture(scope="module")
def port():
    """(b) the hand port: MpDeviceLoader, xm.optimizer_step, drop_last, closures every 5 steps."""
    return _ok(trace_script(DATA / "mlp_xla.py", ["--epochs", "2"], host_random=True, env=XLA_ENV, timeout=TIMEOUT))


@slow
def test_original_runs_on_cpu_through_the_shim(original):
    # 100 samples in batches of 8: 13 steps an epoch (the last one ragged), 2 epochs
    assert original["num_steps"] == 26
    assert all(len(step) == 1 and math.isfinite(step[0]) for step in original["losses"])
    assert {s["optimizer"] for s in original["steps"]} == {0}
    assert original["xla"] is None and not original["torch_xla_imported"]
    assert "max memory 0" in original["output"]
    assert original["notes"] == []


@slow
@needs_xla
@pytest.mark.xla
def test_port_losses_equal_the_original(original, port):
    assert port["num_steps"] == 24  # drop_last: 12 steps an epoch
    common = 12  # the first epoch up to the dropped ragged batch
    assert compare_losses(original["losses"][:common], port["losses"][:common], rtol=0.0, atol=1e-5) is None
    # after the ragged batch the epochs no longer line up, and the losses part
    assert compare_losses(original["losses"], port["losses"], rtol=0.0, atol=1e-5) == common


@slow
@needs_xla
@pytest.mark.xla
def test_port_compiles_only_in_the_first_two_steps(port):
    compiles = port["compiles_per_step"]
    assert len(compiles) == port["num_steps"]
    assert compiles[0] >= 1 and sum(compiles[:2]) == port["xla"]["final"]["compiles"]
    assert compiles[2:] == [0] * (port["num_steps"] - 2)
    assert port["executions_per_step"] == [1] * port["num_steps"]  # one graph per step


@slow
@needs_xla
@pytest.mark.xla
def test_port_transfers_only_in_logging_steps(port):
    logging_steps = {epoch * 12 + step for epoch in range(2) for step in (0, 5, 10)}
    transfers = port["transfers_per_step"]
    assert [i for i, n in enumerate(transfers) if n] == sorted(logging_steps)
    assert all(transfers[i] == 1 for i in logging_steps)


@slow
@needs_xla
@pytest.mark.xla
def test_item_every_step_transfers_every_step():
    """(c) `loss.item()` after the step: a transfer (and an extra graph) every step."""
    record = _ok(trace_script(DATA / "mlp_xla.py", ["--epochs", "1", "--item-every-step"], env=XLA_ENV, timeout=TIMEOUT))
    assert record["num_steps"] == 12
    assert record["transfers_per_step"] == [1 + (step % 5 == 0) for step in range(12)]
    assert record["executions_per_step"] == [2] * 12
    assert record["compiles_per_step"][2:] == [0] * 10


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """(d) the port without drop_last, traced, plus the same run without the harness."""
    folder = tmp_path_factory.mktemp("ragged")
    args = ["--epochs", "2", "--keep-last"]
    traced = _ok(
        trace_script(
            DATA / "mlp_xla.py", [*args, "--report-metrics", folder / "traced.json"], env=XLA_ENV, timeout=TIMEOUT
        )
    )
    plain = subprocess.run(
        [sys.executable, str(DATA / "mlp_xla.py"), *args, "--report-metrics", str(folder / "plain.json")],
        env={**os.environ, **XLA_ENV},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    own = {name: json.loads((folder / f"{name}.json").read_text()) for name in ("traced", "plain")}
    return traced, own


@slow
@needs_xla
@pytest.mark.xla
def test_ragged_last_batch_compiles_again(ragged):
    traced, _ = ragged
    assert traced["num_steps"] == 26
    compiles = traced["compiles_per_step"]
    # warm-up (steps 0, 1), then the 4-sample batch (step 12); epoch 2 reuses both graphs
    assert [i for i, n in enumerate(compiles) if n] == [0, 1, 12]
    assert compiles[12] == 1


@slow
@needs_xla
@pytest.mark.xla
def test_harness_adds_no_compiles_transfers_or_executions(ragged):
    traced, own = ragged
    assert own["traced"] == own["plain"]  # the script's own counters, with and without the harness
    assert {k: traced["xla"]["final"][k] for k in own["plain"]} == own["plain"]


@slow
def test_shim_refuses_the_ported_side():
    record = trace_script(DATA / "mlp_xla.py", ["--epochs", "1"], cuda_shim=True, env=XLA_ENV, timeout=TIMEOUT)
    assert record["status"] == "error" and record["returncode"] == 1
    assert record["exception"]["type"] == "ModuleNotFoundError"
    assert "torch_xla" in record["exception"]["message"]
    assert record["num_steps"] == 0


# --- records of runs that stop early -------------------------------------------------


@slow
def test_exception_gives_a_clean_failure_record(tmp_path):
    out = tmp_path / "fail.json"
    record = trace_script(DATA / "raises.py", out=out, timeout=TIMEOUT)
    assert record["status"] == "error" and record["returncode"] == 1 and record["exit_code"] == 1
    assert json.loads(out.read_text())["status"] == "error"  # the record was written anyway
    exception = record["exception"]
    assert exception["type"] == "ValueError" and exception["message"] == "corrupt batch at step 2"
    tb = exception["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert 'raises.py", line' in tb and "in batch" in tb and tb.rstrip().endswith("ValueError: corrupt batch at step 2")
    assert "runpy" not in tb and "porter/verify" not in tb  # starts at the script's frame
    assert record["num_steps"] == 2 and all(len(s) == 1 for s in record["losses"])


@slow
def test_system_exit_with_a_nonzero_code():
    record = trace_script(DATA / "raises.py", ["3"], timeout=TIMEOUT)
    assert record["status"] == "exit" and record["returncode"] == 3 and record["exit_code"] == 3
    assert record["exception"]["type"] == "SystemExit" and record["exception"]["message"] == "3"
    assert record["num_steps"] == 2


@slow
def test_timeout_kills_the_run():
    record = trace_script(DATA / "sleeps.py", timeout=6)
    assert record["status"] == "timeout" and record["returncode"] is None


@slow
def test_steps_optimizers_and_unstepped_losses(tmp_path):
    own = tmp_path / "own.json"
    record = _ok(trace_script(DATA / "two_optimizers.py", [own], seed=1, timeout=TIMEOUT))  # ends in sys.exit(0)
    assert record["exception"] is None and record["exit_code"] == 0 and record["ended_by"] == "exit"
    values = json.loads(own.read_text())
    assert [s["optimizer"] for s in record["steps"]] == [1, 0, 1, 0]  # creation order: a=0, b=1
    assert compare_losses(record["losses"], values["steps"], rtol=1e-6, atol=0.0) is None
    assert [len(s) for s in record["losses"]] == [1, 2, 1, 2]
    assert record["unstepped_losses"] == pytest.approx([values["tail"]], rel=1e-6)
    times = [s["time_s"] for s in record["steps"]]
    assert times == sorted(times) and record["wall_time_s"] >= times[-1]


# --- (f) the CUDA shim, one check per kind of CUDA call --------------------------------


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    out = tmp_path_factory.mktemp("shim") / "seen.json"
    record = _ok(trace_script(DATA / "shim_cases.py", [out], cuda_shim=True, timeout=TIMEOUT))
    return record, json.loads(out.read_text())


SHIM_EXPECTED = {
    "is_available": True,
    "device_count": 1,
    "current_device": 0,
    "device_name": "porter CUDA shim (CPU)",
    "capability": [8, 0],
    "total_memory_positive": True,
    "bf16": True,
    "memory": [0, 0, 0],
    "accelerator": [True, "cuda"],
    "device_context": 0,
    "cuda_seed_keeps_cpu_stream": True,
    "rng_state_is_cpu_state": True,
    "factories": ["cpu"],
    "tensor_moves": ["cpu"],
    "to_keeps_dtype_change": "torch.float64",
    "cuda_returns_same_tensor": True,
    "pin_memory": ["cpu", False],
    "module_moves": [["cpu"], "torch.float64"],
    "pinned_loader": ["cpu"],
    "other_thread": "cpu",
    "load": {"str": "cpu", "str0": "cpu", "device": "cpu", "dict": "cpu", "callable": "cpu"},
    "gpu_checkpoint_locations": ["cuda:0"],
    "load_gpu_checkpoint": {k: ["cpu", [0.0, 1.0, 2.0, 3.0]] for k in ("none", "str", "callable")},
    "cudnn_flags": [True, True, False],
    "matmul_tf32": True,
    "elapsed_ms_nonnegative": True,
    "autocast_off": [True, False],
    "autocast_on": [True, "torch.float32", True],
    "autocast_legacy": [True, "torch.float32"],
    "scaler": [False, False, True, 1.0],
    "scaler_off": [False, True],
    "dist_backend": "gloo",
    "ddp_forward": [2, 1],
    "data_parallel": [[[2, 1], True]] * 5,
    "torch_xla_import": "ModuleNotFoundError",
    "torch_xla_find_spec": True,
    "after_uninstall": [False, "RuntimeError", False],
}


@slow
@pytest.mark.parametrize("case", sorted(SHIM_EXPECTED))
def test_shim_case(shim, case):
    _, seen = shim
    assert seen[case] == SHIM_EXPECTED[case]


@slow
def test_shim_amp_loop_records_unscaled_losses_and_notes(shim):
    record, seen = shim
    assert record["num_steps"] == 3
    # GradScaler ran disabled, so backward was called on the loss itself, not loss * 65536
    assert compare_losses(record["losses"], seen["amp_losses"], rtol=0.0, atol=0.0) is None
    assert seen["amp_losses"][0] > seen["amp_losses"][-1]
    notes = "\n".join(record["notes"])
    assert "torch.autocast('cuda', dtype=torch.float16)" in notes and "float32" in notes
    assert "GradScaler('cuda', enabled=True) was built disabled" in notes
    assert "init_process_group(backend='nccl') used 'gloo'" in notes
