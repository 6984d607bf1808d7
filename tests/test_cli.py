"""The command line from the user's side: exit codes, outputs, configuration, and what
`porter migrate` does (and does not do) to the files on disk.

Most runs use typer's CliRunner (the same app in-process, fast); the ones that matter most
run the real `porter` executable in a subprocess.
"""
from __future__ import annotations

import ast
import json
import os
import pty
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from clihelp import CLEAN, TRAIN, TRAIN_FIXED, cli, only_tx201, porter_exe, run_porter, snapshot, temp_files, write

pytestmark = pytest.mark.usefixtures("only_tx201")


def make_project(root: Path) -> Path:
    """A small training project: Python files some rule changes, some it leaves alone, and
    files that are not Python."""
    write(root / "train.py", TRAIN)
    write(root / "models" / "__init__.py", "")
    write(root / "models" / "net.py", CLEAN)
    write(root / "models" / "loop.py", TRAIN.replace("optimizer", "opt"))
    write(root / "configs" / "base.yaml", "lr: 0.1\nepochs: 3\n")
    write(root / "README.md", "# demo\n")
    write(root / "data" / "blob.bin", bytes(range(256)) * 4)
    write(root / ".venv" / "lib" / "site.py", TRAIN)  # a virtualenv: never walked
    write(root / "build" / "lib" / "train.py", TRAIN)  # a build dir: never walked
    return root


# --------------------------------------------------------------------------------------
# porter check
# --------------------------------------------------------------------------------------
def test_check_exit_codes_and_text_output_real_executable(tmp_path):
    write(tmp_path / "clean.py", CLEAN)
    write(tmp_path / "train.py", TRAIN)
    ok = run_porter("check", "clean.py", cwd=tmp_path)
    assert ok.code == 0, ok.err
    assert ok.out == ""
    assert "0 finding(s) in 1 file(s)" in ok.err

    bad = run_porter("check", "train.py", "clean.py", cwd=tmp_path)
    assert bad.code == 1
    assert bad.out.splitlines() == [
        "train.py:9:9: TX201 optimizer.step() on XLA: use xm.optimizer_step(optimizer) [*]"
    ]
    assert "1 finding(s) in 2 file(s); 1 fixable with `porter migrate` [*]" in bad.err

    usage = run_porter("check", "train.py", "--format", "xml", cwd=tmp_path)
    assert usage.code == 2
    assert usage.err.strip() == "porter: error: unknown format 'xml'; choose text, json or sarif"
    assert usage.out == ""


def test_check_walks_folders_but_skips_virtualenvs_and_build_dirs(tmp_path):
    make_project(tmp_path / "proj")
    r = cli("check", "proj", cwd=tmp_path)
    assert r.code == 1
    paths = sorted({line.split(":")[0] for line in r.out.splitlines()})
    assert paths == ["proj/models/loop.py", "proj/train.py"]
    assert "in 4 file(s)" in r.err  # train.py, models/{__init__,net,loop}.py; nothing from .venv, build
    assert ".venv" not in r.out and "build" not in r.out


