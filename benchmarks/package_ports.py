"""Whole packages through ``porter.packages.port_package``: what imports, what builds, how long.

For each source (an importable name or a folder) and target: the first port into an empty
folder (wall time, modules ported / unchanged / failed, followed from imports, packages ported
along, data files, findings left by code), then a second call with the same inputs (the
incremental path: every module's record still valid, nothing rewritten) timed in the same run,
and then, in a fresh interpreter with only the port's folder first on ``sys.path``: does the
package import from the port (``__file__`` under out/), and which of the listed models build
(for the JAX target with ``rngs=nnx.Rngs(0)``), with the first error line of each that does not.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/package_ports.py                       # everything
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/package_ports.py --only torchvision --targets jax

Results: benchmarks/results/package_ports.json (rewritten after every row); docs/zoo.md
("Porting a package") has the table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from porter.packages import port_package, summary  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus"
RESULTS = REPO / "benchmarks" / "results" / "package_ports.json"

TV_MODELS = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "densenet121", "squeezenet1_0", "convnext_tiny",
             "regnet_y_400mf", "shufflenet_v2_x0_5", "vgg11", "swin_t", "vit_b_16", "googlenet", "mnasnet0_5"]
TIMM_MODELS = ["resnet18", "mobilenetv3_small_100", "efficientnet_b0", "convnext_atto", "vit_tiny_patch16_224",
               "deit_tiny_patch16_224", "regnety_002", "resnest14d", "levit_128s", "mixer_s16_224"]
CIFAR_MODELS = ["VGG('VGG11')", "ResNet18()", "PreActResNet18()", "GoogLeNet()", "DenseNet121()", "ResNeXt29_2x64d()",
                "MobileNet()", "MobileNetV2()", "DPN26()", "ShuffleNetG2()", "SENet18()", "ShuffleNetV2(1)",
                "EfficientNetB0()", "RegNetX_200MF()", "SimpleDLA()", "LeNet()", "PNASNetA()", "DLA()"]

SOURCES = {
    # name -> (source, package imported, build expressions (evaluated with the package as `pkg`))
    "torchvision": ("torchvision.models", "torchvision.models", [f"pkg.get_model({m!r}{{rngs}})" for m in TV_MODELS]),
    "timm": ("timm", "timm", [f"pkg.create_model({m!r}{{rngs}})" for m in TIMM_MODELS]),
    "pytorch-cifar": (str(CORPUS / "torch" / "pytorch-cifar" / "models"), "models",
                      [f"pkg.{m[:-1]}{{rngs_first}})" if m.endswith("()") else f"pkg.{m[:-1]}{{rngs}})" for m in CIFAR_MODELS]),
    "gluon-model-zoo": ("mxnet.gluon.model_zoo", "model_zoo",
                        [f"pkg.vision.get_model({m!r}{{rngs}})" for m in ("resnet18_v1", "mobilenet1.0", "squeezenet1.0", "vgg11", "alexnet", "densenet121", "inceptionv3")]),
}

CHECK = r'''
import json, os, sys, time, traceback
sys.path.insert(0, OUT)
t0 = time.perf_counter()
result = {"imports": False, "from_port": False, "builds": {}, "import_error": ""}
try:
    import importlib
    pkg = importlib.import_module(PACKAGE)
    result["imports"] = True
    result["file"] = getattr(pkg, "__file__", None) or str(list(getattr(pkg, "__path__", [])))
    result["from_port"] = result["file"].startswith(OUT) or result["file"].startswith("['" + OUT)
except BaseException as exc:
    result["import_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1][:300]
result["import_s"] = round(time.perf_counter() - t0, 2)
if result["imports"]:
    if TARGET == "jax":
        from flax import nnx
    for expr in EXPRS:
        code = expr.replace("{rngs}", ", rngs=nnx.Rngs(0)" if TARGET == "jax" else "").replace(
            "{rngs_first}", "rngs=nnx.Rngs(0)" if TARGET == "jax" else "")
        t1 = time.perf_counter()
        try:
            model = eval(code)
            result["builds"][code] = "ok"
        except BaseException as exc:
            result["builds"][code] = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1][:300]
        model = None
        print("BUILD" + json.dumps([code, result["builds"][code], round(time.perf_counter() - t1, 2)]), flush=True)
print("RESULT" + json.dumps(result))
'''


def check(out: Path, package: str, target: str, exprs: list[str], timeout: float) -> dict:
    code = f"OUT = {str(out)!r}\nPACKAGE = {package!r}\nTARGET = {target!r}\nEXPRS = {exprs!r}\n" + CHECK
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PJRT_DEVICE"] = "CPU"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              cwd=out.parent, env=env)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {timeout:g} s"
    builds, seconds = {}, {}
    for line in stdout.splitlines():
        if line.startswith("RESULT"):
            return dict(json.loads(line[len("RESULT"):]), build_s=seconds)
        if line.startswith("BUILD"):
            expr, verdict, took = json.loads(line[len("BUILD"):])
            builds[expr], seconds[expr] = verdict, took
    return {"imports": bool(builds), "builds": builds, "build_s": seconds,
            "import_error": (stderr.strip().splitlines() or ["no output"])[-1][:300]}


ORIGINAL_BASELINE = {"gluon-model-zoo"}  # (its original runs in the MXNet venv: no baseline here)


def _original_root(port) -> Path:
    """The sys.path entry the original package is imported from."""
    top = port.modules[port.name] if port.name in port.modules else next(iter(port.modules.values()))
    depth = len(top.name.split("."))
    return top.source.parents[depth if top.source.name == "__init__.py" else depth - 1]


def table(rows: list[dict]) -> str:
    """docs/zoo.md's table from the results."""
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['source']} | {r['target']} | error: {r['error']} | | | | | |")
            continue
        c = r.get("check", {})
        imports = "yes" if c.get("imports") and c.get("from_port") else f"no: `{c.get('import_error', '')}`"
        base = f" ({r['original_built']})" if "original_built" in r else ""
        ext = f", along: {', '.join(r['external'])}" if r.get("external") else ""
        lines.append(f"| {r['source']} | {r['target']} | {r['modules']} ({r['selected']} + {r['followed']}{ext}) | "
                     f"{r['ported']} / {r['unchanged']} / {r['failed']} | {r['first_s']:.0f} s | "
                     f"{r['second_s']:.2f} s ({r['second_reused']} reused) | {imports} | {r['built']}{base} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(SOURCES))
    ap.add_argument("--targets", nargs="*", default=["torch-xla", "jax"])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--keep", type=Path, default=None, help="Write the ports under this folder (else a temporary one).")
    ap.add_argument("--results", type=Path, default=RESULTS, help="Rows are merged into this JSON file.")
    ap.add_argument("--table", action="store_true", help="Print the table of the results file and stop.")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(args.results.read_text())))
        return 0

    def save(row: dict) -> None:  # re-read first: another run may have added rows meanwhile
        rows = json.loads(args.results.read_text()) if args.results.is_file() else []
        rows = [r for r in rows if (r["source"], r["target"]) != (row["source"], row["target"])] + [row]
        args.results.write_text(json.dumps(rows, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="porter-packages-") as tmp:
        base = args.keep or Path(tmp)
        for key in args.only:
            source, package, exprs = SOURCES[key]
            for target in args.targets:
                out = base / f"{key}-{target}"
                row = {"source": key, "target": target, "jobs": args.jobs}
                t0 = time.perf_counter()
                try:
                    port = port_package(source, target, out, jobs=args.jobs)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    print(json.dumps(row), flush=True)
                    save(row)
                    continue
                row["first_s"] = round(time.perf_counter() - t0, 2)
                t1 = time.perf_counter()
                again = port_package(source, target, out, jobs=args.jobs)
                row["second_s"] = round(time.perf_counter() - t1, 2)
                row["second_reused"] = sum(m.reused for m in again.modules.values())
                s = summary(port)
                row.update({k: s[k] for k in ("modules", "ported", "unchanged", "failed", "findings", "data_files", "unresolved")})
                row["selected"] = sum(m.selected for m in port.modules.values())
                row["followed"] = len(port.followed)
                row["external"] = port.external
                row["failed_modules"] = s["failed_modules"]
                row["check"] = check(out, package, target, exprs, args.timeout)
                if key not in ORIGINAL_BASELINE:
                    # the same builds of the original, in the same kind of fresh interpreter
                    base_root = _original_root(port)
                    original = check(base_root, package, "torch", exprs, args.timeout)
                    row["original_built"] = f"{sum(v == 'ok' for v in original.get('builds', {}).values())}/{len(exprs)}"
                    row["original_failures"] = {k: v for k, v in original.get("builds", {}).items() if v != "ok"}
                builds = row["check"].get("builds", {})
                row["built"] = f"{sum(v == 'ok' for v in builds.values())}/{len(exprs)}"
                row["failures"] = {k: v for k, v in builds.items() if v != "ok"}
                print(json.dumps({k: v for k, v in row.items() if k != "check"}), flush=True)
                print("   import:", row["check"].get("imports"), row["check"].get("from_port"), row["check"].get("import_error", ""),
                      flush=True)
                save(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
