"""porter.platforms: the version table's facts hang together and match requirements.lock; the
pin check over requirement files, pip command lines and `porter check`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from porter import platforms
from porter.platforms import check_pins, check_shell_lines, command_pins, requirement_pins

ROOT = Path(__file__).resolve().parent.parent


def test_profiles_are_requirements_lock():
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].split("==")
            lock[platforms.normalize(name.strip())] = version.strip().split()[0]
    for prof in platforms.PROFILES.values():
        for name, version in prof.pins:
            assert lock[platforms.normalize(name)] == version, name
        assert all(f"=={v}" in prof.tpu_install[0] for n, v in prof.pins if n != "jaxlib")


def test_every_row_names_sources_and_facts():
    names = [a.name for a in platforms.table()]
    for wanted in ("v2-8", "v3-8", "v4-8", "v5litepod-1", "v5litepod-4", "v5litepod-8", "v5litepod-16", "v5p-8", "v6e-1", "v6e-4", "v6e-8"):
        assert wanted in names
    for a in platforms.table():
        assert a.family.sources and all(k in platforms.SOURCES for k in a.family.sources)
        assert a.runtime and a.zones
        assert a.hosts is None or a.hosts * (a.chips_per_host or a.chips) >= a.chips
        assert a.hosts is None or a.chips is not None
    assert platforms.accelerator("v5litepod-8").runtime == "v2-alpha-tpuv5-lite"
    assert platforms.accelerator("v5litepod-16").hosts == 2
    assert platforms.accelerator("v6e-8").queued is True and platforms.accelerator("v6e-8").chips_per_host is None
    assert platforms.accelerator("v4-8").chips == 4 and platforms.accelerator("v4-8").hosts is None  # not in the sources
    assert platforms.accelerator("v5p-8").chips == 4 and platforms.accelerator("v5p-8").hosts == 1
    assert platforms.accelerator("v2-8").chips is None and platforms.accelerator("v3-8").hosts is None
    assert platforms.accelerator("v5p-16").hosts == 2 and platforms.accelerator("v5p-16").runtime == "v2-alpha-tpuv5"
    assert platforms.accelerator("v5litepod-64").hosts == 8  # sizes outside the table are read the same way
    for bad in ("v7-8", "v5e-8", "v4-12", "tpu"):
        with pytest.raises(ValueError):
            platforms.accelerator(bad)


def test_table_markdown_says_unknown_where_no_source():
    md = platforms.version_table_markdown()
    row = next(line for line in md.splitlines() if line.startswith("| v6e-8 |"))
    assert "unknown" in row and "`v2-alpha-tpuv6e`" in row
    assert "libtpu" in md and "unknown: the one the `[tpu]` extra selects" in md
    for title, url in platforms.SOURCES.values():
        assert title in md and (not url or url in md)


@pytest.mark.parametrize("line,target,found", [
    ("torch==2.1.0", "torch-xla", ["torch==2.1.0"]),
    ("Torch-XLA==2.5.1  # old", "torch-xla", ["Torch-XLA==2.5.1"]),
    ("torch_xla[tpu]==2.8.0 ; python_version >= '3.10'", "torch-xla", ["torch_xla==2.8.0"]),
    ("torch==2.9.0", "torch-xla", []),
    ("torch~=2.1", "torch-xla", []),
    ("torch>=2.0", "torch-xla", []),
    ("-r other.txt", "torch-xla", []),
    ("jax[tpu]==0.4.30", "jax", ["jax==0.4.30"]),
    ("flax==0.8.5", "jax", ["flax==0.8.5"]),
    ("jax==0.4.30", "torch-xla", []),
    ("numpy==1.26.4", "jax", []),
])
def test_requirement_lines(line, target, found):
    got = check_pins(line + "\n", target)
    assert [f.message.split(" does not")[0] for f in got] == found
    for f in got:
        assert f.line == 1 and line[f.column:f.end_column].startswith(line.split("=")[0].split("[")[0])


@pytest.mark.parametrize("line,expected", [
    ("!pip install -q torch==2.1.0 'torch_xla[tpu]==2.1.0' -f https://example.com/x.html", ["torch", "torch_xla"]),
    ("%pip install torch_xla==2.0", ["torch_xla"]),
    ("python3 -m pip install --upgrade torch==2.0 && python train.py --lr==1", ["torch"]),
    ("sudo pip3 install torch==2.0; echo torch_xla==1", ["torch"]),
    ("RUN uv pip install torch==2.3.0", ["torch"]),
    ("echo torch==2.0", []),
    ("pip download torch==2.0", []),
])
def test_pip_command_lines(line, expected):
    assert [p.package for p in command_pins(line)] == expected
    for p in command_pins(line):
        assert line[p.column:].startswith(p.package)


def test_shell_lines_hook_keeps_line_numbers():
    got = check_shell_lines([(3, "!pip install torch==2.0"), (7, "x = 1"), (9, "!pip install torch_xla==2.9.0")], "torch-xla")
    assert [(f.line, f.column) for f in got] == [(3, 13)]


def test_requirement_pins_positions():
    pins = requirement_pins("# c\n  torch==2.1.0\n\ttorch_xla==2.9.0\t# x\n")
    assert [(p.package, p.line, p.column) for p in pins] == [("torch", 2, 2), ("torch_xla", 3, 1)]


def _records(data):
    """Every finding record in porter check's JSON, whatever its nesting."""
    if isinstance(data, dict):
        if "code" in data and "message" in data and "line" in data:
            yield data
        for v in data.values():
            yield from _records(v)
    elif isinstance(data, list):
        for v in data:
            yield from _records(v)