def test_check_json_shape(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    write(tmp_path / "broken.py", "def f(:\n")
    r = cli("check", "train.py", "broken.py", "--format", "json", cwd=tmp_path)
    assert r.code == 1
    doc = json.loads(r.out)
    assert set(doc) == {"porter", "target", "files", "findings", "errors", "summary"}
    assert doc["porter"]["format"] == 1
    assert doc["target"] == "torch-xla"
    assert doc["files"] == 2
    (f,) = doc["findings"]
    assert f == {
        "path": "train.py", "code": "TX201", "rule": "xla-optimizer-step",
        "message": "optimizer.step() on XLA: use xm.optimizer_step(optimizer)",
        "severity": "warning", "line": 9, "column": 9, "end_line": 9, "end_column": 25,
        "fixable": True, "fix_safety": "safe",
    }
    # 1-based columns, end exclusive: the span is exactly the call.
    line = TRAIN.splitlines()[f["line"] - 1]
    assert line[f["column"] - 1:f["end_column"] - 1] == "optimizer.step()"
    (e,) = doc["errors"]
    assert e["path"] == "broken.py" and e["message"].startswith("syntax error")
    assert doc["summary"] == {"findings": 1, "fixable": 1, "files_with_findings": 1, "errors": 1, "by_rule": {"TX201": 1}}
    # nothing else on stdout; the JSON is the whole output
    clean = cli("check", "train.py", "--format", "json", "--ignore", "TX201", cwd=tmp_path)
    assert clean.code == 0 and json.loads(clean.out)["findings"] == []


# The parts of the SARIF 2.1.0 schema (sarif-schema-2.1.0.json) that a log like porter's
# touches: required properties and enumerations.
SARIF_REQUIRED = {
    "log": ("version", "runs"),
    "run": ("tool",),
    "tool": ("driver",),
    "toolComponent": ("name",),
    "reportingDescriptor": ("id",),
    "result": ("message",),
    "invocation": ("executionSuccessful",),
    "notification": ("message",),
}
SARIF_LEVELS = {"none", "note", "warning", "error"}


def _message(m):
    assert isinstance(m, dict) and ("text" in m or "id" in m), m


def _location(loc):
    phys = loc["physicalLocation"]
    art = phys["artifactLocation"]
    assert isinstance(art["uri"], str) and " " not in art["uri"]
    if "region" in phys:
        reg = phys["region"]
        assert reg["startLine"] >= 1 and reg["startColumn"] >= 1
        assert reg["endLine"] >= reg["startLine"] and reg["endColumn"] >= 1
    return art


def test_check_sarif_is_valid_2_1_0(tmp_path):
    write(tmp_path / "my code" / "train.py", TRAIN)
    write(tmp_path / "my code" / "broken.py", "print 'py2'\n")
    r = run_porter("check", "my code", "--format", "sarif", cwd=tmp_path)
    assert r.code == 1
    log = json.loads(r.out)
    for key in SARIF_REQUIRED["log"]:
        assert key in log
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-schema-2.1.0.json")
    (run,) = log["runs"]
    for key in SARIF_REQUIRED["run"]:
        assert key in run
    driver = run["tool"]["driver"]
    assert driver["name"] == "porter"
    assert run["columnKind"] in {"utf16CodeUnits", "unicodeCodePoints"}
    rule_ids = []
    for rule in driver["rules"]:
        assert "id" in rule
        rule_ids.append(rule["id"])
    assert rule_ids == ["TX201"]
    (res,) = run["results"]
    _message(res["message"])
    assert res["level"] in SARIF_LEVELS
    assert driver["rules"][res["ruleIndex"]]["id"] == res["ruleId"] == "TX201"
    (loc,) = res["locations"]
    art = _location(loc)
    assert unquote(art["uri"]) == "my code/train.py" and art["uriBaseId"] in run["originalUriBaseIds"]
    assert loc["physicalLocation"]["region"]["startLine"] == 9
    (inv,) = run["invocations"]
    assert inv["executionSuccessful"] is False
    (note,) = inv["toolExecutionNotifications"]
    _message(note["message"])
    assert note["level"] in SARIF_LEVELS
    assert "broken.py" in note["message"]["text"] and "Python 2" in note["message"]["text"]


def test_select_and_ignore(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    assert cli("check", "train.py", "--select", "TX201", cwd=tmp_path).code == 1
    assert cli("check", "train.py", "--select", "TX2", cwd=tmp_path).code == 1  # a prefix
    assert cli("check", "train.py", "--select", "xla-optimizer-step", cwd=tmp_path).code == 1  # a name
    assert cli("check", "train.py", "--ignore", "TX201", cwd=tmp_path).code == 0
    assert cli("check", "train.py", "--select", "TX201", "--ignore", "TX2", cwd=tmp_path).code == 0
    # the same selection applies to migrate
    r = cli("migrate", "train.py", "--ignore", "TX201", cwd=tmp_path)
    assert r.code == 0 and r.out == ""


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_unknown_rule_code_is_a_usage_error(tmp_path, option):
    write(tmp_path / "train.py", TRAIN)
    r = run_porter("check", "train.py", option, "TX201,XX999", cwd=tmp_path)
    assert r.code == 2
    assert r.out == ""
    assert r.err.splitlines() == [
        f"porter: error: unknown rule code 'XX999' in {option}: no torch-xla rule has this code, "
        "code prefix or name; `porter rules` lists them"
    ]


def test_pyproject_configuration(tmp_path):
    proj = tmp_path / "proj"
    write(proj / "src" / "train.py", TRAIN)
    write(proj / "pyproject.toml", '[project]\nname = "demo"\n\n[tool.porter]\nselect = ["TX2"]\nignore = ["TX201"]\n')
    assert cli("check", "proj/src", cwd=tmp_path).code == 0  # found from the path, not the cwd
    # codes given on the command line are checked as such (and named so in the message)
    r = cli("check", "proj/src", "--ignore", "XX9", cwd=tmp_path)
    assert r.code == 2 and "in --ignore:" in r.err and "pyproject" not in r.err
    write(proj / "pyproject.toml", '[tool.porter]\nselect = ["TX2"]\ntarget = "torch-xla"\nunsafe-fixes = false\n')
    assert cli("check", "proj/src", cwd=tmp_path).code == 1

    write(proj / "pyproject.toml", '[tool.porter]\nselect = ["XX999"]\n')
    r = cli("check", "proj/src", cwd=tmp_path)
    assert r.code == 2 and "'XX999'" in r.err and "pyproject.toml" in r.err
    write(proj / "pyproject.toml", '[tool.porter]\nselct = ["TX2"]\n')
    r = cli("check", "proj/src", cwd=tmp_path)
    assert r.code == 2 and "unknown [tool.porter] keys: selct" in r.err
    write(proj / "pyproject.toml", '[tool.porter]\ntarget = "jaxx"\n')
    r = cli("check", "proj/src", cwd=tmp_path)
    assert r.code == 2 and "unknown target 'jaxx'" in r.err
    write(proj / "pyproject.toml", "[tool.porter\n")
    r = cli("check", "proj/src", cwd=tmp_path)
    assert r.code == 2 and "pyproject.toml" in r.err


def test_suppression_comments(tmp_path):
    src = TRAIN.replace("optimizer.step()", "optimizer.step()  # porter: ignore[TX201]")
    write(tmp_path / "a.py", src)
    write(tmp_path / "b.py", TRAIN.replace("optimizer.step()", "optimizer.step()  # porter: ignore"))
    write(tmp_path / "c.py", TRAIN.replace("optimizer.step()", "optimizer.step()  # porter: ignore[XX999]"))
    r = cli("check", "a.py", "b.py", "c.py", cwd=tmp_path)
    assert r.code == 1
    assert [line.split(":")[0] for line in r.out.splitlines()] == ["c.py"]
    m = cli("migrate", "a.py", "b.py", cwd=tmp_path)
    assert m.code == 0 and m.out == ""  # a suppressed finding is not fixed either


def test_usage_errors(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    cases = [
        (["check", "missing.py"], "missing.py: no such file or folder"),
        (["migrate", "train.py", "--write", "--out", "o"], "--write and --out exclude each other"),
        (["migrate", "train.py", "--to", "tpu"], "unknown target 'tpu'"),
        (["explain", "XX999"], "no rule 'XX999'"),
    ]
    for args, message in cases:
        r = cli(*args, cwd=tmp_path)
        assert r.code == 2, (args, r.err)
        assert message in r.err
    assert cli("check", "train.py", "--jobs", "0", cwd=tmp_path).code == 2
    assert not (tmp_path / "o").exists()


def test_rules_and_explain(tmp_path):
    r = run_porter("rules", cwd=tmp_path)
    assert r.code == 0 and "TX201" in r.out and "xla-optimizer-step" in r.out
    from porter import registry

    for info in registry.infos():  # every rule, each name whole (no markup eaten)
        assert info.code in r.out and info.name in r.out
    e = cli("explain", "TX201", cwd=tmp_path)
    assert e.code == 0 and "## What it does" in e.out and "xm.optimizer_step" in e.out
    assert cli("explain", "xla-optimizer-step", cwd=tmp_path).out == e.out


# --------------------------------------------------------------------------------------
# porter migrate
# --------------------------------------------------------------------------------------
def test_migrate_diff_mode_writes_nothing_and_the_diff_applies(tmp_path):
    proj = make_project(tmp_path / "proj")
    before = snapshot(proj)
    time.sleep(0.01)
    r = run_porter("migrate", "proj", "--to", "torch-xla", cwd=tmp_path)
    assert r.code == 0, r.err
    assert snapshot(proj) == before  # same bytes, mtimes, modes, inodes; no new files
    assert "+++ b/proj/train.py" in r.out and "+++ b/proj/models/loop.py" in r.out
    assert "2 file(s) would change, 2 unchanged, 0 failed; nothing written" in r.err

    # The diff is a real patch: applied to a copy it gives what --out writes.
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy / "proj", symlinks=True)
    subprocess.run(["patch", "-p1", "-s"], input=r.out, text=True, cwd=copy, check=True)
    assert (copy / "proj" / "train.py").read_text() == TRAIN_FIXED
    out = cli("migrate", "proj", "--out", "ported", cwd=tmp_path)
    assert out.code == 0
    for rel in ("train.py", "models/loop.py", "models/net.py"):
        assert (copy / "proj" / rel).read_bytes() == (tmp_path / "ported" / rel).read_bytes()


def test_migrate_write_in_place_atomically(tmp_path):
    proj = make_project(tmp_path / "proj")
    os.chmod(proj / "train.py", 0o751)
    os.symlink("train.py", proj / "alias.py")  # a second name for the same file
    before = snapshot(proj)
    r = run_porter("migrate", "proj", "--write", cwd=tmp_path)
    assert r.code == 0, r.err
    after = snapshot(proj)
    assert (proj / "train.py").read_text() == TRAIN_FIXED
    assert stat.S_IMODE(os.stat(proj / "train.py").st_mode) == 0o751  # permissions kept
    assert after["train.py"][4] != before["train.py"][4]  # replaced by rename, not rewritten
    assert os.readlink(proj / "alias.py") == "train.py"  # the link is kept, its target rewritten
    assert after["models/net.py"] == before["models/net.py"]  # nothing to change: untouched
    assert after["configs/base.yaml"] == before["configs/base.yaml"]
    assert set(after) == set(before)
    assert temp_files(proj) == []
    assert "2 file(s) changed" in r.err
    # Running again changes nothing.
    again = cli("migrate", "proj", "--write", cwd=tmp_path)
    assert again.code == 0 and "0 file(s) changed" in again.err
    assert snapshot(proj) == after


def test_migrate_out_writes_the_whole_tree_and_leaves_the_source_alone(tmp_path):
    proj = make_project(tmp_path / "proj")
    os.symlink("base.yaml", proj / "configs" / "current.yaml")
    before = snapshot(proj)
    r = run_porter("migrate", "proj", "--out", "ported", cwd=tmp_path)
    assert r.code == 0, r.err
    assert r.out == ""
    assert snapshot(proj) == before
    out = tmp_path / "ported"
    assert (out / "train.py").read_text() == TRAIN_FIXED
    # untouched files, Python or not, are copied byte for byte; symlinks stay symlinks
    for rel in ("models/net.py", "models/__init__.py", "configs/base.yaml", "README.md", "data/blob.bin"):
        assert (out / rel).read_bytes() == (proj / rel).read_bytes(), rel
    assert os.readlink(out / "configs" / "current.yaml") == "base.yaml"
    assert not (out / ".venv").exists() and not (out / "build").exists()
    # every Python file of the output parses
    for py in out.rglob("*.py"):
        ast.parse(py.read_bytes())
    assert temp_files(out) == []
    assert "2 file(s) converted, 2 unchanged, 0 failed; 4 other file(s) copied" in r.err
    # porter on its own output changes nothing
    again = run_porter("migrate", "ported", cwd=tmp_path)
    assert again.code == 0 and again.out == ""
    assert "0 file(s) would change" in again.err
    assert cli("check", "ported", "--select", "TX201", cwd=tmp_path).code == 0


def test_migrate_out_for_single_files(tmp_path):
    write(tmp_path / "src" / "train.py", TRAIN)
    write(tmp_path / "src" / "pkg" / "loop.py", TRAIN)
    write(tmp_path / "src" / "notes.txt", "x\n")
    r = cli("migrate", "src/train.py", "--out", "o1", cwd=tmp_path)
    assert r.code == 0, r.err
    assert sorted(p.name for p in (tmp_path / "o1").iterdir()) == ["train.py"]
    assert (tmp_path / "o1" / "train.py").read_text() == TRAIN_FIXED
    # several paths: the output mirrors their common folder
    r = cli("migrate", "src/train.py", "src/pkg/loop.py", "--out", "o2", cwd=tmp_path)
    assert r.code == 0, r.err
    assert (tmp_path / "o2" / "train.py").read_text() == TRAIN_FIXED
    assert (tmp_path / "o2" / "pkg" / "loop.py").read_text() == TRAIN_FIXED


def test_migrate_out_may_not_overlap_the_sources(tmp_path):
    proj = make_project(tmp_path / "proj")
    before = snapshot(proj)
    cases = [
        (["proj", "--out", "proj"], "is the source folder proj"),
        (["proj", "--out", "proj/ported"], "lies inside the source folder proj"),
        (["proj/train.py", "--out", "proj"], "would overwrite the source file proj/train.py"),
        (["proj/models", "--out", "."], "lies inside --out"),
        (["proj", "--out", "proj/README.md"], "exists and is not a folder"),
    ]
    for args, message in cases:
        r = cli("migrate", *args, cwd=tmp_path)
        assert r.code == 2, args
        assert message in r.err, (args, r.err)
    assert snapshot(proj) == before
    assert not (tmp_path / "proj" / "ported").exists()


def test_jobs_two_gives_the_same_results_as_jobs_one(tmp_path):
    proj = tmp_path / "proj"
    for i in range(24):
        body = TRAIN if i % 3 else CLEAN
        write(proj / f"pkg{i % 4}" / f"m{i}.py", body.replace("optimizer", f"opt{i}"))
    write(proj / "pkg0" / "broken.py", "def f(:\n")
    one = run_porter("migrate", "proj", "--jobs", "1", cwd=tmp_path)
    two = run_porter("migrate", "proj", "--jobs", "2", cwd=tmp_path)
    assert one.code == two.code == 1
    assert one.out == two.out and one.out.count("+++ ") == 16
    assert one.err == two.err
    c1 = cli("check", "proj", "--format", "json", "-j", "1", cwd=tmp_path)
    c2 = cli("check", "proj", "--format", "json", "-j", "2", cwd=tmp_path)
    assert c1.out == c2.out and c1.code == c2.code == 1
    o1 = cli("migrate", "proj", "--out", "o1", "--jobs", "1", cwd=tmp_path)
    o2 = cli("migrate", "proj", "--out", "o2", "--jobs", "2", cwd=tmp_path)
    assert o1.code == o2.code == 1

    def contents(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert contents(tmp_path / "o1") == contents(tmp_path / "o2")


def test_migrate_reports_findings_left_for_a_human_and_a_summary_by_rule(tmp_path):
    write(tmp_path / "train.py", TRAIN + "\n\ndef also(optimizer):\n    optimizer.step()  # porter: ignore\n")
    r = cli("migrate", "train.py", "--out", "o", cwd=tmp_path)
    assert r.code == 0
    lines = r.err.splitlines()
    assert any(line.startswith("porter migrate --to torch-xla: 1 file(s) converted") for line in lines)
    table = [line.split() for line in lines if line.strip().startswith(("rule", "TX"))]
    assert table == [["rule", "fixed", "left", "for", "a", "human"], ["TX201", "1", "0"]]


def test_progress_bar_only_on_a_terminal(tmp_path):
    proj = make_project(tmp_path / "proj")
    plain = run_porter("migrate", "proj", cwd=tmp_path)
    assert "\x1b[" not in plain.err and "━" not in plain.err
    # stderr on a pseudo-terminal: the bar is drawn (and removed again at the end)
    leader, follower = pty.openpty()
    try:
        p = subprocess.run(
            [*porter_exe(), "migrate", "proj"], cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=follower, stdin=subprocess.DEVNULL, timeout=120,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
    tty_err = b"".join(chunks).decode("utf-8", "replace")
    assert p.returncode == 0
    assert "porter migrate" in tty_err and "4/4" in tty_err
    assert p.stdout.decode() == plain.out  # stdout is the same diff either way


def test_ctrl_c_stops_the_batch_and_leaves_only_whole_files(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during `--write --jobs 2`:
    exit 130 with one message, no traceback, no temporary file, and every file either as it
    was or fully converted."""
    proj = tmp_path / "proj"
    body = TRAIN + "".join(f"\n\ndef helper_{i}(x):\n    return x * {i}\n" for i in range(400))
    fixed = TRAIN_FIXED + body[len(TRAIN):]
    for i in range(300):
        write(proj / f"m{i:03d}.py", body)
    p = subprocess.Popen(
        [*porter_exe(), "migrate", "proj", "--write", "--jobs", "2"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True,
        # Ctrl-C as porter hears it on a terminal, also when this suite runs as a background
        # job (which starts with SIGINT ignored: Python then installs no KeyboardInterrupt)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # interrupt once the batch is under way: the first file replaced (atomic writes give it a
    # new inode), not after a fixed delay that a loaded machine may not reach porter's main in
    inodes = {f.name: f.stat().st_ino for f in proj.iterdir()}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if any(f.stat().st_ino != inodes.get(f.name) for f in proj.iterdir() if f.name in inodes):
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert err.strip() == "porter: interrupted; files already written are whole (writes are atomic)"
    assert "Traceback" not in err
    contents = [f.read_text() for f in sorted(proj.iterdir())]
    assert len(contents) == 300 and temp_files(proj) == []
    assert all(c in (body, fixed) for c in contents)
    assert body in contents  # it was stopped before the end


def test_every_option_help_reads_as_written():
    """Typer renders help text as Rich markup: an unescaped `[tool.porter]` or `dtype[shape]`
    is taken for a style tag and vanishes from `porter ... --help`. Every option's help must
    appear whole (with `\\[` read as `[`)."""
    import typer.main
    from typer.testing import CliRunner

    from porter.cli import app

    def commands(cmd, path=()):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from commands(sub, (*path, name))

    lost = []
    for path, cmd in commands(typer.main.get_command(app)):
        shown = " ".join(CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "2000"}).output.split())
        for param in cmd.params:
            text = " ".join((param.help or "").replace("\\[", "[").split())
            if text and text not in shown:
                lost.append((" ".join(path), param.name, text))
    assert not lost
