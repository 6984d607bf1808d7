"""The repository's code checks: ruff's pyflakes rules ([tool.ruff]), mypy over porter's typed
modules ([tool.mypy]) and import-linter's layer contracts for porter's core and for the rules
in codemods/ ([tool.importlinter]), all configured in pyproject.toml."""
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
    porter._libcst_compat sit below the engine; porter never imports codemods/, and in each
    target of codemods/ no rule imports another rule and no helper imports a rule."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", code, "--no-cache", "--config", "pyproject.toml"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_import_layers_catch_a_rule_importing_a_rule(tmp_path):
    """The codemods/ contracts fail on a copy of the tree where a helper imports a rule and a
    rule imports another rule's private name (a contract that cannot fail guards nothing)."""
    import shutil

    for package in ("porter", "codemods"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    helper = tmp_path / "codemods" / "torch_xla" / "_tables.py"
    helper.write_text(helper.read_text(encoding="utf-8") + "\nfrom . import tx001_deprecated_xla_api  # noqa\n", encoding="utf-8")
    rule = tmp_path / "codemods" / "gluon" / "gl006_array_creation.py"
    rule.write_text(rule.read_text(encoding="utf-8") + "\nfrom .gl005_random import _SEED  # noqa\n", encoding="utf-8")
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", code, "--no-cache", "--config", "pyproject.toml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout
    assert "torch_xla rules: no rule imports another rule, no helper imports a rule BROKEN" in out, out[-3000:]
    assert "gluon rules: no rule imports another rule, no helper imports a rule BROKEN" in out, out[-3000:]
    assert "jax rules: no rule imports another rule, no helper imports a rule KEPT" in out, out[-3000:]
    assert "codemods.gluon.gl006_array_creation -> codemods.gluon.gl005_random" in out
    assert "codemods.torch_xla._tables -> codemods.torch_xla.tx001_deprecated_xla_api" in out