def test_porter_check_reads_requirement_files(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch==2.1.0\ntorch_xla==2.9.0\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "constraints-tpu.txt").write_text("jax==0.4.1\n")
    (tmp_path / "notes.txt").write_text("torch==1.0\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "requirements.txt").write_text("torch==1.0\n")
    (tmp_path / "run.py").write_text("import subprocess\nsubprocess.run('pip install torch_xla==2.0', shell=True)\n")
    (tmp_path / "bad-requirements.txt").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "requirements-bad.txt").write_bytes(b"torch==\xff\n")
    (tmp_path / "setup_tpu.sh").write_text("#!/bin/sh\nset -e\npython3 -m pip install -q torch==2.9.0 'torch_xla[tpu]==2.4.0'\n")
    (tmp_path / "Dockerfile").write_text("FROM python:3.11\nRUN pip install --no-cache-dir torch==2.3.1\n")

    def check(*extra):
        run = subprocess.run([sys.executable, "-m", "porter", "check", str(tmp_path), "--format", "json", *extra],
                             capture_output=True, text=True, timeout=120)
        return run.returncode, json.loads(run.stdout)

    rc, data = check()
    assert rc == 1
    text = json.dumps(data)
    assert "requirements.txt" in text and "torch==2.1.0" in text and "run.py" in text and "torch_xla==2.0" in text
    assert "notes.txt" not in text and ".venv" not in text and "jax==0.4.1" not in text
    assert "requirements-bad.txt" in text and "not UTF-8" in text
    records = {(r["path"].rsplit("/", 1)[-1], r["line"], r["message"].split(" does")[0]) for r in _records(data)}
    assert ("setup_tpu.sh", 3, "torch_xla==2.4.0") in records and ("Dockerfile", 2, "torch==2.3.1") in records
    rc, data = check("--target", "jax")
    assert "jax==0.4.1" in json.dumps(data) and "torch==2.1.0" not in json.dumps(data)
    rc, data = check("--ignore", "PV")
    assert "does not match" not in json.dumps(data)


def test_notebook_shell_lines_hook():
    from collections import namedtuple

    Line = namedtuple("Line", "cell line text kind")  # the fields of porter.notebook.IPythonLine
    lines = [Line(2, 1, "!pip install -q torch==2.1.0 torch_xla==2.9.0", "shell"), Line(4, 3, "%pip install torch_xla==2.0", "shell")]
    got = platforms.notebook_pin_findings(lines, "torch-xla")
    assert [(cell, f.line, f.column, f.message.split(" does")[0]) for cell, f in got] == [
        (2, 1, 16, "torch==2.1.0"), (4, 3, 13, "torch_xla==2.0")]
