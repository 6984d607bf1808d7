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


# ---------------------------------------------------------------------------------------
# The rewrite over several spellings of a dataset root and its loaders (no server needed)
# ---------------------------------------------------------------------------------------
URL = "gs://my-bucket/ds"


def _fix(source: str, target: str = "torch-xla"):
    from porter import engine, registry
    from porter.gcsdata import GcsDataRule

    rule = next(r for r in registry.rules_for(target) if issubclass(r, GcsDataRule) and r.target == target)
    options = engine.Options((rule.configured(URL),), unsafe_fixes=True)
    result = engine.fix(textwrap.dedent(source), options)
    again = engine.fix(result.source if result.changed else textwrap.dedent(source), options)
    assert not again.changed, "a second run changed the port"
    return (result.source if result.changed else textwrap.dedent(source)), result.remaining


@pytest.mark.parametrize("target", ["torch-xla", "jax"])
@pytest.mark.parametrize("root_src,ref", [
    ('parser.add_argument("--data_dir", type=str, default="data/")', "args.data_dir"),
    ('parser.add_argument("-r", "--root", default="~/datasets")', "args.root"),
    ('parser.add_argument("--data-path", default="./d", help="where")', "args.data_path"),
    ('parser.add_argument("--in", dest="dataset_dir", default="./d")', "args.dataset_dir"),
    ('DATA_ROOT = "/mnt/data"', "DATA_ROOT"),
    ("data_dir = 'data'", "data_dir"),
])
def test_roots_and_loaders_in_several_spellings(root_src, ref, target):
    src = f'''
        import argparse, os
        import numpy as np
        import pandas as pd
        from PIL import Image
        import torch

        parser = argparse.ArgumentParser()
        {root_src}
        args = parser.parse_args()
        base = os.path.join({ref}, "train")
        table = pd.read_csv(base + "/labels.csv")
        image = Image.open(os.path.join(base, "0.png"))
        weights = torch.load(os.path.join({ref}, "init.pt"), map_location="cpu")
        raw = open(os.path.join({ref}, "raw.bin"), "rb").read()
        other = np.load("unrelated.npy")
    '''
    out, remaining = _fix(src, target)
    quote = '"' if 'default="' in root_src or '= "' in root_src else "'"
    assert f"{quote}{URL}{quote}" in out
    assert 'pd.read_csv(fsspec.open(base + "/labels.csv", "rb").open())' in out
    assert 'Image.open(fsspec.open(os.path.join(base, "0.png"), "rb").open())' in out
    assert f'torch.load(fsspec.open(os.path.join({ref}, "init.pt"), "rb").open(), map_location="cpu")' in out
    assert f'fsspec.open(os.path.join({ref}, "raw.bin"), "rb").open().read()' in out
    assert 'np.load("unrelated.npy")' in out  # not built from the root
    assert "import fsspec" in out
    assert not remaining


@pytest.mark.parametrize("use,why", [
    ('np.memmap(os.path.join(args.data, "x.bin"), dtype="float32", mode="r")', "np.memmap maps a local file"),
    ("os.listdir(args.data)", "os.listdir lists a local folder"),
    ('glob.glob(args.data + "/*.png")', "glob.glob lists local files"),
    ('pathlib.Path(args.data) / "x"', "pathlib.Path collapses gs:// into gs:/"),
    ("torchvision.datasets.ImageFolder(args.data)", "ImageFolder lists a local folder"),
    ("torchvision.datasets.CIFAR10(root=args.data, train=True, download=True)", "CIFAR10(download=True) downloads"),
    ('torch.save(x, os.path.join(args.data, "x.pt"))', "torch.save writes a local file"),
    ('np.save(args.data + "/y.npy", x)', "np.save writes a local file"),
    ('open(os.path.join(args.data, "log.txt"), "a")', "open(..., 'a') writes a file"),
])
def test_local_only_uses_are_reported_and_the_root_left(use, why):
    src = f'''
        import argparse, glob, os, pathlib
        import numpy as np
        import torch
        import torchvision

        parser = argparse.ArgumentParser()
        parser.add_argument("--data", default="./data")
        args = parser.parse_args()
        x = np.load(os.path.join(args.data, "x.npy"))
        y = {use}
    '''
    out, remaining = _fix(src)
    assert out == textwrap.dedent(src)  # nothing rewritten: the script still needs local files
    messages = [(f.position.line, f.message) for f in remaining]
    assert any(line == 11 and why in m for line, m in messages), messages
    assert any(line == 8 and "dataset root left local" in m for line, m in messages), messages


def test_a_bucket_root_and_files_without_a_root_are_left_alone():
    for src in ('import argparse\np = argparse.ArgumentParser()\np.add_argument("--data", default="gs://b-1/x")\n',
                'import numpy as np\nx = np.load("data/x.npy")\n',
                'import argparse\np = argparse.ArgumentParser()\np.add_argument("--lr", default="0.1")\n'):
        out, remaining = _fix(src)
        assert out == src and not remaining


def test_migrate_data_needs_unsafe_fixes_and_a_bucket(tmp_path):
    src = tmp_path / "t.py"
    src.write_text('import argparse\nimport numpy as np\np = argparse.ArgumentParser()\np.add_argument("--data", default="d")\n'
                   'a = p.parse_args()\nx = np.load(a.data + "/x.npy")\n')
    run = subprocess.run([*PORTER, "migrate", str(src), "--select", "DT", "--data", URL], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == "" and "add --unsafe-fixes" in run.stderr
    bad = subprocess.run([*PORTER, "migrate", str(src), "--data", "/local/path"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "gs://BUCKET/PREFIX" in bad.stderr
    off = subprocess.run([*PORTER, "migrate", str(src), "--select", "TX1", "--ignore", "DT", "--unsafe-fixes", "--data", URL],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and "fsspec" not in off.stdout
