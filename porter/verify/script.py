"""Script-level verification: both training scripts run unmodified for K optimizer steps,
with the same seed and the same random numbers (drawn on the host), the original along its
GPU code path on the CPU and the port on the XLA backend; losses compared step by step and
the port's XLA health measured per step."""
from __future__ import annotations

import math
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from porter.verify import tpu_lowerings
from porter.verify.backends import imported_modules, port_backend
from porter.verify.compare import NOISE_FACTOR, NOISE_FLOOR
from porter.verify.model import Budgets, Report, SideReport
from porter.verify.trace import trace_script


# float32 comparisons: eager CPU and XLA kernels round differently, and optimizers (adaptive
# ones most) amplify the difference step after step: the tolerance grows with the step index
F32_TOL_PER_STEP = 5e-4
F64_TOL = 1e-5
# a port that fails in float64 is run again in float32 (with its original) when its error is
# about dtypes: the script builds float32 tensors of its own that meet float64 ones
_DTYPE_ERROR = re.compile(r"Double|Float|Half|float64|float32|dtype|scalar type", re.I)
# torch.distributed's env:// rendezvous without the variables torchrun sets
_TORCHRUN_ERROR = re.compile(r"env:// rendezvous: environment variable \w+ expected|"
                             r"KeyError: '(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'")


