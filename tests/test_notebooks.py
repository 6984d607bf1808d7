"""Notebooks (porter/notebook.py): the ports of fixtures/notebooks/ byte for byte, idempotence,
untouched notebooks identical, the JSON layout kept, IPython lines masked and restored, the
bad-notebook errors, findings that name the cell (text, JSON, SARIF) and per-cell diffs.

No framework starts here (the rules run in this process). The executed ports:
tests/test_notebooks_run.py. ``python tests/test_notebooks.py --regen`` rewrites the expected
notebooks from the current rules (review the diff).
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from porter import notebook, runner
from porter.engine import PorterError

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures" / "notebooks"
# (fixture, target) -> expected file; the others must come out unchanged
PORTS = {
    ("train_classifier", "torch-xla"): "expected_torch_xla.ipynb",
    ("train_classifier", "jax"): "expected_jax.ipynb",
    ("multi_gpu", "torch-xla"): "expected_torch_xla.ipynb",
    ("multi_gpu", "jax"): "expected_jax.ipynb",
    ("magics", "torch-xla"): "expected_torch_xla.ipynb",
    ("magics", "jax"): "expected_jax.ipynb",
}
UNCHANGED = [("nothing_to_port", "torch-xla"), ("nothing_to_port", "jax")]


def _port(name: str, target: str, out: Path) -> runner.FileOutcome:
    settings = runner.Settings(target=target, time_limit=0, memory_mb=0)
    return notebook.migrate_file(FIXTURES / name / "notebook.ipynb", settings, "out", out)


@pytest.mark.parametrize("name,target", sorted(PORTS), ids=[f"{n}-{t}" for n, t in sorted(PORTS)])
def test_port_is_byte_identical_to_expected(name, target, tmp_path):
    out = tmp_path / "out.ipynb"
    outcome = _port(name, target, out)
    assert outcome.status == "changed", outcome.error
    expected = FIXTURES / name / PORTS[(name, target)]
    assert out.read_bytes() == expected.read_bytes(), f"port of {name} ({target}) changed: review, then `python tests/test_notebooks.py --regen`"


@pytest.mark.parametrize("name,target", sorted(PORTS), ids=[f"{n}-{t}" for n, t in sorted(PORTS)])
def test_port_is_idempotent_valid_and_changes_only_code_sources(name, target, tmp_path):
    expected = FIXTURES / name / PORTS[(name, target)]
    nbformat.validate(nbformat.read(expected, as_version=nbformat.NO_CONVERT))
    again = tmp_path / "again.ipynb"
    settings = runner.Settings(target=target, time_limit=0, memory_mb=0)
    outcome = notebook.migrate_file(expected, settings, "out", again)
    assert outcome.status == "unchanged", outcome.error or outcome.diff
    assert again.read_bytes() == expected.read_bytes()
    before = json.loads((FIXTURES / name / "notebook.ipynb").read_text(encoding="utf-8"))
    after = json.loads(expected.read_text(encoding="utf-8"))
    assert list(before) == list(after) and before["metadata"] == after["metadata"]
    assert len(before["cells"]) == len(after["cells"])
    changed = 0
    for old, new in zip(before["cells"], after["cells"]):
        assert {k: v for k, v in old.items() if k != "source"} == {k: v for k, v in new.items() if k != "source"}
        assert list(old) == list(new)  # key order
        assert type(old["source"]) is type(new["source"])
        if old["source"] != new["source"]:
            assert old["cell_type"] == "code" and not old["source"].__str__().startswith("%%bash")
            changed += 1
    assert changed >= 1


@pytest.mark.parametrize("name,target", UNCHANGED, ids=[f"{n}-{t}" for n, t in UNCHANGED])
def test_a_notebook_with_nothing_to_change_stays_byte_identical(name, target, tmp_path):
    src = tmp_path / "nb.ipynb"
    shutil.copy(FIXTURES / name / "notebook.ipynb", src)
    settings = runner.Settings(target=target, time_limit=0, memory_mb=0)
    assert notebook.migrate_file(src, settings, "write").status == "unchanged"
    assert src.read_bytes() == (FIXTURES / name / "notebook.ipynb").read_bytes()
    out = tmp_path / "o.ipynb"
    assert notebook.migrate_file(src, settings, "out", out).status == "unchanged"
    assert out.read_bytes() == src.read_bytes()


def test_training_notebook_keeps_outputs_and_ports_across_cells():
    """The device (cell 4), the loop (cell 8) and the imports (cell 3) are in different cells:
    the fixes need all three; the imports go to the imports cell, after its last import."""
    before = nbformat.read(FIXTURES / "train_classifier" / "notebook.ipynb", as_version=4)
    after = nbformat.read(FIXTURES / "train_classifier" / "expected_torch_xla.ipynb", as_version=4)
    assert any("image/png" in o.get("data", {}) for c in after.cells if c.cell_type == "code" for o in c.outputs)
    assert [c.get("execution_count") for c in before.cells] == [c.get("execution_count") for c in after.cells]
    imports = after.cells[2].source.splitlines()
    assert imports[0] == "%matplotlib inline" and imports[-1].startswith("import torch_xla")
    assert "import matplotlib.pyplot as plt" in imports[:imports.index("import torch_xla")]
    assert "torch_xla.device()" in after.cells[3].source
    assert "MpDeviceLoader" in after.cells[7].source and "xm.optimizer_step(optimizer)" in after.cells[7].source
    assert after.cells[1].source == before.cells[1].source == "!pip install --quiet --no-index --no-deps torch"


def test_layout_of_another_writer_is_kept():
    """multi_gpu is written with indent 2, sources as strings, \\u escapes, no final newline."""
    raw = (FIXTURES / "multi_gpu" / "expected_torch_xla.ipynb").read_text(encoding="utf-8")
    assert raw.isascii() and "\\u2014" in raw and not raw.endswith("\n")
    assert raw.startswith('{\n  "cells": [\n    {\n')
    doc = json.loads(raw)
    assert all(isinstance(c["source"], str) for c in doc["cells"])
    assert "init_method='xla://'" in doc["cells"][2]["source"]


def test_magic_cells_kept_and_python_magics_ported():
    before = nbformat.read(FIXTURES / "magics" / "notebook.ipynb", as_version=4)
    after = nbformat.read(FIXTURES / "magics" / "expected_torch_xla.ipynb", as_version=4)
    for i in (3, 4, 5, 6, 7):  # %%time (nothing to change once gpu is XLA's), %%bash, %%writefile, !pip \ ..., raw
        assert after.cells[i].source == before.cells[i].source
    assert ".cuda()" in after.cells[5].source  # %%writefile is left alone
    assert after.cells[2].source.splitlines()[0] == "files = !ls"
    assert "torch_xla.device()" in after.cells[2].source and after.cells[2].source.endswith("torch.randn?")


# --------------------------------------------------------------------------------------
# IPython lines
# --------------------------------------------------------------------------------------
MASKED = [
    ("%matplotlib inline\nx = 1\n", [1]),
    ("%time x = f()\n", [1]),
    ("%load_ext autoreload\n%autoreload 2", [1, 2]),
    ("!pip install torch\n", [1]),
    ("files = !ls -1\n", [1]),
    ("a, b = !echo 1; echo 2\n", [1]),
    ("out = %sx ls\n", [1]),
    ("torch.randn?\n", [1]),
    ("np.mean??\n", [1]),
    ("?len\n", [1]),
    ("for i in range(2):\n    %time f(i)\n    !echo {i}\n", [2, 3]),
    ("%%time\nx = f()\n%time y = g()\n", [1, 3]),
    ("!pip install a \\\n    b \\\n    c\nimport a\n", [1, 2, 3]),
    ("get_ipython().system('ls')\nget_ipython().run_line_magic('time', 'f()')\n", []),
    # Python that looks like IPython: never masked
    ("x = (a\n% b)\n", []),
    ("s = '''\n%not a magic\n!nor a shell\n'''\n", []),
    ("y = 5 % 3\nz = x != y\nw = not x\n", []),
    ("a %= 3\n", []),
    ("# what is this?\nx = 1  # or this?\n", []),
    ("print('?')\n", []),
]


@pytest.mark.parametrize("source,lines", MASKED, ids=range(len(MASKED)))
def test_ipython_lines_masked_and_restored_exactly(source, lines):
    masked = notebook.mask(source)
    assert sorted(masked.where.values()) == lines
    compile(masked.text, "<cell>", "exec")  # the stand-ins are Python
    assert notebook.unmask(masked.text, masked.lines) == source
    assert masked.text.count("\n") == source.count("\n")


def test_shell_lines_of_a_notebook():
    text = (FIXTURES / "magics" / "notebook.ipynb").read_text(encoding="utf-8")
    shell = notebook.shell_lines(text)
    assert [(x.cell, x.line, x.text) for x in shell] == [
        (3, 1, "files = !ls"), (7, 1, "!pip install --upgrade \\"), (7, 2, "    torch==2.9.0 \\"), (7, 3, "    torchvision"),
    ]
    kinds = {x.text: x.kind for x in notebook.ipython_lines(text)}
    assert kinds["%%time"] == "cell-magic" and kinds["torch.randn?"] == "help" and kinds["%autoreload 2"] == "magic"
    train = (FIXTURES / "train_classifier" / "notebook.ipynb").read_text(encoding="utf-8")
    assert [x.text for x in notebook.shell_lines(train)] == ["!pip install --quiet --no-index --no-deps torch"]


def _nb(cells, **meta) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata = meta or {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    nb.cells = [nbformat.v4.new_code_cell(c) if isinstance(c, str) else c for c in cells]
    for i, c in enumerate(nb.cells):
        c.id = f"c{i}"
    return nbformat.writes(nb) + "\n"


def test_imports_go_to_the_first_cell_with_module_level_imports(tmp_path):
    src = tmp_path / "nb.ipynb"
    src.write_text(_nb(["%%bash\necho hi", "!nvidia-smi\n%matplotlib inline\n# setup\nx = 1\ndef f():\n    import os",
                        "# the model\nimport torch\n\ndev = torch.device('cuda')\nprint(dev)", "import math"]))
    outcome = notebook.migrate_file(src, runner.Settings(time_limit=0, memory_mb=0), "write")
    assert outcome.status == "changed", outcome.error
    cells = nbformat.read(src, as_version=4).cells
    assert cells[0].source == "%%bash\necho hi"
    assert cells[1].source == "!nvidia-smi\n%matplotlib inline\n# setup\nx = 1\ndef f():\n    import os"
    assert cells[2].source == "# the model\nimport torch\nimport torch_xla\n\ndev = torch_xla.device()\nprint(dev)"
    assert cells[3].source == "import math"
    assert notebook.migrate_file(src, runner.Settings(time_limit=0, memory_mb=0), "diff").status == "unchanged"


@pytest.mark.parametrize("magic", ["%time", "%timeit", "%prun"])
def test_code_on_a_timing_line_magic_is_reported_not_rewritten(tmp_path, magic):
    src = tmp_path / "nb.ipynb"
    timed = f"{magic} out = net(batch.cuda())"
    src.write_text(_nb(["import torch\nnet = torch.nn.Linear(2, 2)\nbatch = torch.zeros(1, 2)",
                        f"for i in range(2):\n    {timed}\n{magic} -n 1 net(batch.cuda())"]))
    before = src.read_bytes()
    check = notebook.check_file(src, runner.Settings(time_limit=0, memory_mb=0))
    (left,) = [f for f in check.findings if f.cell == 2]
    assert left.line == 2 and not left.fixable and notebook.TIMED_NOTE in left.message
    line = nbformat.read(src, as_version=4).cells[1].source.splitlines()[1]
    assert line[left.column:].startswith("batch.cuda()") or line[left.column:].startswith(".cuda()")
    outcome = notebook.migrate_file(src, runner.Settings(time_limit=0, memory_mb=0), "write")
    assert src.read_bytes() == before and outcome.status == "unchanged"
    assert [(f.cell, f.line, f.code) for f in outcome.findings if f.cell == 2] == [(2, 2, left.code)]


def test_findings_after_migrate_point_into_the_converted_cells(tmp_path):
    """A finding left in the imports cell, below the imports a fix added there: its line is
    the line in the converted cell."""
    src = tmp_path / "nb.ipynb"
    src.write_text(_nb([
        "import torch\nimport torch.nn as nn\nds = torch.utils.data.TensorDataset(torch.zeros(10, 2))\n"
        "loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)",
        "model = nn.Linear(2, 2).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)",
        "for (x,) in loader:\n    x = x.cuda()\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()",
    ]))
    outcome = notebook.migrate_file(src, runner.Settings(time_limit=0, memory_mb=0), "write")
    assert outcome.status == "changed", outcome.error
    cells = nbformat.read(src, as_version=4).cells
    left = [f for f in outcome.findings if f.code == "TX302"]
    assert left and left[0].cell == 1
    line = cells[0].source.splitlines()[left[0].line - 1]
    assert line[left[0].column:].startswith("torch.utils.data.DataLoader(")
    assert cells[0].source.splitlines()[2].startswith("import torch_xla")  # the imports came first


@pytest.mark.parametrize("gap", ["", "\n", "\n\n"], ids=["no-gap", "one-blank", "two-blanks"])
def test_code_a_fix_adds_at_the_end_of_a_cell_adds_no_trailing_blank_lines(tmp_path, gap):
    """--to jax adds the weight converter after the model classes, at the end of their cell:
    the cell ends as it did (its own trailing blank lines, no more)."""
    src = tmp_path / "nb.ipynb"
    model = "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(4, 2)\n\n    def forward(self, x):\n        return self.fc(x)\n" + gap
    src.write_text(_nb(["import torch\nimport torch.nn as nn", model, "net = Net()\nprint(net(torch.zeros(1, 4)).shape)"]))
    outcome = notebook.migrate_file(src, runner.Settings(target="jax", time_limit=0, memory_mb=0), "write")
    assert outcome.status == "changed", outcome.error
    cell = nbformat.read(src, as_version=4).cells[1].source
    assert "def load_torch_state_dict" in cell
    assert cell.endswith("    }\n" + gap) and not cell.endswith("\n\n" + gap), repr(cell[-40:])
    assert notebook.migrate_file(src, runner.Settings(target="jax", time_limit=0, memory_mb=0), "diff").status == "unchanged"


# --------------------------------------------------------------------------------------
# Bad notebooks
# --------------------------------------------------------------------------------------
BAD = {
    "invalid_json.ipynb": ('{"cells": [', "not a notebook: invalid JSON"),
    "v3.ipynb": (json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": []}), "nbformat 3 notebook"),
    "r_kernel.ipynb": (_nb(["x <- 1"], kernelspec={"name": "ir", "language": "R", "display_name": "R"}), "kernel language is R"),
    "sql_cell.ipynb": (None, "cell 2 is a sql cell"),
    "syntax.ipynb": (_nb(["import torch", "def f(:\n    pass"]), "cell 2: syntax error at line 1"),
    "not_schema.ipynb": (json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}), "not a valid nbformat 4 notebook"),
}


def _sql_notebook() -> str:
    cell = nbformat.v4.new_code_cell("SELECT * FROM runs")
    cell.metadata = {"vscode": {"languageId": "sql"}}
    return _nb(["import torch", cell])


def test_bad_notebooks_fail_alone_and_nothing_is_written(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    for name, (text, _) in BAD.items():
        (folder / name).write_text(_sql_notebook() if text is None else text)
    good = folder / "good.ipynb"
    good.write_text(_nb(["import torch", "x = torch.zeros(2).cuda()"]))
    (folder / ".ipynb_checkpoints").mkdir()
    shutil.copy(good, folder / ".ipynb_checkpoints" / "good-checkpoint.ipynb")
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    outcomes = runner.run("migrate", [folder], runner.Settings(time_limit=0, memory_mb=0), mode="write")
    by_name = {Path(o.path).name: o for o in outcomes}
    assert set(by_name) == set(before)  # the checkpoint folder is skipped
    assert by_name["good.ipynb"].status == "changed"
    assert "torch_xla.device()" in good.read_text()
    for name, (_, message) in BAD.items():
        assert by_name[name].status == "failed" and message in by_name[name].error, (name, by_name[name].error)
        assert "\n" not in by_name[name].error
        assert (folder / name).read_bytes() == before[name]


def test_reserved_names_are_refused():
    with pytest.raises(PorterError, match="reserves"):
        notebook.parse(_nb(["__porter_cell__(1)"]))


# --------------------------------------------------------------------------------------
# The command line: findings that name the cell, per-cell diffs
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    from clihelp import cli, run_porter

    work = tmp_path_factory.mktemp("cli")
    shutil.copy(FIXTURES / "train_classifier" / "notebook.ipynb", work / "train.ipynb")
    shutil.copy(FIXTURES / "multi_gpu" / "notebook.ipynb", work / "multi.ipynb")
    (work / "script.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    # the real executable for what a terminal shows; the JSON and SARIF documents in this process
    return work, {
        "text": run_porter("check", ".", cwd=work),
        "json": cli("check", ".", "--format", "json", cwd=work),
        "sarif": cli("check", "multi.ipynb", "train.ipynb", "--format", "sarif", cwd=work),
        "diff": run_porter("migrate", "train.ipynb", cwd=work),
    }


def test_check_text_names_the_cell(cli_runs):
    _, runs = cli_runs
    lines = runs["text"].out.splitlines()
    assert runs["text"].code == 1
    assert "train.ipynb:cell 4:1:10: TX101 " in "\n".join(lines)
    assert any(line.startswith("train.ipynb:cell 8:9:9: TX201 ") for line in lines), lines
    assert any(line.startswith("script.py:2:") for line in lines)  # .py files as before
    assert any(line.startswith("multi.ipynb:cell 3:") for line in lines)


def test_check_json_has_the_cell(cli_runs):
    _, runs = cli_runs
    doc = json.loads(runs["json"].out)
    tx101 = [f for f in doc["findings"] if f["path"] == "train.ipynb" and f["code"] == "TX101"]
    assert tx101 and tx101[0]["cell"] == 4 and (tx101[0]["line"], tx101[0]["column"]) == (1, 10)
    assert all("cell" not in f for f in doc["findings"] if f["path"] == "script.py")
    assert doc["files"] == 3


def test_sarif_region_points_into_the_notebook_file(cli_runs):
    work, runs = cli_runs
    doc = json.loads(runs["sarif"].out)
    results = doc["runs"][0]["results"]
    assert results
    for r in results:
        loc = r["locations"][0]
        uri = loc["physicalLocation"]["artifactLocation"]["uri"]
        region = loc["physicalLocation"]["region"]
        cell, line = loc["properties"]["cell"], loc["properties"]["cellLine"]
        column = loc["properties"]["cellColumn"]
        file_lines = (work / uri).read_text(encoding="utf-8").split("\n")
        source = json.loads((work / uri).read_text(encoding="utf-8"))["cells"][cell - 1]["source"]
        code_line = "".join(source).splitlines()[line - 1]
        # the region's line of the .ipynb holds the JSON string of that code line, and the
        # region starts at the finding's character (its JSON spelling)
        text_at = file_lines[region["startLine"] - 1][region["startColumn"] - 1:]
        want = json.dumps(code_line[column - 1:], ensure_ascii=True)[1:-1]
        assert text_at.startswith(want[:8]), (uri, cell, line, text_at, want)
        assert loc["logicalLocations"][0]["name"] == f"cell {cell}"
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results} == {"multi.ipynb", "train.ipynb"}


def test_migrate_diff_is_per_cell(cli_runs):
    work, runs = cli_runs
    out = runs["diff"].out
    assert runs["diff"].code == 0
    assert "--- train.ipynb (cell 3)\n+++ train.ipynb (cell 3)\n" in out
    assert "--- train.ipynb (cell 8)\n" in out and "(cell 1)" not in out and "(cell 2)" not in out
    assert "\\ No newline" not in out
    # the findings left for a human: lines and columns in the converted cells
    assert "train.ipynb:cell 8:13:27: TX403 " in runs["diff"].err
    assert "train.ipynb:cell 6:4:10: TX302 " in runs["diff"].err
    assert "-device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n+device = torch_xla.device()\n" in out
    assert (work / "train.ipynb").read_bytes() == (FIXTURES / "train_classifier" / "notebook.ipynb").read_bytes()


def _regenerate() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for (name, target), expected in sorted(PORTS.items()):
            out = Path(tmp) / f"{name}-{target}.ipynb"
            outcome = _port(name, target, out)
            if outcome.status != "changed":
                raise SystemExit(f"{name} ({target}): {outcome.status} {outcome.error}")
            shutil.copy(out, FIXTURES / name / expected)
            print(f"wrote {FIXTURES / name / expected}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        _regenerate()
    else:
        raise SystemExit("usage: python tests/test_notebooks.py --regen")


@pytest.mark.parametrize("target, line, code, pin", [
    ("torch-xla", "!pip install -q torch_xla==2.5.0 numpy", "PV001", "torch_xla==2.9.0"),
    ("torch-xla", "%pip install 'torch==2.4.1'", "PV001", "torch==2.9.0"),
    ("jax", "!python -m pip install jax==0.4.30 && echo done", "PV002", "jax==0.10.2"),
])
def test_pinned_versions_in_a_notebooks_pip_lines_are_reported_at_the_cell(tmp_path, target, line, code, pin):
    src = tmp_path / "nb.ipynb"
    src.write_text(_nb(["import torch", f"# set-up\n{line}\nprint('ok')"]))
    before = src.read_bytes()
    outcome = notebook.check_file(src, runner.Settings(target=target, time_limit=0, memory_mb=0))
    found = [f for f in outcome.findings if f.code == code]
    assert len(found) == 1, outcome.findings
    assert (found[0].cell, found[0].line) == (2, 2) and pin in found[0].message
    assert src.read_bytes() == before
    # the same pins in the profile's versions are not reported
    src.write_text(_nb(["import torch", f"# set-up\n{line.replace('2.5.0', '2.9.0').replace('2.4.1', '2.9.0').replace('0.4.30', '0.10.2')}"]))
    assert not [f for f in notebook.check_file(src, runner.Settings(target=target, time_limit=0, memory_mb=0)).findings
                if f.code == code]
