"""A slice of benchmarks/realworld.py (the corpus ported to both targets and verified at script
level): two small tutorial scripts, safe mode, both targets. Skipped without ../shared/corpus."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("PORTER_CORPUS", REPO.parent / "shared" / "corpus"))

pytestmark = [pytest.mark.xla, pytest.mark.slow,
              pytest.mark.skipif(not (CORPUS / "torch").is_dir(), reason="no ../shared/corpus")]


def test_realworld_slice_writes_rows_and_table(tmp_path):
    out, doc = tmp_path / "realworld.json", tmp_path / "realworld.md"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "realworld.py"), "--only", "linear_regression",
                           "--only", "logistic_regression", "--targets", "torch-xla,jax", "--modes", "safe",
                           "--steps", "2", "--jobs", "2", "--out", str(out), "--doc", str(doc)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert sorted((r["script"].split("/")[-2], r["target"]) for r in rows) == [
        ("linear_regression", "jax"), ("linear_regression", "torch-xla"),
        ("logistic_regression", "jax"), ("logistic_regression", "torch-xla")]
    for r in rows:
        assert r["migrate"]["ok"], r
        assert r["verify"]["status"] in ("passed", "diverged", "over-budget", "side-failed"), r
        if r["verify"]["status"] != "side-failed":
            assert "health" in r["verify"], r
    text = doc.read_text(encoding="utf-8")
    assert text.count("| pytorch-tutorial/01-basics/") == 4
    # the table is regenerated from the JSON alone
    again = subprocess.run([sys.executable, str(REPO / "benchmarks" / "realworld.py"), "--render", "--out", str(out),
                            "--doc", str(tmp_path / "again.md")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and (tmp_path / "again.md").read_text(encoding="utf-8") == text
