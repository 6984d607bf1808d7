"""`porter zoo` over real zoos, and what the zoo costs per model over a plain `porter verify`.

Zoos (slices by name; each slice x target is one `porter zoo` run, its JSON and dashboard in
benchmarks/results/zoo-<slice>-<target>.json / .html):

  cifar        ../shared/corpus/torch/pytorch-cifar/models (no registry: its factories)
  torchvision  torchvision.models, every classification builder (list_models)
  timm         timm: at least 200 names, every family: the names sorted, grouped by the
               prefix before the first digit or '_', and taken round-robin over the groups
  gluon        mxnet.gluon.model_zoo.vision (the MXNet venv)
  gluoncv      gluoncv.model_zoo (the MXNet venv)

`--overhead N` measures, side by side in one run, the first N verified models of the first
slice: `porter zoo --model M --resume` is not used; each model is run as `porter zoo ...
--select NAME` (discovery, the package port reused from its manifest, one verify) and as
`porter verify original.py port.py --model EXPR --input ...` on the same driver files,
alternating, and the ratio of wall times is reported (target <= 1.3).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py --slice cifar --target torch-xla --jobs 1
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py --slice cifar --target torch-xla --overhead 3
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py --slice gluon --target torch-xla --jobs 2 --atol 1e-3 --select resnet18_v1

`--atol` is porter zoo's (the comparison's absolute tolerance; docs/zoo.md says why the Gluon
runs at 224x224 use 1e-3). `--image-size N` is porter zoo's: each image model at the smallest of
N, 2N, ... pixels below its own size that it takes (the torchvision runs of docs/zoo.md: 64).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/zoo.py --slice torchvision --target torch-xla --jobs 1 --image-size 64

Writes the tables of docs/zoo.md's "Results" section to stdout (counts per status, top
blockers). A measurement, not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("PORTER_ZOO_RESULTS", REPO / "benchmarks" / "results"))
CORPUS = REPO.parent / "shared" / "corpus"
# the ports and per-model caches (large; --resume reuses them)
WORK = Path(os.environ.get("PORTER_ZOO_WORK", Path(tempfile.gettempdir()) / "porter-zoo-bench"))
STATUSES = ("verified", "mismatch", "over-budget", "port-incomplete", "port-failed", "original-failed", "timeout")


def timm_sample(n: int = 200) -> list[str]:
    import timm

    groups: dict[str, list[str]] = {}
    for name in sorted(timm.list_models()):
        groups.setdefault(re.split(r"[\d_]", name, maxsplit=1)[0] or name, []).append(name)
    out, i = [], 0
    while len(out) < n and any(i < len(v) for v in groups.values()):
        out += [v[i] for v in groups.values() if i < len(v)]
        i += 1
    return sorted(out[: max(n, len(groups))])


def slices() -> dict[str, tuple[str, list[str]]]:
    return {
        "cifar": (str(CORPUS / "torch" / "pytorch-cifar" / "models"), []),
        "torchvision": ("torchvision.models", []),
        "timm": ("timm", ["__timm__"]),
        "gluon": ("mxnet.gluon.model_zoo.vision", []),
        "gluoncv": ("gluoncv.model_zoo", []),
    }


def zoo_cmd(package: str, target: str, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "porter", "zoo", package, "--to", target, "--out", str(out), "--format", "json", *extra]


def run_slice(name: str, target: str, jobs: int, timeout: float, select: list[str], limit: int,
              atol: float | None = None, image_size: int | None = None) -> dict:
    package, sel = slices()[name]
    if sel == ["__timm__"]:
        sel = timm_sample()
    sel = (sel + select)[: limit or None] if (sel or select) else []
    out = WORK / f"{name}-{target}"
    extra = ["--jobs", str(jobs), "--timeout", str(timeout), "--resume",
             "--report", str(RESULTS / f"zoo-{name}-{target}.html")]
    if atol is not None:
        extra += ["--atol", str(atol)]
    if image_size:
        extra += ["--image-size", str(image_size)]
    for s in sel:
        extra += ["--select", s]
    env = dict(os.environ, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
    t0 = time.perf_counter()
    proc = subprocess.run(zoo_cmd(package, target, out, extra), capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        return {"slice": name, "target": target, "error": proc.stderr.strip()[-2000:], "wall_s": round(wall, 1)}
    data = json.loads(proc.stdout)
    data["slice"], data["target"], data["wall_s"] = name, target, round(wall, 1)
    (RESULTS / f"zoo-{name}-{target}.json").write_text(json.dumps(data, indent=1))
    return data


def overhead(name: str, target: str, n: int, timeout: float) -> dict:
    """Per model: `porter zoo --select NAME` vs `porter verify` on the zoo's own driver files."""
    package, _ = slices()[name]
    out = WORK / f"{name}-{target}"
    first = json.loads((RESULTS / f"zoo-{name}-{target}.json").read_text())
    models = [m for m in first["models"] if m["status"] == "verified"][:n]
    env = dict(os.environ, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
    rows = []
    for m in models:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in m["name"])[:80]
        drivers = out / ".porter-zoo" / "drivers" / safe
        verify = [sys.executable, "-m", "porter", "verify", str(drivers / "original.py"), str(drivers / "port.py"),
                  "--model", m["expr"], "--steps", "3", "--timeout", str(timeout), "--format", "json"]
        for spec in m["inputs"]:
            verify += ["--input", spec]
        zoo = zoo_cmd(package, target, out, ["--select", m["name"], "--timeout", str(timeout)])
        times = {"zoo": [], "verify": []}
        for _ in range(2):  # alternating, twice
            for kind, cmd in (("verify", verify), ("zoo", zoo)):
                t0 = time.perf_counter()
                subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
                times[kind].append(time.perf_counter() - t0)
        z, v = statistics.median(times["zoo"]), statistics.median(times["verify"])
        rows.append({"model": m["name"], "zoo_s": round(z, 2), "verify_s": round(v, 2), "ratio": round(z / v, 3)})
    return {"slice": name, "target": target, "rows": rows,
            "median_ratio": round(statistics.median([r["ratio"] for r in rows]), 3) if rows else None}


