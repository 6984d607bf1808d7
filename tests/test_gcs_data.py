"""Data in Cloud Storage, against a real local Cloud Storage server (gcp-storage-emulator on
127.0.0.1, a free port): a synthetic dataset is staged into a bucket, gcsfs reads it, and a
script ported with `porter migrate --data gs://...` trains on it under torch_xla (CPU) with
the losses of the original trained on the same files on the local disk."""
from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PORTER = [sys.executable, "-m", "porter"]
BUCKET = "porter-test"
# gcsfs 2026.x first asks a gRPC endpoint for the bucket type (60 s timeout against an HTTP-only
# emulator); the plain JSON API is what the emulator serves
GCS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

TRAIN = textwrap.dedent('''
    import argparse
    import json
    import os

    import numpy as np
    import torch
    import torch.nn as nn

    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    x = np.load(os.path.join(args.data_dir, "x.npy"))
    labels = torch.load(f"{args.data_dir}/y.pt")
    with open(os.path.join(args.data_dir, "meta.json")) as fh:
        meta = json.load(fh)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(meta["features"], 16), nn.ReLU(), nn.Linear(16, meta["classes"])).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.from_numpy(x).to(device)
    labels = labels.to(device)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs[step * 8:(step + 1) * 8]), labels[step * 8:(step + 1) * 8])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.8f}")
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dataset() -> dict[str, bytes]:
    import json

    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = torch.from_numpy(rng.integers(0, 3, 32))
    files = {}
    buf = io.BytesIO()
    np.save(buf, x)
    files["x.npy"] = buf.getvalue()
    buf = io.BytesIO()
    torch.save(y, buf)
    files["y.pt"] = buf.getvalue()
    files["meta.json"] = json.dumps({"features": 6, "classes": 3}).encode()
    return files


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """A running emulator holding gs://porter-test/ds/{x.npy,y.pt,meta.json}; the same files on disk."""
    from gcp_storage_emulator.server import create_server

    for k, v in GCS_ENV.items():
        os.environ[k] = v
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    host = f"http://127.0.0.1:{port}"
    try:
        import gcsfs

        fs = gcsfs.GCSFileSystem(endpoint_url=host, token="anon", project="porter-test")
        local = tmp_path_factory.mktemp("local-data")
        for name, data in _dataset().items():
            fs.pipe(f"{BUCKET}/ds/{name}", data)
            (local / name).write_bytes(data)
        yield {"host": host, "fs": fs, "url": f"gs://{BUCKET}/ds", "local": local}
    finally:
        server.stop()


def test_gcsfs_reads_the_staged_dataset(bucket):
    fs = bucket["fs"]
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/ds")) == ["meta.json", "x.npy", "y.pt"]
    with fs.open(f"{BUCKET}/ds/x.npy", "rb") as fh:
        x = np.load(fh)
    assert x.shape == (32, 6) and np.array_equal(x, np.load(bucket["local"] / "x.npy"))


@pytest.fixture(scope="module")
def ported(tmp_path_factory, bucket):
    work = tmp_path_factory.mktemp("gcs-port")
    (work / "src").mkdir()
    (work / "src" / "train.py").write_text(TRAIN, encoding="utf-8")
    run = subprocess.run(
        [*PORTER, "migrate", str(work / "src" / "train.py"), "--to", "torch-xla", "--unsafe-fixes",
         "--data", bucket["url"], "--out", str(work / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return work


def test_migrate_data_rewrites_the_root_and_the_loaders(ported, bucket):
    text = (ported / "out" / "train.py").read_text(encoding="utf-8")
    assert f'default="{bucket["url"]}"' in text
    assert 'np.load(fsspec.open(os.path.join(args.data_dir, "x.npy"), "rb").open())' in text
    assert 'torch.load(fsspec.open(f"{args.data_dir}/y.pt", "rb").open())' in text
    assert 'with fsspec.open(os.path.join(args.data_dir, "meta.json"), "r") as fh:' in text
    assert "import fsspec" in text and "torch_xla" in text
    again = subprocess.run([*PORTER, "migrate", str(ported / "out" / "train.py"), "--to", "torch-xla", "--unsafe-fixes",
                            "--data", bucket["url"]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout == "", again.stdout  # a second run changes nothing


def _losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"step \d+ loss ([0-9.]+)", out)]


def test_port_trains_on_the_bucket_like_the_original_on_local_files(ported, bucket):
    env = {**os.environ, **GCS_ENV, "PJRT_DEVICE": "CPU", "STORAGE_EMULATOR_HOST": bucket["host"]}
    port = subprocess.run([sys.executable, str(ported / "out" / "train.py"), "--steps", "4"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert port.returncode == 0, port.stderr[-3000:]
    env.pop("PJRT_DEVICE")
    orig = subprocess.run([sys.executable, str(ported / "src" / "train.py"), "--steps", "4",
                           "--data-dir", str(bucket["local"])], env=env, capture_output=True, text=True, timeout=600)
    assert orig.returncode == 0, orig.stderr[-3000:]
    got, want = _losses(port.stdout), _losses(orig.stdout)
    assert len(got) == len(want) == 4
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)


def test_uses_that_need_local_files_are_reported_and_the_root_stays(tmp_path, bucket):
    src = tmp_path / "mm.py"
    src.write_text(TRAIN + 'big = np.memmap(os.path.join(args.data_dir, "big.bin"), mode="r")\n'
                   'import torchvision\nds = torchvision.datasets.MNIST(args.data_dir, download=True)\n', encoding="utf-8")
    run = subprocess.run([*PORTER, "migrate", str(src), "--to", "torch-xla", "--unsafe-fixes", "--select", "DT",
                          "--data", bucket["url"]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout == ""
    lines = TRAIN.count("\n")
    assert f":{lines + 1}:" in run.stderr and "np.memmap maps a local file" in run.stderr
    assert f":{lines + 3}:" in run.stderr and "MNIST(download=True) downloads into a local folder" in run.stderr
    assert "dataset root left local" in run.stderr
