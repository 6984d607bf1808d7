"""A real editor as the client: headless Neovim (Debian's 0.7.2 in CI, installed by
scripts/bootstrap) starts `porter lsp`, shows the diagnostics of a fixture, applies a
quick-fix with vim.lsp.util.apply_workspace_edit(edit, 'utf-16'), and the buffer must equal
what the engine makes of the file with that one fix."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from porter import engine
from porter.context import FileContext
from porter.runner import Settings

REPO = Path(__file__).resolve().parent.parent
INIT = REPO / "tests" / "data" / "lsp" / "init.lua"
MNIST = REPO / "fixtures" / "torch_xla" / "mnist_cnn" / "train.py"
UNICODE = '''\
import torch


def save(model) -> None:
    größe = "🙂🙂"; torch.save(model.state_dict(), f"modèle-{größe}.pt")
'''


def nvim() -> str:
    found = shutil.which("nvim")
    if found is None:
        message = "nvim is not installed (scripts/bootstrap installs Debian's neovim when run as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run this test")
        pytest.skip(message)
    return found


def expected_after_fix(text: str, code: str, nth: int) -> tuple[str, list]:
    result = engine.check(text, Settings().options())
    chosen = [f for f in result.findings if f.code == code][nth - 1]
    assert chosen.fix is not None
    return engine.apply_fixes(result.module, [chosen.fix], FileContext(result.module)).code, result.findings


@pytest.mark.slow
def test_neovim_shows_diagnostics_and_applies_a_quick_fix(tmp_path: Path):
    exe = nvim()
    mnist = tmp_path / "train.py"
    mnist.write_text(MNIST.read_text(encoding="utf-8"), encoding="utf-8")
    uni = tmp_path / "uni.py"
    uni.write_text(UNICODE, encoding="utf-8")
    jobs = [
        {"file": str(mnist), "code": "TX201", "nth": 1, "out": str(tmp_path / "train.fixed.py")},
        {"file": str(uni), "code": "TX704", "nth": 1, "out": str(tmp_path / "uni.fixed.py")},
    ]
    env = dict(os.environ, PORTER_NVIM_JOBS=json.dumps(jobs),
               PORTER_NVIM_CMD=json.dumps([sys.executable, "-m", "porter", "lsp", "--debounce-ms", "50"]),
               HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"), XDG_DATA_HOME=str(tmp_path / "data"))
    proc = subprocess.run([exe, "--headless", "--clean", "-u", str(INIT)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout

    for job, source in ((jobs[0], mnist), (jobs[1], uni)):
        text = source.read_text(encoding="utf-8")
        fixed, findings = expected_after_fix(text, job["code"], job["nth"])
        seen = json.loads(Path(job["out"] + ".json").read_text(encoding="utf-8"))
        # what Neovim holds: porter's findings, at their lines, with their codes
        assert [(d["code"], d["lnum"]) for d in seen] == [(f.code, f.position.line - 1) for f in findings]
        assert all(d["source"] == "porter" for d in seen)
        # Neovim's columns are bytes: the emoji line's finding is where the UTF-8 bytes say
        for d, f in zip(seen, findings):
            line = text.splitlines()[f.position.line - 1]
            assert d["col"] == len(line[: f.position.column].encode("utf-8"))
        assert Path(job["out"]).read_text(encoding="utf-8") == fixed
        assert fixed != text