def table(results: list[dict]) -> str:
    lines = ["| zoo | target | models | " + " | ".join(STATUSES) + " | wall s |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in STATUSES) + " | ---: |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['slice']} | {r['target']} | error: {r['error'][:120]} |")
            continue
        c = r["summary"]["counts"]
        lines.append(f"| {r['slice']} | {r['target']} | {r['summary']['total']} | " + " | ".join(str(c[s]) for s in STATUSES)
                     + f" | {r['wall_s']:.0f} |")
    for r in results:
        if "error" in r:
            continue
        lines += ["", f"Top blockers, {r['slice']} --to {r['target']}:", "", "| models | kind | what |", "| ---: | --- | --- |"]
        lines += [f"| {b['models']} | {b['kind']} | `{b['what'][:150].replace('|', '/')}` |" for b in r["summary"]["top_blockers"][:8]]
    return "\n".join(lines)


def collect(name: str, target: str, since: float, names: list[str], wall: float) -> dict:
    """The slice's JSON and dashboard from the results its (interrupted) run cached, for the
    results written after ``since`` (epoch seconds; older files are another code's); the
    models of ``names`` with no such result are listed under ``not_run``."""
    from porter.zoo.model import ModelResult
    from porter.zoo.report import as_html
    from porter.zoo.run import ZooRun

    package, _ = slices()[name]
    folder = WORK / f"{name}-{target}" / ".porter-zoo" / "results"
    run = ZooRun(package, target, "cached results of an interrupted run")
    for f in sorted(folder.glob("*.json")):
        if f.stat().st_mtime >= since:
            run.results.append(ModelResult(**json.loads(f.read_text())["result"]))
    done = {r.name for r in run.results}
    run.seconds = wall
    data = run.as_dict()
    data["not_run"] = [n for n in names if n not in done]
    data["slice"], data["target"], data["wall_s"] = name, target, round(wall, 1)
    (RESULTS / f"zoo-{name}-{target}.json").write_text(json.dumps(data, indent=1))
    (RESULTS / f"zoo-{name}-{target}.html").write_text(as_html(run))
    return data


def per_model(r: dict) -> str:
    """One row per model: status and where its time went (seconds; `porter verify`'s timings)."""
    lines = [f"Per model, {r['slice']} --to {r['target']} (seconds):", "",
             "| model | input | status | total | original | of it float64 ref | port | of it steps | compare |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in sorted(r["models"], key=lambda m: m["seconds"]):
        t = m.get("timings") or {}
        cells = [t.get(k) for k in ("original_s", "original_reference_s", "port_s", "port_steps_s", "compare_s")]
        lines.append(f"| {m['name']} | {' '.join(m['inputs'])} | {m['status']} | {m['seconds']:.0f} | "
                     + " | ".join("" if c is None else f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice", action="append", choices=sorted(slices()), help="zoo slice (repeatable; default all)")
    ap.add_argument("--target", action="append", choices=("torch-xla", "jax"), help="default: both")
    ap.add_argument("--select", action="append", default=[], help="only these model names (globs)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many --select names")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--overhead", type=int, default=0, help="measure the zoo's overhead on N verified models")
    ap.add_argument("--collect-since", type=float, default=0.0,
                    help="do not run: write the slice's JSON/dashboard from the results cached since this epoch time")
    ap.add_argument("--wall", type=float, default=0.0, help="with --collect-since: the interrupted run's wall time")
    ap.add_argument("--names", default="", help="with --collect-since: a file of the slice's model names, one a line")
    ap.add_argument("--atol", type=float, default=None, help="absolute tolerance of the comparison (porter zoo --atol)")
    ap.add_argument("--image-size", type=int, default=None,
                    help="porter zoo --image-size: image models at the smallest N, 2N, ... pixels they take")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = []
    if args.collect_since:
        names = Path(args.names).read_text().split() if args.names else []
        results = [collect(n, t, args.collect_since, names, args.wall) for n in args.slice for t in args.target]
        print(table(results))
        for r in results:
            print("\n" + per_model(r))
        return 0
    for name in args.slice or sorted(slices()):
        for target in args.target or ("torch-xla", "jax"):
            r = run_slice(name, target, args.jobs, args.timeout, args.select, args.limit, args.atol, args.image_size)
            results.append(r)
            print(f"{name} {target}: {r.get('summary', {}).get('counts', r.get('error'))} ({r['wall_s']} s)", file=sys.stderr)
    print(table(results))
    for r in results:
        if "models" in r:
            print("\n" + per_model(r))
    if args.overhead:
        o = overhead(results[0]["slice"], results[0]["target"], args.overhead, args.timeout)
        (RESULTS / "zoo-overhead.json").write_text(json.dumps(o, indent=1))
        print("\n| model | porter zoo s | porter verify s | ratio |\n| --- | ---: | ---: | ---: |")
        for r in o["rows"]:
            print(f"| {r['model']} | {r['zoo_s']} | {r['verify_s']} | {r['ratio']} |")
        print(f"\nmedian ratio {o['median_ratio']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
