"""The command line: parse arguments, call the core, render, choose the exit code.

Exit codes: 0 nothing to report, 1 findings (check) or failed files (migrate), 2 usage or
internal error.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from porter import registry, report
from porter.config import Config, ConfigError, load
from porter.registry import RegistryError
from porter.runner import FileOutcome, Settings, run

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Move PyTorch training code onto TPUs (torch_xla), and prove the port.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False)
TARGETS = ", ".join(registry.TARGETS)


def _fail(message: str) -> "typer.Exit":
    err.print(f"porter: error: {message}", markup=False)
    return typer.Exit(2)


def _settings(paths: List[Path], target: Optional[str], select: List[str], ignore: List[str], unsafe: Optional[bool]) -> Settings:
    try:
        cfg = load(paths[0]) if paths else Config()
    except ConfigError as exc:
        raise _fail(str(exc))
    chosen = target or cfg.target or "torch-xla"
    if chosen not in registry.TARGETS:
        raise _fail(f"unknown target {chosen!r} (known: {TARGETS})")
    settings = Settings(
        target=chosen,
        select=tuple(_split(select)) or cfg.select,
        ignore=tuple(_split(ignore)) or cfg.ignore,
        unsafe_fixes=cfg.unsafe_fixes if unsafe is None else unsafe,
    )
    try:
        settings.options()
    except RegistryError as exc:
        raise _fail(str(exc))
    return settings


def _split(values: List[str]) -> List[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _check_paths(paths: List[Path]) -> None:
    for p in paths:
        if not p.exists() and not p.is_symlink():
            raise _fail(f"{p}: no such file or directory")


def _run_with_progress(kind: str, paths: List[Path], settings: Settings, **kw) -> list[FileOutcome]:
    if not err.is_terminal:
        return run(kind, paths, settings, **kw)
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    ) as progress:
        task = progress.add_task(kind, total=None)

        def tick(_: FileOutcome) -> None:
            progress.advance(task)

        return run(kind, paths, settings, on_file=tick, **kw)


@app.command()
def check(
    paths: List[Path] = typer.Argument(..., help="Files or folders to check."),
    target: Optional[str] = typer.Option(None, "--target", help=f"Port target ({TARGETS})."),
    fmt: str = typer.Option("text", "--format", help="text, json or sarif."),
    select: List[str] = typer.Option([], "--select", help="Only these rule codes or prefixes (comma-separated)."),
    ignore: List[str] = typer.Option([], "--ignore", help="Skip these rule codes or prefixes."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Processes to use."),
) -> None:
    """Report what stands between this code and the target; change nothing."""
    if fmt not in ("text", "json", "sarif"):
        raise _fail(f"unknown format {fmt!r} (text, json, sarif)")
    _check_paths(paths)
    settings = _settings(paths, target, select, ignore, None)
    outcomes = _run_with_progress("check", paths, settings, jobs=jobs)
    if fmt == "json":
        typer.echo(report.as_json(outcomes))
    elif fmt == "sarif":
        typer.echo(report.sarif(outcomes))
    else:
        body = report.text(outcomes)
        if body:
            typer.echo(body)
        errors = report.errors(outcomes)
        if errors:
            err.print(errors, markup=False)
        n = len(report.findings_of(outcomes))
        fixable = sum(1 for f in report.findings_of(outcomes) if f.fixable and f.safety == "safe")
        err.print(f"{n} finding(s) in {len(outcomes)} file(s); {fixable} fixable with `porter migrate` [*]", markup=False)
    failed = any(o.status == "failed" for o in outcomes)
    raise typer.Exit(1 if report.findings_of(outcomes) or failed else 0)


@app.command()
def migrate(
    paths: List[Path] = typer.Argument(..., help="Files or folders to port."),
    to: Optional[str] = typer.Option(None, "--to", help=f"Port target ({TARGETS})."),
    write: bool = typer.Option(False, "--write", help="Rewrite the files in place."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the ported tree here; the sources stay untouched."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Also apply fixes that may change numerics or semantics."),
    select: List[str] = typer.Option([], "--select", help="Only these rule codes or prefixes."),
    ignore: List[str] = typer.Option([], "--ignore", help="Skip these rule codes or prefixes."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Processes to use."),
) -> None:
    """Rewrite code for the target. Without --write or --out, print a diff and write nothing."""
    if write and out is not None:
        raise _fail("--write and --out exclude each other")
    _check_paths(paths)
    if out is not None:
        resolved = out.resolve()
        for p in paths:
            if p.is_dir() and (resolved == p.resolve() or p.resolve() in resolved.parents):
                raise _fail(f"--out {out} lies inside the source folder {p}")
    settings = _settings(paths, to, select, ignore, unsafe_fixes)
    mode = "write" if write else ("out" if out is not None else "diff")
    outcomes = _run_with_progress("migrate", paths, settings, mode=mode, out_dir=out, jobs=jobs)
    if mode == "diff":
        for o in outcomes:
            if o.diff:
                sys.stdout.write(o.diff)
    errors = report.errors(outcomes)
    if errors:
        err.print(errors, markup=False)
    left = report.text([o for o in outcomes])
    if left:
        err.print("\nLeft for a human:", markup=False)
        err.print(left, markup=False)
    _print_summary(outcomes, mode, settings)
    raise typer.Exit(1 if any(o.status == "failed" for o in outcomes) else 0)


def _print_summary(outcomes: list[FileOutcome], mode: str, settings: Settings) -> None:
    s = report.summary(outcomes)
    verb = {"diff": "would change", "write": "changed", "out": "converted"}[mode]
    err.print(
        f"\nporter migrate --to {settings.target}: {s['changed']} file(s) {verb}, "
        f"{s['unchanged']} unchanged, {s['failed']} failed",
        markup=False,
    )
    if s["fixed"] or s["left"]:
        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("rule")
        table.add_column("fixed", justify="right")
        table.add_column("left for a human", justify="right")
        for code in sorted(set(s["fixed"]) | set(s["left"])):
            table.add_row(code, str(s["fixed"].get(code, 0)), str(s["left"].get(code, 0)))
        err.print(table)


@app.command("rules")
def list_rules(target: Optional[str] = typer.Option(None, "--target", help="Only this target's rules.")) -> None:
    """List every rule."""
    try:
        infos = registry.infos(target)
    except RegistryError as exc:
        raise _fail(str(exc))
    table = Table(show_header=True, header_style="bold")
    for col in ("code", "name", "target", "default", "summary"):
        table.add_column(col)
    for r in infos:
        table.add_row(r.code, r.name, r.target, "on" if r.default_enabled else "off", r.summary)
    Console(highlight=False, width=160).print(table)


@app.command()
def explain(code: str = typer.Argument(..., help="A rule code (TX201) or name.")) -> None:
    """Print a rule's documentation and its examples."""
    try:
        rule = registry.find(code)
    except RegistryError as exc:
        raise _fail(str(exc))
    typer.echo(render_rule_doc(rule))


def render_rule_doc(rule) -> str:
    from porter.docs import rule_markdown

    return rule_markdown(rule)


def main() -> None:
    try:
        app()
    except RegistryError as exc:
        err.print(f"porter: error: {exc}", markup=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
