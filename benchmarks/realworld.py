"""How far does porter get on training code it was not written for?

Every training script in ../shared/corpus/torch and ../shared/corpus/gluon (a .py file that
runs a training step: ``.backward(`` or a Gluon ``trainer.step(``; model files and helpers are
ported with their folder but not run) is ported to both targets (torch-xla, jax) in both modes
(default: safe fixes only; ``--unsafe-fixes``), and then:

1. migrate: ``porter migrate FOLDER --to T --out PORTED [--unsafe-fixes] [--with gluoncv]`` (the
   script's whole folder, so that its helper modules are ported with it; the modules of gluoncv
   a Gluon script imports are ported along into PORTED/gluoncv); the result: ok / failed (exit
   code and the first error line);
2. findings left: ``porter check PORT --target T --format json`` on the ported script, by rule code;
3. verify: ``porter verify --script`` (``porter.verify.script.verify_script``) for ``--steps``
   optimizer steps, on synthetic data of the script's own shapes: torchvision datasets are
   substituted by the verifier (porter/verify/datasets.py); where a script reads a file
   layout, a small synthetic one is written into a temporary folder that both sides get as
   their working directory's contents (nanoGPT's train.bin/val.bin memmaps and meta.pkl, a
   text corpus for a language model, the two images of a style transfer, an ImageFolder tree);
   the status, the summary (the first error line or divergence), the XLA health:
   compilations after warm-up, the most host transfers in a step that logs nothing,
   and for JAX the jit cache sizes of the step functions and their host callbacks.

Gluon scripts' originals run in the MXNet venv (porter/verify/mxnet_env.py,
porter/verify/trace_mxnet.py); their ports start from the original's initial weights, and the
files they read are written in the layouts MXNet's and gluoncv's datasets read (CIFAR-10's
binary records under ``$MXNET_HOME/datasets/cifar10``, ImageNet RecordIO files, MINC image
folders, the MINC tutorial's zip).

The results go to benchmarks/results/realworld.json (rewritten after every row, so an
interrupted run keeps what it measured) and the table to docs/realworld.md:

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/realworld.py --jobs 2              # everything
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/realworld.py --only nanoGPT --targets jax --modes safe
    .venv/bin/python benchmarks/realworld.py --render                              # the table again from the JSON
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/realworld.py --explain-jax         # the finding behind each failed JAX port

``--only`` takes substrings of the script's corpus path (repeatable); a run with ``--only``,
``--targets`` or ``--modes`` replaces its own rows in the JSON and keeps the others. ``--timeout`` is
each side's limit in seconds. Without the corpus the run says so and exits 0.
This is a measurement, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pickle
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("PORTER_CORPUS", REPO.parent / "shared" / "corpus"))
RESULTS = REPO / "benchmarks" / "results" / "realworld.json"
DOC = REPO / "docs" / "realworld.md"
TARGETS = ("torch-xla", "jax")
MODES = ("safe", "unsafe")
_TRAINS = re.compile(r"\.backward\(|\btrainer\.step\(")


@dataclass
class Script:
    rel: str  # path under the corpus
    framework: str  # torch / gluon
    args: list = field(default_factory=list)
    data: str = ""  # the synthetic file layout it reads (a builder below), "" for none

    @property
    def path(self) -> Path:
        return CORPUS / self.rel


# Arguments that keep a run small (a few batches of small inputs) and the file layouts the
# scripts read; everything else runs with the script's defaults.
SETTINGS = {
    "torch/nanoGPT/train.py": (["{corpus}/torch/nanoGPT/config/train_shakespeare_char.py", "--compile=False", "--eval_interval=1000", "--eval_iters=2", "--log_interval=1",
                                "--batch_size=4", "--block_size=32", "--n_layer=2", "--n_head=2", "--n_embd=32",
                                "--max_iters=20", "--dropout=0.0", "--always_save_checkpoint=False",
                                "--wandb_log=False", "--gradient_accumulation_steps=1", "--dtype=float32"],
                               "nanogpt"),
    "torch/nanoGPT/bench.py": (["--batch_size=2", "--block_size=32", "--compile=False", "--dtype=float32",
                                "--profile=False"], "nanogpt"),
    "torch/pytorch-tutorial/02-intermediate/language_model/main.py": ([], "text"),
    "torch/pytorch-tutorial/03-advanced/neural_style_transfer/main.py": (
        ["--max_size", "64", "--total_step", "20", "--log_step", "1000", "--sample_step", "1000"], "style"),
    "torch/pytorch-cifar/main.py": ([], ""),
    "torch/timm-scripts/train.py": (["imagefolder", "--model", "resnet18", "--img-size", "64", "-b", "4",
                                     "--epochs", "1", "--workers", "0", "--num-classes", "2",
                                     "--no-prefetcher"], "imagefolder"),
    "torch/pytorch-tutorial/03-advanced/image_captioning/train.py": ([], "captioning"),
    # gluon-cv: small models and batches, no data workers, nothing saved between the steps compared
    "gluon/gluon-cv/train_cifar10.py": (["--num-epochs", "1", "--batch-size", "4", "-j", "0", "--model",
                                         "cifar_resnet20_v1", "--save-period", "1000"], "cifar10-bin"),
    "gluon/gluon-cv/train_mixup_cifar10.py": (["--num-epochs", "1", "--batch-size", "4", "-j", "0", "--model",
                                               "cifar_resnet20_v1", "--save-period", "1000"], "cifar10-bin"),
    "gluon/gluon-cv/dive_deep_cifar10.py": ([], "cifar10-bin"),
    # --use-rec: the script's other MXNet path (ImageNet folders through gluon's DataLoader) hands
    # split_and_load one image instead of a batch at this commit (`batch_fn(batch[j], ctx)` of a list)
    "gluon/gluon-cv/train_imagenet.py": (["--model", "resnet18_v1", "--use-rec", "--rec-train", "rec/train.rec",
                                          "--rec-train-idx", "rec/train.idx", "--rec-val", "rec/val.rec",
                                          "--rec-val-idx", "rec/val.idx", "--batch-size", "2", "--num-epochs", "1",
                                          "-j", "1", "--input-size", "64", "--log-interval", "1"], "imagenet-rec"),
    "gluon/gluon-cv/finetune_minc.py": (["--data", "minc", "--model", "resnet18_v1", "-j", "0", "--epochs", "1",
                                         "-b", "2"], "minc-folder"),
    "gluon/gluon-cv/transfer_learning_minc.py": ([], "minc-tiny-zip"),
}
# the verifier's dtype where its default (float64 where both sides run in it) does not fit: bench.py
# builds GPT-2 124M (n_layer=12, n_embd=768 are not options); in float64 its XLA:CPU port went over
# the 8 GB per side (8233 MB when it was killed)
DTYPES = {"torch/nanoGPT/bench.py": "float32"}
# environment variables of both sides for a data layout (MXNet's datasets root: $MXNET_HOME/datasets)
DATA_ENV = {"cifar10-bin": {"MXNET_HOME": ".mxnet"}}


# Why a torch-xla row does not pass, as measured (rendered under the table; the finding that
# predicts it where porter prints one)
REASONS = {
    "torch/pytorch-tutorial/01-basics/": "CPU-only scripts (linear_regression, logistic_regression, pytorch_basics): "
                                         "TX109 builds the trained model on torch_xla.device() and moves the tensors "
                                         "its steps take; a row that still fails has the finding of TX109 that "
                                         "says why it moved nothing",
    "torch/timm-scripts/": "the port trains on XLA with the original's losses (float64, 3 steps) in both modes: "
                           "TX103 makes `--device`'s default 'xla' as a safe fix (every read of the option is a "
                           "device use or text; the namespace goes to utils.init_distributed_device, which returns "
                           "torch.device('xla') for it). The unsafe port has no host transfer in a step that logs "
                           "nothing: TX406 reads timm's utils.AverageMeter in its installed source (update only does "
                           "arithmetic with the value) and passes `loss.detach() * accum_steps` at train.py:1384. The "
                           "safe port keeps that `.item()` (TX406's fix is unsafe: the meter's attributes become "
                           "tensors), one transfer per step, reported there by TX406",
    "torch/pytorch-tutorial/02-intermediate/bidirectional_recurrent_neural_network/": "XLA:CPU compile time of the "
        "unrolled nn.LSTM step, predicted by TX505 (\"nn.LSTM is unrolled over the sequence on XLA\", from `porter "
        "check` at this commit): the sibling recurrent_neural_network's port, traced alone (float64, 2 steps), logged "
        "one SyncTensorsGraph compile of 4 min 41 s (XLA's slow_operation_alarm) on the loaded 2-core machine, over "
        "the per-side limit. A standalone 2-layer nn.LSTM(28, 128) step (batch 4, float32, forward, backward, SGD; "
        "load average ~20) compiles once in three steps, in 28 s for sequences of 4 and 8 steps and 82 s for 16 "
        "(torch_xla.debug.metrics CompileTime): no recompilation; the one compile grows with the sequence, and the "
        "scripts' sequence is 28 (MNIST rows, fixed by the model's reshape, not by the synthetic data)",
    "torch/pytorch-tutorial/02-intermediate/recurrent_neural_network/": "as the bidirectional one (TX505 at its "
        "nn.LSTM): one XLA:CPU compile of the unrolled nn.LSTM graph took 4 min 41 s (measured alone), over the "
        "per-side limit",
    "torch/pytorch-tutorial/02-intermediate/language_model/": "the port timed out at the per-side limit; TX505 "
        "reports its nn.LSTM (sequence 30, hidden 1024: unrolled over the 30 steps, a compile that grows with the "
        "sequence as measured for the tutorials' other LSTMs); this script was not traced alone",
}


# Why a gluon row does not pass, as measured (rendered under the table)
GLUON_REASONS = {
    "gluon/gluon-cv/dive_deep_cifar10.py": "the MXNet parts port (the context list as one device, GL002; "
        "`split_and_load(..., ctx_list=ctx)` as the whole batch, GL003; the per-shard backward loop, GL303; the "
        "Trainer with its optimizer and parameters in variables, GL302) and, in the rows re-measured with "
        "`--with gluoncv` (2026-12-02 15:35-16:09 UTC), the 224 gluoncv modules it imports port along; the port "
        "stopped in the ported `gluoncv/__init__.py` at gluoncv's framework probe `_require_pytorch_version('1.4.0', "
        "'2.0.0')` (RuntimeError on torch 2.9); since GL009 (torch-xla rows re-measured 2026-12-03 07:45-08:00 UTC) "
        "the probes no longer refuse and gluoncv's subpackages load outside the MXNet probe's `try`, and the port "
        "stops at the first of them that keeps MXNet: `import mxnet as mx` at line 5 of "
        "`gluoncv/data/transforms/image.py` (reached from `from . import data`; `nd.flip` and `nd.stack(*...)` get "
        "GL201 findings, `mx.image.imresize` at lines 51 and 340 none); rows not re-measured stop at \"No module named 'gluoncv'\"; the original "
        "trains on the synthetic CIFAR-10 records",
    "gluon/gluon-cv/train_cifar10.py": "as dive_deep_cifar10 (not re-measured with --with gluoncv): the port stops at "
        "its gluoncv import (get_model, TrainingHistory, gluoncv's transforms); the MXNet parts port",
    "gluon/gluon-cv/train_mixup_cifar10.py": "re-measured (torch-xla) with GL301's probability labels "
        "(`SoftmaxCrossEntropyLoss(sparse_label=False)` -> a float32 target), GL402's `mx.metric.RMSE`, GL201's "
        "`nd.SoftmaxActivation` and `--with gluoncv`: no mxnet import is left, and the port stops, as "
        "dive_deep_cifar10's, at gluoncv's `_require_pytorch_version` probe (RuntimeError on torch 2.9; the unsafe "
        "row's \"GL008 4\" was counted before GL008 required an mxnet import in the file); the jax "
        "rows were not re-measured (\"No module named 'mxnet'\", before these rules)",
    "gluon/gluon-cv/train_imagenet.py": "the port keeps its mxnet imports (\"No module named 'mxnet'\"): findings "
        "name what stays for a person (`mx.init.MSRAPrelu`, the Trainer's optimizer parameters not a dict literal "
        "(`lr_scheduler`), `SoftmaxCrossEntropyLoss(sparse_label=<a variable>)`, RandomResizedCrop/ColorJitter/"
        "Lighting transforms, eval/train modes of helpers); `mx.metric.TopKAccuracy(5)` and `RMSE` port since "
        "GL402 emits them (torch-xla unsafe re-measured 2026-12-02, with --with gluoncv); the original trains on "
        "the synthetic RecordIO files",
    "gluon/gluon-cv/finetune_minc.py": "the original cannot run offline: `get_model(name, pretrained=True)` downloads "
        "gluoncv's pretrained weights (ConnectionError); the verifier has no stand-in for gluoncv's model store",
    "gluon/gluon-cv/transfer_learning_minc.py": "the original cannot run offline: `get_model(name, pretrained=True)` "
        "downloads gluoncv's pretrained weights; the verifier has no stand-in for gluoncv's model store",
}


def discover() -> list[Script]:
    found = []
    for framework in ("torch", "gluon"):
        root = CORPUS / framework
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if not _TRAINS.search(text) or "model_zoo" in path.parts:
                continue
            rel = path.relative_to(CORPUS).as_posix()
            args, data = SETTINGS.get(rel, ([], ""))
            found.append(Script(rel, framework, [a.format(corpus=CORPUS) for a in args], data))
    return found


# --- synthetic file layouts -------------------------------------------------------------


def build_data(kind: str, folder: Path) -> str:
    """Write the layout KIND into FOLDER; a line for the report ('' when there is none)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if kind == "nanogpt":
        d = folder / "data" / "shakespeare_char"
        d.mkdir(parents=True, exist_ok=True)
        vocab = 65
        for name, n in (("train.bin", 20000), ("val.bin", 4000)):
            rng.integers(0, vocab, n).astype(np.uint16).tofile(d / name)
        with open(d / "meta.pkl", "wb") as f:
            pickle.dump({"vocab_size": vocab, "itos": {i: chr(32 + i) for i in range(vocab)},
                         "stoi": {chr(32 + i): i for i in range(vocab)}}, f)
        d = folder / "data" / "openwebtext"
        d.mkdir(parents=True, exist_ok=True)
        for name, n in (("train.bin", 20000), ("val.bin", 4000)):
            rng.integers(0, 50257, n).astype(np.uint16).tofile(d / name)
        return ("data/shakespeare_char/{train,val}.bin: uint16 token memmaps (20,000 / 4,000 tokens, vocab 65), "
                "meta.pkl; data/openwebtext/{train,val}.bin: the same with GPT-2's vocabulary (50,257)")
    if kind == "text":
        d = folder / "data"
        d.mkdir(parents=True, exist_ok=True)
        words = [f"w{i}" for i in range(200)]
        lines = [" ".join(words[j] for j in rng.integers(0, 200, 12)) for _ in range(400)]
        (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return "data/train.txt: 400 lines of 12 words from a vocabulary of 200"
    if kind == "style":
        from PIL import Image

        d = folder / "png"
        d.mkdir(parents=True, exist_ok=True)
        for name in ("content.png", "style.png"):
            Image.fromarray(rng.integers(0, 255, (64, 64, 3)).astype(np.uint8)).save(d / name)
        return "png/content.png, png/style.png: 64x64 random images"
    if kind == "imagefolder":
        from PIL import Image

        for split in ("train", "validation"):
            for cls in ("a", "b"):
                d = folder / "imagefolder" / split / cls
                d.mkdir(parents=True, exist_ok=True)
                for i in range(8):
                    Image.fromarray(rng.integers(0, 255, (72, 72, 3)).astype(np.uint8)).save(d / f"{i}.jpg")
        return "imagefolder/{train,validation}/{a,b}/*.jpg: 8 random 72x72 images per class"
    if kind == "cifar10-bin":
        # mxnet.gluon.data.vision.CIFAR10's layout: records of 1 label byte + 3,072 pixel bytes (CHW)
        d = folder / ".mxnet" / "datasets" / "cifar10"
        d.mkdir(parents=True, exist_ok=True)
        for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
            n = 32 if name.startswith("data") else 64
            labels = rng.integers(0, 10, (n, 1)).astype(np.uint8)
            pixels = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
            np.concatenate([labels, pixels], axis=1).tofile(d / name)
        return (".mxnet/datasets/cifar10/{data_batch_1..5,test_batch}.bin: CIFAR-10 binary records "
                "(32 per training file, 64 test), MXNET_HOME=.mxnet")
    if kind == "imagenet-rec":
        # MXNet's RecordIO (what mx.io.ImageRecordIter reads): per record the magic 0xced7230a, the
        # length (continuation flag 0), then IRHeader (flag, label, id, id2) and the JPEG bytes, padded
        # to 4 bytes; the .idx file: "<id>\t<offset>" per line
        import io
        import struct

        from PIL import Image

        d = folder / "rec"
        d.mkdir(parents=True, exist_ok=True)
        for split, n in (("train", 16), ("val", 8)):
            offsets = []
            with open(d / f"{split}.rec", "wb") as rec:
                for i in range(n):
                    buffer = io.BytesIO()
                    Image.fromarray(rng.integers(0, 255, (72, 72, 3)).astype(np.uint8)).save(buffer, "JPEG")
                    payload = struct.pack("<IfQQ", 0, float(i % 2), i, 0) + buffer.getvalue()
                    offsets.append(rec.tell())
                    rec.write(struct.pack("<II", 0xCED7230A, len(payload)))
                    rec.write(payload + b"\0" * (-len(payload) % 4))
            (d / f"{split}.idx").write_text("".join(f"{i}\t{o}\n" for i, o in enumerate(offsets)), encoding="utf-8")
        return "rec/{train,val}.{rec,idx}: MXNet RecordIO of 16 / 8 random 72x72 JPEGs, labels 0-1"
    if kind in ("imagenet-folder", "minc-folder", "minc-tiny-zip"):
        from PIL import Image

        root, splits, classes, size = {
            "imagenet-folder": ("imagenet", ("train", "val"), ("n01440764", "n01443537"), 72),
            "minc-folder": ("minc", ("train", "val", "test"), ("brick", "carpet"), 96),
            "minc-tiny-zip": ("minc-2500-tiny", ("train", "val", "test"), ("brick", "carpet"), 96)}[kind]
        for split in splits:
            for cls in classes:
                d = folder / root / split / cls
                d.mkdir(parents=True, exist_ok=True)
                for i in range(4):
                    Image.fromarray(rng.integers(0, 255, (size, size, 3)).astype(np.uint8)).save(d / f"{i}.jpg")
        what = f"{root}/{{{','.join(splits)}}}/{{{','.join(classes)}}}/*.jpg: 4 random {size}x{size} images per class"
        if kind == "minc-tiny-zip":
            import zipfile

            # the tutorial downloads this zip into its folder unless it is there
            with zipfile.ZipFile(folder / "minc-2500-tiny.zip", "w") as z:
                for path in sorted((folder / root).rglob("*.jpg")):
                    z.write(path, path.relative_to(folder).as_posix())
            shutil.rmtree(folder / root)
            what = f"minc-2500-tiny.zip (the file the tutorial would download) holding {what}"
        return what
    return ""


# --- one row ---------------------------------------------------------------------------


def _porter(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def _first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error|failed", line)]
    return (errors or lines or [""])[-1][:300]


_GLUON_LIBRARIES = ("gluoncv",)


def run_row(script: Script, target: str, mode: str, steps: int, timeout: float, work: Path) -> dict:
    row: dict = {"script": script.rel, "framework": script.framework, "target": target, "mode": mode,
                 "args": script.args}
    out = work / f"{target}-{mode}"
    source_dir = script.path.parent
    t0 = time.perf_counter()
    cmd = ["migrate", str(source_dir), "--to", target, "--out", str(out)] + (["--unsafe-fixes"] if mode == "unsafe" else [])
    # a Gluon library the script imports is ported along (GL008, `porter migrate --with`)
    cmd += [a for lib in _GLUON_LIBRARIES if re.search(rf"^\s*(import|from)\s+{lib}\b", script.path.read_text(), re.M)
            for a in ("--with", lib)]
    if "--with" in cmd:
        cmd += ["--jobs", "2"]  # a library of a few hundred modules
    try:
        proc = _porter(*cmd)
        ok = proc.returncode == 0
        row["migrate"] = {"ok": ok, "exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
                          "error": "" if ok else _first_error(proc.stderr + proc.stdout)}
    except subprocess.TimeoutExpired:
        row["migrate"] = {"ok": False, "exit": None, "seconds": round(time.perf_counter() - t0, 1),
                          "error": "porter migrate timed out"}
    port = out / script.path.name
    if not port.exists():
        row["findings"] = {}
        row["verify"] = {"status": "not-run", "summary": "no ported script was written"}
        return row
    check = _porter("check", str(port), "--target", target, "--format", "json")
    try:
        findings = json.loads(check.stdout).get("findings", [])
        row["findings"] = dict(sorted(Counter(f["code"] for f in findings).items()))
    except (json.JSONDecodeError, AttributeError):
        row["findings"] = {"?": 1}
        row["check_error"] = _first_error(check.stderr + check.stdout)
    # the script's folder is its working directory in the real world (nanoGPT opens
    # configurator.py and its config files by relative path): both sides get its files
    files = work / "files"
    shutil.copytree(source_dir, files, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    if script.data:
        row["data"] = build_data(script.data, files)
    from porter.verify.script import ScriptRequest, verify_script

    t0 = time.perf_counter()
    try:
        report = verify_script(ScriptRequest(script.path, port, steps, tuple(script.args), timeout=timeout,
                                             dtype=DTYPES.get(script.rel, "auto"),
                                             memory_mb=8192, files=files, env=DATA_ENV.get(script.data)))
    except Exception as exc:  # noqa: BLE001 - porter's own failure: the row says so
        row["verify"] = {"status": "porter-error", "summary": f"{type(exc).__name__}: {exc}"[:300]}
        return row
    v: dict = {"status": report.status, "summary": report.summary.splitlines()[0][:300] if report.summary else "",
               "seconds": round(time.perf_counter() - t0, 1), "steps_compared": len(report.steps or []),
               "dtype": report.settings.get("dtype"),
               "notes": [n for n in report.notes if n.startswith(("the original failed", "the port failed", "both sides",
                                                                   "the original's model has dropout",
                                                                   "the original drew random", "port: optimizer"))]}
    if report.health:
        h = report.health
        v["health"] = {"compiles_after_warmup": h.get("compiles_after_warmup"),
                       "max_transfers_per_step": h.get("max_transfers_per_step"),
                       "fallback_ops": h.get("fallback_ops", []), "problems": h.get("problems", [])}
        if "jit_cache_sizes" in h:
            v["health"]["jit_cache_sizes"] = h["jit_cache_sizes"]
            v["health"]["host_callbacks"] = h.get("host_callbacks_total", 0)
    row["verify"] = v
    return row


# --- the table ---------------------------------------------------------------------------


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(result: dict) -> str:
    rows = result["rows"]
    status = Counter(r["verify"]["status"] for r in rows)
    lines = [
        "# Real-world benchmark: the corpus, ported and verified",
        "",
        "Generated by `benchmarks/realworld.py` (do not edit by hand; run it again to refresh). "
        f"Run of {result.get('date', '?')}"
        + (f" (rows re-run since: {', '.join(result['runs'][1:])})" if len(result.get("runs", [])) > 1 else "")
        + f", {result.get('steps')} optimizer steps per verification, "
        f"per-side timeout {result.get('timeout')} s, on {result.get('machine', '?')}. "
        "Every training script of `../shared/corpus` (torch, gluon) ported to each target in each mode "
        "(`safe`: default, safe fixes only; `unsafe`: `--unsafe-fixes`), then `porter verify --script` on "
        "synthetic data (see the benchmark's docstring). JSON: `benchmarks/results/realworld.json`.",
        "",
        "Verify status over all rows: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())) + f" (of {len(rows)}).",
        "",
        "Columns: migrate (ok, or the first error line), findings left in the ported script by rule code, "
        "verify status and its summary (the first error line or divergence), and the port's health: "
        "`c` compilations after verify's 2 warm-up steps (with 3 steps, in step 3 alone; a row whose "
        "script compared 2 steps judges none), `t` the most device-to-host transfers in a step that logs "
        "nothing; for JAX `jit` the jit cache size of each step function and `cb` the host callbacks traced "
        "into them.",
        "",
        "| script | target | mode | migrate | findings left | verify | summary | health |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        m = r["migrate"]
        mig = "ok" if m["ok"] else f"failed: {m.get('error', '')}"
        findings = ", ".join(f"{k} {v}" for k, v in r.get("findings", {}).items()) or "none"
        v = r["verify"]
        h = v.get("health") or {}
        health = ""
        if h:
            health = f"c {h.get('compiles_after_warmup')}, t {h.get('max_transfers_per_step')}"
            if "jit_cache_sizes" in h:
                sizes = ", ".join(f"{k} {n}" for k, n in h["jit_cache_sizes"].items()) or "no step function"
                health += f"; jit {sizes}; cb {h.get('host_callbacks', 0)}"
        script = r["script"].split("/", 1)[1]
        lines.append(f"| {_cell(script)} | {r['target']} | {r['mode']} | {_cell(mig[:120])} | {_cell(findings)} | "
                     f"{v['status']} | {_cell(('(earlier run: not re-measured) ' if r.get('stale') else '') + v.get('summary', '')[:200])} | "
                     f"{_cell(health)} |")
    notes = [(r["script"], r["target"], r["mode"], n) for r in rows for n in r["verify"].get("notes", [])
             if not n.startswith("both sides")]
    if notes:
        lines += ["", "## Notes of the verifications", ""]
        lines += [f"- {s} ({t}, {m}): {_cell(n[:300])}" for s, t, m, n in notes]
    failing = sorted({r["script"] for r in rows if r["target"] == "torch-xla" and r["framework"] == "torch"
                      and r["verify"]["status"] != "passed"})
    reasons = [(s, why) for s in failing for prefix, why in REASONS.items() if s.startswith(prefix)]
    if reasons:
        lines += ["", "## Why torch-xla rows do not pass (as measured)", ""]
        lines += [f"- {s}: {_cell(why)}" for s, why in reasons]
    failing = sorted({r["script"] for r in rows if r["framework"] == "gluon" and r["verify"]["status"] != "passed"
                      and r["verify"]["status"] != "not-run"})
    reasons = [(s, GLUON_REASONS[s]) for s in failing if s in GLUON_REASONS]
    if reasons:
        lines += ["", "## Why gluon rows do not pass (as measured)", ""]
        lines += [f"- {s}: {_cell(why)}" for s, why in reasons]
    predicted = [r for r in rows if r["target"] == "jax" and "predicted_by" in r]
    if predicted:
        lines += ["", "## JAX ports that do not pass, and the finding that predicts each", "",
                  "For each JAX row whose port failed or diverged: the finding of `porter check` on the port that "
                  "names what fails (`--explain-jax`: the finding whose message, then flagged line, holds the most names of "
                  "the port's error, else its first error-level finding; `none` where no finding does)."
                  , ""]
        for r in predicted:
            lines.append(f"- {r['script']} ({r['mode']}): {_cell(r['verify'].get('summary', '')[:160])} <- "
                         f"{_cell(r['predicted_by'] or 'none: no finding predicts this failure')}")
    data = sorted({(r["script"], r["data"]) for r in rows if r.get("data")})
    if data:
        lines += ["", "## Synthetic files written for the scripts", ""]
        lines += [f"- {s}: {d}" for s, d in data]
    return "\n".join(lines) + "\n"


def _failed_port(row: dict) -> bool:
    summary = row["verify"].get("summary", "")
    return row["verify"]["status"] == "diverged" or (row["verify"]["status"] == "side-failed"
                                                      and summary.startswith("the port could not run"))


def predicting_finding(summary: str, findings: list[dict], port_dir: Path) -> str:
    """The finding (``path:line: CODE message``) that names what the port's error names: the
    one whose message (twice the weight) and flagged source line hold the most identifiers of
    the error message (the attribute, the name; the first of equals), else the first
    error-level finding, else ''."""
    error = summary.split(": ", 1)[1] if ": " in summary else summary
    words = {w for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]{2,}", error)
             if w not in {"the", "object", "has", "attribute", "not", "before", "its", "first", "optimizer", "step",
                          "port", "could", "run", "Error", "AttributeError", "TypeError", "jaxlib", "_jax"}}

    def text(f: dict) -> str:
        return f"{Path(f.get('path', '')).relative_to(port_dir) if f.get('path', '').startswith(str(port_dir)) else f.get('path')}:" \
               f"{f.get('line')}: {f['code']} {f.get('message', '')}"

    def source_line(f: dict) -> str:
        try:
            return Path(f["path"]).read_text(encoding="utf-8").splitlines()[int(f["line"]) - 1]
        except (OSError, KeyError, IndexError, ValueError):
            return ""

    def score(f: dict) -> int:
        # a name in the message counts more than one on the flagged line
        return sum(2 * bool(re.search(rf"\b{re.escape(w)}\b", f.get("message", "")))
                   + bool(re.search(rf"\b{re.escape(w)}\b", source_line(f))) for w in words)

    best = max(findings, key=score, default=None)  # the first of the best
    if best is not None and score(best) > 0:
        return text(best)
    errors = [f for f in findings if f.get("severity") == "error"]
    return text(errors[0]) if errors else ""


def explain_jax(result: dict, only: list[str]) -> None:
    """For each JAX row whose port failed or diverged: port it again, check the port and record
    the finding that predicts the failure (``predicted_by``)."""
    root = Path(tempfile.mkdtemp(prefix="porter-realworld-explain-"))
    try:
        for row in result["rows"]:
            if row["target"] != "jax" or not _failed_port(row) or (only and not any(o in row["script"] for o in only)):
                continue
            path = CORPUS / row["script"]
            out = root / re.sub(r"\W+", "_", row["script"]) / row["mode"]
            _porter("migrate", str(path.parent), "--to", "jax", "--out", str(out),
                    *(["--unsafe-fixes"] if row["mode"] == "unsafe" else []))
            check = _porter("check", str(out), "--target", "jax", "--format", "json")
            try:
                findings = json.loads(check.stdout).get("findings", [])
            except json.JSONDecodeError:
                findings = []
            # the script's own file first, then its helper modules
            findings.sort(key=lambda f: (Path(f.get("path", "")).name != path.name, f.get("path", ""), f.get("line", 0)))
            row["predicted_by"] = predicting_finding(row["verify"].get("summary", ""), findings, out)
            print(f"{row['script']} ({row['mode']}): {row['predicted_by'] or 'none'}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="substring of the script's corpus path (repeat)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: torch-xla,jax")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: safe,unsafe")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps each verification compares")
    parser.add_argument("--jobs", type=int, default=1, help="rows run at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds each side of a verification may run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results")
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown table")
    parser.add_argument("--render", action="store_true", help="only write the table again from --out")
    parser.add_argument("--explain-jax", action="store_true",
                        help="for the JAX rows of --out whose port failed: record the finding that predicts it, then render")
    opts = parser.parse_args(argv)
    if opts.explain_jax:
        result = json.loads(opts.out.read_text(encoding="utf-8"))
        explain_jax(result, opts.only)
        opts.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        opts.doc.write_text(render(result), encoding="utf-8")
        return 0
    if opts.render:
        opts.doc.write_text(render(json.loads(opts.out.read_text(encoding="utf-8"))), encoding="utf-8")
        return 0
    if not CORPUS.is_dir():
        print(f"no corpus at {CORPUS}: nothing to measure")
        return 0
    targets = [t for t in opts.targets.split(",") if t]
    modes = [m for m in opts.modes.split(",") if m]
    scripts = [s for s in discover() if not opts.only or any(o in s.rel for o in opts.only)]
    jobs = [(s, t, m) for s in scripts for t in targets for m in modes]
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "steps": opts.steps, "timeout": opts.timeout,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "corpus": str(CORPUS), "rows": []}
    partial = bool(opts.only) or set(targets) != set(TARGETS) or set(modes) != set(MODES)
    if partial and opts.out.exists():
        # a partial run replaces its own rows and keeps the others (their date stays in "runs")
        previous = json.loads(opts.out.read_text(encoding="utf-8"))
        mine = {(s.rel, t, m) for s, t, m in jobs}
        result["rows"] = [r for r in previous.get("rows", []) if (r["script"], r["target"], r["mode"]) not in mine]
        result["runs"] = previous.get("runs", [previous.get("date")]) + [result["date"]]
        result["date"] = previous.get("date", result["date"])
    lock = threading.Lock()
    everything = [(s.rel, t, m) for s in discover() for t in TARGETS for m in MODES]
    order = {job: i for i, job in enumerate(everything)}

    def save() -> None:
        result["rows"].sort(key=lambda r: order.get((r["script"], r["target"], r["mode"]), 0))
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = opts.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        tmp.replace(opts.out)
        opts.doc.write_text(render(result), encoding="utf-8")

    root = Path(tempfile.mkdtemp(prefix="porter-realworld-"))

    def one(job) -> None:
        script, target, mode = job
        work = root / re.sub(r"\W+", "_", script.rel) / f"{target}-{mode}"
        work.mkdir(parents=True)
        t0 = time.perf_counter()
        try:
            row = run_row(script, target, mode, opts.steps, opts.timeout, work)
        except Exception as exc:  # noqa: BLE001 - the benchmark goes on
            row = {"script": script.rel, "framework": script.framework, "target": target, "mode": mode,
                   "migrate": {"ok": False, "error": f"benchmark error: {type(exc).__name__}: {exc}"},
                   "findings": {}, "verify": {"status": "not-run", "summary": "benchmark error"}}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        with lock:
            result["rows"].append(row)
            save()
            print(f"[{len(result['rows'])}/{len(jobs)}] {script.rel} {target} {mode}: {row['verify']['status']} "
                  f"({time.perf_counter() - t0:.0f} s) {row['verify'].get('summary', '')[:120]}", flush=True)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            list(pool.map(one, jobs))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
