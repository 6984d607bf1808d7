"""How fast is porter on a large body of real code nobody here wrote?

The corpus: the Python sources of the installed ``torch`` package (found with
importlib.util.find_spec, so torch itself is never imported). Measured side by side, in this
one process, over exactly the same files:

  1. bare   LibCST parse + codegen of every file (read, decode, parse_module, .code)
  2. check  porter check (in-process runner, jobs=1)
  3. migrate porter migrate in diff mode (nothing written), jobs=1
  4. migrate --jobs N (default 2) in diff mode

and prints seconds and ratios (check/bare, migrate/bare, jobs1/jobsN); the JSON goes to
benchmarks/results/bench_migrate.json. Targets: migrate <= 2x bare; jobs=2 close to 2x faster.

    .venv/bin/python benchmarks/bench_migrate.py                      # the whole torch tree
    .venv/bin/python benchmarks/bench_migrate.py --subset nn,optim,utils,distributed
    .venv/bin/python benchmarks/bench_migrate.py --limit 200          # the first 200 files
    .venv/bin/python benchmarks/bench_migrate.py --profile migrate --limit 300   # cProfile

With ``--targets``, the targets side by side instead (one process, the same files, jobs=1,
diff mode): the bare parse+codegen floor, then ``porter migrate --to T`` for each target, then
the floor again; each target's wall and CPU seconds as a ratio to the mean of the two floors.
``--corpus`` picks the files: ``torch`` (default, with ``--subset``), ``timm`` / ``torchvision``
(the installed packages), ``corpus-torch`` (``../shared/corpus/torch``); ``--sample N`` takes N
files spread evenly over the sorted list. Targets: torch-xla <= 2x, jax <= 5x the floor.

    .venv/bin/python benchmarks/bench_migrate.py --corpus timm --targets torch-xla,jax --sample 12
    .venv/bin/python benchmarks/bench_migrate.py --corpus torchvision --targets torch-xla,jax --sample 12

This is a measurement, not a test: it asserts nothing and never writes into the corpus.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import pstats
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import libcst as cst

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from porter import registry  # noqa: E402
from porter.runner import Settings, run  # noqa: E402
from porter.sources import iter_python_files  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "bench_migrate.json"


def torch_root() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench_migrate: torch is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def corpus(root: Path, subset: list[str], limit: int | None) -> list[Path]:
    roots = [root / s for s in subset] if subset else [root]
    for r in roots:
        if not r.is_dir():
            sys.exit(f"bench_migrate: {r} is not a folder")
    files, _ = iter_python_files(roots)
    return files[:limit] if limit else files


SHARED_CORPUS = REPO.parent / "shared" / "corpus"


def corpus_root(name: str) -> Path:
    """The folder of a --corpus name."""
    if name == "torch":
        return torch_root()
    if name == "corpus-torch":
        root = SHARED_CORPUS / "torch"
    else:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"bench_migrate: {name} is not installed in this environment")
        root = Path(list(spec.submodule_search_locations)[0])
    if not root.is_dir():
        sys.exit(f"bench_migrate: {root} is not a folder")
    return root


def spread(files: list[Path], n: int | None) -> list[Path]:
    """``n`` files spread evenly over the sorted list (the same ones every run)."""
    files = sorted(files)
    if not n or n >= len(files):
        return files
    step = len(files) / n
    return [files[int(i * step)] for i in range(n)]


def compare_targets(files: list[Path], targets: list[str], name: str, out: Path, host: dict) -> None:
    """The floor, each target's migrate, the floor again: ratios to the floors' mean."""
    for t in targets:
        Settings(target=t).options()  # import every rule before timing
    phases: dict[str, dict] = {}
    t, c, v = timed(bare, files)
    phases["bare_before"] = {"seconds": t, "cpu_seconds": c, **v}
    for target in targets:
        t, c, v = timed(run, "migrate", files, Settings(target=target), mode="diff", jobs=1)
        phases[target] = {"seconds": t, "cpu_seconds": c, **outcome_counts(v)}
        print(f"  migrate --to {target:<10}{t:8.1f} s  (cpu {c:.1f} s)", flush=True)
    t, c, v = timed(bare, files)
    phases["bare_after"] = {"seconds": t, "cpu_seconds": c, **v}
    wall = (phases["bare_before"]["seconds"] + phases["bare_after"]["seconds"]) / 2
    cpu = (phases["bare_before"]["cpu_seconds"] + phases["bare_after"]["cpu_seconds"]) / 2
    ratios = {}
    print(f"\nfloor (bare parse+codegen, mean of before/after): wall {wall:.2f} s, cpu {cpu:.2f} s")
    print(f"{'target':<12}{'wall s':>9}{'x floor':>9}{'cpu s':>9}{'x floor':>9}{'changed':>9}{'failed':>8}")
    for target in targets:
        ph = phases[target]
        ratios[target] = {"wall": ph["seconds"] / wall, "cpu": ph["cpu_seconds"] / cpu}
        print(f"{target:<12}{ph['seconds']:>9.2f}{ratios[target]['wall']:>9.2f}{ph['cpu_seconds']:>9.2f}"
              f"{ratios[target]['cpu']:>9.2f}{ph['changed']:>9}{ph['failed']:>8}")
    end_load = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start {host['load_average_at_start']}, at end {end_load}")
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host,
        "corpus": {"name": name, "files": [str(f) for f in files]},
        "phases": phases,
        "floor": {"seconds": wall, "cpu_seconds": cpu},
        "ratios_to_floor": ratios,
        "load_average_at_end": end_load,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {out}")


def bare(files: list[Path]) -> dict:
    ok = failed = 0
    for f in files:
        try:
            text = f.read_bytes().decode("utf-8")
            cst.parse_module(text).code
            ok += 1
        except Exception:
            failed += 1
    return {"parsed": ok, "failed": failed}


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the --jobs workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *args, **kw):
    gc.collect()
    t0 = time.perf_counter()
    c0 = _cpu()
    value = fn(*args, **kw)
    return time.perf_counter() - t0, _cpu() - c0, value


def _burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def parallel_ceiling(jobs: int, n: int = 6_000_000) -> float:
    """How much faster `jobs` processes finish `jobs` equal pure-Python tasks than one process
    does, right now on this machine: the most --jobs can give while other work shares the
    cores (2.0 on an idle 2-core machine)."""
    import multiprocessing

    t0 = time.perf_counter()
    for _ in range(jobs):
        _burn(n)
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        pool.map(_burn, [n] * jobs)
    return serial / (time.perf_counter() - t0)


def outcome_counts(outcomes) -> dict:
    status = Counter(o.status for o in outcomes)
    findings = Counter(f.code for o in outcomes for f in o.findings)
    errors = Counter(o.error.split(":")[0] for o in outcomes if o.status == "failed")
    return {
        "files": len(outcomes),
        "changed": status.get("changed", 0),
        "unchanged": status.get("unchanged", 0),
        "failed": status.get("failed", 0),
        "findings": sum(findings.values()),
        "findings_by_rule": dict(sorted(findings.items())),
        "errors_by_kind": dict(errors.most_common(10)),
    }


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "libcst": importlib.metadata.version("libcst"),
        "torch_sources": importlib.metadata.version("torch"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subset", default="", help="comma-separated folders under torch/ (default: all of it)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N files (sorted)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes for the parallel run")
    ap.add_argument("--profile", choices=["check", "migrate"], help="cProfile one phase instead of benchmarking")
    ap.add_argument("--out", type=Path, default=None, help="where the JSON goes")
    ap.add_argument("--corpus", default="torch", choices=["torch", "timm", "torchvision", "corpus-torch"],
                    help="which files (torch: the installed torch package)")
    ap.add_argument("--targets", default="", help="comma-separated targets, side by side with the floor")
    ap.add_argument("--sample", type=int, default=None, help="N files spread evenly (with --targets)")
    args = ap.parse_args()

    host = machine()
    if args.targets:
        root = corpus_root(args.corpus)
        subset = [s for s in args.subset.split(",") if s]
        files = spread(corpus(root, subset, None), args.sample)
        n_lines = sum(f.read_bytes().count(b"\n") for f in files)  # also warms the page cache
        print(f"corpus: {len(files)} files, {n_lines} lines under {root}", flush=True)
        out = args.out or RESULTS.with_name(f"bench_migrate_targets_{args.corpus}.json")
        compare_targets(files, [t for t in args.targets.split(",") if t], args.corpus, out, host)
        return
    args.out = args.out or RESULTS
    root = torch_root()
    subset = [s for s in args.subset.split(",") if s]
    files = corpus(root, subset, args.limit)
    settings = Settings()
    settings.options()  # import every rule before timing
    n_bytes = sum(f.stat().st_size for f in files)
    n_lines = sum(f.read_bytes().count(b"\n") for f in files)  # also warms the page cache
    print(f"corpus: {len(files)} files, {n_lines} lines, {n_bytes / 1e6:.1f} MB under {root}"
          f"{' (' + ', '.join(subset) + ')' if subset else ''}; {len(settings.options().rules)} rules",
          flush=True)

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        if args.profile == "check":
            run("check", files, settings, jobs=1)
        else:
            run("migrate", files, settings, mode="diff", jobs=1)
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
        stats.print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        print(buf.getvalue())
        return

    phases = {}
    t, c, v = timed(bare, files)
    phases["bare"] = {"seconds": t, "cpu_seconds": c, **v}
    print(f"  bare parse+codegen   {t:8.1f} s  (cpu {c:.1f} s)", flush=True)
    t, c, v = timed(run, "check", files, settings, jobs=1)
    phases["check"] = {"seconds": t, "cpu_seconds": c, **outcome_counts(v)}
    print(f"  porter check         {t:8.1f} s  (cpu {c:.1f} s)", flush=True)
    t, c, v = timed(run, "migrate", files, settings, mode="diff", jobs=1)
    phases["migrate_jobs1"] = {"seconds": t, "cpu_seconds": c, **outcome_counts(v)}
    print(f"  porter migrate -j1   {t:8.1f} s  (cpu {c:.1f} s)", flush=True)
    ceiling_before = parallel_ceiling(args.jobs)
    t, c, v = timed(run, "migrate", files, settings, mode="diff", jobs=args.jobs)
    ceiling = (ceiling_before + parallel_ceiling(args.jobs)) / 2
    phases[f"migrate_jobs{args.jobs}"] = {"seconds": t, "cpu_seconds": c, **outcome_counts(v)}
    print(f"  porter migrate -j{args.jobs}   {t:8.1f} s  (cpu {c:.1f} s, all processes)", flush=True)

    b = phases["bare"]["seconds"]
    bc = phases["bare"]["cpu_seconds"]
    m1 = phases["migrate_jobs1"]["seconds"]
    mj = phases[f"migrate_jobs{args.jobs}"]["seconds"]
    ratios = {
        "check/bare": phases["check"]["seconds"] / b,
        "migrate/bare": m1 / b,
        f"jobs1/jobs{args.jobs}": m1 / mj,
        f"machine ceiling for {args.jobs} processes": ceiling,
        "cpu check/bare": phases["check"]["cpu_seconds"] / bc,
        "cpu migrate/bare": phases["migrate_jobs1"]["cpu_seconds"] / bc,
    }
    same = phases["migrate_jobs1"]["changed"] == phases[f"migrate_jobs{args.jobs}"]["changed"]
    end_load = [round(x, 2) for x in os.getloadavg()]

    print()
    print(f"{'phase':<18}{'wall s':>9}{'x bare':>8}{'cpu s':>9}{'x bare':>8}")
    for name, ph in phases.items():
        print(f"{name:<18}{ph['seconds']:>9.1f}{ph['seconds'] / b:>8.2f}{ph['cpu_seconds']:>9.1f}{ph['cpu_seconds'] / bc:>8.2f}")
    print()
    for k, v in ratios.items():
        print(f"{k:<22}{v:>8.2f}")
    print(f"\nmigrate: {phases['migrate_jobs1']['changed']} file(s) would change, "
          f"{phases['migrate_jobs1']['failed']} failed, {phases['migrate_jobs1']['findings']} finding(s) left; "
          f"jobs={args.jobs} same result: {same}")
    print(f"targets: migrate/bare <= 2: {ratios['migrate/bare'] <= 2}; "
          f"jobs1/jobs{args.jobs} >= 1.7: {ratios[f'jobs1/jobs{args.jobs}'] >= 1.7}")
    print(f"the machine itself gave {ceiling:.2f}x with {args.jobs} processes of pure Python "
          f"around the --jobs run (2.0 would be idle cores)")
    print(f"load average at start {host['load_average_at_start']}, at end {end_load} "
          f"(on {host['cores']} cores: wall times include waiting for other processes)")

    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host,
        "corpus": {"root": str(root), "subset": subset, "limit": args.limit, "files": len(files),
                   "lines": n_lines, "bytes": n_bytes},
        "rules": [r.code for r in settings.options().rules],
        "phases": phases,
        "ratios": ratios,
        "same_result_across_jobs": same,
        "load_average_at_end": end_load,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
