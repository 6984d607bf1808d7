"""How many of torchvision's classification models does the JAX port verify against torch?

torchvision's models import ``..ops.misc``, ``.._utils``, ``._api``, ``..utils`` and
``..transforms._presets``, so the measurement ports a copy of the package's classification
modules together with what they import, as package ``tvport`` in a temporary folder:

- ``models/``: every top-level model file (the detection, segmentation, video, optical flow
  and quantization subpackages are not classification builders) and ``_api``, ``_meta``,
  ``_utils``; ``ops/``: ``misc``, ``stochastic_depth``, ``_utils``; the package's ``_utils``,
  ``utils`` and ``_internally_replaced_utils``. Package ``__init__`` files are empty (the
  originals import every subpackage);
- ``transforms/__init__.py`` re-exports torchvision's own ``functional`` and
  ``InterpolationMode`` (the presets are the host-side input pipeline; they stay torch).

Then ``porter migrate TMP/tvport --to jax --unsafe-fixes --out PORT``, ``porter check PORT
--target jax --format json`` for the findings the port still holds (those without a fix: what a
human must finish), and for every builder of ``torchvision.models.list_models(module=
torchvision.models)``, ``porter verify`` at model level: the original is torchvision's module,
the port the ported module (each through a two-line wrapper file that imports it), ``--model
"<builder>(weights=None)"``, input 2x3xHxW with H, W the weights' ``min_size`` (at least 64: at
32x32 a ResNet's last BatchNorm normalizes 2 x 1 x 1 values per channel, and float32 rounding
alone diverges past the tolerance; the models with a fixed image size get it), ``--steps 2``, ``--reference`` (a tensor outside the float32 tolerance passes when the port is at most
10x as far from a float64 run of the original as the original itself is: float32 rounding, as in
``porter zoo``). Builders run one per model file first, then the rest (a run stopped by ``--deadline`` covers
every family); the JSON is rewritten after every row, and rows not reached say ``not-run``. A row is

- ``verified``: forward, gradients and both steps within tolerance (porter verify exit 0);
- ``mismatch``: both sides ran, a tensor diverged (exit 1);
- ``port-incomplete``: the builder's own file holds findings without a fix; they are listed
  (with ``--verify-all`` verify runs anyway and its result is kept beside them; the findings of
  the package's other files it imports are counted in ``imported_findings``, and verify shows
  whether they matter);
- ``port-failed``: no finding predicted it, the port did not build or run (exit 2; the first
  error line);
- ``timeout``.

Results: benchmarks/results/torchvision_jax.json (rewritten after every row) and the table on
stdout; docs/jax.md has a section with the numbers.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/torchvision_jax.py --jobs 2
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/torchvision_jax.py --only resnet18 --only vgg11   # replaces these rows
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/torchvision_jax.py --select 'swin_*' --image-size 64

A partial run (``--only NAME`` / ``--select GLOB``, repeatable) keeps the other builders' rows of the
JSON, and the rows of the selected builders it did not reach before ``--deadline`` as they were;
only what it measured is replaced. ``--image-size N`` runs the transformers on a smaller image (the
vit builders with ``image_size=N`` rounded up to their patch size, swin at N; the row's ``model``
says which expression ran); maxvit keeps 224 (its 7x7 windows).
    .venv/bin/python benchmarks/torchvision_jax.py --render

This is a measurement, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "torchvision_jax.json"
PORTER = [sys.executable, "-m", "porter"]
# classification model files are the top-level modules of torchvision.models
SUPPORT = {
    "models": ("_api.py", "_meta.py", "_utils.py"),
    "ops": ("misc.py", "stochastic_depth.py", "_utils.py"),
    "": ("_utils.py", "utils.py", "_internally_replaced_utils.py"),
}
BLOCKING = "fixable"  # a finding of the port without a fix: left for a human


def copy_package(tmp: Path) -> Path:
    import torchvision

    src = Path(torchvision.__file__).parent
    pkg = tmp / "tvport"
    for sub in ("", "models", "ops", "transforms"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("", encoding="utf-8")
    for path in sorted((src / "models").glob("*.py")):
        if not path.name.startswith("__") and path.name != "feature_extraction.py":
            shutil.copy(path, pkg / "models" / path.name)
    for sub, names in SUPPORT.items():
        for name in names:
            shutil.copy(src / sub / name, pkg / sub / name)
    (pkg / "transforms" / "__init__.py").write_text(
        "# the presets are the host-side input pipeline: torchvision's own transforms\n"
        "from torchvision.transforms import InterpolationMode, functional  # noqa: F401\n", encoding="utf-8")
    shutil.copy(src / "transforms" / "_presets.py", pkg / "transforms" / "_presets.py")
    # a model file importing the package absolutely (maxvit: `from torchvision.ops.misc import
    # ...`) imports the copy's module (`from ..ops.misc import ...`), as a package imports itself
    for path in sorted((pkg / "models").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        new = re.sub(r"^from torchvision((?:\.\w+)+) import", lambda m: _own(m, pkg), text, flags=re.M)
        if new != text:
            path.write_text(new, encoding="utf-8")
    return pkg


def _own(match: "re.Match", pkg: Path) -> str:
    parts = match.group(1).strip(".").split(".")
    # a module of the copy (its package __init__ files are empty: `from torchvision.ops import
    # StochasticDepth` stays torchvision's, which the JAX rules translate)
    # (relative, as the other model files import it: porter follows a relative import to its file)
    mine = pkg.joinpath(*parts).with_suffix(".py").exists()
    if not mine:
        return match.group(0)
    return f"from .{'.'.join(parts[1:])} import" if parts[0] == "models" else f"from ..{'.'.join(parts)} import"


def builders(image_size: int = 0) -> list[dict]:
    import torchvision

    rows = []
    for name in torchvision.models.list_models(module=torchvision.models):
        fn = torchvision.models.get_model_builder(name)
        module = fn.__module__.rsplit(".", 1)[-1]
        size = 64  # BatchNorm over 2 x 1 x 1 values at the last stage of a 32x32 input is ill-conditioned
        try:
            weights = torchvision.models.get_model_weights(name)
            meta = next(iter(weights)).meta
            size = max(64, *meta.get("min_size", (64, 64)))
        except (KeyError, ValueError, StopIteration):
            pass
        expr = f"{name}(weights=None)"
        if name.startswith(("vit_", "swin_", "maxvit")):
            size = max(size, 224)  # a fixed image size (vit: image_size=224; maxvit's 7x7 windows need 224)
        if image_size and name.startswith("vit_"):
            patch = int(name.rsplit("_", 1)[1])
            size = -(-image_size // patch) * patch
            expr = f"{name}(weights=None, image_size={size})"
        elif image_size and name.startswith("swin_"):
            size = image_size
        rows.append({"builder": name, "module": module, "input": f"float32[2,3,{size},{size}]", "model": expr})
    return rows


def imports_of(path: Path, pkg: Path) -> set[Path]:
    """The package's files a module imports (relative imports), transitively."""
    import ast

    seen: set[Path] = set()
    todo = [path]
    while todo:
        p = todo.pop()
        if p in seen or not p.exists():
            continue
        seen.add(p)
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = p.parent
                for _ in range(node.level - 1):
                    base = base.parent
                parts = (node.module or "").split(".") if node.module else []
                target = base.joinpath(*parts)
                for cand in (target.with_suffix(".py"), target / "__init__.py"):
                    if cand.exists():
                        todo.append(cand)
                if not node.module:
                    todo += [base / f"{a.name}.py" for a in node.names]
    return seen


