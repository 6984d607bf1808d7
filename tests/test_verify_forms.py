"""`porter verify --script` on the forms a training step takes and on scripts that end badly
(tests/data/verify/forms/, each original with a hand-written port), run for real: the
original on the CPU, the port on torch_xla (PJRT_DEVICE=CPU) or JAX.

- the run stops after K optimizer steps whatever form the step takes: torch.optim, manual
  parameter updates (three spellings), a closure (LBFGS), two optimizers (a GAN); gradient
  accumulation and a clamp of the weights after a step are not steps;
- a failure after the compared steps (a reload refused by torch.load's weights_only default, an
  exit with an error) is a note, not a failed verification;
- a side that ends without an error before the K steps (its script ended, sys.exit(0)) is named
  in the report with the steps it reached and its exit status; the steps both sides ran are
  compared (a port shorter by design, drop_last=True, passes with a note), none at all fails;
- originals that build float32 inputs explicitly run in float32 (three spellings), said in
  the notes, with tolerances that grow with the step;
- a JAX port at script level runs on the JAX side: weights from the original, its jitted step
  counted, its jit cache and host callbacks measured, labelled jax.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from porter.verify.script import ScriptRequest, compare_steps, tolerance, verify_script
from porter.verify.trace import trace_script

from lanes import fixture_slice

FORMS = Path(__file__).parent / "data" / "verify" / "forms"


def verify(name: str, steps: int, *args: str, port: str | None = None):
    return verify_script(ScriptRequest(FORMS / f"{name}.py", FORMS / (port or f"{name}_xla.py"), steps, args,
                                       timeout=300))


# --- no subprocess -------------------------------------------------------------------------


def test_float32_tolerance_grows_with_the_step_and_explicit_tolerances_stay():
    assert tolerance("float64", None, None) == (1e-5, 1e-5, False)
    rtol, atol, scaled = tolerance("float32", None, None)
    assert scaled and rtol == atol == 5e-4
    assert tolerance("float32", 1e-9, None) == (1e-9, 1e-5, False)
    # 3e-3 is within step 6's tolerance (6 x (5e-4 + 5e-4 x 1)) but not step 1's
    steps, first = compare_steps([[1.0]] * 6, [[1.003]] * 6, rtol, atol, scaled=True)
    assert first is not None and first["step"] == 1
    steps, first = compare_steps([[1.0]], [[1.0]], rtol, atol, scaled=True)
    assert first is None
    ok = compare_steps([[1.0]] * 6, [[1.0]] * 5 + [[1.005]], rtol, atol, scaled=True)
    assert ok[1] is None


def test_a_loss_that_never_changes_is_said():
    from porter.verify.script import _constant_loss

    # cross-entropy over a single output column is 0 whatever the weights: every step "matches"
    steps, first = compare_steps([[0.0]] * 3, [[0.0]] * 3, 1e-5, 1e-5)
    assert first is None and _constant_loss(steps) == 0.0
    assert _constant_loss(compare_steps([[0.5]] * 3, [[0.5]] * 3, 1e-5, 1e-5)[0]) == 0.5
    assert _constant_loss(compare_steps([[0.5], [0.4]], [[0.5], [0.4]], 1e-5, 1e-5)[0]) is None
    assert _constant_loss(compare_steps([[0.5]], [[0.5]], 1e-5, 1e-5)[0]) is None  # one step shows nothing


def test_jax_step_compared_by_the_sum_of_the_originals_losses():
    steps, first = compare_steps([[0.5, 0.25]], [[0.75]], 1e-5, 1e-5, summed=True)
    assert first is None and steps[0]["original"] == [0.75]
    _, first = compare_steps([[0.5, 0.25]], [[0.75]], 1e-5, 1e-5)
    assert first is not None  # torch against torch: the number of backward calls must agree


# --- traced alone (CPU, no XLA) -------------------------------------------------------------


@pytest.mark.slow
def test_accumulation_and_clamping_are_not_manual_steps():
    record = trace_script(FORMS / "accumulate.py", max_steps=3, seed=0, timeout=120)
    assert record["status"] == "ok", record.get("output")
    assert record["num_steps"] == 3
    assert [len(s) for s in record["losses"]] == [2, 2, 2]
    assert {s["optimizer"] for s in record["steps"]} == {0}


# --- both sides, for real --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("update", ["data_add", "isub", "copy"])
def test_manual_updates_are_optimizer_steps(update):
    """Each spelling stops the original after its K updates (the tracer's business, one side);
    both sides of one spelling below."""
    record = trace_script(FORMS / "manual.py", ["--update", update], max_steps=4, seed=0, dtype="float64",
                          cuda_shim=True, host_random=True, timeout=120)
    assert record["status"] == "ok", record.get("output")
    assert record["num_steps"] == 4 and [len(s) for s in record["losses"]] == [1, 1, 1, 1]


@pytest.mark.xla
@pytest.mark.slow
def test_a_manual_update_port_verifies():
    report = verify("manual", 4, "--update", "isub")
    assert report.passed, report.summary
    assert len(report.steps) == 4 and all(len(s["original"]) == 1 for s in report.steps)
    assert report.health["compiles_after_warmup"] == 0


@pytest.mark.xla
@pytest.mark.slow
def test_closure_optimizer_steps_once_per_step_call():
    report = verify("lbfgs", 3)
    # LBFGS reads its convergence tests on the host: the health may be over budget, the losses match
    assert report.status in ("passed", "over-budget"), report.summary
    assert all(s["ok"] for s in report.steps) and len(report.steps) == 3
    assert all(len(s["original"]) == len(s["port"]) >= 2 for s in report.steps)  # every closure's backward


@pytest.mark.xla
@pytest.mark.slow
def test_two_optimizers_each_have_their_warm_up():
    report = verify("gan", 6)
    assert report.passed, report.summary
    assert [len(s["original"]) for s in report.steps] == [2, 1, 2, 1, 2, 1]


@pytest.mark.xla
@pytest.mark.slow
# one way of failing after the steps per run of the suite (both with PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("end, error", fixture_slice([("reload", "UnpicklingError"), ("exit", "SystemExit: no validation data")], 2))
def test_failure_after_the_compared_steps_is_a_note(end, error):
    report = verify("after", 4, "--batches", "4", "--end", end)
    assert report.passed, report.summary
    notes = [n for n in report.notes if n.startswith("the original failed after its 4 optimizer steps")]
    assert notes and error in notes[0], report.notes
    # (the port stops at the sync that closes its 4th step, before the end of the script)
    assert report.original.ok and report.port.ok


@pytest.mark.xla
@pytest.mark.slow
def test_a_port_that_fails_where_the_original_runs_to_its_end_fails():
    """After the compared steps, a failure of the port alone (its evaluation, its save) is the
    port's: the original ran its whole script."""
    report = verify("after", 5, "--batches", "4", "--end", "evaluate")  # (4 steps: the script ends)
    assert report.status == "side-failed" and not report.passed, report.summary
    assert "where the original ran to the end of its script" in report.summary, report.summary
    assert "after its 4 optimizer steps" in report.summary and report.original.ok
    assert [s["ok"] for s in report.steps] == [True] * 4  # the steps themselves matched


@pytest.mark.xla
@pytest.mark.slow
def test_failure_before_the_steps_still_fails():
    report = verify("after", 4, "--batches", "0", "--end", "exit")
    assert report.status == "side-failed" and "before its first optimizer step" in report.summary, report.summary


@pytest.mark.xla
@pytest.mark.slow
# one way of ending early per run of the suite (both with PORTER_TEST_EVERY_FIXTURE=1; sys.exit(0)
# before the first step: test_a_port_that_ends_before_its_first_step_says_so)
@pytest.mark.parametrize("end, how", fixture_slice([("none", "ran to the end of its script"), ("exit0", "called sys.exit(0)")], 2))
def test_a_port_that_ends_before_the_original_says_so(end, how):
    # 40 samples: the original makes 3 steps (16, 16, 8), the port 2 (it drops the partial batch)
    # (a port shorter by design, as drop_last=True makes it: the steps both ran are compared and
    # the report says why there are fewer, it does not fail)
    report = verify("short", 4, "--samples", "40", "--end", end)
    assert report.passed and [s["step"] for s in report.steps] == [1, 2], report.summary
    assert f"the port {how} after 2 optimizer steps, of the 4 asked for (exit status 0, no error)" in report.summary
    assert f"the original {how} after 3 optimizer steps" in report.summary, report.summary
    assert "the original ran 3 optimizer steps, the port 2: 2 compared" in report.notes, report.notes
    # the original stopped at the K asked for: only the port ended early
    report = verify("short", 3, "--samples", "40", "--end", end)
    assert report.passed and "the original" not in report.summary.split(";")[0], report.summary
    assert f"the port {how} after 2 optimizer steps, of the 3 asked for" in report.summary, report.summary


@pytest.mark.xla
@pytest.mark.slow
def test_scripts_that_both_end_before_the_steps_compare_the_steps_they_made():
    # 32 samples: two full batches on both sides; 3 steps asked for
    report = verify("short", 3, "--samples", "32")
    assert report.status != "diverged" and [s["step"] for s in report.steps] == [1, 2], report.summary
    assert "the original ran to the end of its script after 2 optimizer steps, of the 3 asked for" in report.summary
    assert "the port ran to the end of its script after 2 optimizer steps" in report.summary, report.summary


@pytest.mark.xla
@pytest.mark.slow
def test_a_port_that_ends_before_its_first_step_says_so():
    # 8 samples: one partial batch, which the port drops
    report = verify("short", 2, "--samples", "8", "--end", "exit0")
    assert report.status == "diverged", report.summary
    assert "the port called sys.exit(0) before its first optimizer step, of the 2 asked for (exit status 0, " \
           "no error)" in report.summary, report.summary


@pytest.mark.slow
@pytest.mark.parametrize("inputs", ["numpy", "dtype", "float"])
def test_explicit_float32_inputs_cannot_run_in_float64(inputs):
    """What sends the verifier to float32, in each spelling: the original fails in float64 and
    runs in float32 (the tracer, one side; both sides of one spelling below)."""
    def run(dtype):
        return trace_script(FORMS / "f32.py", ["--inputs", inputs], max_steps=2, seed=0, dtype=dtype,
                            cuda_shim=True, host_random=True, timeout=120)
    wide = run("float64")
    assert wide["status"] != "ok" and "double" in (wide.get("exception") or {}).get("message", "").lower(), wide

    assert run("float32")["status"] == "ok"


@pytest.mark.xla
@pytest.mark.slow
def test_float32_inputs_run_in_float32():
    report = verify("f32", 6, "--inputs", "dtype")
    assert report.passed, report.summary
    assert report.settings["dtype"] == "float32" and report.settings["tolerance_scaled"]
    note = [n for n in report.notes if n.startswith("both sides ran with torch's default dtype float32")]
    assert note and "in float64 the original could not run" in note[0], report.notes


@pytest.mark.xla
@pytest.mark.slow
def test_float64_when_both_sides_run_in_it():
    report = verify("manual", 2)
    assert report.passed and report.settings["dtype"] == "float64"
    assert max(s["diff"] for s in report.steps) < 1e-12


@pytest.mark.slow
def test_jax_port_at_script_level():
    report = verify("mlp", 8, port="mlp_jax.py")
    assert report.passed, report.summary
    assert report.port.backend.startswith("jax") and report.settings["port_backend"] == "jax"
    assert len(report.steps) == 8
    assert report.health["jit_cache_sizes"] == {"train_step": 1}
    assert report.health["host_callbacks_total"] == 0 and report.health["max_transfers_per_step"] == 0
    assert any("weights loaded into the port's MLP" in n for n in report.notes), report.notes
    assert all(math.isfinite(s["port"][0]) for s in report.steps)


@pytest.mark.slow
def test_jax_port_host_callback_is_over_budget():
    report = verify("mlp", 4, "--debug-print", port="mlp_jax.py")
    assert report.status == "over-budget", report.summary
    assert "train_step calls back to the host (jax.debug.print x1)" in report.summary


def test_sides_have_a_terminal_size_and_no_input(tmp_path):
    """Progress bars ask the terminal for its size (`stty size`); reading input gets EOF."""
    import os
    import sys

    from porter.verify.process import run_side

    script = tmp_path / "tty.py"
    script.write_text("import os\nprint(os.popen('stty size').read().split())\n"
                      "try:\n    input()\nexcept EOFError:\n    print('eof')\n", encoding="utf-8")
    run = run_side([sys.executable, str(script)], dict(os.environ), tmp_path / "log", 60, 1000)
    assert run.ok and run.log.split() == ["['24',", "'80']", "eof"], run.log
