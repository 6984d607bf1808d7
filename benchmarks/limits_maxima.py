"""The deepest bracket nesting and the longest operator chain in real code, for the limits of
``porter.engine.precheck`` (MAX_NESTING, MAX_CHAIN): the limits must stay far above these.

Reads every .py file of the installed torch, torchvision and timm packages and of
../shared/corpus (when present), measures each with ``engine.text_shape`` and prints the
maxima with the file and line they are in, the number of files, and the pre-check's total
time next to LibCST's parse of the same files (a sample: --parse-sample files, the largest).

    .venv/bin/python benchmarks/limits_maxima.py
    .venv/bin/python benchmarks/limits_maxima.py --json benchmarks/results/limits_maxima.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import libcst as cst

from porter import engine

ROOT = Path(__file__).resolve().parent.parent


def roots() -> list[Path]:
    found = []
    for name in ("torch", "torchvision", "timm"):
        spec = importlib.util.find_spec(name)
        if spec and spec.submodule_search_locations:
            found.append(Path(list(spec.submodule_search_locations)[0]))
    corpus = ROOT.parent / "shared" / "corpus"
    if corpus.is_dir():
        found.append(corpus)
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--parse-sample", type=int, default=40)
    args = ap.parse_args(argv)
    files = sorted(p for r in roots() for p in r.rglob("*.py") if p.is_file())
    best = {"nesting": (0, "", 0), "chain": (0, "", 0)}
    pre_time = 0.0
    sizes = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        t = time.perf_counter()
        shape = engine.text_shape(text)
        pre_time += time.perf_counter() - t
        sizes.append((len(text), p, text))
        if shape.nesting > best["nesting"][0]:
            best["nesting"] = (shape.nesting, str(p), shape.nesting_line)
        if shape.chain > best["chain"][0]:
            best["chain"] = (shape.chain, str(p), shape.chain_line)
    sizes.sort(key=lambda x: -x[0])
    sample = sizes[: args.parse_sample]
    t_pre = t_parse = 0.0
    for _, _, text in sample:
        t = time.perf_counter()
        engine.text_shape(text)
        t_pre += time.perf_counter() - t
        t = time.perf_counter()
        try:
            cst.parse_module(text)
        except Exception:
            pass
        t_parse += time.perf_counter() - t
    result = {
        "files": len(sizes),
        "roots": [str(r) for r in roots()],
        "max_nesting": {"value": best["nesting"][0], "file": best["nesting"][1], "line": best["nesting"][2]},
        "max_chain": {"value": best["chain"][0], "file": best["chain"][1], "line": best["chain"][2]},
        "limits": {"MAX_NESTING": engine.MAX_NESTING, "MAX_CHAIN": engine.MAX_CHAIN},
        "precheck_seconds_all_files": round(pre_time, 2),
        "largest_files_sample": len(sample),
        "precheck_seconds_sample": round(t_pre, 3),
        "libcst_parse_seconds_sample": round(t_parse, 3),
        "precheck_over_parse": round(t_pre / t_parse, 3) if t_parse else None,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    ok = best["nesting"][0] <= engine.MAX_NESTING and best["chain"][0] <= engine.MAX_CHAIN
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