def classify(row: dict, port: Path, blocking: dict, opts, work: Path) -> dict:
    mod = row["module"]
    own = port / "models" / f"{mod}.py"
    found = blocking.get(str(own), [])
    row["blocking"] = [f"{Path(f['path']).relative_to(port)}:{f['line']}: {f['code']} {f['message'][:160]}" for f in found]
    # the package's other files it imports: their findings are listed, verify decides whether they matter
    row["imported_findings"] = sum(len(blocking.get(str(p), [])) for p in imports_of(own, port) if p != own)
    if found and not opts.verify_all:
        row["status"] = "port-incomplete"
        return row
    original = work / f"orig_{row['builder']}.py"
    ported = work / f"port_{row['builder']}.py"
    # every name of the module (torchvision's modules define __all__); the port's wrapper imports
    # flax so that verify runs it on the JAX side
    # (import_module: `import torchvision.models.alexnet as m` binds the function models/__init__ exports)
    original.write_text(f"import importlib\n_m = importlib.import_module('torchvision.models.{mod}')\n"
                        "globals().update({k: v for k, v in vars(_m).items() if not k.startswith('__')})\n",
                        encoding="utf-8")
    ported.write_text(f"import sys\nimport flax.nnx  # noqa: F401  (a JAX port)\nsys.path.insert(0, {str(port.parent)!r})\n"
                      f"import tvport.models.{mod} as _m\n"
                      "globals().update({k: v for k, v in vars(_m).items() if not k.startswith('__')})\n",
                      encoding="utf-8")
    cmd = [*PORTER, "verify", str(original), str(ported), "--model", row.get("model", f"{row['builder']}(weights=None)"),
           "--input", row["input"], "--steps", str(opts.steps), "--timeout", str(opts.timeout),
           "--reference"]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout * 2 + 120,
                              env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=str(work))
    except subprocess.TimeoutExpired:
        row.update(status="timeout", seconds=round(time.monotonic() - start, 1))
        return row
    row["seconds"] = round(time.monotonic() - start, 1)
    # the report's first lines: the verdict and its one-line reason
    lines = [line.strip() for line in (proc.stdout + "\n" + proc.stderr).splitlines() if line.strip()]
    summary = " / ".join(lines[:2])
    reason = next((line for line in lines if "could not run" in line or "diverged" in line or "Error:" in line), "")
    if reason and reason not in summary:
        summary = f"{summary} / {reason}"
    row["summary"] = str(summary)[:300]
    verdict = {0: "verified", 1: "mismatch"}.get(proc.returncode, "port-failed")
    if "timed out" in row["summary"] or "timeout" in row["summary"].lower():
        verdict = "timeout" if proc.returncode == 2 else verdict
    if found:
        row["verify"] = verdict
        row["status"] = "verified" if verdict == "verified" else "port-incomplete"
    else:
        row["status"] = verdict
    return row


