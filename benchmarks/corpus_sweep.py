"""porter migrate over real third-party code, every target and fix mode: does it ever crash?

For each corpus x target x mode (safe / ``--unsafe-fixes``) this runs the real runner
(``porter.runner.run("migrate", ..., mode="out")``, exactly what ``porter migrate FILES --to T
--out DIR`` does, in this process) over the corpus's files into a temporary folder, then
checks every file:

- internal errors: a file the runner failed with "internal error at ...: <exception>" (an
  exception inside a rule or the engine) -- porter's bug, always;
- unparsable outputs: a file refused because the fixes produced code that LibCST does not
  parse or CPython does not compile ("produced code that does not parse", "does not
  compile"), plus any written output that CPython cannot compile (never expected: the
  runner re-parses before writing);
- non-convergent: fixes that did not settle within the engine's passes;
- non-idempotent: the output, migrated again with the same settings, changes;
- changed untouched: a file with no fix applied whose output is not byte-identical;
- refusals: other failures, each with its message (input LibCST cannot read back byte for
  byte, syntax errors of the input...): a clear per-file message, not a bug;

and the time of the migrate as a ratio to a bare LibCST parse + codegen of the same files
(read, decode, ``parse_module``, ``.code``), measured in the same run just before and just
after the migrate (the mean of the two), in wall and CPU seconds of this process (jobs=1; with
``--jobs N`` the migrate's CPU seconds include its finished workers).

Corpora (each skipped, with a note, when absent):

=================  =========================================================================
torch-sample       torch's own sources: ``torch/nn``, ``torch/optim``, ``torch/utils/data``
torchvision        the installed torchvision package, whole
timm               the installed timm package (1.0.31), whole
gluon-model-zoo    ``mxnet/gluon/model_zoo`` in the MXNet venv (porter.verify.mxnet_env)
corpus-torch       ``../shared/corpus/torch`` (nanoGPT, pytorch-tutorial, pytorch-cifar, timm scripts)
corpus-gluon       ``../shared/corpus/gluon`` (gluon-cv scripts and GluonCV's model zoo)
=================  =========================================================================

Targets: ``torch-xla`` and ``jax`` for every corpus (MXNet code goes through the Gluon front
end by itself), and ``torch`` for the Gluon corpora.

    .venv/bin/python benchmarks/corpus_sweep.py                                   # everything
    .venv/bin/python benchmarks/corpus_sweep.py --limit 10                        # 10 files per corpus
    .venv/bin/python benchmarks/corpus_sweep.py --corpora timm --targets jax --modes safe
    .venv/bin/python benchmarks/corpus_sweep.py --profile --corpora timm --targets jax --limit 60

``--limit N`` takes N files spread evenly over the sorted file list (always the same ones).
The table goes to stdout, the JSON to benchmarks/results/corpus_sweep.json (``--out``), rewritten
after every row (``"complete": false`` until the last one), so a run stopped early keeps the rows it
finished. ``--corpora`` also sets the order the corpora are swept in.
A measurement, not a test (tests/test_corpus_sweep.py runs its checks on a small sample).
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
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import libcst as cst

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from porter.runner import FileOutcome, Settings, run  # noqa: E402
from porter.sources import iter_python_files  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "corpus_sweep.json"
SHARED_CORPUS = REPO.parent / "shared" / "corpus"
TORCH_SAMPLE = ("nn", "optim", "utils/data")
MODES = ("safe", "unsafe")


@dataclass
class Corpus:
    name: str
    roots: list[Path]
    gluon: bool
    note: str = ""
    files: list[Path] = field(default_factory=list)

    @property
    def targets(self) -> tuple[str, ...]:
        return ("torch-xla", "jax", "torch") if self.gluon else ("torch-xla", "jax")


def _package_dir(name: str) -> Optional[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _mxnet_dir() -> tuple[Optional[Path], str]:
    from porter.verify.mxnet_env import MXNetEnvError, mxnet_python

    try:
        python = mxnet_python()
    except MXNetEnvError as exc:
        return None, str(exc)
    # the MXNet venv's site-packages, without importing mxnet (slow, and not needed)
    out = subprocess.run(
        [python, "-c", "import importlib.util as u; s = u.find_spec('mxnet'); "
         "print(s.submodule_search_locations[0] if s else '')"],
        capture_output=True, text=True, timeout=120,
    )
    path = out.stdout.strip()
    if out.returncode != 0 or not path:
        return None, f"mxnet is not installed in {python}"
    return Path(path), ""


def corpora() -> list[Corpus]:
    """Every corpus this machine has; absent ones carry a note and no roots."""
    found: list[Corpus] = []
    torch = _package_dir("torch")
    found.append(Corpus("torch-sample", [torch / s for s in TORCH_SAMPLE] if torch else [], False,
                        "" if torch else "torch is not installed"))
    for pkg in ("torchvision", "timm"):
        d = _package_dir(pkg)
        found.append(Corpus(pkg, [d] if d else [], False, "" if d else f"{pkg} is not installed"))
    mx, why = _mxnet_dir()
    zoo = mx / "gluon" / "model_zoo" if mx else None
    found.append(Corpus("gluon-model-zoo", [zoo] if zoo and zoo.is_dir() else [], True, why))
    for kind in ("torch", "gluon"):
        d = SHARED_CORPUS / kind
        found.append(Corpus(f"corpus-{kind}", [d] if d.is_dir() else [], kind == "gluon",
                            "" if d.is_dir() else f"{d} is absent"))
    return found


def sample(files: list[Path], limit: Optional[int]) -> list[Path]:
    """``limit`` files spread evenly over the sorted list (the same ones every run)."""
    files = sorted(files)
    if not limit or limit >= len(files):
        return files
    step = len(files) / limit
    return [files[int(i * step)] for i in range(limit)]


def load(corpus: Corpus, limit: Optional[int]) -> Corpus:
    if corpus.roots:
        files, _ = iter_python_files([r for r in corpus.roots if r.is_dir()])
        corpus.files = sample(files, limit)
    return corpus


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------
def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *args, **kw):
    gc.collect()
    t0, c0 = time.perf_counter(), _cpu()
    value = fn(*args, **kw)
    return time.perf_counter() - t0, _cpu() - c0, value


def bare(files: list[Path]) -> int:
    """LibCST parse + codegen of every file; how many parsed."""
    ok = 0
    for f in files:
        try:
            cst.parse_module(f.read_bytes().decode("utf-8")).code
            ok += 1
        except Exception:
            pass
    return ok


# --------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------
UNPARSABLE = ("produced code that does not parse", "converted code does not compile")


def classify(outcome: FileOutcome) -> str:
    """failed outcome -> internal | unparsable | nonconvergent | refusal."""
    err = outcome.error
    if err.startswith("internal error at "):
        return "internal"
    if any(s in err for s in UNPARSABLE):
        return "unparsable"
    if "did not converge" in err:
        return "nonconvergent"
    return "refusal"


def _compiles(path: Path) -> bool:
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True, flags=0x400)  # PyCF_ONLY_AST
        return True
    except (SyntaxError, ValueError):
        return False
    except RecursionError:
        return True  # CPython's own limit, not a porter output problem


def sweep_one(files: list[Path], target: str, mode: str, jobs: int = 1,
              on_file=None) -> dict:
    """Migrate ``files`` with ``target``/``mode`` into a temporary --out tree, migrate the
    output again, and count every check. Returns the counts and the problem files."""
    settings = Settings(target=target, unsafe_fixes=(mode == "unsafe"))
    settings.options()
    with tempfile.TemporaryDirectory(prefix="porter-sweep-") as tmp:
        out = Path(tmp) / "out"
        wall, cpu, outcomes = timed(run, "migrate", files, settings, mode="out", out_dir=out,
                                    jobs=jobs, on_file=on_file)
        py = [o for o in outcomes if o.status != "copied"]
        problems: dict[str, list[str]] = {k: [] for k in (
            "internal", "unparsable", "nonconvergent", "refusal", "nonidempotent", "changed_untouched")}
        written: list[Path] = []
        for o in py:
            if o.status == "failed":
                problems[classify(o)].append(f"{o.path}: {o.error}")
                continue
            outp = Path(o.out)
            if o.status == "unchanged":
                if outp.read_bytes() != Path(o.path).read_bytes():
                    problems["changed_untouched"].append(f"{o.path}: unchanged, but its output differs")
            elif not o.fixed:
                problems["changed_untouched"].append(f"{o.path}: changed with no fix applied")
            if o.status == "changed":
                written.append(outp)
                if not _compiles(outp) and _compiles(Path(o.path)):
                    problems["unparsable"].append(f"{o.path}: the written output does not compile")
        again = run("migrate", written, settings, mode="diff", jobs=jobs) if written else []
        for o in again:
            if o.status == "changed":
                rules = ", ".join(code for code, _ in o.fixed) or "?"
                problems["nonidempotent"].append(f"{o.path}: a second run changes it (rules {rules})")
            elif o.status == "failed":
                problems["nonidempotent"].append(f"{o.path}: a second run fails: {o.error}")
    status = Counter(o.status for o in py)
    return {
        "files": len(py),
        "changed": status.get("changed", 0),
        "unchanged": status.get("unchanged", 0),
        "failed": status.get("failed", 0),
        "fixes": sum(n for o in py for _, n in o.fixed),
        "findings_left": sum(len(o.findings) for o in py),
        "seconds": wall,
        "cpu_seconds": cpu,
        **{k: len(v) for k, v in problems.items()},
        "problems": {k: v for k, v in problems.items() if v},
    }


COUNTS = ("internal", "unparsable", "nonconvergent", "nonidempotent", "changed_untouched", "refusal")


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------
def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("libcst", "torch", "torchvision", "timm"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()], **versions}


def table(rows: list[dict]) -> str:
    head = ("corpus", "target", "mode", "files", "changed", "internal", "unparsable",
            "nonconv", "non-idem", "untouched chg", "refusals", "x bare", "x bare cpu")
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + " |"]
    for r in rows:
        lines.append("| " + " | ".join([
            r["corpus"], r["target"], r["mode"], str(r["files"]), str(r["changed"]),
            str(r["internal"]), str(r["unparsable"]), str(r["nonconvergent"]), str(r["nonidempotent"]),
            str(r["changed_untouched"]), str(r["refusal"]),
            f"{r['x_bare']:.2f}", f"{r['x_bare_cpu']:.2f}",
        ]) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", default="", help="comma-separated corpus names (default: all present)")
    ap.add_argument("--targets", default="", help="comma-separated targets (default: each corpus's targets)")
    ap.add_argument("--modes", default="safe,unsafe", help="safe, unsafe or both (default)")
    ap.add_argument("--limit", type=int, default=None, help="N files per corpus, spread evenly")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes for the migrate (default 1)")
    ap.add_argument("--profile", action="store_true", help="cProfile the migrates instead of the checks")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    ap.add_argument("--show", type=int, default=5, help="problem files printed per row")
    args = ap.parse_args(argv)

    wanted = [c for c in args.corpora.split(",") if c]
    targets = [t for t in args.targets.split(",") if t]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    all_corpora = corpora()
    names = {c.name for c in all_corpora}
    for w in wanted:
        if w not in names:
            ap.error(f"unknown corpus {w!r}; choose from {', '.join(sorted(names))}")
    by_name = {c.name: c for c in all_corpora}
    chosen = [load(by_name[w], args.limit) for w in dict.fromkeys(wanted)] if wanted else [load(c, args.limit) for c in all_corpora]
    host = machine()

    if args.profile:
        prof = cProfile.Profile()
        for c in chosen:
            for t in c.targets:
                if targets and t not in targets:
                    continue
                for m in modes:
                    settings = Settings(target=t, unsafe_fixes=(m == "unsafe"))
                    settings.options()
                    prof.enable()
                    run("migrate", c.files, settings, mode="diff", jobs=1)
                    prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
        stats.print_stats(60)
        stats.sort_stats("tottime").print_stats(40)
        print(buf.getvalue())
        return 0

    rows: list[dict] = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def write(complete: bool) -> None:
        """The JSON of the rows so far (after each row, so that a run stopped early keeps them)."""
        totals = {k: sum(r[k] for r in rows) for k in COUNTS}
        doc = {
            "command": " ".join([Path(sys.executable).name, "benchmarks/corpus_sweep.py", *(argv if argv is not None else sys.argv[1:])]),
            "when": started,
            "complete": complete,
            "machine": host,
            "jobs": args.jobs,
            "limit": args.limit,
            "corpora": {c.name: {"roots": [str(r) for r in c.roots], "files": len(c.files), "note": c.note} for c in chosen},
            "rows": rows,
            "totals": totals,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, args.out)

    for c in chosen:
        if not c.files:
            print(f"{c.name}: skipped ({c.note or 'no Python files'})", flush=True)
            continue
        lines = sum(f.read_bytes().count(b"\n") for f in c.files)  # also warms the page cache
        print(f"{c.name}: {len(c.files)} files, {lines} lines under {', '.join(map(str, c.roots))}", flush=True)
        for t in c.targets:
            if targets and t not in targets:
                continue
            for m in modes:
                bw0, bc0, parsed = timed(bare, c.files)
                res = sweep_one(c.files, t, m, jobs=args.jobs)
                bw1, bc1, _ = timed(bare, c.files)
                bw, bc = (bw0 + bw1) / 2, (bc0 + bc1) / 2
                row = {"corpus": c.name, "target": t, "mode": m, "lines": lines,
                       "bare_seconds": bw, "bare_cpu_seconds": bc, "bare_parsed": parsed, **res,
                       "x_bare": res["seconds"] / bw if bw else 0.0,
                       "x_bare_cpu": res["cpu_seconds"] / bc if bc else 0.0}
                rows.append(row)
                write(complete=False)
                print(f"  {t:<9} {m:<6} {res['seconds']:7.1f} s = {row['x_bare']:5.2f}x bare "
                      f"({bw:.1f} s; cpu {row['x_bare_cpu']:.2f}x)  "
                      + "  ".join(f"{k}={res[k]}" for k in COUNTS), flush=True)
                for kind, items in res["problems"].items():
                    if kind == "refusal":
                        continue
                    for item in items[: args.show]:
                        print(f"      {kind}: {item}", flush=True)

    print()
    print(table(rows))
    totals = {k: sum(r[k] for r in rows) for k in COUNTS}
    print("\ntotals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    write(complete=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
