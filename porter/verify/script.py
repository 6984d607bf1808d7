"""Script-level verification: both training scripts run unmodified for K optimizer steps,
with the same seed and the same random numbers (drawn on the host), the original along its
GPU code path on the CPU and the port on the XLA backend; losses compared step by step and
the port's XLA health measured per step."""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from porter.verify.backends import imported_modules
from porter.verify.model import Budgets, Report, SideReport
from porter.verify.trace import trace_script


@dataclass(frozen=True)
class ScriptRequest:
    original: Path
    port: Path
    steps: int = 12
    args: tuple[str, ...] = ()
    seed: Optional[int] = 0
    # float64 by default: float32 rounding differences between eager CPU and XLA kernels are
    # amplified by adaptive optimizers within a few steps and would hide or fake a divergence
    dtype: Optional[str] = "float64"
    rtol: float = 1e-5
    atol: float = 1e-5
    budgets: Budgets = Budgets()
    timeout: float = 900.0
    memory_mb: float = 16384.0
    synthetic_size: Optional[int] = None  # samples in each synthetic stand-in for a torchvision dataset


def _side(role: str, path: Path, backend: str, record: dict) -> SideReport:
    status = record.get("status")
    ok = status == "ok"
    exc = record.get("exception") or {}
    if status == "timeout":
        cause = f"timed out after {record.get('timeout_s', 0):.0f} s; killed"
        error = cause
    elif status == "memory":
        cause = record.get("cause", "memory limit exceeded")
        error = cause
    elif status == "crashed":
        cause = record.get("cause") or f"crashed (exit status {record.get('returncode')}) without a record"
        error = cause
    else:
        cause = ""
        error = f"{exc.get('type')}: {exc.get('message')}" if exc else ("" if ok else f"status {status}")
    log = (exc.get("traceback") or "") + "\n" + record.get("output", "") if not ok else record.get("output", "")
    return SideReport(role, str(path), backend, ok, round(record.get("wall_time_s", 0.0), 3), cause, error, log[-20000:],
                      record.get("peak_mb", 0.0))


def script_health(record: dict, budgets: Budgets) -> dict:
    """Compilations after warm-up and transfers in steps that wrote no output."""
    steps = []
    for s in record.get("steps", []):
        d = s.get("xla_delta") or {}
        steps.append({"compiles": d.get("compiles", 0), "transfers": d.get("transfers", 0),
                      "executions": d.get("executions", 0), "logged": bool(s.get("printed"))})
    # the last step's record also holds whatever ran after it (evaluation, the script's end)
    judged = steps[:-1] if len(steps) > 1 else steps
    compiles_after = sum(s["compiles"] for s in judged[budgets.warmup_steps:])
    late = [i + 1 for i, s in enumerate(judged) if i >= budgets.warmup_steps and s["compiles"]]
    quiet = [i + 1 for i, s in enumerate(judged) if not s["logged"] and s["transfers"] > budgets.max_transfers_per_step]
    problems = []
    if compiles_after > budgets.max_compiles:
        problems.append(f"{compiles_after} compilation(s) after the {budgets.warmup_steps} warm-up steps "
                        f"(at step {', '.join(map(str, late))}; budget {budgets.max_compiles})")
    if quiet:
        problems.append(f"device-to-host transfers in step(s) {', '.join(map(str, quiet))} that log nothing "
                        f"(budget {budgets.max_transfers_per_step} per step)")
    xla = record.get("xla") or {}
    return {
        "steps": steps,
        "compiles_total": sum(s["compiles"] for s in steps),
        "compiles_after_warmup": compiles_after,
        "max_transfers_per_step": max((s["transfers"] for s in judged if not s["logged"]), default=0),
        "fallback_ops": sorted(xla.get("fallback_ops", [])),
        "budgets": {"max_compiles": budgets.max_compiles, "max_transfers_per_step": budgets.max_transfers_per_step,
                    "warmup_steps": budgets.warmup_steps},
        "problems": problems,
        "within_budget": not problems,
    }


def original_is_xla(path: Path) -> bool:
    """An original that already imports torch_xla (written for an older torch_xla): it runs
    on the XLA backend, with the names removed since torch_xla 2.6 put back."""
    return "torch_xla" in imported_modules(path.read_text(encoding="utf-8", errors="replace"))


def compare_steps(original: list, port: list, rtol: float, atol: float) -> tuple[list[dict], Optional[dict]]:
    """Per-step losses of the steps both sides ran, and the first step whose losses differ
    (|original - port| > atol + rtol * |original|, a different number of backward calls in the
    step, or NaN on one side only)."""
    steps = []
    first = None
    for i, (a, b) in enumerate(zip(original, port), 1):
        worst = 0.0
        ok = len(a) == len(b)
        for x, y in zip(a, b):
            if x is None or y is None or (math.isnan(x) != math.isnan(y)):
                ok = False
                continue
            if not math.isnan(x):
                worst = max(worst, abs(x - y))
                ok = ok and abs(x - y) <= atol + rtol * abs(x)
        steps.append({"step": i, "original": a, "port": b, "diff": worst, "ok": ok})
        if not ok and first is None:
            first = {"key": f"step{i}/loss", "phase": "loss", "name": "loss", "step": i, "max_abs": worst,
                     "where": f"loss at step {i}"}
    return steps, first


