"""Model-level verification: the same model, weights and inputs on both sides; compare
every layer's output, the gradients, and K training steps; measure the port's XLA health."""
from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from porter.verify import backends
from porter.verify.compare import Tolerance, TensorResult, compare_all, first_failure
from porter.verify.process import SideRun, run_side


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

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else (2 if self.status == "side-failed" else 1)


def _run(backend: backends.Backend, request: dict, work: Path, role: str, timeout: float, memory_mb: float) -> tuple[SideRun, dict]:
    req_path = work / f"{role}.request.json"
    request = dict(request, device=backend.device, meta=str(work / f"{role}.meta.json"), out=str(work / f"{role}.npz"))
    req_path.write_text(json.dumps(request))
    run = run_side([backend.python, "-m", backend.module, str(req_path)], backend.environment(),
                   work / f"{role}.log", timeout, memory_mb)
    meta_path = Path(request["meta"])
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return run, meta


def _side_report(role: str, path: Path, backend: backends.Backend, run: SideRun, meta: dict) -> SideReport:
    ok = run.ok and meta.get("ok", False)
    error = meta.get("error", "")
    if not ok and not error:
        error = run.cause or (f"exited with status {run.returncode}" if run.returncode else "wrote no result")
    return SideReport(role, str(path), backend.name, ok, round(run.seconds, 3), run.cause, error, run.log,
                      round(run.peak_mb, 1), meta.get("notes", []))


def health_of(steps: Sequence[dict], budgets: Budgets) -> dict:
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
    return {
        "steps": list(steps),
        "compiles_total": sum(s["compiles"] for s in steps),
        "compiles_after_warmup": compiles_after,
        "max_transfers_per_step": worst_transfers,
        "fallback_ops": fallbacks,
        "budgets": asdict(budgets),
        "problems": problems,
        "within_budget": not problems,
    }


def verify_model(req: ModelRequest) -> Report:
    orig_backend = backends.original_backend(req.original)
    port_backend = backends.port_backend(req.port)
    settings = {
        "model": req.model, "inputs": list(req.inputs), "steps": req.steps, "optimizer": req.optimizer,
        "lr": req.lr, "seed": req.seed, "tolerance": asdict(req.tolerance),
    }
    base = {"model": req.model, "inputs": list(req.inputs), "steps": req.steps, "optimizer": req.optimizer,
            "lr": req.lr, "seed": req.seed, "cuda_shim": True}
    with tempfile.TemporaryDirectory(prefix="porter-verify-") as tmp:
        work = Path(tmp)
        run_o, meta_o = _run(orig_backend, dict(base, file=str(req.original.resolve())), work, "original", req.timeout, req.memory_mb)
        side_o = _side_report("original", req.original, orig_backend, run_o, meta_o)
        if not side_o.ok:
            return Report("model", False, "side-failed", f"the original could not run: {side_o.error}", side_o, None, settings=settings)
        run_p, meta_p = _run(port_backend, dict(base, file=str(req.port.resolve()), shared=str(work / "original.npz"), cuda_shim=False),
                             work, "port", req.timeout, req.memory_mb)
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
        a = np.load(work / "original.npz")
        b = np.load(work / "port.npz")
        results = compare_all(meta_o["order"], a, b, req.tolerance)
        health = health_of(meta_p["health"]["steps"], req.budgets) if meta_p.get("health") else None
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
                  health, notes, settings)
