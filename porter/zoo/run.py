"""``porter zoo``: port a zoo as a package, then verify its models one by one.

``run_zoo(options)`` finds the models (``porter.zoo.discover``, in the zoo framework's own
interpreter), ports the package (``porter.packages.port_package``), builds one ``ModelJob``
per model (its inputs, the manual findings and porting errors of the modules it uses, its
cache key), reuses the cached results that ``--resume`` allows, runs the rest on the chosen
executor, and caches each result as it arrives.
"""
from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from porter.runner import UsageError
from porter.verify import warm
from porter.zoo.cache import FOLDER, ResultCache
from porter.zoo.executors import run_jobs
from porter.zoo.model import STATUSES, ModelJob, ModelResult, cache_key, port_digest, runner_fingerprint

TARGETS = ("torch-xla", "jax")


class ZooError(RuntimeError):
    """The zoo cannot be run at all (no such package, discovery failed): a usage-level error."""


@dataclass(frozen=True)
class ZooOptions:
    package: str
    target: str
    out: Path
    models: tuple[str, ...] = ()  # MODULE:EXPR
    select: tuple[str, ...] = ()  # globs over model names
    inputs: tuple[str, ...] = ()
    steps: int = 3
    jobs: int = 1
    executor: str = "local"
    resume: bool = False
    timeout: float = 600.0
    memory_mb: float = 8192.0
    atol: Optional[float] = None  # float32's absolute tolerance of the comparison (verify's default 1e-5)
    image_size: Optional[int] = None  # one-image models at the smallest NxN they take (discover.py)

    def settings(self) -> dict:
        """What a cached result depends on besides the code."""
        out = {"target": self.target, "steps": self.steps, "timeout": self.timeout, "memory_mb": self.memory_mb}
        if self.atol is not None:
            out["atol"] = self.atol
        return out


@dataclass
class ZooRun:
    package: str
    target: str
    registry: str
    results: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # modules that did not import at discovery
    seconds: float = 0.0

    def as_dict(self) -> dict:
        from porter.zoo.report import summary

        return {"models": [r.as_dict() for r in sorted(self.results, key=lambda r: r.name)],
                "summary": summary(self)}


# --- finding the models --------------------------------------------------------------------


def _is_mxnet_dir(path: Path) -> bool:
    for f in path.rglob("*.py"):
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "import mxnet" in text or "from mxnet" in text:
            return True
    return False


def zoo_python(package: str) -> str:
    """The interpreter that can import PACKAGE: this one, or the MXNet venv's for a Gluon zoo."""
    from porter.verify import mxnet_env

    path = Path(package)
    if path.is_dir():
        needs_mxnet = _is_mxnet_dir(path)
    else:
        top = package.split(".")[0]
        try:
            needs_mxnet = top == "mxnet" or importlib.util.find_spec(top) is None
        except (ImportError, ValueError):
            needs_mxnet = True
    if not needs_mxnet:
        return sys.executable
    try:
        return mxnet_env.mxnet_python()
    except mxnet_env.MXNetEnvError as exc:
        raise ZooError(f"{package}: not importable here, and the MXNet venv is not there: {exc}") from None