def _where_it_stopped(record: dict) -> str:
    """'in step N, after N-1 optimizer steps' for a script that raised or exited with an error;
    '' when the record says nothing about steps (timeout, memory limit, crash)."""
    if record.get("status") not in ("error", "exit") or "num_steps" not in record:
        return ""
    done = record["num_steps"]
    if done == 0:
        return "before its first optimizer step"
    return f"in step {done + 1}, after {done} optimizer step{'s' if done > 1 else ''}"


def verify_script(req: ScriptRequest) -> Report:
    settings = {"steps": req.steps, "args": list(req.args), "seed": req.seed, "dtype": req.dtype or "float32",
                "rtol": req.rtol, "atol": req.atol}
    notes = ["random numbers drawn on the host in the same order on both sides (--host-random)",
             f"both sides run with torch's default dtype {req.dtype or 'float32'}"]
    legacy = original_is_xla(req.original)
    if legacy:
        reference = dict(legacy_xla=True, env={"PJRT_DEVICE": "CPU"})
        backend = "torch-xla (the original already imports torch_xla; names removed since 2.6 put back)"
        notes.append("the original already imports torch_xla: it ran on the XLA backend with the names removed "
                     "since torch_xla 2.6 put back as aliases")
    else:
        reference = dict(cuda_shim=True, env={"CUDA_VISIBLE_DEVICES": ""})
        backend = "torch (CPU, CUDA calls served by the CPU)"
    with tempfile.TemporaryDirectory(prefix="porter-verify-") as tmp:
        work = Path(tmp)
        (work / "original").mkdir()
        (work / "port").mkdir()
        common = dict(host_random=True, seed=req.seed, dtype=req.dtype, max_steps=req.steps, timeout=req.timeout,
                      memory_mb=req.memory_mb, synthetic_size=req.synthetic_size)
        orig = trace_script(req.original, req.args, cwd=work / "original", **reference, **common)
        side_o = _side("original", req.original, backend, orig)
        notes += [n for n in orig.get("synthetic_datasets", []) if n not in notes]
        if not side_o.ok:
            return Report("script", False, "side-failed",
                          f"the original could not run: {side_o.error}" + (f" ({_where_it_stopped(orig)})" if _where_it_stopped(orig) else ""), side_o, None,
                          notes=notes, settings=settings)
        port = trace_script(req.port, req.args, cwd=work / "port", env={"PJRT_DEVICE": "CPU"}, **common)
        side_p = _side("port", req.port, "torch-xla", port)
        notes += [n for n in port.get("synthetic_datasets", []) if n not in notes]
    if not side_p.ok:
        # the steps the port completed before it failed are still compared: the report says
        # in which step it stopped and whether the steps before it matched
        steps, first = compare_steps(orig.get("losses", []), port.get("losses", []), req.rtol, req.atol)
        where = _where_it_stopped(port)
        if where and first is not None:
            where += f"; diverged before that, first at {first['where']}"
        elif where and steps:
            where += f"; the losses of steps 1-{len(steps)} match" if len(steps) > 1 else "; the loss of step 1 matches"
        where = f" ({where})" if where else ""
        return Report("script", False, "side-failed", f"the port could not run: {side_p.error}{where}", side_o, side_p,
                      first_divergence=first, notes=notes, settings=settings, steps=steps)
    steps, first = compare_steps(orig["losses"], port["losses"], req.rtol, req.atol)
    health = script_health(port, req.budgets) if port.get("xla") else None
    count_note = None
    if orig["num_steps"] != port["num_steps"]:
        count_note = f"the original ran {orig['num_steps']} optimizer steps, the port {port['num_steps']}"
        notes.append(count_note)
    if first is not None:
        status, summary = "diverged", f"diverged first at {first['where']}: |original - port| = {first['max_abs']:.3g}"
    elif not steps:
        status, summary = "diverged", "no optimizer step ran on both sides"
        first = {"key": "steps", "where": count_note or "no steps"}
    elif health is not None and not health["within_budget"]:
        status, summary = "over-budget", "losses match, but XLA health is over budget: " + "; ".join(health["problems"])
    else:
        worst = max(s["diff"] for s in steps)
        status, summary = "passed", f"losses of {len(steps)} steps match (worst |difference| {worst:.3g})"
    passed = status == "passed"
    return Report("script", passed, status, summary, side_o, side_p, first_divergence=first, health=health,
                  notes=notes, settings=settings, steps=steps)