def merged_rows(previous: list[dict], results: dict, done: set) -> list[dict]:
    """The rows of a partial run (--only / --select) merged into the file's: a builder this run
    measured replaces its row, every other row (the builders not selected, and the selected ones
    the run did not reach before --deadline) stays as it was; a builder the file did not have
    is added (not-run when not reached)."""
    rows = [results[r["builder"]] if r["builder"] in done else r for r in previous]
    known = {r["builder"] for r in previous}
    return rows + [r for b, r in results.items() if b not in known]


def render(rows: list[dict]) -> str:
    counts = Counter(r["status"] for r in rows)
    lines = [f"{len(rows)} builders: " + ", ".join(f"{k} {counts[k]}" for k in
                                                    ("verified", "mismatch", "port-incomplete", "port-failed", "timeout", "not-run")), ""]
    lines.append(f"{'builder':28} {'status':16} {'s':>6}  first blocking finding / summary")
    for r in rows:
        detail = (r.get("blocking") or [r.get("summary", "")])[0] if r["status"] != "verified" else r.get("summary", "")
        if r.get("verify") and r["status"] != "verified":
            detail = f"[verify: {r['verify']}: {r.get('summary', '')[:80]}] {detail}"
        lines.append(f"{r['builder']:28} {r['status']:16} {r.get('seconds', ''):>6}  {detail[:150]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds each side may run")
    ap.add_argument("--only", action="append", default=[], help="builder names (repeatable)")
    ap.add_argument("--select", action="append", default=[], help="builder name globs (repeatable), e.g. 'swin_*'")
    ap.add_argument("--image-size", type=int, default=0,
                    help="a smaller image for the transformers: vit_* built with image_size=N (rounded up to a multiple "
                         "of the patch size) and run at it, swin_* run at N (their windows are padded); 0: 224")
    ap.add_argument("--verify-all", action="store_true", help="verify also builders whose port holds findings")
    ap.add_argument("--deadline", type=float, default=0, help="minutes after which no new builder starts (0: none)")
    ap.add_argument("--render", action="store_true", help="print the table from the JSON")
    opts = ap.parse_args(argv)
    if opts.render:
        print(render(json.loads(OUT.read_text(encoding="utf-8"))["rows"]))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="tv_jax_"))
    try:
        pkg = copy_package(tmp / "src")
        port = tmp / "port" / "tvport"
        t0 = time.monotonic()
        mig = subprocess.run([*PORTER, "migrate", str(pkg), "--to", "jax", "--unsafe-fixes", "--out", str(port),
                              "--jobs", str(opts.jobs)], capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
        migrate_s = round(time.monotonic() - t0, 1)
        check = subprocess.run([*PORTER, "check", str(port), "--target", "jax", "--format", "json"],
                               capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
        blocking: dict = {}
        for f in json.loads(check.stdout or "{}").get("findings", []):
            if not f.get("fixable"):
                blocking.setdefault(f["path"], []).append(f)
        partial = bool(opts.only or opts.select)
        rows = [r for r in builders(opts.image_size) if not partial or r["builder"] in opts.only
                or any(fnmatch.fnmatchcase(r["builder"], g) for g in opts.select)]
        firsts = {}
        for r in rows:
            firsts.setdefault(r["module"], r)
        rows = [*firsts.values(), *(r for r in rows if firsts[r["module"]] is not r)]
        work = tmp / "work"
        work.mkdir()
        by_rule = Counter(f["code"] for fs in blocking.values() for f in fs)
        results = {r["builder"]: dict(r, status="not-run") for r in rows}
        done: set = set()  # the builders this run measured
        stop = time.monotonic() + opts.deadline * 60 if opts.deadline else None

        def save():
            data = {"migrate": {"exit": mig.returncode, "seconds": migrate_s, "summary": mig.stdout.strip().splitlines()[-1:]},
                    "blocking_findings_by_rule": dict(sorted(by_rule.items())), "steps": opts.steps,
                    "jobs": opts.jobs, "rows": list(results.values())}
            if partial and OUT.exists():
                data["rows"] = merged_rows(json.loads(OUT.read_text(encoding="utf-8"))["rows"], results, done)
            OUT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

        def one(row):
            if stop is not None and time.monotonic() > stop:
                return
            result = classify(dict(row), port, blocking, opts, work)
            results[row["builder"]] = result
            done.add(row["builder"])
            save()
            print(f"{result['builder']:28} {result['status']:16} {result.get('seconds', '')}", flush=True)

        save()
        with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
            list(pool.map(one, rows))
        save()
        print(render(list(results.values())))
        print("blocking findings by rule:", dict(sorted(by_rule.items())))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