def discover(options: ZooOptions) -> dict:
    python = zoo_python(options.package)
    models = []
    for spec in options.models:
        module, sep, expr = spec.partition(":")
        if not sep or not module.strip() or not expr.strip():
            raise ZooError(f"--model {spec!r}: expected MODULE:EXPR, e.g. torchvision.models:resnet18()")
        models.append({"name": spec, "module": module.strip(), "expr": expr.strip()})
    with tempfile.TemporaryDirectory(prefix="porter-zoo-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "found.json"
        req.write_text(json.dumps({"package": options.package, "models": models, "inputs": list(options.inputs),
                                   "select": list(options.select), "out": str(out),
                                   "image_size": options.image_size}))
        from porter.verify.backends import BACKENDS

        env = BACKENDS["torch"].environment()
        limit = max(600.0, options.timeout)
        try:
            proc = subprocess.run([python, "-m", "porter.zoo.discover", str(req)], env=env, capture_output=True,
                                  text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise ZooError(f"finding the models of {options.package} took more than {limit:.0f} s (the larger of "
                           "600 s and --timeout); --select fewer models, or give --model") from None
        try:
            found = json.loads(out.read_text())
        except (OSError, ValueError):
            raise ZooError(f"finding the models of {options.package} failed: {proc.stderr.strip()[-2000:]}") from None
    if "error" in found:
        raise ZooError(f"finding the models of {options.package} failed: {found['error']}")
    found["python"] = python
    return found


def selected(names: Sequence[str], globs: Sequence[str]) -> list[str]:
    return [n for n in names if not globs or any(fnmatch.fnmatchcase(n, g) for g in globs)]


# --- from the package's port to jobs ----------------------------------------------------------


def _get(obj, name, default=None):
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def finding_dict(finding, module: str) -> dict:
    position = _get(finding, "position")
    line = _get(position, "line") if position is not None else _get(finding, "line", 0)
    severity = _get(finding, "severity", "")
    return {"code": _get(finding, "code", ""), "message": _get(finding, "message", ""), "module": module,
            "line": line or 0, "severity": getattr(severity, "value", severity),
            "manual": _get(finding, "fix") is None}


def blocking(finding: dict) -> bool:
    """A manual finding that stops the port from running correctly (no fix, severity error)."""
    return finding["manual"] and finding["severity"] == "error"


def port_module_name(found: dict, port, module: str) -> str:
    """The port's name of the original's module (they differ for a selection inside a
    framework: ``mxnet.gluon.model_zoo.vision.resnet`` is ported as ``vision.resnet``)."""
    if module in port.modules:
        return module
    package = found["package"]
    if module == package or module.startswith(package + "."):
        for prefix in (port.selected, port.name):
            if prefix and prefix + module[len(package):] in port.modules:
                return prefix + module[len(package):]
    return module


def make_jobs(options: ZooOptions, found: dict, port, names: Sequence[str]) -> list[ModelJob]:
    by_name = {m["name"]: m for m in found["models"]}
    original_root = str(Path(found["path"]).parents[len(found["package"].split(".")) - 1])
    work = options.out / FOLDER / "drivers"
    jobs = []
    fingerprint = runner_fingerprint()
    for name in names:
        m = by_name[name]
        port_module = port_module_name(found, port, m["module"])
        mp = port.modules.get(port_module)
        closure = port.closure(port_module) if mp is not None else []
        blockers, errors = [], []
        for mod in closure:
            p = port.modules[mod]
            if _get(p, "error"):
                errors.append({"module": mod, "error": str(_get(p, "error"))})
            blockers += [f for f in (finding_dict(f, mod) for f in _get(p, "findings", ()) or ()) if blocking(f)]
        if mp is None:
            errors.append({"module": m["module"], "error": "not in the package's port"})
            digest = ""
        else:
            digest = port_digest(port, port_module)
        inputs = tuple(options.inputs) or tuple(m.get("inputs") or ())
        settings = dict(options.settings(), expr=m["expr"], module=m["module"], inputs=list(inputs))
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
        jobs.append(ModelJob(name=name, module=port_module, expr=m["expr"], inputs=inputs, framework=m["framework"],
                             target=options.target, original_root=original_root, port_root=str(port.root),
                             work=str(work / safe), key=cache_key(digest, settings, fingerprint), steps=options.steps,
                             timeout=options.timeout, memory_mb=options.memory_mb, atol=options.atol,
                             blockers=tuple(blockers),
                             port_errors=tuple(errors), build_error=m.get("build_error", ""),
                             original_module=m["module"]))
    return jobs


def port(options: ZooOptions, found: dict):
    try:
        from porter.packages import port_package
    except ModuleNotFoundError:
        raise ZooError("this porter has no package porter (porter.packages)") from None
    try:
        return port_package(Path(found["path"]), options.target, options.out, unsafe=True, jobs=max(1, options.jobs))
    except UsageError as exc:
        raise ZooError(str(exc)) from None


def run_zoo(options: ZooOptions, on_start: Callable[[int], None] = lambda n: None,
            on_result: Callable[[ModelResult], None] = lambda r: None) -> ZooRun:
    if options.target not in TARGETS:
        raise ZooError(f"unknown target {options.target!r} ({', '.join(TARGETS)})")
    t0 = time.perf_counter()
    found = discover(options)
    names = selected([m["name"] for m in found["models"]], options.select)
    if not names:
        raise ZooError(f"no model of {options.package} matches --select {' '.join(options.select)}"
                       if options.select else f"{options.package}: no model found (give --model MODULE:EXPR)")
    package_port = port(options, found)
    jobs = make_jobs(options, found, package_port, names)
    cache = ResultCache(options.out)
    run = ZooRun(found["package"], options.target, found["registry"], skipped=found.get("skipped", []))
    todo = []
    for job in jobs:
        hit = cache.get(job.name, job.key) if options.resume else None
        if hit is not None:
            run.results.append(hit)
        else:
            todo.append(job)
    # the cheapest models first (the registry's cost metadata, where it has some): an
    # interrupted run has verified as many models as it could
    cost = {m["name"]: m.get("cost") for m in found["models"]}
    todo.sort(key=lambda j: (cost.get(j.name) is None, cost.get(j.name) or 0.0))
    on_start(len(jobs))
    for r in run.results:
        on_result(r)
    # the models' sides start warm (porter.verify.warm): torch is imported once per kind of side,
    # not twice per model; not for a Ray cluster elsewhere (its nodes have their own processes)
    local = options.executor == "local" or not os.environ.get("RAY_ADDRESS")
    try:
        with warm.session() if local else contextlib.nullcontext():
            for result in run_jobs(todo, options.jobs, options.executor):
                cache.put(result)
                run.results.append(result)
                on_result(result)
    finally:
        run.seconds = round(time.perf_counter() - t0, 3)
    return run


__all__ = ["STATUSES", "ZooError", "ZooOptions", "ZooRun", "run_zoo"]
