"""Verification reports: a terminal table (rich), JSON, and HTML (templates/verify_report.html.j2)."""
from __future__ import annotations

import json

import jinja2
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from porter._layout import templates_dir
from porter.verify.model import Report

MAX_ROWS = 40


def as_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2, default=str)


def as_html(report: Report) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True)
    return env.get_template("verify_report.html.j2").render(r=report.as_dict())


def _rows(report: Report):
    """The rows worth showing: every failure, then the largest errors of each phase."""
    tensors = report.tensors
    failing = [t for t in tensors if not t["ok"]]
    passing = sorted((t for t in tensors if t["ok"]), key=lambda t: -t["max_abs"])
    return (failing + passing)[:MAX_ROWS], len(tensors)


def print_text(report: Report, console: Console) -> None:
    colour = "green" if report.passed else "red"
    console.print(Text(f"porter verify ({report.kind}): {report.status.upper()}", style=f"bold {colour}"))
    console.print(report.summary, markup=False)
    sides = Table(box=box.SIMPLE, show_header=True, header_style="bold")
    for col in ("side", "file", "backend", "seconds", "peak MB", "result"):
        sides.add_column(col)
    for side in (report.original, report.port):
        if side is None:
            continue
        sides.add_row(side.role, side.path, side.backend, f"{side.seconds:.1f}", f"{side.peak_mb:.0f}",
                      "ok" if side.ok else (side.cause or side.error or "failed"))
    console.print(sides)
    if report.tensors:
        rows, total = _rows(report)
        table = Table(title=f"tensors ({total} compared; showing {len(rows)})", box=box.SIMPLE, header_style="bold")
        for col in ("", "tensor", "shape", "max abs err", "max rel err"):
            table.add_column(col)
        for t in rows:
            mark = Text("ok", style="green") if t["ok"] else Text("DIFF", style="bold red")
            name = t["key"] + (f"  ({t['note']})" if t.get("note") else "")
            table.add_row(mark, name, "x".join(map(str, t["shape"])), f"{t['max_abs']:.3g}", f"{t['max_rel']:.3g}")
        console.print(table)
    if report.steps:
        table = Table(title=f"losses per optimizer step ({len(report.steps)} compared)", box=box.SIMPLE,
                      header_style="bold")
        for col in ("", "step", "original", "port", "|difference|"):
            table.add_column(col)
        first_bad = next((i for i, s in enumerate(report.steps) if not s["ok"]), None)
        # the first differing step and the steps around it, else the first MAX_ROWS
        start = 0 if first_bad is None else max(0, first_bad - MAX_ROWS // 2)
        for s in report.steps[start:start + MAX_ROWS]:
            mark = Text("ok", style="green") if s["ok"] else Text("DIFF", style="bold red")
            values = lambda xs: ", ".join("none" if x is None else f"{x:.10g}" for x in xs)  # noqa: E731
            table.add_row(mark, str(s["step"]), values(s["original"]), values(s["port"]), f"{s['diff']:.3g}")
        console.print(table)
    if report.health:
        h = report.health
        table = Table(title="XLA health of the port", box=box.SIMPLE, header_style="bold")
        for col in ("step", "compilations", "transfers to host", "executions"):
            table.add_column(col)
        for i, s in enumerate(h["steps"], 1):
            table.add_row(str(i), str(s["compiles"]), str(s["transfers"]), str(s.get("executions", "")))
        console.print(table)
        console.print(f"compilations after warm-up: {h['compiles_after_warmup']}; "
                      f"CPU fallback ops: {', '.join(h['fallback_ops']) or 'none'}", markup=False)
        for p in h["problems"]:
            console.print(Text(f"over budget: {p}", style="red"))
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
    for side in (report.original, report.port):
        if side is not None and not side.ok and side.log:
            console.print(Text(f"--- {side.role} log (tail) ---", style="bold"))
            console.print(side.log[-3000:], markup=False, highlight=False)
