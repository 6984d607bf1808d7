"""What does `porter verify` cost over simply running both sides?

The model: a ResNet-18 for CIFAR-size images (benchmarks/data/resnet18.py, 11.2M parameters,
input float32[8,3,32,32], 10 classes) and its torch_xla port (benchmarks/data/resnet18_xla.py).
Measured side by side in one run, alternating, several repetitions:

  1. direct  the same work done by plain scripts, one process each, one after the other:
             the original builds the model and runs K steps of forward, backward and SGD on
             the CPU eagerly (`python resnet18.py --steps K`); the port the same on the XLA
             device with torch_xla.sync() per step (`python resnet18_xla.py --steps K`).
             Wall time of both processes.
  2. verify  `porter verify resnet18.py resnet18_xla.py --model "ResNet18()"
             --input "float32[8,3,32,32]" --steps K`, one command, wall time; it compares
             every layer's output, the gradients, and K steps of loss, parameters and buffers.

and prints the ratio verify/direct for each repetition and their median (target: at most 1.5).
The JSON goes to benchmarks/results/bench_verify.json.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/bench_verify.py                 # K=5, 3 repetitions
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/bench_verify.py --repeat 5 --steps 3

Both kinds run with CUDA_VISIBLE_DEVICES="" (the original on the CPU, as verify runs it) and
PJRT_DEVICE=CPU unless set otherwise. This is a measurement, not a test: it asserts nothing.
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
DATA = REPO / "benchmarks" / "data"
RESULTS = REPO / "benchmarks" / "results" / "bench_verify.json"
ORIGINAL = DATA / "resnet18.py"
PORT = DATA / "resnet18_xla.py"


def environment() -> dict:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("PJRT_DEVICE", "CPU")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def run(cmd: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    return time.perf_counter() - t0, proc


def direct(steps: int, env: dict) -> dict:
    out = {}
    for role, script in (("original", ORIGINAL), ("port", PORT)):
        seconds, proc = run([sys.executable, str(script), "--steps", str(steps)], env, DATA)
        if proc.returncode != 0:
            sys.exit(f"bench_verify: {script.name} failed:\n{proc.stderr[-3000:]}")
        out[role] = round(seconds, 2)
    out["seconds"] = round(out["original"] + out["port"], 2)
    return out


def verify(steps: int, env: dict, atol: float, rtol: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        report_path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "porter", "verify", str(ORIGINAL), str(PORT), "--model", "ResNet18()",
               "--input", "float32[8,3,32,32]", "--steps", str(steps), "--atol", str(atol), "--rtol", str(rtol),
               "--format", "json", "--out", str(report_path)]
        seconds, proc = run(cmd, env, DATA)
        if not report_path.is_file():
            sys.exit(f"bench_verify: porter verify wrote no report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        report = json.loads(report_path.read_text())
    return {
        "seconds": round(seconds, 2),
        "exit_code": proc.returncode,
        "status": report["status"],
        "summary": report["summary"],
        "tensors_compared": len(report.get("tensors", [])),
        "original_side_s": report["original"]["seconds"],
        "port_side_s": (report.get("port") or {}).get("seconds"),
        "timings": report.get("timings", {}),
    }


def machine() -> dict:
    import importlib.metadata

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in ("torch", "torch_xla", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), **versions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps K (both kinds)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the direct/verify pair")
    # float32 eager CPU and XLA round differently; over 5 SGD steps of a batch of 8 the
    # BatchNorm running variances drift apart by up to ~3e-3 relative (measured), so the
    # comparison uses looser tolerances than the defaults; it compares every tensor either way
    ap.add_argument("--atol", type=float, default=1e-3, help="verify's absolute tolerance")
    ap.add_argument("--rtol", type=float, default=1e-2, help="verify's relative tolerance")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = ap.parse_args()

    env = environment()
    host = machine()
    print(f"ResNet-18 (11.2M parameters), float32[8,3,32,32], K={args.steps} steps; "
          f"{host['cores']} cores, torch {host['torch']}, torch_xla {host['torch_xla']}", flush=True)
    pairs = []
    for i in range(args.repeat):
        load = [round(x, 2) for x in os.getloadavg()]
        # alternate which goes first, so that a trend in the machine's load favours neither
        if i % 2 == 0:
            d = direct(args.steps, env)
            v = verify(args.steps, env, args.atol, args.rtol)
        else:
            v = verify(args.steps, env, args.atol, args.rtol)
            d = direct(args.steps, env)
        ratio = v["seconds"] / d["seconds"]
        pairs.append({"direct": d, "verify": v, "ratio": round(ratio, 3), "load_average_at_start": load,
                      "load_average_at_end": [round(x, 2) for x in os.getloadavg()]})
        print(f"  #{i + 1}  direct {d['seconds']:6.1f} s (original {d['original']:.1f} + port {d['port']:.1f})"
              f"   verify {v['seconds']:6.1f} s ({v['status']}, {v['tensors_compared']} tensors)"
              f"   verify/direct {ratio:.2f}   load {load[0]:.1f}", flush=True)
    ratios = [p["ratio"] for p in pairs]
    median = statistics.median(ratios)
    print(f"\nverify/direct: median {median:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); target <= 1.5: "
          f"{median <= 1.5}")
    if pairs[-1]["verify"]["timings"]:
        print("last verify's timings:", json.dumps(pairs[-1]["verify"]["timings"]))
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host,
        "settings": {"steps": args.steps, "repeat": args.repeat, "atol": args.atol, "rtol": args.rtol, "model": "ResNet18()",
                     "input": "float32[8,3,32,32]", "PJRT_DEVICE": env["PJRT_DEVICE"]},
        "pairs": pairs,
        "ratio_median": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
