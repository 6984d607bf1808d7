"""Model-level verification: the same model, weights and inputs on both sides; compare
every layer's output, the gradients, and K training steps; measure the port's XLA health.

Both sides start at once. The port's process imports its framework, opens its device and
builds its model while the original runs, then waits for the original's weights and inputs:
the ``.npz`` the original writes counts as there only once the original has exited cleanly
(this process then creates ``original.ready``; the port waits for that file). When the
original fails, the waiting port is killed. The port's timeout counts from that moment, so a
port is allowed the same time as when the sides ran one after the other.

``python -m porter.verify.model REQUEST.json`` is the port's side: the side module of its
backend, with that warm-up and wait in front."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import psutil

from porter.verify import backends, tpu_lowerings
from porter.verify.compare import Tolerance, TensorResult, compare_all, first_failure
from porter.verify.process import Side, SideRun, watch


@dataclass(frozen=True)
class Budgets:
    max_compiles: int = 0  # new compilations allowed after the warm-up steps
    max_transfers_per_step: int = 0  # device-to-host transfers allowed in a step
    warmup_steps: int = 2  # step 1 builds the graph, step 2 the one with optimizer state


@dataclass(frozen=True)
class ModelRequest:
    original: Path
    port: Path
    model: str
    inputs: tuple[str, ...] = ()
    steps: int = 5
    optimizer: str = "sgd"
    lr: float = 0.01
    seed: int = 0
    tolerance: Tolerance = Tolerance()
    budgets: Budgets = Budgets()
    timeout: float = 600.0
    memory_mb: float = 8192.0
    # the original's forward, backward and steps once more in float64 (torch originals): a
    # tensor outside the tolerance passes when the port is as near those values as the
    # original is (compare.compare_to_reference)
    reference: bool = False


@dataclass
class SideReport:
    role: str  # original / port
    path: str
    backend: str
    ok: bool
    seconds: float
    cause: str = ""
    error: str = ""
    log: str = ""
    peak_mb: float = 0.0
    notes: list = field(default_factory=list)


@dataclass
class Report:
    kind: str
    passed: bool
    status: str  # passed / diverged / over-budget / side-failed
    summary: str
    original: SideReport
    port: Optional[SideReport]
    tensors: list = field(default_factory=list)
    first_divergence: Optional[dict] = None
    health: Optional[dict] = None
    notes: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)  # script level: per-step losses of both sides
    timings: dict = field(default_factory=dict)  # where the wall time went (seconds)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else (2 if self.status == "side-failed" else 1)


def _start(backend: backends.Backend, request: dict, work: Path, role: str, timeout: float, memory_mb: float,
           wait_for: Optional[Path] = None) -> tuple[Side, Path]:
    req_path = work / f"{role}.request.json"
    request = dict(request, device=backend.device, meta=str(work / f"{role}.meta.json"), out=str(work / f"{role}.npz"))
    if wait_for is not None:  # warm up, then wait for the original: this module's main() in front of the side
        request.update(wait_for=str(wait_for), side_module=backend.module, parent=os.getpid())
        cmd = [backend.python, "-m", "porter.verify.model", str(req_path)]
    else:
        cmd = [backend.python, "-m", backend.module, str(req_path)]
    req_path.write_text(json.dumps(request))
    return (Side(cmd, backend.environment(), work / f"{role}.log", timeout, memory_mb, preload=backend.preload),
            Path(request["meta"]))


def _compare(order: Sequence[str], original: Path, port: Path, tol: Tolerance) -> list[TensorResult]:
    """``compare_all`` in the original's order, the tensors shared out over threads (numpy
    releases the GIL in its loops); each thread reads the two .npz files through its own
    handles."""
    workers = max(1, min(4, os.cpu_count() or 1, len(order)))

    def part(keys: Sequence[str]) -> list[TensorResult]:
        with np.load(original) as a, np.load(port) as b:
            return compare_all(keys, a, b, tol)

    if workers == 1:
        return part(order)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(part, [order[i::workers] for i in range(workers)]))
    by_key = {r.key: r for results in parts for r in results}
    return [by_key[k] for k in order]


def _meta(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:  # a side killed while writing it
        return {}


def _side_report(role: str, path: Path, backend: backends.Backend, run: SideRun, meta: dict) -> SideReport:
    ok = run.ok and meta.get("ok", False)
    error = meta.get("error", "")
    if not ok and not error:
        error = run.cause or (f"exited with status {run.returncode}" if run.returncode else "wrote no result")
    return SideReport(role, str(path), backend.name, ok, round(run.seconds, 3), run.cause, error, run.log,
                      round(run.peak_mb, 1), meta.get("notes", []))


def health_of(steps: Sequence[dict], budgets: Budgets, side_problems: Sequence[str] = ()) -> dict:
    """``side_problems``: what the port's side found itself (the JAX side: a host callback in
    the compiled step, a train step compiled more than once)."""
    # transfers of the fallbacks a TPU does not take are not the port's (porter.verify.tpu_lowerings)
    off_tpu = [s.get("off_tpu_fallbacks", 0) for s in steps]
    steps = [{**s, "transfers": s["transfers"] - n} for s, n in zip(steps, off_tpu)]
    after = steps[budgets.warmup_steps:]
    compiles_after = sum(s["compiles"] for s in after)
    worst_transfers = max((s["transfers"] for s in steps), default=0)
    fallbacks = sorted({op for s in steps for op in s.get("fallbacks", [])})
    problems = []
    if compiles_after > budgets.max_compiles:
        bad = [i + 1 for i, s in enumerate(steps) if i >= budgets.warmup_steps and s["compiles"]]
        problems.append(f"{compiles_after} compilation(s) after the {budgets.warmup_steps} warm-up steps "
                        f"(at step {', '.join(map(str, bad))}; budget {budgets.max_compiles})")
    over = [i + 1 for i, s in enumerate(steps) if s["transfers"] > budgets.max_transfers_per_step]
    if over:
        problems.append(f"device-to-host transfers in step {', '.join(map(str, over))} "
                        f"(up to {worst_transfers} in a step; budget {budgets.max_transfers_per_step})")
    problems += [p for p in side_problems if p not in problems]
    return {
        "steps": list(steps),
        "compiles_total": sum(s["compiles"] for s in steps),
        "compiles_after_warmup": compiles_after,
        "max_transfers_per_step": worst_transfers,
        "fallback_ops": fallbacks,
        "budgets": asdict(budgets),
        "problems": problems,
        "within_budget": not problems,
        "notes": [n for n in [tpu_lowerings.note(off_tpu)] if n],
    }


def verify_model(req: ModelRequest) -> Report:
    orig_backend = backends.original_backend(req.original)
    port_backend = backends.port_backend(req.port)
    settings = {
        "model": req.model, "inputs": list(req.inputs), "steps": req.steps, "optimizer": req.optimizer,
        "lr": req.lr, "seed": req.seed, "tolerance": asdict(req.tolerance), "reference": req.reference,
    }
    base = {"model": req.model, "inputs": list(req.inputs), "steps": req.steps, "optimizer": req.optimizer,
            "lr": req.lr, "seed": req.seed,
            # an original already on torch_xla imports it; the CUDA shim would block that import
            "cuda_shim": "torch_xla" not in backends.imported_modules(req.original.read_text(encoding="utf-8", errors="replace"))}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="porter-verify-") as tmp:
        work = Path(tmp)
        ready = work / "original.ready"
        orig, meta_o_path = _start(orig_backend, dict(base, file=str(req.original.resolve()), reference=req.reference),
                                   work, "original",
                                   req.timeout, req.memory_mb)
        try:
            port, meta_p_path = _start(port_backend, dict(base, file=str(req.port.resolve()), shared=str(work / "original.npz"),
                                                          original=str(req.original.resolve()), cuda_shim=False), work, "port", req.timeout, req.memory_mb, wait_for=ready)
        except BaseException:
            orig.kill("stopped: the port could not be started")
            raise

        def on_end(side: Side) -> None:
            if side is not orig:
                return
            if orig.result().ok and _meta(meta_o_path).get("ok"):
                ready.touch()  # the original's .npz is complete: the port may load it
                port.restart_clock()  # the port's own work starts now
            else:
                port.kill("stopped: the original failed")

        watch([orig, port], on_end)
        run_o, meta_o = orig.result(), _meta(meta_o_path)
        side_o = _side_report("original", req.original, orig_backend, run_o, meta_o)
        if not side_o.ok:
            stopped = ["the port, started alongside the original, was stopped when the original failed"] \
                if port.cause.startswith("stopped") else []
            return Report("model", False, "side-failed", f"the original could not run: {side_o.error}", side_o, None,
                          notes=stopped, settings=settings)
        run_p, meta_p = port.result(), _meta(meta_p_path)
        side_p = _side_report("port", req.port, port_backend, run_p, meta_p)
        notes = list(dict.fromkeys(side_o.notes + side_p.notes))
        if not side_p.ok:
            return Report("model", False, "side-failed", f"the port could not run: {side_p.error}", side_o, side_p, notes=notes, settings=settings)
        if meta_p.get("mismatch"):
            mm = meta_p["mismatch"]
            if "shape" in mm:
                name, (a, b) = next(iter(mm["shape"].items()))
                what = f"weight {name} has shape {tuple(a)} in the original and {tuple(b)} in the port"
            else:
                what = f"the port's state dict differs: missing {mm['missing'][:5]}, unexpected {mm['unexpected'][:5]}"
            first = {"key": f"init/{name}" if "shape" in mm else "init", "where": what}
            return Report("model", False, "diverged", what, side_o, side_p, first_divergence=first, notes=notes, settings=settings)
        t_compare = time.perf_counter()
        # layers the port's backend cannot record (no NNX module stands for that torch module):
        # its side names them in `skipped` and says so in its notes
        skipped = set(meta_p.get("skipped", ()))
        order = [k for k in meta_o["order"] if k not in skipped]
        results = _compare(order, work / "original.npz", work / "port.npz", req.tolerance)
        health = (health_of(meta_p["health"]["steps"], req.budgets, meta_p["health"].get("problems", ()))
                  if meta_p.get("health") else None)
        if health is not None:
            notes.extend(health.pop("notes"))
        timings = {"original_s": round(run_o.seconds, 3), "port_s": round(run_p.seconds, 3),
                   "port_waited_for_original_s": meta_p.get("waited_s"),
                   "original_steps_s": round(meta_o.get("seconds", 0.0), 3),
                   "original_reference_s": meta_o.get("reference_s"),
                   "port_steps_s": round(meta_p.get("seconds", 0.0), 3),
                   "compare_s": round(time.perf_counter() - t_compare, 3)}
    timings["total_s"] = round(time.perf_counter() - t0, 3)
    first = first_failure(results)
    passed = first is None and (health is None or health["within_budget"])
    if first is not None:
        status = "diverged"
        summary = f"diverged first at {first.where}: max abs error {first.max_abs:.3g} (max rel {first.max_rel:.3g})"
    elif health is not None and not health["within_budget"]:
        status = "over-budget"
        summary = "outputs match, but XLA health is over budget: " + "; ".join(health["problems"])
    else:
        status = "passed"
        worst = max((r.max_abs for r in results), default=0.0)
        summary = f"{len(results)} tensors match (worst max abs error {worst:.3g}) over {req.steps} steps"
    return Report("model", passed, status, summary, side_o, side_p,
                  [r.as_dict() for r in results], first.as_dict() | {"where": first.where} if first else None,
                  health, notes, settings, timings=timings)


# --- the port's side: warm up while the original runs, then wait for its .npz ------------


class _WhenReady(os.PathLike):
    """The original's .npz as a path that is only handed out once ``ready`` exists (created by
    the verifying process after the original exited cleanly). Waiting stops if that process
    goes away (the port must never outlive it)."""

    def __init__(self, path: str, ready: str, parent: int) -> None:
        self.path, self.ready = path, ready
        self.waited = 0.0
        try:  # (not getppid(): a warm side's parent is its warm interpreter)
            self.parent: Optional[psutil.Process] = psutil.Process(parent)
        except psutil.Error:
            self.parent = None

    def _parent_alive(self) -> bool:
        """porter verify, by its process id and start time (never a later process given the
        same id), still running."""
        try:
            return (self.parent is not None and self.parent.is_running()
                    and self.parent.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def __fspath__(self) -> str:
        start = time.perf_counter()
        while not os.path.exists(self.ready):
            if not self._parent_alive():
                raise SystemExit("porter verify ended while the port waited for the original")
            time.sleep(0.02)
        self.waited += time.perf_counter() - start
        return self.path

    def __bool__(self) -> bool:
        return True

    def __str__(self) -> str:
        return self.path


def _warm_up(device: str) -> None:
    """What a torch side does first and that needs nothing from the original: import the
    framework and open the device. (A side module with a ``warm_up(request)`` does its own.)"""
    import torch  # noqa: F401

    if device == "xla":
        import torch_xla
        import torch_xla.debug.metrics  # noqa: F401

        torch_xla.device()


def side_main(argv: Sequence[str]) -> int:
    import importlib

    from porter.verify import sideproto

    request = json.loads(Path(argv[0]).read_text())
    shared = _WhenReady(request["shared"], request["wait_for"], request["parent"])

    def run() -> dict:
        side = importlib.import_module(request["side_module"])
        if callable(getattr(side, "warm_up", None)):
            side.warm_up(request)
        else:
            _warm_up(request["device"])
        meta = side.run(dict(request, shared=shared))
        meta["waited_s"] = round(shared.waited, 3)
        return meta

    return sideproto.record(request["meta"], run)


if __name__ == "__main__":
    sys.exit(side_main(sys.argv[1:]))
