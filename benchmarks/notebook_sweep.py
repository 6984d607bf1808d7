"""Each script of ../shared/corpus/torch as a notebook, ported, against the script's own port.

A script is cut into code cells at its top-level statements (cell 1: the leading imports;
then a cell every few statements, a markdown cell between some of them), written with
nbformat, and ported with ``porter.notebook.migrate_file``; the script itself is ported
with ``porter.runner.migrate_file``. Per script and target: whether both ported, whether the
cells of the ported notebook, joined, equal the ported script (the same fixes across cell
boundaries), whether a second run changes nothing, and the time of each (ratio notebook /
script, measured side by side in this run).

    .venv/bin/python benchmarks/notebook_sweep.py [--targets torch-xla,jax] [--limit N]

Writes benchmarks/results/notebook_sweep.json.
"""
from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from porter import notebook, runner

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus" / "torch"


def cells_of(text: str, every: int = 3) -> list[str]:
    """The script cut at top-level statement starts: the leading imports, then ``every``
    statements a cell. Joined, the cells are the script."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    starts = []
    for stmt in tree.body:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        starts.append(first - 1)
    head = 1 if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant) else 0
    while head < len(tree.body) and isinstance(tree.body[head], (ast.Import, ast.ImportFrom)):
        head += 1
    # leading comment/blank lines belong to the statement after them
    cuts = sorted({0} | ({starts[head]} if head < len(starts) else set()) | {starts[i] for i in range(head, len(starts), every)})
    adjusted = []
    for c in cuts:
        while c > 0 and (not lines[c - 1].strip() or lines[c - 1].lstrip().startswith("#")) and c - 1 not in adjusted:
            c -= 1
        adjusted.append(c)
    adjusted = sorted(set(adjusted))
    bounds = adjusted + [len(lines)]
    return ["".join(lines[a:b]) for a, b in zip(bounds, bounds[1:]) if a < b]


def write_notebook(cells: list[str], path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    out = []
    for i, c in enumerate(cells):
        if i and i % 4 == 0:
            out.append(nbformat.v4.new_markdown_cell(f"## Part {i // 4}"))
        out.append(nbformat.v4.new_code_cell(c))
    for i, c in enumerate(out):
        c.id = f"c{i}"
    nb.cells = out
    nbformat.write(nb, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="torch-xla,jax")
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    if not CORPUS.is_dir():
        raise SystemExit(f"no corpus at {CORPUS}")
    scripts = sorted(CORPUS.rglob("*.py"))
    if args.limit:
        scripts = scripts[:args.limit]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        for script in scripts:
            text = script.read_text(encoding="utf-8")
            try:
                cells = cells_of(text)
            except SyntaxError:
                continue
            assert "".join(cells) == text
            # the notebook beside a copy of the script's folder (rules read sibling modules:
            # `from model import GPT`), the script ported from that copy too
            folder = tmp_path / str(len(rows)) / script.parent.name
            folder.mkdir(parents=True)
            for sibling in script.parent.glob("*.py"):
                shutil.copy(sibling, folder / sibling.name)
            nb_path = folder / (script.stem + ".ipynb")
            write_notebook(cells, nb_path)
            for target in args.targets.split(","):
                settings = runner.Settings(target=target, time_limit=0, memory_mb=0)
                t0 = time.perf_counter()
                py = runner.migrate_file(folder / script.name, settings, "out", tmp_path / "py" / script.name)
                t1 = time.perf_counter()
                out_nb = tmp_path / "nb" / nb_path.name
                nbo = notebook.migrate_file(nb_path, settings, "out", out_nb)
                t2 = time.perf_counter()
                row = {"script": str(script.relative_to(CORPUS)), "target": target, "cells": len(cells),
                       "script_status": py.status, "notebook_status": nbo.status,
                       "notebook_error": nbo.error, "script_s": round(t1 - t0, 3), "notebook_s": round(t2 - t1, 3)}
                if py.status != "failed" and nbo.status != "failed":
                    ported = (tmp_path / "py" / script.name).read_text(encoding="utf-8")
                    new = nbformat.read(out_nb, as_version=4)
                    joined = "".join(c.source for c in new.cells if c.cell_type == "code")
                    row["same_as_script"] = joined == ported
                    # the same but for where the added imports went (notebook: after the last
                    # import of the imports cell; script: after the leading import block)
                    added = {x for x in ported.splitlines() if x.startswith(("import ", "from ")) and x not in text.splitlines()}
                    row["same_but_import_placement"] = (
                        [x for x in joined.splitlines() if x not in added] == [x for x in ported.splitlines() if x not in added])
                    # ... and for blank lines (a cell does not end in the blank lines a fix adds there)
                    row["same_but_imports_and_blank_lines"] = (
                        [x for x in joined.splitlines() if x not in added and x.strip()]
                        == [x for x in ported.splitlines() if x not in added and x.strip()])
                    again = notebook.migrate_file(out_nb, settings, "diff")
                    row["idempotent"] = again.status == "unchanged"
                    row["findings_script"] = len(py.findings)
                    row["findings_notebook"] = len(nbo.findings)
                rows.append(row)
                print(json.dumps(row), flush=True)
    done = [r for r in rows if "same_as_script" in r]
    summary = {
        "runs": len(rows),
        "both_ported": len(done),
        "notebook_failed_only": sum(1 for r in rows if r["notebook_status"] == "failed" and r["script_status"] != "failed"),
        "same_as_script": sum(1 for r in done if r["same_as_script"]),
        "same_but_import_placement": sum(1 for r in done if r["same_but_import_placement"]),
        "same_but_imports_and_blank_lines": sum(1 for r in done if r["same_but_imports_and_blank_lines"]),
        "idempotent": sum(1 for r in done if r["idempotent"]),
        "same_findings_count": sum(1 for r in done if r["findings_script"] == r["findings_notebook"]),
        "time_ratio_notebook_over_script": round(sum(r["notebook_s"] for r in done) / max(sum(r["script_s"] for r in done), 1e-9), 3),
    }
    print(json.dumps(summary, indent=1))
    out = REPO / "benchmarks" / "results" / "notebook_sweep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
