"""What the per-file budgets cost: `porter check` and `porter migrate` (diff mode) with the
default budgets (each file in a worker process: a fork, the outcome pickled back) next to no
budgets (`--time-limit 0 --memory-limit 0`: in porter's own process), jobs=1, on the same
files in this one run, alternating (--repeat rounds; medians). Also the pre-check
(``engine.text_shape``) against LibCST's parse of the same files.

    .venv/bin/python benchmarks/bench_budgets.py
    .venv/bin/python benchmarks/bench_budgets.py --folder ../shared/corpus/torch --repeat 3 --json benchmarks/results/bench_budgets.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from porter import engine  # noqa: E402
from porter.runner import Settings, run  # noqa: E402
from porter.sources import iter_python_files  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=ROOT.parent / "shared" / "corpus" / "torch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    files, _ = iter_python_files([args.folder])
    budgets, none = Settings(), Settings(time_limit=0, memory_mb=0)
    times: dict[str, list[float]] = {k: [] for k in ("check_budgets", "check_none", "migrate_budgets", "migrate_none")}
    for _ in range(args.repeat):
        for kind in ("check", "migrate"):
            for name, settings in (("budgets", budgets), ("none", none)):
                t = time.perf_counter()
                run(kind, files, settings, mode="diff", jobs=1)
                times[f"{kind}_{name}"].append(time.perf_counter() - t)
    texts = [f.read_text(encoding="utf-8") for f in files]
    t = time.perf_counter()
    for text in texts:
        engine.text_shape(text)
    pre = time.perf_counter() - t
    t = time.perf_counter()
    for text in texts:
        cst.parse_module(text)
    parse = time.perf_counter() - t
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "folder": str(args.folder), "files": len(files), "repeat": args.repeat,
        "seconds_median": {k: round(v, 3) for k, v in med.items()},
        "check_budgets_over_none": round(med["check_budgets"] / med["check_none"], 3),
        "migrate_budgets_over_none": round(med["migrate_budgets"] / med["migrate_none"], 3),
        "precheck_seconds": round(pre, 3), "parse_seconds": round(parse, 3),
        "precheck_over_parse": round(pre / parse, 3),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