def single_process_env() -> dict:
    """The variables ``torchrun --nproc_per_node 1`` gives its one process (a free port)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


@dataclass(frozen=True)
class ScriptRequest:
    original: Path
    port: Path
    steps: int = 12
    args: tuple[str, ...] = ()
    seed: Optional[int] = 0
    # "auto": float64 when both sides run in it (float32 rounding differences between eager
    # CPU and XLA kernels are amplified by adaptive optimizers within a few steps and would
    # hide or fake a divergence), else float32 with tolerances that grow with the step; a JAX
    # port runs in float64 with jax_enable_x64 on (porter.verify.trace_jax)
    dtype: Optional[str] = "auto"
    rtol: Optional[float] = None  # None: by dtype (float64: 1e-5; float32: 5e-4 x the step index)
    atol: Optional[float] = None
    budgets: Budgets = Budgets()
    timeout: float = 900.0
    memory_mb: float = 16384.0
    synthetic_size: Optional[int] = None  # samples in each synthetic stand-in for a torchvision dataset
    files: Optional[Path] = None  # a folder copied into both sides' working directories (data the scripts read)
    env: Optional[dict] = None  # environment variables for both sides (MXNET_HOME=... for an MXNet original's datasets)
    # float32 losses that differ past the tolerance are judged again against a float64 run of
    # the original that draws the same random numbers (script._judge_by_reference)
    reference: bool = True


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
    """Compilations after warm-up and transfers in steps that wrote no output. In a JAX port the
    step functions' own recompilations are their jit caches' growth (jax_health); outside them,
    the eager operations of the code that logs (a loss read and formatted, an evaluation at the
    end of an epoch) compile the first time each runs: when every step function holds one
    program, compilations in steps that log are that code's, said in a note, not over budget."""
    steps = []
    seen: dict = {}  # optimizer -> its steps so far: each optimizer has its own warm-up steps
    for s in record.get("steps", []):
        d = s.get("xla_delta") or {}
        which = str(s.get("optimizer"))
        seen[which] = seen.get(which, 0) + 1
        off_tpu = d.get("off_tpu_fallbacks", 0)  # transfers a TPU does not make (porter.verify.tpu_lowerings)
        steps.append({"compiles": d.get("compiles", 0), "transfers": d.get("transfers", 0) - off_tpu,
                      "off_tpu_fallbacks": off_tpu, "executions": d.get("executions", 0),
                      "logged": bool(s.get("printed")), "warmup": seen[which] <= budgets.warmup_steps})
    # a script that ended by itself: its last step's record also holds whatever ran after it
    # (evaluation, the script's end); stopped after its K steps, the last step is a step like the
    # others (it ended at its own sync or at the next step's start) and is judged
    ended = record.get("ended_by") != "stop"
    judged = steps[:-1] if ended and len(steps) > 1 else steps
    logging = _jax_logging_steps(record, judged)
    compiles_after = sum(s["compiles"] for i, s in enumerate(judged) if not s["warmup"] and i not in logging)
    late = [i + 1 for i, s in enumerate(judged) if not s["warmup"] and s["compiles"] and i not in logging]
    quiet = [i + 1 for i, s in enumerate(judged) if not s["logged"] and s["transfers"] > budgets.max_transfers_per_step]
    problems = []
    if compiles_after > budgets.max_compiles:
        per = " of each optimizer" if len(seen) > 1 else ""
        problems.append(f"{compiles_after} compilation(s) after the {budgets.warmup_steps} warm-up steps{per} "
                        f"(at step {', '.join(map(str, late))}; budget {budgets.max_compiles})")
    if quiet:
        problems.append(f"device-to-host transfers in step(s) {', '.join(map(str, quiet))} that log nothing "
                        f"(budget {budgets.max_transfers_per_step} per step)")
    # a port whose steps launch no XLA graph at all trained on the CPU (say a script that
    # never moves its model): its losses can match and it is still not a port to XLA
    executions = sum(s["executions"] for s in steps)
    if steps and not executions and not record.get("jax"):
        problems.append("no XLA computation ran in the optimizer steps: the port trained on the CPU")
    xla = record.get("xla") or {}
    notes = []
    logged = [i for i in sorted(logging) if judged[i]["compiles"]]
    if logged:
        notes.append("compilations after the warm-up in steps that log (" + ", ".join(
            f"step {i + 1}: {judged[i]['compiles']}" for i in logged) + "): the eager operations of the code that "
            "logs or evaluates, on their first run; every step function holds one program")
    off_tpu = tpu_lowerings.note([s["off_tpu_fallbacks"] for s in steps])
    if off_tpu:
        notes.append(off_tpu)
    return {
        "notes": notes,
        "steps": steps,
        "executions_total": executions,
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


def tolerance(dtype: str, rtol: Optional[float], atol: Optional[float]) -> tuple[float, float, bool]:
    """(rtol, atol, scaled): given tolerances stay as they are; by default float64 compares at
    1e-5 and float32 at 5e-4 times the step index (scaled)."""
    if rtol is not None or atol is not None:
        return (rtol if rtol is not None else F64_TOL), (atol if atol is not None else F64_TOL), False
    if dtype == "float64":
        return F64_TOL, F64_TOL, False
    return F32_TOL_PER_STEP, F32_TOL_PER_STEP, True


def compare_steps(original: list, port: list, rtol: float, atol: float, scaled: bool = False,
                  summed: bool = False) -> tuple[list[dict], Optional[dict]]:
    """Per-step losses of the steps both sides ran, and the first step whose losses differ
    (|original - port| > atol + rtol * |original|, both times the step index when ``scaled``;
    a different number of backward calls in the step, or NaN on one side only). ``summed``: a
    step of the original with several backward calls is compared by their sum with a port's
    step that has one loss (a JAX port's step function returns the total)."""
    steps = []
    first = None
    for i, (a, b) in enumerate(zip(original, port), 1):
        if summed and len(a) > 1 and len(b) == 1 and all(x is not None for x in a):
            a = [sum(a)]
        k = i if scaled else 1
        worst = 0.0
        ok = len(a) == len(b)
        for x, y in zip(a, b):
            if x is None or y is None or (math.isnan(x) != math.isnan(y)):
                ok = False
                continue
            if not math.isnan(x):
                worst = max(worst, abs(x - y))
                ok = ok and abs(x - y) <= k * (atol + rtol * abs(x))
        steps.append({"step": i, "original": a, "port": b, "diff": worst, "ok": ok})
        if not ok and first is None:
            first = _divergence(steps[-1])
    return steps, first


def _widened_run(req: ScriptRequest, script: Path, jax_port: bool, settings: dict) -> dict:
    """``script`` run in float64 drawing the float32 run's random numbers, its float32 tensors
    widened (``float64_reference``)."""
    with tempfile.TemporaryDirectory(prefix="porter-reference-") as tmp:
        _copy_files(req.files, Path(tmp))
        return trace_script(script, req.args, cwd=tmp, host_random=True, float64_reference=True, seed=req.seed,
                            dtype="float64", max_steps=req.steps, timeout=req.timeout, memory_mb=req.memory_mb,
                            synthetic_size=req.synthetic_size, reseed_at_optimizer=jax_port, init_apart=jax_port,
                            **settings)


def _judge_by_reference(req: ScriptRequest, steps: list[dict], side_settings: dict, jax_port: bool,
                        notes: list[str], port_env: Optional[dict] = None) -> Optional[dict]:
    """Losses compared in float32 that differ past the tolerance, judged again against a float64
    run of the original that draws the float32 run's random numbers and widens its float32
    tensors (``float64_reference``): the same computation without float32's rounding. A step
    whose port is at most NOISE_FACTOR times the original's own distance from that reference
    (plus NOISE_FLOOR of its loss) is float32 rounding, as model-level verify's --reference
    judges tensors. Where a step is still divergent and the port is a torch-xla script
    (``port_env``), the port is widened the same way: losses that then equal the reference's
    at every step (float64's tolerance) make the float32 differences the port's rounding (XLA's
    kernels round otherwise than eager CPU's; a loss that jumps from step to step grows the
    difference), not a difference of the port. Updates ``steps`` and ``notes``; returns the
    first step still divergent (None: every step is within it)."""
    ref = _widened_run(req, req.original, jax_port, side_settings)
    losses = [_summed_like(r, s["original"]) for r, s in zip(ref.get("losses") or [], steps)]
    unjudged = next((_divergence(s) for s in steps if not s["ok"]), None)
    if len(losses) < len(steps):
        why = _error_line(ref) or ref.get("cause") or ref.get("status")
        notes.append(f"no float64 reference to tell float32 rounding from a difference: the original ran "
                     f"{len(losses)} of {len(steps)} steps in float64 ({why})")
        return unjudged
    # the reference is the original's computation only if its first step, one forward from the
    # same weights and batch, is within float32's tolerance of the original's
    if not _close(steps[0]["original"], losses[0], lambda x, y: abs(x - y) <= F32_TOL_PER_STEP * (1 + abs(x))):
        notes.append(f"a float64 run of the original did not start where the float32 run did (step 1's loss "
                     f"{losses[0]} against {steps[0]['original']}): it cannot tell float32 rounding from a difference")
        return unjudged
    first = None
    rounded = []
    apart = ""  # the first step past float32 rounding, said if the port widened does not settle it
    for s, r in zip(steps, losses):
        if not s["ok"] and _within_rounding(s["original"], s["port"], r):
            s["ok"], s["reference"] = True, r
            rounded.append(f"step {s['step']}: port {max(abs(y - z) for y, z in zip(s['port'], r)):.3g}, original "
                           f"{max(abs(x - z) for x, z in zip(s['original'], r)):.3g}")
        if not s["ok"] and first is None:
            first = _divergence(s)
            if _close(s["port"], r, _any) and _close(s["original"], r, _any):
                far = max(abs(y - z) for y, z in zip(s["port"], r))
                own = max(abs(x - z) for x, z in zip(s["original"], r))
                apart = (f"not float32 rounding at step {s['step']}: against a float64 run of the original that drew "
                         f"the same random numbers, the port's loss is {far:.3g} from it, the original's {own:.3g}")
    if rounded:
        notes.append(f"float32 rounding, judged against a float64 run of the original that drew the same random "
                     f"numbers: the port's losses are within {NOISE_FACTOR:g} times the original's own distance from "
                     "it (|loss - float64 reference|: " + "; ".join(rounded) + ")")
    if first is not None and port_env is not None:
        first = _judge_widened_port(req, steps, losses, port_env, notes, first)
    if first is not None and apart:
        notes.append(apart)
    return first


def _judge_widened_port(req: ScriptRequest, steps: list[dict], reference: list, port_env: dict, notes: list[str],
                        first: dict) -> Optional[dict]:
    """The port widened as the reference was: the same losses as the reference at every
    compared step make the float32 differences rounding (every step then passes)."""
    widened = _widened_run(req, req.port, False, {"env": port_env, "jax_first": True})
    ported = [_summed_like(r, s["port"]) for r, s in zip(widened.get("losses") or [], steps)]
    if len(ported) < len(steps):
        notes.append(f"the port widened to float64 ran {len(ported)} of {len(steps)} steps "
                     f"({_error_line(widened) or widened.get('status')}): float32 rounding not told apart")
        return first
    worst = 0.0
    for r, w in zip(reference, ported):
        if not _close(r, w, lambda x, y: abs(x - y) <= F64_TOL * (1 + abs(x))):
            notes.append("widened to float64 (the same random numbers, float32 tensors widened) on both sides, the "
                         "losses still differ: a difference of the port, not float32 rounding")
            return first
        worst = max([worst, *(abs(x - y) for x, y in zip(r, w))])
    apart = [s["step"] for s in steps if not s["ok"]]
    for s, r in zip(steps, reference):
        if not s["ok"]:
            s["ok"], s["reference"] = True, r
    notes.append(f"float32 rounding of the port: widened to float64 on both sides (the same random numbers, float32 "
                 f"tensors widened), the port's losses equal the original's at every step (worst |difference| "
                 f"{worst:.3g}); in float32 they part by more than the original's own rounding at step(s) "
                 f"{', '.join(map(str, apart))}")
    return None


def _any(x: float, y: float) -> bool:
    return True


def _summed_like(losses: list, like: list) -> list:
    """One step's losses summed where the compared step holds their sum (compare_steps' ``summed``)."""
    if len(losses) > 1 and len(like) == 1 and all(x is not None for x in losses):
        return [sum(losses)]
    return losses


def _close(a: list, b: list, within) -> bool:
    """Same number of losses, all finite, each pair ``within``."""
    return len(a) == len(b) and all(x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
                                    and within(x, y) for x, y in zip(a, b))


def _within_rounding(original: list, port: list, reference: list) -> bool:
    """Each port loss at most NOISE_FACTOR times the original's distance from the reference
    (plus NOISE_FLOOR of it), all of them finite."""
    values = list(zip(original, port, reference))
    return (len(original) == len(port) == len(reference)
            and all(v is not None and math.isfinite(v) for t in values for v in t)
            and all(abs(y - z) <= NOISE_FACTOR * abs(x - z) + NOISE_FLOOR * abs(z) for x, y, z in values))


def _divergence(step: dict) -> dict:
    """The first-divergence record of a step whose losses differ."""
    i = step["step"]
    return {"key": f"step{i}/loss", "phase": "loss", "name": "loss", "step": i, "max_abs": step["diff"],
            "where": f"loss at step {i}"}


def _constant_loss_note(steps: list[dict], notes: list[str]) -> str:
    """For losses that match but never changed: a note (appended to ``notes``) and the words the
    summary ends with; '' otherwise."""
    constant = _constant_loss(steps)
    if constant is None:
        return ""
    notes.append(f"the loss is {constant:g} at every compared step on both sides: the steps changed nothing the loss "
                 "shows (a loss that cannot change, such as cross-entropy over a single class, or a learning rate of "
                 "0), so matching losses say little about the port; compare more steps, or the model itself "
                 "(porter verify --model)")
    return " (a constant loss: see the notes)"


def _constant_loss(steps: list[dict]) -> Optional[float]:
    """The loss value when two or more compared steps all had that one loss on both sides."""
    values = {x for s in steps for x in (*s["original"], *s["port"]) if x is not None}
    if len(steps) < 2 or len(values) != 1:
        return None
    value = values.pop()
    return None if math.isnan(value) else value


def _where_it_stopped(record: dict) -> str:
    """'in step N, after N-1 optimizer steps' for a script that raised or exited with an error;
    '' when the record says nothing about steps (timeout, memory limit, crash)."""
    if record.get("status") not in ("error", "exit") or "num_steps" not in record:
        return ""
    done = record["num_steps"]
    if done == 0:
        return "before its first optimizer step"
    return f"in step {done + 1}, after {done} optimizer step{'s' if done > 1 else ''}"


def _ended_early(record: dict, steps: int) -> str:
    """How a side that ended without an error before ``steps`` optimizer steps ended ('its
    script ended after 1 optimizer step, of the 3 asked for (exit status 0, no error)'); ''
    for a side that reached them, or failed."""
    done = record.get("num_steps", 0)
    if record.get("status") != "ok" or done >= steps:
        return ""
    how = {"exit": "called sys.exit(0)", "end": "ran to the end of its script"}.get(record.get("ended_by") or "",
                                                                                   "ended without an error")
    when = "before its first optimizer step" if done == 0 else f"after {done} optimizer step{'s' if done != 1 else ''}"
    return f"{how} {when}, of the {steps} asked for (exit status {record.get('exit_code', 0)}, no error)"


def _early_end(orig: dict, port: dict, steps: list, req_steps: int, notes: list[str]) -> tuple[str, Optional[str]]:
    """What a side that ended early without an error means for the report: ('', None) when
    neither did; else (the summary's words on it, a reason the verification fails or None).
    Both sides ending after the same number of steps is the script's own length (those steps
    are compared); one ending before the other leaves steps of the other uncompared: a failure."""
    early = [(role, text) for role, record in (("original", orig), ("port", port))
             if (text := _ended_early(record, req_steps))]
    for role, text in early:
        notes.append(f"the {role} {text}")
    if not early:
        return "", None
    said = "; ".join(f"the {role} {text}" for role, text in early)
    n_o, n_p = orig.get("num_steps", 0), port.get("num_steps", 0)
    if n_o != n_p:
        # a port that takes fewer steps by design (drop_last=True, an unsafe fix, shortens the
        # epoch) still matches on the steps both ran: said, not a failure; no step both ran is one
        notes.append(f"the original ran {n_o} optimizer step{'s' if n_o != 1 else ''}, the port {n_p}: "
                     f"{min(n_o, n_p)} compared")
        if not steps:
            return said, f"{said}; no optimizer step ran on both sides"
    return said, None


def _failed_after(record: dict, steps: int) -> bool:
    """The script raised (or exited with an error) after at least STEPS optimizer steps: what
    failed came after the steps compared (a reload, an evaluation, a save), not in them."""
    return record.get("status") in ("error", "exit") and steps >= 1 and record.get("num_steps", 0) >= steps


def _failed_after_the_steps(orig: dict, port: dict, side_o: SideReport, side_p: SideReport, notes: list[str],
                            settings: dict, compare) -> Optional[Report]:
    """A port that failed after the compared steps: where the original ran its whole script (its
    evaluation, its save), what failed is the port's (a side-failed report, its steps compared by
    ``compare()``); else the failure is a note and the port's side counts as run. None when the
    port did not fail."""
    if port.get("status") == "ok":
        return None
    if orig.get("status") == "ok" and orig.get("ended_by") in ("end", "exit"):
        steps, first = compare()
        return Report("script", False, "side-failed",
                      f"the port could not run: {side_p.error} (after its {port.get('num_steps', 0)} optimizer steps, "
                      f"where the original ran to the end of its script)", side_o, side_p,
                      first_divergence=first, notes=notes, settings=settings, steps=steps)
    notes.append(f"the port failed after its {port.get('num_steps', 0)} optimizer steps, after the compared "
                 f"steps: {_error_line(port)}")
    side_p.ok, side_p.error = True, ""
    return None


def _error_line(record: dict) -> str:
    exc = record.get("exception") or {}
    message = re.sub(r"\x1b\[[0-9;]*m", "", exc.get("message") or "").strip().splitlines()
    return f"{exc.get('type')}: {message[0] if message else ''}".rstrip(": ")


def _port_health(port: dict, budgets: Budgets, jax_port: bool, notes: list[str]) -> Optional[dict]:
    """The port's XLA health (script_health, with jax_health's measures for a JAX port); its
    notes go to the report's."""
    if not port.get("xla") and jax_port:
        return None
    health = script_health(port, budgets)
    if jax_port:
        health = jax_health(port, health, budgets)
    notes.extend(health.pop("notes"))
    return health


def _jax_logging_steps(record: dict, judged: list[dict]) -> set[int]:
    """The indexes of the judged steps after the warm-up that log, in a JAX port whose step
    functions each hold one program (see script_health); none otherwise."""
    sizes = (record.get("jax") or {}).get("jit_cache_sizes")
    if not sizes or any(size is None or size > 1 for size in sizes.values()):
        return set()
    return {i for i, s in enumerate(judged) if not s["warmup"] and s["logged"]}


def jax_health(record: dict, health: dict, budgets: Budgets) -> dict:
    """A JAX port's health: script_health's per-step numbers, and each step function's jit
    cache size and the host callbacks traced into it."""
    jx = record.get("jax") or {}
    sizes = jx.get("jit_cache_sizes") or {}
    callbacks = jx.get("host_callbacks") or {}
    problems = list(health["problems"])
    for name, size in sizes.items():
        if size is not None and size > 1 + budgets.max_compiles:
            problems.append(f"{name} was compiled {size} times (its jit cache holds {size} programs; budget "
                            f"{1 + budgets.max_compiles})")
    for name, found in callbacks.items():
        if found:
            what = ", ".join(f"{cb} x{n}" for cb, n in found.items())
            problems.append(f"{name} calls back to the host ({what}): a device-to-host transfer in every step")
    return {**health, "jit_cache_sizes": sizes, "host_callbacks": callbacks,
            "host_callbacks_total": sum(sum(v.values()) for v in callbacks.values()),
            "problems": problems, "within_budget": not problems}


def _not_ported(record: dict) -> Optional[str]:
    """Why a JAX port's run proves nothing about it, when some of its recorded steps were torch's
    (a torch.optim optimizer's step, by its index, or a manual update of torch parameters, -1; a
    JAX step is named by its step function, or "eager update"): the port trained with torch (a
    step JAX could not take over, a torch library model), so its losses are the original's own."""
    torch_steps = sum(1 for step in record.get("steps", []) if isinstance(step.get("optimizer"), int))
    if not torch_steps:
        return None
    return (f"the port's training ran in torch, not JAX: {torch_steps} of its {record.get('num_steps', 0)} optimizer "
            "steps were torch.optim steps or manual updates of torch parameters (see the port's JX901 findings at "
            "its backward() and its model)")


def _copy_files(folder: Optional[Path], target: Path) -> None:
    if folder is not None:
        shutil.copytree(folder, target, dirs_exist_ok=True, symlinks=True)


def original_is_mxnet(path: Path) -> bool:
    """An MXNet/Gluon original: it runs in the MXNet venv (``porter.verify.trace_mxnet``)."""
    return "mxnet" in imported_modules(path.read_text(encoding="utf-8", errors="replace"))


def _original_outcome(req: ScriptRequest, orig: dict, orig_ran: bool, side_o: SideReport, notes: list[str],
                      settings: dict) -> Optional[Report]:
    """The verification's end when the original did not run (its error and where it stopped);
    else None, with a note (and ``side_o`` counted as having run) when the original failed only
    after the steps that are compared."""
    if not orig_ran:
        where = _where_it_stopped(orig)
        return Report("script", False, "side-failed",
                      f"the original could not run: {side_o.error}" + (f" ({where})" if where else ""), side_o, None,
                      notes=notes, settings=settings)
    if orig.get("status") != "ok":
        done = orig.get("num_steps", 0)
        of = "" if done >= req.steps else f" (of the {req.steps} asked for; those are compared)"
        notes.append(f"the original failed after its {done} optimizer step{'s' if done != 1 else ''}{of}: "
                     f"{_error_line(orig)}; a failure after the compared steps is not part of the verification")
        side_o.ok, side_o.error = True, ""
    return None


def verify_script(req: ScriptRequest) -> Report:
    if original_is_mxnet(req.original):
        return verify_mxnet_script(req)
    jax_port = port_backend(req.port).name == "jax"
    auto = req.dtype in (None, "auto")
    if auto:
        candidates = ["float64", "float32"]
    else:
        candidates = [req.dtype]
    notes = ["random numbers drawn on the host in the same order on both sides (--host-random)"]
    legacy = original_is_xla(req.original)
    if legacy:
        reference = dict(legacy_xla=True, env={"PJRT_DEVICE": "CPU"})
        backend = "torch-xla (the original already imports torch_xla; names removed since 2.6 put back)"
        notes.append("the original already imports torch_xla: it ran on the XLA backend with the names removed "
                     "since torch_xla 2.6 put back as aliases")
    else:
        reference = dict(cuda_shim=True, env={"CUDA_VISIBLE_DEVICES": ""})
        backend = "torch (CPU, CUDA calls served by the CPU)"
    if jax_port:
        port_label = "jax (JAX on the CPU; steps: the jitted functions that update parameters)"
        notes.append("a JAX port: the original's initial weights go into each nnx.Optimizer's model through the "
                     "port's load_torch_state_dict, and torch/random/numpy are seeded again as each optimizer is "
                     "created on both sides (the port builds its model from nnx.Rngs, the original draws from "
                     "torch's generator); a step of the original with several backward calls is compared by "
                     "the sum of its losses")
    else:
        port_label = "torch-xla"
    # a side on torch_xla imports jax in its loader thread, drawing from numpy's global generator:
    # both sides import it first (porter.verify.trace._import_jax_first)
    jax_first = not jax_port and (legacy or "torch_xla" in imported_modules(
        req.port.read_text(encoding="utf-8", errors="replace")))
    with tempfile.TemporaryDirectory(prefix="porter-verify-") as tmp:
        work = Path(tmp)
        tried: list[str] = []
        port: dict = {}
        launch_env: dict = {}  # a single-process torchrun environment, once the original asked for one
        for attempt, dtype in enumerate(candidates):
            last = attempt == len(candidates) - 1
            for side in ("original", "port"):
                folder = work / f"{side}-{dtype}-{attempt}"
                folder.mkdir()
                _copy_files(req.files, folder)
            common = dict(host_random=True, seed=req.seed, dtype=dtype, max_steps=req.steps, jax_first=jax_first,
                          timeout=req.timeout, memory_mb=req.memory_mb, synthetic_size=req.synthetic_size)
            extra_o: dict = {}
            extra_p: dict = {}
            if jax_port:
                extra_o = dict(export_weights=work / "weights", reseed_at_optimizer=True, init_apart=True)
                extra_p = dict(jax=True, jax_weights=work / "weights", reseed_at_optimizer=True, init_apart=True)
            orig = trace_script(req.original, req.args, cwd=work / f"original-{dtype}-{attempt}",
                                **{**reference, "env": {**reference["env"], **launch_env}}, **common, **extra_o)
            orig_ran = orig.get("status") == "ok" or _failed_after(orig, 1)
            if not orig_ran and not launch_env and _TORCHRUN_ERROR.search(_error_line(orig)):
                # a script written for torchrun, run without it: again as its one process
                launch_env = single_process_env()
                notes.append("the script reads torchrun's environment (env:// rendezvous): both sides ran as its "
                             "single process (" + ", ".join(f"{k}={v}" for k, v in launch_env.items()
                                                             if k != "MASTER_PORT") + ")")
                candidates.insert(attempt + 1, dtype)
                continue
            if not orig_ran and not last:
                tried.append(f"in {dtype} the original could not run ({_error_line(orig) or orig.get('status')}"
                             f"{', ' + _where_it_stopped(orig) if _where_it_stopped(orig) else ''})")
                continue
            if not orig_ran:
                break
            env = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""} if jax_port else {"PJRT_DEVICE": "CPU"}
            if jax_port and not orig.get("optimizers_created", 1):
                # an original that updates by hand never reseeds: neither does the port as its
                # nnx.Optimizer is made (its weights still load there, from the first loss's model)
                extra_p["reseed_at_optimizer"] = False
            port = trace_script(req.port, req.args, cwd=work / f"port-{dtype}-{attempt}",
                                env={**env, **launch_env}, **common, **extra_p)
            port_ran = port.get("status") == "ok" or _failed_after(port, orig.get("num_steps", 0))
            # an error about dtypes, or float64's cost (twice the memory, slower kernels: a conv net's
            # XLA program past the side's memory or time limit): float32 is tried
            if not port_ran and not last and (_DTYPE_ERROR.search(_error_line(port))
                                              or port.get("status") in ("memory", "timeout")):
                why = {"memory": port.get("cause", "memory limit exceeded"),
                       "timeout": f"timed out after {port.get('timeout_s', 0):.0f} s"}.get(port.get("status"))
                tried.append(f"in {dtype} the port could not run ({why or _error_line(port)})")
                continue
            break
    dtype_note = f"both sides ran with torch's default dtype {dtype}"
    if jax_port and dtype == "float64":
        dtype_note += " (the JAX port with jax_enable_x64 on and its models' variables widened to float64)"
    elif jax_port:
        dtype_note += " (the JAX port with jax_enable_x64 off)"
    if tried:
        dtype_note += " (" + "; ".join(tried) + ")"
    elif auto and dtype == "float64":
        dtype_note += " (chosen: both sides run in it)"
    # a JAX port that casts its own parameters to float32 computes in float32 whatever the
    # run's dtype: its losses are compared with float32's tolerances
    narrow = (port.get("jax") or {}).get("narrow_parameters") or [] if dtype == "float64" else []
    compared_in = "float32" if narrow else dtype
    if narrow:
        dtype_note += (f"; the port's parameters stayed narrower than float64 ({', '.join(narrow[:3])}"
                       f"{' ...' if len(narrow) > 3 else ''}): compared with float32's tolerances")
    rtol, atol, scaled = tolerance(compared_in, req.rtol, req.atol)
    if scaled:
        dtype_note += (f"; float32 tolerances grow with the step: step k allows |original - port| <= "
                       f"k x ({atol:g} + {rtol:g} x |original|)")
    notes.append(dtype_note)
    settings = {"steps": req.steps, "args": list(req.args), "seed": req.seed, "dtype": dtype,
                "dtype_requested": req.dtype or "auto", "rtol": rtol, "atol": atol, "tolerance_scaled": scaled,
                "port_backend": "jax" if jax_port else "torch-xla"}
    side_o = _side("original", req.original, backend, orig)
    notes += [n for n in orig.get("synthetic_datasets", []) if n not in notes]
    notes += [f"original: {n}" for n in orig.get("exported_weights", [])]
    stopped = _original_outcome(req, orig, orig_ran, side_o, notes, settings)
    if stopped is not None:
        return stopped
    side_p = _side("port", req.port, port_label, port)
    notes += [n for n in port.get("synthetic_datasets", []) if n not in notes]
    notes += [f"port: {n}" for n in (port.get("jax") or {}).get("weights_loaded", [])]
    if not port_ran:
        # the steps the port completed before it failed are still compared: the report says
        # in which step it stopped and whether the steps before it matched
        steps, first = compare_steps(orig.get("losses", []), port.get("losses", []), rtol, atol, scaled, jax_port)
        where = _where_it_stopped(port)
        if where and first is not None:
            where += f"; diverged before that, first at {first['where']}"
        elif where and steps:
            where += f"; the losses of steps 1-{len(steps)} match" if len(steps) > 1 else "; the loss of step 1 matches"
        where = f" ({where})" if where else ""
        return Report("script", False, "side-failed", f"the port could not run: {side_p.error}{where}", side_o, side_p,
                      first_divergence=first, notes=notes, settings=settings, steps=steps)
    failed = _failed_after_the_steps(orig, port, side_o, side_p, notes, settings,
                                     lambda: compare_steps(orig["losses"], port.get("losses", []), rtol, atol, scaled,
                                                           jax_port))
    if failed is not None:
        return failed
    steps, first = compare_steps(orig["losses"], port["losses"], rtol, atol, scaled, jax_port)
    if first is not None and dtype == "float32" and req.reference:
        first = _judge_by_reference(req, steps, {**reference, "jax_first": jax_first}, jax_port, notes,
                                    None if jax_port else {"PJRT_DEVICE": "CPU", **launch_env})
    # a torch-xla port that never imported torch_xla has no metrics: its health says it ran on the CPU
    health = _port_health(port, req.budgets, jax_port, notes)
    count_note = None
    if orig["num_steps"] != port["num_steps"]:
        count_note = f"the original ran {orig['num_steps']} optimizer steps, the port {port['num_steps']}"
        notes.append(count_note)
    early, stopped = _early_end(orig, port, steps, req.steps, notes)
    not_ported = _not_ported(port) if jax_port else None
    if not_ported:
        return Report("script", False, "not-ported", not_ported, side_o, side_p, health=health, notes=notes,
                      settings=settings, steps=steps)
    if first is not None:
        status, summary = "diverged", f"diverged first at {first['where']}: |original - port| = {first['max_abs']:.3g}"
    elif stopped is not None:
        status, summary = "diverged", stopped
        first = {"key": "steps", "where": count_note or "steps"}
    elif not steps:
        status, summary = "diverged", "no optimizer step ran on both sides" + (f" ({early})" if early else "")
        first = {"key": "steps", "where": count_note or "no steps"}
    elif health is not None and not health["within_budget"]:
        status, summary = "over-budget", "losses match, but XLA health is over budget: " + "; ".join(health["problems"])
    else:
        worst = max(s["diff"] for s in steps)
        status, summary = "passed", f"losses of {len(steps)} steps match (worst |difference| {worst:.3g})"
        if any("reference" in s for s in steps):
            summary += ", within float32 rounding of a float64 reference run (see the notes)"
    if status in ("passed", "over-budget"):
        summary += _constant_loss_note(steps, notes)
    if early and status in ("passed", "over-budget"):
        summary += f" ({early})"
    passed = status == "passed"
    return Report("script", passed, status, summary, side_o, side_p, first_divergence=first, health=health,
                  notes=notes, settings=settings, steps=steps)


