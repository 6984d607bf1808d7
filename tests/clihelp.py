"""Shared helpers for the command-line tests: run the real `porter`, snapshot trees."""
from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from porter.cli import app

REPO = Path(__file__).resolve().parent.parent
VENV_PORTER = REPO / ".venv" / "bin" / "porter"


def porter_exe() -> list[str]:
    """The installed console script when there is one, else `python -m porter`."""
    if VENV_PORTER.exists():
        return [str(VENV_PORTER)]
    return [sys.executable, "-m", "porter"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if ": error: " in line]


def run_porter(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None) -> Result:
    """The real `porter` executable in a subprocess (stdin closed, stderr not a terminal)."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("FORCE_COLOR", None)
    p = subprocess.run(
        [*porter_exe(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, env=full_env,
    )
    return Result(p.returncode, p.stdout, p.stderr)


def cli(*args: str, cwd: Path) -> Result:
    """The same app in-process (typer's CliRunner): fast, same parsing and exit codes."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)
    return Result(r.exit_code, r.stdout, r.stderr)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: kind, bytes' hash (regular files), mtime_ns, mode, link target.

    Never opens anything but regular files (no FIFO blocks, no /proc link is followed)."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                snap[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                try:
                    digest = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError:
                    digest = "unreadable"
                snap[rel] = ("file", digest, st.st_mtime_ns, stat.S_IMODE(st.st_mode), st.st_ino)
            else:
                snap[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_mtime_ns)
    return snap


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".porter-tmp")]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


TRAIN = """\
import torch


def train(model, optimizer, loader):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
"""

TRAIN_FIXED = """\
import torch
import torch_xla.core.xla_model as xm


def train(model, optimizer, loader):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
"""

CLEAN = """\
import torch


def evaluate(model, x):
    with torch.no_grad():
        return model(x)
"""


@pytest.fixture(autouse=False)
def only_tx201(tmp_path):
    """Pin the rule set to TX201 (the rule these tests build their inputs for) through a
    pyproject.toml above every test folder, so that rules added later do not change the
    expected output. Tests that want every rule put their own pyproject.toml nearer."""
    write(tmp_path / "pyproject.toml", '[tool.porter]\nselect = ["TX201"]\n')
    return tmp_path
