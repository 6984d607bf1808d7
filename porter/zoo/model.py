"""One model of a zoo, verified in isolation: porter verify's model level on two small driver
files, and its report turned into one of the zoo's statuses.

A driver file loads the model's module (from the original package, or from the port of it)
and copies its namespace, so that ``porter verify --model EXPR`` evaluates the zoo's own
expression there; its framework import tells verify which backend runs the side. Relative
imports and package-level state work because the module is imported as part of its package,
not run as a file.

Statuses (``STATUSES``): verified, mismatch, over-budget, port-incomplete (manual findings in
the modules the model uses), port-failed (a module of it could not be ported, or the port does
not run), original-failed, timeout (either side).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from porter.sources import write_atomic

STATUSES = ("verified", "mismatch", "over-budget", "port-incomplete", "port-failed", "original-failed", "timeout")

FRAMEWORK_IMPORTS = {
    "torch": "import torch  # noqa: F401  (porter verify picks the torch side)",
    "mxnet": "import mxnet  # noqa: F401  (porter verify picks the MXNet side)",
    "torch-xla": "import torch_xla  # noqa: F401  (porter verify picks the torch_xla side)",
    "jax": "import jax  # noqa: F401  (porter verify picks the JAX side)\nfrom flax import nnx  # noqa: F401",
}

_DRIVER = '''"""porter zoo: {role} of model {name!r} ({module}:{expr})."""
import importlib as _porter_importlib
import sys as _porter_sys
from pathlib import Path as _PorterPath

{framework}

_porter_sys.path.insert(0, {root!r})
_porter_module = _porter_importlib.import_module({module!r})
if not _PorterPath(_porter_module.__file__).resolve().is_relative_to({root!r}):
    raise ImportError(f"{module} was imported from {{_porter_module.__file__}}, not from {root}: "
                      "a module of that name was loaded before the {role}'s")
globals().update({{k: v for k, v in vars(_porter_module).items() if not (k.startswith("__") and k.endswith("__"))}})
'''


@dataclass(frozen=True)
class ModelJob:
    """Everything one model's run needs (plain data: it crosses to worker processes and Ray)."""

    name: str
    module: str
    expr: str
    inputs: tuple[str, ...]
    framework: str  # the original's: torch / mxnet
    target: str  # torch-xla / jax
    original_root: str  # sys.path entry of the original package
    port_root: str  # sys.path entry of the port
    work: str  # folder for this model's driver files
    key: str  # the cache key
    steps: int = 2
    timeout: float = 600.0
    memory_mb: float = 8192.0
    atol: Optional[float] = None  # absolute tolerance of the comparison (None: verify's default by dtype)
    blockers: tuple[dict, ...] = ()  # manual findings in the model's module closure
    port_errors: tuple[dict, ...] = ()  # modules of the closure that could not be ported
    build_error: str = ""
    original_module: str = ""  # the model's module in the original (``module`` is the port's)


