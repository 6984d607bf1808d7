"""The CI slice of the torchvision zoo: `porter zoo torchvision.models --to torch-xla` on a few
small real classification builders (the whole package ported, each model verified in its own
processes on real torch_xla beside eager torch), in at most 5 minutes on 2 cores. The models are
verified at 64 pixels (`--image-size 64`: their weights' metadata says 224, and both take any
size), a sixth of the compute of 224: what is checked is the port, not the image."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lanes import every_lane

pytest.importorskip("torchvision", reason="torchvision is not installed")

ROOT = Path(__file__).resolve().parents[1]
# small builders: resnet18 per run of the suite, a second family with PORTER_TEST_EVERY_FIXTURE=1
MODELS = ("resnet18", *every_lane(["squeezenet1_1"]))

pytestmark = [pytest.mark.slow, pytest.mark.xla]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tv")
    cmd = [sys.executable, "-m", "porter", "zoo", "torchvision.models", "--to", "torch-xla", "--out", str(out),
           "--timeout", os.environ.get("PORTER_ZOO_CI_TIMEOUT", "200"), "--jobs", "1", "--image-size", "64", "--format", "json", "--report", str(out / "zoo.html")]
    for m in MODELS:
        cmd += ["--select", m]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PJRT_DEVICE="CPU"), cwd=ROOT,
                          timeout=900)  # a guard: the slice takes at most 5 minutes on 2 idle cores
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout), proc, out


def test_every_small_builder_verifies_within_the_health_budgets(run):
    data, proc, _ = run
    by_name = {m["name"]: m for m in data["models"]}
    assert sorted(by_name) == sorted(MODELS)
    for name, m in by_name.items():
        assert m["status"] == "verified", (name, m["summary"], m["errors"])
        assert m["inputs"] == ["float32[2,3,64,64]"]
        assert m["module"].startswith("torchvision.models.")
        h = m["health"]
        assert h["within_budget"] and h["compiles_after_warmup"] == 0 and h["max_transfers_per_step"] == 0
        assert h["fallback_ops"] == [] and len(h["steps"]) == 3
    assert proc.returncode == 0


def test_summary_and_dashboard(run):
    data, _, out = run
    s = data["summary"]
    assert s["registry"] == "torchvision-like" and s["target"] == "torch-xla"
    assert s["total"] == len(MODELS) and s["counts"]["verified"] == len(MODELS)
    assert sum(s["counts"].values()) == len(MODELS)
    html = (out / "zoo.html").read_text()
    assert all(m in html for m in MODELS)