def _mxnet_alignment_notes(orig: dict, port: dict, jax_port: bool) -> list[str]:
    """What the two sides could not be made to agree on, as the records show it."""
    notes = []
    if orig.get("dropout_layers"):
        notes.append("the original's model has dropout (" + ", ".join(orig["dropout_layers"]) + "): MXNet's and the "
                     "port's generators draw different masks, so the losses cannot match in training mode; run the "
                     "script with its dropout off (a --dropout 0 flag) to compare")
    if orig.get("random_calls"):
        calls = ", ".join(f"{k} x{n}" for k, n in orig["random_calls"].items())
        notes.append(f"the original drew random numbers from MXNet's generator in the compared steps ({calls}): the "
                     "port draws from another generator, so the steps that use them cannot match")
    if orig.get("random_augmentations"):
        notes.append("the original's data pipeline has random augmentations (" + ", ".join(orig["random_augmentations"])
                     + "): MXNet's and the port's draws differ, so the batches and their losses cannot match")
    loaded = (port.get("jax") or {}).get("weights_loaded", []) if jax_port else port.get("weights_loaded", [])
    if not orig.get("exported_weights"):
        notes.append("the original made no gluon.Trainer whose model's initial weights could be exported: each side "
                     "kept its own initial weights")
    return notes + [f"port: {n}" for n in loaded]


