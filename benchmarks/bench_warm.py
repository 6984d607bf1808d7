"""What do warm sides (PORTER_WARM_SIDES, porter.verify.warm) save on `porter verify`?

Each case is one `porter verify` command, run alternately with fresh sides
(PORTER_WARM_SIDES="") and with warm ones (a folder whose warm interpreters were started by
two runs before the measured ones), several repetitions; wall time of the command. Printed: the
median per mode and the ratio warm/fresh per case; the reports of both modes must agree
(status, and the compared losses at script level), or the case says so.

  script-xla    `porter verify --script` of fixtures/torch_xla/mnist_cnn (original vs its port,
                12 steps): a torch side and a torch_xla side
  model-xla     `porter verify --model Net()` of the same files (3 steps)
  script-jax    `porter verify --script` of fixtures/jax/mlp (original vs its Flax port)

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/bench_warm.py              # 3 repetitions
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/bench_warm.py --repeat 5 --only script-xla

The JSON goes to benchmarks/results/bench_warm.json. A measurement, not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "bench_warm.json"
XLA = REPO / "fixtures" / "torch_xla" / "mnist_cnn"
JAX = REPO / "fixtures" / "jax" / "mlp"


def cases() -> dict[str, list[str]]:
    xla_args = ["--epochs", "1", "--dropout", "0"]
    jax_run = _toml(JAX / "port.toml").get("run", [])
    return {
        "script-xla": ["verify", str(XLA / "train.py"), str(XLA / "expected.py"), "--script", "--steps", "12",
                       "--", *xla_args],
        "model-xla": ["verify", str(XLA / "train.py"), str(XLA / "expected.py"), "--model", "Net()",
                      "--input", "float32[4,1,28,28]", "--steps", "3"],
        "script-jax": ["verify", str(JAX / "train.py"), str(JAX / "expected.py"), "--script", "--steps", "6",
                       "--", *jax_run],
    }


def _toml(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def run(args: list[str], warm_dir: str) -> tuple[float, dict]:
    env = dict(os.environ, PORTER_WARM_SIDES=warm_dir, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "porter", args[0], "--format", "json", *args[1:]], env=env,
                          capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - t0
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {"status": f"no report (exit {proc.returncode}): {proc.stderr[-300:]}"}
    return seconds, report


def _same(a: dict, b: dict) -> bool:
    def losses(r: dict) -> list:
        return [(s.get("original"), s.get("port")) for s in r.get("steps", [])]

    return a.get("status") == b.get("status") and losses(a) == losses(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as folder:
        os.environ["PORTER_WARM_OWNER"] = str(os.getpid())
        for name, command in cases().items():
            if args.only and name not in args.only:
                continue
            for _ in range(2):  # the first side of a kind marks it, the second starts its interpreter
                run(command, folder)
            time.sleep(15)  # (the interpreters import their stack now, not during a measured run)
            fresh, warm = [], []
            reports: dict[str, dict] = {}
            for _ in range(args.repeat):
                for mode, times in (("fresh", fresh), ("warm", warm)):
                    seconds, report = run(command, "" if mode == "fresh" else folder)
                    times.append(seconds)
                    reports[mode] = report
            row = {"case": name, "fresh_s": [round(t, 2) for t in fresh], "warm_s": [round(t, 2) for t in warm],
                   "fresh_median_s": round(statistics.median(fresh), 2),
                   "warm_median_s": round(statistics.median(warm), 2),
                   "ratio": round(statistics.median(warm) / statistics.median(fresh), 2),
                   "status": reports["fresh"].get("status"),
                   "same_result": _same(reports["fresh"], reports["warm"])}
            rows.append(row)
            print(f"{name:12} fresh {row['fresh_median_s']:6.2f} s  warm {row['warm_median_s']:6.2f} s  "
                  f"ratio {row['ratio']:.2f}  {row['status']}  same result: {row['same_result']}", flush=True)
        subprocess.run([sys.executable, "-m", "porter.verify.warm", "stop", folder], cwd=REPO)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "repeat": args.repeat,
                                   "rows": rows}, indent=1) + "\n")
    print("\n| case | fresh s (median) | warm s (median) | warm / fresh | same result |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['case']} | {r['fresh_median_s']} | {r['warm_median_s']} | {r['ratio']} | {r['same_result']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