@dataclass
class ModelResult:
    name: str
    module: str
    expr: str
    status: str
    summary: str
    inputs: list = field(default_factory=list)
    key: str = ""
    seconds: float = 0.0
    blockers: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # {"side", "cause", "error"}
    health: Optional[dict] = None
    first_divergence: Optional[dict] = None
    notes: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    cached: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def runner_fingerprint() -> str:
    """sha256 of the code that runs and judges a model (porter.verify, porter.zoo, and the
    helpers they import): a result verified by other code is not reused. The rules are not
    in it: what they wrote is, through the port's digest (``port_digest``)."""
    here = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    files = sorted((here / "verify").rglob("*.py")) + sorted((here / "zoo").rglob("*.py")) + [
        here / name for name in ("__init__.py", "_layout.py", "sources.py", "runner.py")]
    for f in files:
        if "__pycache__" in f.parts or not f.is_file():
            continue
        h.update(str(f.relative_to(here)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def port_digest(port, module: str) -> str:
    """sha256 over what the port wrote for every module of ``module``'s closure (and the
    target): a rule change that leaves a model's modules as they were keeps its result."""
    h = hashlib.sha256(f"{port.target}\0{int(getattr(port, 'unsafe', True))}\0".encode())
    for name in port.closure(module):
        mp = port.modules[name]
        try:
            data = Path(mp.output).read_bytes()
        except OSError:
            data = f"unreadable:{mp.digest}".encode()
        h.update(f"{name}\0{mp.status}\0{mp.digest}\0".encode() + hashlib.sha256(data).digest())
    return h.hexdigest()


def cache_key(digest: str, settings: dict, fingerprint: Optional[str] = None) -> str:
    from porter import __version__

    blob = json.dumps({"digest": digest, "porter": [__version__, fingerprint or runner_fingerprint()],
                       "settings": settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _driver(job: ModelJob, role: str) -> Path:
    root = job.original_root if role == "original" else job.port_root
    module = (job.original_module or job.module) if role == "original" else job.module
    framework = job.framework if role == "original" else job.target
    text = _DRIVER.format(role="the original" if role == "original" else f"the {job.target} port", name=job.name,
                          module=module, expr=job.expr, root=str(Path(root).resolve()),
                          framework=FRAMEWORK_IMPORTS[framework])
    path = Path(job.work) / f"{role}.py"
    write_atomic(path, text.encode())
    return path


def _timed_out(side) -> bool:
    return bool(side) and side.cause.startswith("timed out")


def status_of(report) -> tuple[str, list]:
    """The zoo status of a verify Report, and the errors of the sides that failed."""
    errors = []
    for side in (report.original, report.port):
        if side is not None and not side.ok:
            errors.append({"side": side.role, "cause": side.cause, "error": side.error})
    if report.status == "passed":
        return "verified", errors
    if report.status == "diverged":
        return "mismatch", errors
    if report.status == "over-budget":
        return "over-budget", errors
    if not report.original.ok:
        return ("timeout" if _timed_out(report.original) else "original-failed"), errors
    return ("timeout" if _timed_out(report.port) else "port-failed"), errors


def run_model(job: ModelJob) -> ModelResult:
    """Verify one model; never raises for the model's own failures (they are its status)."""
    from porter.verify.compare import Tolerance
    from porter.verify.model import Budgets, ModelRequest, verify_model

    start = time.perf_counter()
    base = dict(name=job.name, module=job.module, expr=job.expr, inputs=list(job.inputs), key=job.key,
                blockers=[dict(b) for b in job.blockers])
    if job.port_errors:
        first = job.port_errors[0]
        return ModelResult(status="port-failed", summary=f"{first['module']} could not be ported: {first['error']}",
                           errors=[{"side": "port", "cause": "porting", "error": f"{e['module']}: {e['error']}"} for e in job.port_errors],
                           seconds=round(time.perf_counter() - start, 3), **base)
    if job.blockers:
        first = job.blockers[0]
        more = f" (and {len(job.blockers) - 1} more)" if len(job.blockers) > 1 else ""
        return ModelResult(status="port-incomplete",
                           summary=f"needs a human at {first['module']}:{first['line']}: {first['code']} {first['message']}{more}",
                           seconds=round(time.perf_counter() - start, 3), **base)
    if not job.inputs:
        why = job.build_error or "no input shape found (give --input)"
        return ModelResult(status="original-failed", summary=f"the original could not be built or run: {why}",
                           errors=[{"side": "original", "cause": "", "error": why}],
                           seconds=round(time.perf_counter() - start, 3), **base)
    original, port = _driver(job, "original"), _driver(job, "port")
    report = verify_model(ModelRequest(original, port, job.expr, tuple(job.inputs), job.steps, "sgd", 0.01, 0,
                                       Tolerance(atol=job.atol), Budgets(), job.timeout, job.memory_mb, reference=True))
    status, errors = status_of(report)
    return ModelResult(status=status, summary=report.summary, errors=errors, health=report.health,
                       first_divergence=report.first_divergence, notes=list(report.notes), timings=report.timings,
                       seconds=round(time.perf_counter() - start, 3), **base)