def _weights_loaded(port: dict, jax_port: bool) -> bool:
    loaded = (port.get("jax") or {}).get("weights_loaded", []) if jax_port else port.get("weights_loaded", [])
    return bool(loaded) and all(" loaded into " in n for n in loaded)


def verify_mxnet_script(req: ScriptRequest) -> Report:
    """Script-level verification of an MXNet/Gluon original: the original runs in the MXNet
    venv (``porter.verify.trace_mxnet``) for K optimizer steps, writing its models' initial
    weights by torch-style name as each trainer's model first runs backward; the port
    (torch_xla or JAX) runs under ``porter.verify.trace`` and loads them into the model of
    each optimizer it creates (in creation order); both sides' DataLoaders read in order.
    Both sides run in float32 (MXNet's default), with tolerances that grow with the step."""
    from porter.verify.datasets import default_size
    from porter.verify.trace_mxnet import trace_mxnet_script

    jax_port = port_backend(req.port).name == "jax"
    if req.dtype not in (None, "auto", "float32"):
        raise ValueError(f"--dtype {req.dtype}: an MXNet original runs in float32 (Gluon's default); "
                         "use --dtype float32 or auto")
    backend = "mxnet 1.9.1 (the MXNet venv, on the CPU)"
    port_label = "jax (JAX on the CPU; steps: the jitted functions that update parameters)" if jax_port else "torch-xla"
    notes = ["an MXNet original: its initial weights go into the port's models (the i-th gluon.Trainer's model into "
             "the model of the port's i-th optimizer, by the torch names the Gluon rules keep); both sides' "
             "DataLoaders read their datasets in order; a step's loss is the one whose gradient it applies "
             "(trainer.step(batch_size) divides a summed loss by the batch size); a step of the original with "
             "several backward passes is compared by the sum of their losses"]
    with tempfile.TemporaryDirectory(prefix="porter-verify-") as tmp:
        work = Path(tmp)
        for side in ("original", "port"):
            (work / side).mkdir()
            _copy_files(req.files, work / side)
        # Gluon's vision datasets and the port's torchvision ones read the same synthetic samples
        size = req.synthetic_size or default_size(req.steps)
        orig = trace_mxnet_script(req.original, req.args, seed=req.seed, max_steps=req.steps,
                                  export_weights=work / "weights", no_shuffle=True, timeout=req.timeout,
                                  memory_mb=req.memory_mb, cwd=work / "original", env=dict(req.env or {}),
                                  synthetic_size=size)
        orig_ran = orig.get("status") == "ok" or _failed_after(orig, 1)
        port: dict = {}
        if orig_ran:
            env = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""} if jax_port else {"PJRT_DEVICE": "CPU"}
            env.update(req.env or {})
            extra = dict(jax=True, jax_weights=work / "weights") if jax_port else dict(torch_weights=work / "weights")
            port = trace_script(req.port, req.args, cwd=work / "port", env=env, host_random=True, seed=req.seed,
                                max_steps=req.steps, no_shuffle=True, timeout=req.timeout, memory_mb=req.memory_mb,
                                synthetic_size=size, **extra)
    rtol, atol, scaled = tolerance("float32", req.rtol, req.atol)
    notes.append("both sides ran in float32 (an MXNet original runs in Gluon's default float32)"
                 + (f"; float32 tolerances grow with the step: step k allows |original - port| <= "
                    f"k x ({atol:g} + {rtol:g} x |original|)" if scaled else ""))
    settings = {"steps": req.steps, "args": list(req.args), "seed": req.seed, "dtype": "float32",
                "dtype_requested": req.dtype or "auto", "rtol": rtol, "atol": atol, "tolerance_scaled": scaled,
                "port_backend": "jax" if jax_port else "torch-xla", "original_backend": "mxnet"}
    side_o = _side("original", req.original, backend, orig)
    notes += [n for n in orig.get("notes", []) if n not in notes]
    notes += [f"original: {n}" for n in orig.get("exported_weights", [])]
    stopped = _original_outcome(req, orig, orig_ran, side_o, notes, settings)
    if stopped is not None:
        return stopped
    side_p = _side("port", req.port, port_label, port)
    notes += _mxnet_alignment_notes(orig, port, jax_port)
    notes += [n for n in port.get("synthetic_datasets", []) if n not in notes]
    port_ran = port.get("status") == "ok" or _failed_after(port, orig.get("num_steps", 0))
    steps, first = compare_steps(orig.get("losses", []), port.get("losses", []), rtol, atol, scaled, True)
    if not port_ran:
        where = _where_it_stopped(port)
        if where and first is not None:
            where += f"; diverged before that, first at {first['where']}"
        elif where and steps:
            where += f"; the losses of steps 1-{len(steps)} match" if len(steps) > 1 else "; the loss of step 1 matches"
        where = f" ({where})" if where else ""
        return Report("script", False, "side-failed", f"the port could not run: {side_p.error}{where}", side_o, side_p,
                      first_divergence=first, notes=notes, settings=settings, steps=steps)
    failed = _failed_after_the_steps(orig, port, side_o, side_p, notes, settings,
                                     lambda: compare_steps(orig["losses"], port.get("losses", []), rtol, atol, scaled,
                                                           jax_port))
    if failed is not None:
        return failed
    health = _port_health(port, req.budgets, jax_port, notes)
    count_note = None
    if orig["num_steps"] != port["num_steps"]:
        count_note = f"the original ran {orig['num_steps']} optimizer steps, the port {port['num_steps']}"
        notes.append(count_note)
    early, stopped = _early_end(orig, port, steps, req.steps, notes)
    not_ported = _not_ported(port) if jax_port else None
    if not_ported:
        return Report("script", False, "not-ported", not_ported, side_o, side_p, health=health, notes=notes,
                      settings=settings, steps=steps)
    if first is not None:
        status, summary = "diverged", f"diverged first at {first['where']}: |original - port| = {first['max_abs']:.3g}"
        if not _weights_loaded(port, jax_port):
            summary += " (the port did not start from the original's initial weights: see the notes)"
    elif stopped is not None:
        status, summary = "diverged", stopped
        first = {"key": "steps", "where": count_note or "steps"}
    elif not steps:
        status, summary = "diverged", "no optimizer step ran on both sides" + (f" ({early})" if early else "")
        first = {"key": "steps", "where": count_note or "no steps"}
    elif not _weights_loaded(port, jax_port):
        # equal losses from different initial weights would be chance, not a verification
        status = "diverged"
        summary = "the port did not start from the original's initial weights (see the notes): the losses are not comparable"
        first = {"key": "weights", "where": "initial weights"}
    elif health is not None and not health["within_budget"]:
        status, summary = "over-budget", "losses match, but XLA health is over budget: " + "; ".join(health["problems"])
    else:
        worst = max(s["diff"] for s in steps)
        status, summary = "passed", f"losses of {len(steps)} steps match (worst |difference| {worst:.3g})"
    if status in ("passed", "over-budget"):
        summary += _constant_loss_note(steps, notes)
    if early and status in ("passed", "over-budget"):
        summary += f" ({early})"
    return Report("script", status == "passed", status, summary, side_o, side_p, first_divergence=first,
                  health=health, notes=notes, settings=settings, steps=steps)
