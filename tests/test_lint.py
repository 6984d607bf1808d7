"""The repository's code checks: ruff's pyflakes rules ([tool.ruff]), mypy over porter's typed
modules ([tool.mypy]) and import-linter's layer contracts for porter's core
([tool.importlinter]), all configured in pyproject.toml."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_passes():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_passes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy"), "--no-color-output"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_import_layers_are_kept():
    """porter's core (engine, rules, edits, context, registry, ...) never imports a front end
    (cli, lsp, notebook, zoo, kits, verify, runner), directly or not; porter.edits and
    porter._libcst_compat sit below the engine."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", code, "--no-cache", "--config", "pyproject.toml"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
