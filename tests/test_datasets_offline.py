"""Script-level verification offline: torchvision's file-backed datasets are replaced by
deterministic synthetic data of the same form, identical on both sides.

The in-process tests install the substitutes into this process and take them out again.
The slow ones run `porter verify --script` on a GPU-style training script that downloads
MNIST or CIFAR10 (tests/data/trace/tv_train.py) and its torch_xla port, with every network
connection refused (tests/data/trace/offline/sitecustomize.py) and a data root that does not
exist; the scripts write a digest of every batch their loader gave, so the test can see that
both sides trained on the same images and labels.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchvision")

from porter.verify import datasets as synthetic  # noqa: E402
from porter.verify.trace import trace_script  # noqa: E402

from lanes import fixture_slice  # noqa: E402

DATA = Path(__file__).parent / "data" / "trace"
OFFLINE = DATA / "offline"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tv(tmp_path):
    synthetic.install(size=96, seed=0, announce=False)
    import torchvision.datasets as D

    yield D
    synthetic.uninstall()


def test_mnist_family_gives_pil_L_28x28_through_the_users_transform(tv, tmp_path):
    from PIL import Image
    from torchvision import transforms as T

    root = tmp_path / "nowhere" / "data"
    ds = tv.MNIST(str(root), train=True, download=True,
                  transform=T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))]))
    assert type(ds).__name__ == "MNIST" and isinstance(ds, sys.modules["torchvision.datasets.mnist"].MNIST)
    assert len(ds) == 96 and tuple(ds.data.shape) == (96, 28, 28) and str(ds.data.dtype) == "torch.uint8"
    assert str(ds.targets.dtype) == "torch.int64" and 0 <= int(ds.targets.min()) and int(ds.targets.max()) <= 9
    assert ds.classes[0] == "0 - zero" and ds.class_to_idx["9 - nine"] == 9
    x, y = ds[0]
    assert tuple(x.shape) == (1, 28, 28) and isinstance(y, int)
    raw = tv.MNIST(str(root), train=False)
    img, _ = raw[0]
    assert isinstance(img, Image.Image) and img.mode == "L" and img.size == (28, 28)
    assert not root.exists(), "nothing may be written under the dataset root"
    letters = tv.EMNIST(str(root), split="letters", download=True)
    assert letters.classes[0] == "N/A" and int(letters.targets.min()) >= 1 and int(letters.targets.max()) <= 26
    assert tv.FashionMNIST(str(root)).classes[0] == "T-shirt/top" and len(tv.KMNIST(str(root)).classes) == 10
    with pytest.raises(ValueError):
        tv.EMNIST(str(root), split="nonsense")


def test_cifar_svhn_stl_shapes_and_labels(tv):
    c10 = tv.CIFAR10("data", train=True, download=True)
    img, label = c10[5]
    assert img.mode == "RGB" and img.size == (32, 32) and isinstance(label, int)
    assert c10.data.shape == (96, 32, 32, 3) and c10.data.dtype == np.uint8 and isinstance(c10.targets, list)
    assert c10.classes[0] == "airplane" and len(c10.classes) == 10
    c100 = tv.CIFAR100("data", download=True)
    assert len(c100.classes) == 100 and max(c100.targets) < 100 and c100.classes[-1] == "worm"
    svhn = tv.SVHN("data", split="test", download=True)
    assert svhn.data.shape == (96, 3, 32, 32) and svhn[0][0].size == (32, 32) and svhn.labels.max() <= 9
    stl = tv.STL10("data", split="unlabeled", download=True)
    assert stl[0][0].size == (96, 96) and stl[0][1] == -1


def test_image_folder_and_imagenet(tv, tmp_path):
    from torchvision import transforms as T

    folder = tv.ImageFolder(str(tmp_path / "missing" / "train"), transform=T.Compose([T.RandomResizedCrop(64), T.ToTensor()]))
    x, y = folder[3]
    assert tuple(x.shape) == (3, 64, 64) and 0 <= y < 10 and len(folder.classes) == 10
    assert folder.targets == [t for _, t in folder.samples] and folder.imgs is folder.samples
    raw = tv.ImageFolder(str(tmp_path / "missing" / "train"))[3][0]
    assert raw.mode == "RGB" and raw.size == (224, 224)
    # an existing root gives its class folders, as the real class would find them
    for name in ("dog", "cat"):
        (tmp_path / "real" / name).mkdir(parents=True)
    assert tv.ImageFolder(str(tmp_path / "real")).classes == ["cat", "dog"]
    net = tv.ImageNet(str(tmp_path / "imagenet"), split="val")
    assert len(net.classes) == 1000 and len(net.wnids) == 1000 and max(net.targets) < 1000
    assert net[0][0].size == (224, 224)


def test_image_size_is_configurable(tv):
    from porter.verify.trace import _image_size

    synthetic.install(size=8, seed=0, image_size=_image_size("40x60"), announce=False)
    assert tv.ImageFolder("anywhere")[0][0].size == (60, 40)  # PIL: (width, height)
    assert _image_size("32") == (32, 32)
    with pytest.raises(Exception):
        _image_size("0x5")


def test_same_seed_same_data_other_seed_other_data(tv):
    a = tv.CIFAR10("x").data
    b = tv.CIFAR10("elsewhere").data
    assert np.array_equal(a, b)
    synthetic.install(size=96, seed=1, announce=False)
    assert not np.array_equal(a, tv.CIFAR10("x").data)


def test_fake_data_gives_torchvisions_samples_without_the_global_generator(tv, monkeypatch):
    # torchvision's FakeData seeds and restores the global generator in __getitem__, which
    # races with the script's own draws when a loader thread reads it (a port's MpDeviceLoader)
    import torch
    from torchvision import transforms
    from torchvision.datasets import fakedata

    real = synthetic._patched[(fakedata, "FakeData")]
    kwargs = dict(size=6, image_size=(3, 8, 8), num_classes=5, transform=transforms.ToTensor(), random_offset=3)
    expected = [real(**kwargs)[i] for i in range(6)]
    for name in ("manual_seed", "set_rng_state", "get_rng_state"):
        monkeypatch.setattr(torch, name, lambda *a, **k: pytest.fail("the global generator was used"))
    got = [tv.FakeData(**kwargs)[i] for i in range(6)]
    for (x, y), (ex, ey) in zip(got, expected):
        assert y == ey and torch.equal(x, ex)


def test_downloads_and_unknown_loaders_fail_clearly(tv, tmp_path):
    with pytest.raises(RuntimeError, match="runs offline"):
        tv.Caltech101(str(tmp_path), download=True)
    with pytest.raises(RuntimeError, match="own loader"):
        tv.DatasetFolder(str(tmp_path / "missing"), loader=lambda p: open(p).read(), extensions=(".txt",))
    assert synthetic.notes() == []  # nothing was substituted


def test_notes_name_each_substitution(tv):
    tv.MNIST("data", train=True, download=True)
    tv.CIFAR10("data", train=False, download=True)
    got = synthetic.notes()
    assert got[0].startswith("torchvision.datasets.MNIST(train=True) replaced by 96 synthetic samples")
    assert got[1].startswith("torchvision.datasets.CIFAR10(train=False) replaced by 96 synthetic samples")


# --- from the user's side -------------------------------------------------------------------


def _path() -> str:
    return os.pathsep.join([str(OFFLINE), str(ROOT)])


def _offline_env():
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(OFFLINE), env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.slow
@pytest.mark.xla
# one dataset per run of the suite (both with PORTER_TEST_EVERY_FIXTURE=1; the synthetic data of
# each: the tests above)
@pytest.mark.parametrize("dataset,name", fixture_slice([("cifar10", "CIFAR10"), ("mnist", "MNIST")], 2))
def test_verify_script_runs_offline_on_identical_synthetic_data(tmp_path, dataset, name):
    digests = tmp_path / "digests.txt"
    root = tmp_path / "no" / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "porter", "verify", "--script", DATA / "tv_train.py", DATA / "tv_train_xla.py",
         "--steps", "3", "--format", "json", "--", "--dataset", dataset, "--data", root, "--digest-file", digests],
        capture_output=True, text=True, timeout=900, env=_offline_env())
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"] + report["original"]["log"] + (report["port"] or {}).get("log", "")
    expected = f"porter: torchvision.datasets.{name}(train=True) replaced by 768 synthetic samples"
    assert expected in report["original"]["log"] and expected in report["port"]["log"]
    # the report itself names the substitution, once
    named = [n for n in report["notes"] if n.startswith(f"torchvision.datasets.{name}(train=True) replaced by 768")]
    assert len(named) == 1, report["notes"]
    lines = [line.split() for line in digests.read_text().splitlines()]
    seen = {side: {int(step): rest for s, step, *rest in lines if s == side} for side in ("original", "port")}
    assert sorted(seen["port"]) == [0, 1, 2]
    for step in range(3):  # the same images and labels, batch by batch (random crops and flips included)
        assert seen["original"][step] == seen["port"][step]
    assert not root.exists()


@pytest.mark.slow
def test_trace_record_notes_and_synthetic_size(tmp_path):
    record = trace_script(DATA / "tv_train.py", ["--dataset", "cifar10", "--data", tmp_path / "none", "--batch-size", "16"],
                          cuda_shim=True, host_random=True, seed=0, synthetic_size=40, cwd=tmp_path,
                          env={"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": _path()}, timeout=600)
    assert record["status"] == "ok", record.get("exception") or record.get("output")
    assert record["num_steps"] == 3  # 40 samples in batches of 16, one epoch
    assert record["synthetic_datasets"] == [
        "torchvision.datasets.CIFAR10(train=True) replaced by 40 synthetic samples (PIL 'RGB' 32x32, labels 0-9); "
        "nothing read or downloaded"]
    assert record["synthetic_datasets"][0] in record["notes"]
    real = trace_script(DATA / "tv_train.py", ["--dataset", "mnist", "--data", tmp_path / "none"], cuda_shim=True,
                        synthetic_data=False, cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": _path()},
                        timeout=600)
    assert real["status"] == "error" and "network access is disabled" in real["exception"]["message"] + real["output"]
