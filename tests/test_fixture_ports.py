"""The torch -> torch_xla port of every fixture: byte-for-byte expected output, idempotence,
and a real run of original and port side by side.

The run: the original on the CPU (its CUDA calls served by the CPU) and the port on
torch_xla (PJRT_DEVICE=CPU), one epoch with dropout off, random numbers drawn on the host in
the same order on both sides, in float64 through `porter verify --script`. Then: the verifier
passes, at least 12 optimizer steps, the losses of every common step within 1e-5, no
compilation after the warm-up steps and device-to-host transfers only in steps that log (the
verifier's health of the port's run). A port that changes its precision (autocast, bf16) can
build other graphs in float32 than in float64: its health is measured again in a float32 run
over the warm-up and two logging intervals.
"""
import re
import json
import os
import subprocess
import sys

import libcst as cst
import pytest

from porter import engine, registry
from porter.fixtures import fixtures
from porter.verify.datasets import DEFAULT_SIZE
from porter.verify.trace import compare_losses, trace_script

from lanes import fixture_slice

FIXTURES = fixtures()
IDS = [f.name for f in FIXTURES]
WHOLE_RUN = 100_000  # optimizer steps: more than any fixture's epoch
# what makes a port's graphs depend on the dtype it runs in: mixed precision
_PRECISION = re.compile(r"\bautocast\b|bfloat16|\.half\(\)|XLA_USE_BF16|GradScaler")


def test_there_are_eight_fixtures():
    assert len(FIXTURES) >= 8


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_port_is_byte_identical_to_expected(fx):
    assert fx.expected.is_file(), f"run `python -m porter.fixtures` and review {fx.expected}"
    assert fx.port() == fx.expected.read_text(encoding="utf-8"), f"port of {fx.name} changed: review, then `python -m porter.fixtures`"


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_port_is_idempotent_and_parses(fx):
    text = fx.expected.read_text(encoding="utf-8")
    cst.parse_module(text)
    compile(text, str(fx.expected), "exec")
    options = engine.Options(registry.select("torch-xla"), unsafe_fixes=fx.unsafe)
    again = engine.fix(text, options)
    assert not again.changed


def test_cli_port_equals_expected(tmp_path):
    """The user's command, on one fixture: `porter migrate --out` writes the expected port."""
    fx = next(f for f in FIXTURES if f.name == "mnist_cnn")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "porter", "migrate", str(fx.original), "--to", "torch-xla",
                           *fx.migrate, "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "train.py").read_text(encoding="utf-8") == fx.expected.read_text(encoding="utf-8")


def _logging_iteration(i: int, interval: int) -> bool:
    return i % interval == 0


# a third of the fixtures per run of the suite (one safe port with autocast among them); the rest
# are verified at model level (test_fixture_verify.py), all of them with PORTER_TEST_EVERY_FIXTURE=1
SCRIPT_RUNS = fixture_slice(FIXTURES, 3, offset=1)


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("fx", SCRIPT_RUNS, ids=lambda fx: fx.name)
def test_port_runs_on_xla_and_matches_the_original(fx, tmp_path):
    """Losses are compared in float64: in float32, rounding differences between eager CPU
    kernels and XLA's CPU kernels (~1e-7 relative in gradients) are amplified by adaptive
    optimizers (Adam, Adadelta) to 1e-5..1e-3 within a dozen steps (measured; see
    docs/verification.md), which says nothing about the port. In float64 the same scripts
    agree to ~1e-10. XLA health is measured on the float32 run the user would make.

    The float64 run of both sides is the user's `porter verify --script` (its report read
    back: the verifier's script level on every fixture, on the whole epoch), so each side runs
    once in float64; the losses of its steps are compared again here.

    Where an unsafe fix deliberately changes what is computed (port.toml's reference_rules:
    drop_last shortens the epoch a schedule is built from; SparseAdam becomes Adam), the
    reference is the original with only those fixes applied, so every other rewrite must
    still be exact.

    The float64 run's health (the same per-step compilations and transfers the tracer counts)
    stands for the float32 run's, except in a port with mixed precision, which runs again in
    float32."""
    reference_script = fx.original
    if fx.reference_rules:  # the original with only the accepted semantic changes applied
        reference_script = tmp_path / "reference" / "train.py"
        reference_script.parent.mkdir()
        reference_script.write_text(fx.reference(), encoding="utf-8")
    k = fx.optimizer_steps_per_iteration
    warmup = fx.warmup_iterations * k
    size = fx.synthetic_size or DEFAULT_SIZE
    code, report = _verify_script(reference_script, fx.expected, warmup, fx.run, size)
    assert code == 0 and report["passed"], report["summary"]
    steps = report["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and all(s["ok"] for s in steps)
    assert report["settings"]["dtype"] == "float64"
    # both scripts ran to their end (the verifier passes a side that fails after the compared steps, with a note)
    assert not [note for note in report["notes"] if " failed after its " in note], report["notes"]
    health = report["health"]
    assert health["within_budget"] and health["compiles_after_warmup"] == 0, health["problems"]
    if fx.original_runs_on == "xla-legacy":
        assert any("already imports torch_xla" in n for n in report["notes"])
    n = len(steps)
    assert n >= 12 * k, n
    original, port = [s["original"] for s in steps], [s["port"] for s in steps]
    first = compare_losses(original, port, rtol=1e-5, atol=1e-5)
    assert first is None, f"step {first + 1}: original {original[first]} port {port[first]}"

    if not _PRECISION.search(fx.expected.read_text(encoding="utf-8")):
        return
    # the float32 run, for the warm-up and two logging intervals after it (the float64 run went
    # to the end): every step but the last (whose record also holds what follows the last step)
    (tmp_path / "port32").mkdir()
    port32 = trace_script(fx.expected, fx.run, host_random=True, cwd=tmp_path / "port32", timeout=900,
                          max_steps=warmup + 2 * fx.log_interval * k + 1, synthetic_size=size,
                          env={"PJRT_DEVICE": "CPU"})
    assert port32.get("status") == "ok", (port32.get("exception"), port32.get("output"))
    compiles = port32["compiles_per_step"][:-1]
    transfers = port32["transfers_per_step"][:-1]
    assert sum(compiles[warmup:]) == 0, f"compilations after warm-up: {compiles}"
    quiet = [s for s, t in enumerate(transfers) if t and not _logging_iteration(s // k, fx.log_interval)]
    assert not quiet, f"device-to-host transfers in steps that do not log: {quiet} (per step: {transfers})"


def _verify_script(reference, port, warmup: int, args, size: int) -> tuple[int, dict]:
    """`porter verify --script` in float64 over the whole run: a step limit no epoch reaches,
    and synthetic datasets of `size` samples (by default the size a run without a step limit
    gets)."""
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--format", "json", "--script", str(reference),
                           str(port), "--dtype", "float64", "--steps", str(WHOLE_RUN),
                           "--synthetic-size", str(size), "--warmup-steps", str(warmup), "--", *args],
                          capture_output=True, text=True, timeout=1900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)
