"""`porter verify --reference` with a Flax NNX port: the torch original's float64 forward and
backward tell float32 rounding from a real difference. At a tolerance below float32 rounding
(atol 1e-7, rtol 1e-6) the hand-written port of the CNN differs from torch in its conv,
BatchNorm and Linear outputs by rounding alone, and passes only with the reference; a port
with a real difference (a BatchNorm eps, an activation scaled by 0.999) still diverges at
the layer that differs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "verify" / "jax"
CNN = ("--model", "SmallCNN()", "--input", "float32[4,3,16,16]")
TIGHT = ("--atol", "1e-7", "--rtol", "1e-6", "--steps", "1")

pytestmark = [pytest.mark.slow, pytest.mark.jax]


def _verify(port: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", str(DATA / "cnn.py"), str(port), *CNN, *TIGHT,
                           *extra, "--format", "json"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout, proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (DATA / "cnn_nnx.py").read_text()
    assert text.count(old) == 1, old
    path = tmp_path / f"{name}.py"
    path.write_text(text.replace(old, new))
    return path


def test_rounding_passes_with_the_reference_and_fails_without():
    rc, plain = _verify(DATA / "cnn_nnx.py")
    assert rc == 1 and plain["status"] == "diverged", plain["summary"]
    assert plain["settings"]["reference"] is False
    rc, report = _verify(DATA / "cnn_nnx.py", "--reference")
    assert rc == 0 and report["status"] == "passed", report["summary"]
    assert report["settings"]["reference"] is True
    assert report["timings"]["original_reference_s"] > 0
    # the tensors the elementwise comparison failed are those passed as float32 rounding
    failed = {t["key"] for t in plain["tensors"] if not t["ok"]}
    rounding = {t["key"] for t in report["tensors"] if "float32 rounding" in (t.get("note") or "")}
    assert failed and failed <= rounding | {t["key"] for t in report["tensors"] if t["ok"]}
    assert plain["first_divergence"]["key"] in rounding


@pytest.mark.parametrize("name,old,new,where", [
    ("eps", "self.bn2 = BatchNorm(16, momentum=0.9, epsilon=1e-5, rngs=rngs)",
     "self.bn2 = BatchNorm(16, momentum=0.9, epsilon=1e-3, rngs=rngs)", "output of bn2"),
    ("scaled", "return self.fc(self.drop(x.reshape(x.shape[0], -1)))",
     "return self.fc(self.drop(0.999 * x.reshape(x.shape[0], -1)))", "output of drop"),
])
def test_a_real_difference_still_fails_with_the_reference(tmp_path, name, old, new, where):
    rc, report = _verify(_variant(tmp_path, name, old, new), "--reference")
    assert rc == 1 and report["status"] == "diverged", report["summary"]
    assert report["first_divergence"]["where"] == where


def test_reference_is_model_level_only(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", str(DATA / "cnn.py"), str(DATA / "cnn_nnx.py"),
                           "--script", "--reference"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--reference is for model level" in proc.stderr + proc.stdout
