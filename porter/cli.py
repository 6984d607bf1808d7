"""The command line: parse arguments, call the core, render, choose the exit code.

Exit codes (every command): 0 nothing to report, 1 findings (check) or a file that could not
be processed (check, migrate), 2 a usage error (bad option, unknown rule code or target, bad
``[tool.porter]`` settings, an ``--out`` that overlaps the sources) or an internal error,
130 interrupted. Results go to stdout (findings, diffs, JSON, SARIF); messages, the progress
bar (only when stderr is a terminal) and summaries go to stderr, one line per problem.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from porter import registry, report
from porter.config import Config, ConfigError, load
from porter.engine import PorterError, describe_exception
from porter.registry import RegistryError
from porter.runner import DEFAULT_MEMORY_MB, DEFAULT_TIME_LIMIT, FileOutcome, Settings, UsageError, run

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Move PyTorch training code onto TPUs (torch_xla), and prove the port.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
TARGETS = ", ".join(registry.TARGETS)
FORMATS = ("text", "json", "sarif")


def say(message: str) -> None:
    """One message on stderr, never wrapped or styled (it may be read by a program)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def guarded(command: Callable) -> Callable:
    """Usage errors -> one line and exit 2; a bug in porter -> one line (traceback with
    PORTER_DEBUG=1) and exit 2. Also when the app is driven in-process (typer's CliRunner)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            say("porter: interrupted; files already written are whole (writes are atomic)")
            raise typer.Exit(130) from None
        except (UsageError, RegistryError) as exc:
            say(f"porter: error: {exc}")
            raise typer.Exit(2) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            _internal_error(exc)
        except Exception as exc:
            _internal_error(exc)

    return wrapper


def _internal_error(exc: BaseException) -> None:
    if os.environ.get("PORTER_DEBUG"):
        traceback.print_exc()
    say(f"porter: internal error: {describe_exception(exc)}")
    if not os.environ.get("PORTER_DEBUG"):
        say("porter: this is a bug in porter; set PORTER_DEBUG=1 for the traceback")
    raise typer.Exit(2) from None


def _table_console(stream, min_width: int = 100) -> Console:
    return Console(file=stream, highlight=False, soft_wrap=False, width=max(min_width, Console(file=stream).width))


def _settings(paths: List[Path], target: Optional[str], select: List[str], ignore: List[str], unsafe: Optional[bool],
              time_limit: Optional[float] = None, memory_limit: Optional[int] = None) -> Settings:
    try:
        cfg = load(paths[0]) if paths else Config()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    chosen = target or cfg.target or "torch-xla"
    if chosen not in registry.TARGETS:
        where = "" if target else f" (from {cfg.source})"
        raise UsageError(f"unknown target {chosen!r}{where}; known: {TARGETS}")
    cli_select, cli_ignore = tuple(_split(select)), tuple(_split(ignore))
    settings = Settings(
        target=chosen,
        select=cli_select or cfg.select,
        ignore=cli_ignore or cfg.ignore,
        unsafe_fixes=cfg.unsafe_fixes if unsafe is None else unsafe,
        time_limit=next(v for v in (time_limit, cfg.time_limit, DEFAULT_TIME_LIMIT) if v is not None),
        memory_mb=next(v for v in (memory_limit, cfg.memory_limit, DEFAULT_MEMORY_MB) if v is not None),
    )
    # Check each source of codes on its own so the message says where a bad code came from.
    Settings(chosen, cli_select, cli_ignore).validate()
    if cfg.source is not None:
        Settings(chosen, cfg.select if not cli_select else (), cfg.ignore if not cli_ignore else ()).validate(f"[tool.porter] in {cfg.source}")
    settings.options()
    return settings


def _with_data(settings: Settings, data: str) -> Settings:
    """Settings with the --data bucket path (gs://bucket/prefix) for the data rules."""
    import dataclasses

    from porter.kits import KitError, check_data

    try:
        url = check_data(data, ("gs",))
    except KitError as exc:
        raise UsageError(str(exc)) from None
    if not settings.unsafe_fixes:
        say("porter: --data rewrites are unsafe fixes: add --unsafe-fixes to apply them (reported only now)")
    return dataclasses.replace(settings, data=url or "")


def _split(values: List[str]) -> List[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _check_paths(paths: List[Path]) -> None:
    for p in paths:
        if not p.exists() and not p.is_symlink():
            raise UsageError(f"{p}: no such file or folder")


def _run(kind: str, paths: List[Path], settings: Settings, **kw) -> list[FileOutcome]:
    """Run the batch; a progress bar on stderr only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return run(kind, paths, settings, **kw)
    console = Console(file=sys.stderr, highlight=False)
    # auto_refresh=False: no refresh thread, so the worker processes are forked from a
    # single-threaded parent; the bar is redrawn as each file finishes.
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, auto_refresh=False,
    ) as progress:
        task = progress.add_task(f"porter {kind}", total=None)

        def start(n: int) -> None:
            progress.update(task, total=n)
            progress.refresh()

        def tick(_: FileOutcome) -> None:
            progress.advance(task)
            progress.refresh()

        return run(kind, paths, settings, on_start=start, on_file=tick, **kw)


@app.command()
@guarded
def check(
    paths: List[Path] = typer.Argument(..., help="Files or folders to check (folders are walked)."),
    target: Optional[str] = typer.Option(None, "--target", help=f"Port target ({TARGETS}); default from \\[tool.porter] or torch-xla."),
    fmt: str = typer.Option("text", "--format", help="Output format: text, json or sarif."),
    select: List[str] = typer.Option([], "--select", help="Only these rule codes, code prefixes or names (comma-separated, repeatable)."),
    ignore: List[str] = typer.Option([], "--ignore", help="Skip these rule codes, code prefixes or names."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Worker processes."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", min=0, help=f"Seconds of CPU time one file may take (0: no limit); default from \\[tool.porter] time-limit or {DEFAULT_TIME_LIMIT:g}."),
    memory_limit: Optional[int] = typer.Option(None, "--memory-limit", min=0, help=f"MB of memory one file may use (0: no limit); default from \\[tool.porter] memory-limit or {DEFAULT_MEMORY_MB}."),
) -> None:
    """Report what stands between this code and the target; change nothing.

    Exit 0: no findings; 1: findings, or a file could not be read; 2: usage or internal error.
    """
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose text, json or sarif")
    _check_paths(paths)
    settings = _settings(paths, target, select, ignore, None, time_limit, memory_limit)
    outcomes = _run("check", paths, settings, jobs=jobs)
    found = report.findings_of(outcomes)
    if fmt == "json":
        typer.echo(report.as_json(outcomes, settings.target))
    elif fmt == "sarif":
        typer.echo(report.sarif(outcomes))
    else:
        body = report.text(outcomes)
        if body:
            typer.echo(body)
        errors = report.errors(outcomes)
        if errors:
            say(errors)
        n_files = len(report.python_files(outcomes))
        fixable = sum(1 for f in found if f.fixable and f.safety == "safe")
        unsafe = sum(1 for f in found if f.fixable and f.safety != "safe")
        line = f"{len(found)} finding(s) in {n_files} file(s)"
        if found:
            line += f"; {fixable} fixable with `porter migrate` [*]"
            if unsafe:
                line += f", {unsafe} more with --unsafe-fixes"
        failed = len(report.failed(outcomes))
        if failed:
            line += f"; {failed} file(s) could not be checked"
        say(line)
    raise typer.Exit(1 if found or report.failed(outcomes) else 0)


@app.command()
@guarded
def migrate(
    paths: List[Path] = typer.Argument(..., help="Files or folders to port (folders are walked)."),
    to: Optional[str] = typer.Option(None, "--to", "--target", help=f"Port target ({TARGETS}); default from \\[tool.porter] or torch-xla."),
    write: bool = typer.Option(False, "--write", help="Rewrite the files in place."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the ported tree (with the untouched files) into this folder; the sources stay as they are."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Also apply fixes that may change numerics or semantics."),
    select: List[str] = typer.Option([], "--select", help="Only these rule codes, code prefixes or names."),
    ignore: List[str] = typer.Option([], "--ignore", help="Skip these rule codes, code prefixes or names."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Worker processes."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", min=0, help=f"Seconds of CPU time one file may take (0: no limit); default from \\[tool.porter] time-limit or {DEFAULT_TIME_LIMIT:g}."),
    memory_limit: Optional[int] = typer.Option(None, "--memory-limit", min=0, help=f"MB of memory one file may use (0: no limit); default from \\[tool.porter] memory-limit or {DEFAULT_MEMORY_MB}."),
    verify_port: bool = typer.Option(False, "--verify", help="Then run the original script and its port side by side (`porter verify --script`). One file, with --out."),
    verify_steps: int = typer.Option(12, "--verify-steps", min=1, help="Optimizer steps that --verify compares."),
    verify_args: str = typer.Option("", "--verify-args", help="Arguments for both scripts in --verify, as one string (e.g. \"--epochs 1 --dropout 0\")."),
    data: Optional[str] = typer.Option(None, "--data", help="gs://bucket/prefix: read the script's dataset root from Cloud Storage through fsspec/gcsfs (rules DT001/DT002; unsafe fixes, with --unsafe-fixes)."),
    package: bool = typer.Option(False, "--package", help="Port PATH as a package that imports under its own name from --out: a package folder or an importable name (torchvision.models, timm), with everything it imports from itself and other packages' model code."),
    with_packages: List[str] = typer.Option([], "--with", help="Also port the modules of this installed package that the scripts import, into --out/PACKAGE, so that the port imports them from there: a Gluon library (gluoncv) whole, a torch library's model code (torchvision, for --to jax) as an overlay of the installed package (repeatable)."),
) -> None:
    """Rewrite code for the target. Without --write or --out: print a unified diff, write nothing.

    Exit 0: every file was processed (and, with --verify, the port matched); 1: some file
    could not be processed or the port did not match; 2: usage or internal error.
    """
    if package:
        _migrate_package(paths, to, out, write, verify_port, unsafe_fixes, select, ignore, jobs)
    if write and out is not None:
        raise UsageError("--write and --out exclude each other: --write rewrites the sources, --out leaves them alone")
    if with_packages and out is None:
        raise UsageError("--with needs --out DIR: the package's port is written beside the scripts' (DIR/PACKAGE)")
    if verify_port and (out is None or len(paths) != 1 or not paths[0].is_file()):
        raise UsageError("--verify needs one script and --out DIR (the original must stay as it is to compare with)")
    _check_paths(paths)
    settings = _settings(paths, to, select, ignore, unsafe_fixes, time_limit, memory_limit)
    if data is not None:
        settings = _with_data(settings, data)
    mode = "write" if write else ("out" if out is not None else "diff")
    overlays = _torch_libraries(with_packages)
    library_failed = False
    if overlays:
        # the scripts' rules must know what the port of the libraries' model code builds
        ok, libraries = _migrate_libraries(paths, with_packages, settings, out, jobs, overlay=True)
        library_failed = not ok
        settings = dataclasses.replace(settings, libraries=libraries)
    outcomes = _run("migrate", paths, settings, mode=mode, out_dir=out, jobs=jobs)
    if with_packages:
        outcomes = [_without_library_findings(o, with_packages) for o in outcomes]
    if mode == "diff":
        for o in outcomes:
            if o.diff:
                sys.stdout.write(o.diff)
        sys.stdout.flush()
    errors = report.errors(outcomes)
    if errors:
        say(errors)
    left = report.text(outcomes)
    if left:
        note = " (lines as in the converted code)" if mode == "diff" else ""
        say(f"\nLeft for a human{note}:")
        say(left)
    _print_summary(outcomes, mode, settings, out)
    if with_packages and not overlays:
        library_failed = not _migrate_libraries(paths, with_packages, settings, out, jobs)[0]
    if report.failed(outcomes) or library_failed:
        raise typer.Exit(1)
    if verify_port:
        from porter.verify import render
        from porter.verify.script import ScriptRequest, verify_script

        ported = out / paths[0].name
        script_args = tuple(shlex.split(verify_args))
        say(f"\nporter verify --script {paths[0]} {ported} --steps {verify_steps} -- {shlex.join(script_args)}")
        result = verify_script(ScriptRequest(paths[0], ported, verify_steps, script_args))
        render.print_text(result, _table_console(sys.stdout))
        raise typer.Exit(result.exit_code)
    raise typer.Exit(0)


def _without_library_findings(outcome: FileOutcome, packages: List[str]) -> FileOutcome:
    """GL008's findings of the packages ``--with`` ports along (its message starts with the
    package's name): they are taken care of."""
    tops = {p.split(".")[0] for p in packages}
    kept = tuple(f for f in outcome.findings if not (f.code == "GL008" and f.message.split(" ", 1)[0] in tops))
    return outcome if len(kept) == len(outcome.findings) else dataclasses.replace(outcome, findings=kept)


def _torch_libraries(packages: List[str]) -> bool:
    """Whether the ``--with`` packages are torch libraries (installed here, as torchvision and
    timm: their model code is ported as an overlay, porter.packages) rather than Gluon
    libraries (installed in the MXNet venv, ported whole). Raises UsageError for a mix."""
    if not packages:
        return False
    from porter.packages import imports_mxnet, resolve_source

    def torch_library(package: str) -> bool:
        path, _name, env = resolve_source(package)
        return env.python is None and not imports_mxnet(path)

    here = {p: torch_library(p) for p in packages}
    if len(set(here.values())) > 1:
        raise UsageError(f"--with {' --with '.join(packages)}: torch libraries "
                         f"({', '.join(p for p, t in here.items() if t)}) and Gluon libraries "
                         f"({', '.join(p for p, t in here.items() if not t)}) are ported in separate runs")
    return all(here.values())


def _migrate_libraries(paths: List[Path], packages: List[str], settings: Settings, out: Path, jobs: int,
                       overlay: bool = False) -> tuple[bool, tuple]:
    """``porter migrate SCRIPT --out DIR --with PACKAGE``: the modules of each installed
    PACKAGE the scripts import (porter.packages.used_modules), ported into DIR/PACKAGE with
    their import closure (porter.packages.port_package, one call for all of them: one manifest
    in DIR); ``overlay`` (torch libraries): their model code only, the installed package
    serving the rest (porter.packages.overlay_selection). (True when every module was ported,
    porter.program's ported_libraries of an overlay)."""
    from porter.packages import overlay_constructors, overlay_selection, port_package, summary, used_modules
    from porter.sources import iter_python_files, read_source

    files, _errors = iter_python_files(paths)
    texts = []
    for f in files:
        if f.suffix == ".py":
            try:
                texts.append(read_source(f).text)
            except PorterError:
                continue  # the scripts' own run reported it
    wanted: list[str] = []
    for package in packages:
        used = used_modules(package, texts)
        wanted += [m for m in (overlay_selection(package, used, texts) if overlay else used) if m not in wanted]
    port = port_package(packages[0].split(".")[0], settings.target, out, unsafe=settings.unsafe_fixes, include=wanted,
                        jobs=jobs, select=settings.select, ignore=settings.ignore, whole_folder=False, overlay=overlay)
    s = summary(port)
    for name, error in s["failed_modules"].items():
        say(f"{port.modules[name].source}: error: {error}")
    tops = {p.split(".")[0] for p in packages}
    # the library's own imports of itself (GL008 in its modules) are ported along too
    left = [(m, f) for m in port.modules.values() for f in m.findings
            if not (f.code == "GL008" and f.message.split(" ", 1)[0] in tops)]
    if left:
        say(f"\nLeft for a human in the ported {', '.join(packages)}:")
        for m, f in left:
            pos = f.position
            where = f"{pos.line}:{pos.column + 1}" if pos else "1:1"
            say(f"{m.output}:{where}: {f.code} {f.message}")
    say(f"porter migrate --with {' --with '.join(packages)}: the scripts use {', '.join(wanted)}; "
        f"{s['modules']} module(s) with what they import, {s['ported']} ported, {s['unchanged']} unchanged, "
        f"{s['failed']} failed, into {out}" + (
            f" (their model code: an overlay of the installed {', '.join(packages)}, which serves the rest)"
            if overlay else ""))
    return not s["failed"], overlay_constructors(port) if overlay else ()


def _migrate_package(paths: List[Path], to: Optional[str], out: Optional[Path], write: bool, verify_port: bool,
                     unsafe_fixes: Optional[bool], select: List[str], ignore: List[str], jobs: int) -> None:
    """``porter migrate PACKAGE --package --out DIR``: porter.packages.port_package, summarized."""
    from porter.packages import port_package, summary

    if out is None or write or verify_port or len(paths) != 1:
        raise UsageError("--package needs one package (a folder or an importable name) and --out DIR, "
                         "without --write or --verify")
    source = str(paths[0])
    settings = _settings([paths[0]] if paths[0].exists() else [Path.cwd()], to, select, ignore, unsafe_fixes)
    port = port_package(paths[0] if paths[0].exists() else source, settings.target, out, unsafe=settings.unsafe_fixes,
                        jobs=jobs, select=settings.select, ignore=settings.ignore)
    s = summary(port)
    for name, error in s["failed_modules"].items():
        say(f"{port.modules[name].source}: error: {error}")
    left = [(m, f) for m in port.modules.values() for f in m.findings]
    if left:
        say("\nLeft for a human:")
        for m, f in left:
            pos = f.position
            where = f"{pos.line}:{pos.column + 1}" if pos else "1:1"
            say(f"{m.output}:{where}: {f.code} {f.message}")
    reused = sum(1 for m in port.modules.values() if m.reused)
    say(f"\nporter migrate --package --to {port.target}: {port.selected}: {s['modules']} module(s), "
        f"{s['ported']} ported, {s['unchanged']} unchanged, {s['failed']} failed"
        + (f" ({reused} unchanged since the last run, not rewritten)" if reused else "")
        + f"; {len(port.followed)} followed from imports"
        + (f" (packages ported along: {', '.join(port.external)})" if port.external else "")
        + f"; {s['data_files']} data file(s) copied; import it with {out} first on sys.path")
    if port.unresolved:
        say(f"imports of {port.name} with no module file (left as they are): {', '.join(port.unresolved)}")
    if s["findings"]:
        say("findings left: " + ", ".join(f"{code} {n}" for code, n in s["findings"].items()))
    raise typer.Exit(1 if s["failed"] else 0)


def _print_summary(outcomes: list[FileOutcome], mode: str, settings: Settings, out: Optional[Path]) -> None:
    s = report.summary(outcomes)
    verb = {"diff": "would change", "write": "changed", "out": "converted"}[mode]
    line = (
        f"\nporter migrate --to {settings.target}: {s['changed']} file(s) {verb}, "
        f"{s['unchanged']} unchanged, {s['failed']} failed"
    )
    if mode == "out":
        line += f"; {s['copied']} other file(s) copied; output in {out}"
    elif mode == "diff" and s["changed"]:
        line += "; nothing written (use --write or --out DIR)"
    if not settings.unsafe_fixes and any(f.fixable and f.safety != "safe" for f in report.findings_of(outcomes)):
        line += "; more fixes with --unsafe-fixes"
    say(line)
    if s["fixed"] or s["left"]:
        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("rule")
        table.add_column("fixed", justify="right")
        table.add_column("left for a human", justify="right")
        for code in sorted(set(s["fixed"]) | set(s["left"])):
            table.add_row(code, str(s["fixed"].get(code, 0)), str(s["left"].get(code, 0)))
        _table_console(sys.stderr).print(table)


@app.command("rules")
@guarded
def list_rules(target: Optional[str] = typer.Option(None, "--target", help="Only this target's rules.")) -> None:
    """List every rule."""
    infos = registry.infos(target)
    table = Table(show_header=True, header_style="bold")
    for col in ("code", "name", "target", "default", "summary"):
        table.add_column(col)
    for r in infos:  # Text cells: a summary like "x[d]" is text, not rich markup
        table.add_row(*(Text(v) for v in (r.code, r.name, r.target, "on" if r.default_enabled else "off", r.summary)))
    _table_console(sys.stdout, 160).print(table)


@app.command()
@guarded
def explain(code: str = typer.Argument(..., help="A rule code (TX201) or name.")) -> None:
    """Print a rule's documentation and its examples."""
    rule = registry.find(code)
    typer.echo(render_rule_doc(rule))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@guarded
def verify(
    ctx: typer.Context,
    original: Path = typer.Argument(..., help="The original file (model definition or training script)."),
    ported: Path = typer.Argument(..., help="The port of it."),
    model: Optional[str] = typer.Option(None, "--model", help="Model level: a name or call evaluated in each file, e.g. \"ResNet(num_classes=10)\"."),
    inputs: List[str] = typer.Option([], "--input", help="Model level: an input, dtype\\[shape] with an optional <high for integers (float32[8,3,32,32], int64[8,128]<30000); repeat for several. Default: the original's example_inputs()."),
    script: bool = typer.Option(False, "--script", help="Script level: run both training scripts unmodified (arguments after --); an MXNet/Gluon original runs in the MXNet venv (scripts/bootstrap-mxnet)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Training steps to compare (model level 5, script level 12)."),
    optimizer: str = typer.Option("sgd", "--optimizer", help="Model level: sgd (momentum 0.9) or adam."),
    lr: float = typer.Option(0.01, "--lr", help="Model level: learning rate of the comparison steps."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights, inputs and data order."),
    dtype: str = typer.Option("auto", "--dtype", help="Script level: torch's default float dtype in both runs. auto (default): float64 when both sides run in it (no float32 rounding noise, which adaptive optimizers amplify), else float32 with tolerances that grow with the step; float32 is the run as written."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Relative tolerance (default by dtype; float32: 1e-4 model level; script level 1e-5 in float64, 5e-4 x the step index in float32)."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Absolute tolerance (default by dtype; float32: 1e-5)."),
    reference: bool = typer.Option(False, "--reference", help="Model level: run the torch original's forward, backward and steps once more in float64; a tensor outside the tolerance passes when the port is at most 10x as far from those values as the original itself is (float32 rounding, not a real difference). Script level judges float32 losses that differ the same way by itself, against a float64 run of the original that draws the same random numbers."),
    max_compiles: int = typer.Option(0, "--max-compiles", min=0, help="Compilations allowed after the warm-up steps."),
    max_transfers: int = typer.Option(0, "--max-transfers-per-step", min=0, help="Device-to-host transfers allowed in a step (script level: in a step that logs nothing)."),
    warmup: int = typer.Option(2, "--warmup-steps", min=0, help="Steps allowed to compile."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds each side may run."),
    memory_mb: float = typer.Option(16384.0, "--memory-mb", help="Resident memory each side may use (its whole process tree)."),
    files: Optional[Path] = typer.Option(None, "--files", help="Script level: a folder whose contents are copied into both sides' working directories (the data files the scripts read by relative paths)."),
    synthetic_size: Optional[int] = typer.Option(None, "--synthetic-size", min=1, help="Script level: samples in each synthetic stand-in for a torchvision dataset (default 256 per step)."),
    fmt: str = typer.Option("text", "--format", help="text, json or html."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the report here (json or html) instead of stdout."),
) -> None:
    """Run the original and the port side by side and compare them; measure the port's XLA health.

    Exit 0: within tolerance and budget; 1: a divergence or a budget exceeded; 2: a side could
    not run, or a usage error.
    """
    from porter.verify import render
    from porter.verify.compare import Tolerance
    from porter.verify.model import Budgets, ModelRequest, verify_model
    from porter.verify.specs import InputSpec, SpecError

    if fmt not in ("text", "json", "html"):
        raise UsageError(f"unknown format {fmt!r} (text, json, html)")
    for p in (original, ported):
        if not p.is_file():
            raise UsageError(f"{p}: no such file")
    if script == (model is not None):
        raise UsageError("give either --model EXPR (model level) or --script (script level)")
    if optimizer not in ("sgd", "adam"):
        raise UsageError(f"unknown optimizer {optimizer!r} (sgd, adam)")
    budgets = Budgets(max_compiles, max_transfers, warmup)
    if files is not None and not (script and files.is_dir()):
        raise UsageError(f"--files {files}: not a folder" if script else "--files is for script level (--script)")
    if script and reference:
        raise UsageError("--reference is for model level (--model); script level compares in float64 itself "
                         "(--dtype auto), and float32 losses that differ against a float64 run of the original")
    if script:
        if dtype not in ("auto", "float32", "float64"):
            raise UsageError(f"unknown dtype {dtype!r} (auto, float32, float64)")
        from porter.verify.script import ScriptRequest, original_is_mxnet, verify_script  # imports torch

        if dtype == "float64" and original_is_mxnet(original):
            raise UsageError("--dtype float64: an MXNet original runs in float32 (Gluon's default); use auto or float32")
        report = verify_script(ScriptRequest(original, ported, steps or 12, tuple(ctx.args), seed, dtype,
                                             rtol, atol, budgets, timeout, memory_mb, synthetic_size=synthetic_size,
                                             files=files))
    else:
        if ctx.args:
            raise UsageError(f"unexpected arguments {' '.join(ctx.args)} (script arguments go with --script)")
        try:
            for spec in inputs:
                InputSpec.parse(spec)
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        report = verify_model(ModelRequest(original, ported, model, tuple(inputs), steps or 5, optimizer, lr, seed,
                                           Tolerance(rtol, atol), budgets, timeout, memory_mb, reference=reference))
    text = render.as_json(report) if fmt == "json" else render.as_html(report) if fmt == "html" else None
    if out is not None:
        out.write_text(text if text is not None else render.as_json(report), encoding="utf-8")
        say(f"porter verify: {report.status}: {report.summary} (report: {out})")
    elif text is not None:
        typer.echo(text)
    else:
        render.print_text(report, _table_console(sys.stdout))
    raise typer.Exit(report.exit_code)


@app.command()
@guarded
def zoo(
    package: str = typer.Argument(..., help="The zoo: a package folder or an importable package name (torchvision.models, timm, gluoncv)."),
    to: str = typer.Option(..., "--to", help="Target: torch-xla or jax."),
    out: Path = typer.Option(..., "--out", help="Folder for the package's port, the per-model results and the drivers."),
    models: List[str] = typer.Option([], "--model", help="A model as MODULE:EXPR (torchvision.models:resnet18()); repeat for several. Default: the zoo's registry, else every no-argument factory and model class."),
    select: List[str] = typer.Option([], "--select", help="Only models whose name matches this glob (resnet*); repeatable."),
    inputs: List[str] = typer.Option([], "--input", help="Input spec for every model (float32[2,3,224,224]); repeatable. Default: the model's metadata, batch 2."),
    steps: int = typer.Option(3, "--steps", min=1, help="Optimizer steps compared per model."),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Models verified at once (local processes, or Ray CPUs of a local cluster)."),
    executor: str = typer.Option("local", "--executor", help="local, or ray (RAY_ADDRESS's cluster, else a local one)."),
    resume: bool = typer.Option(False, "--resume", help="Reuse the results in --out whose code and settings are unchanged."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds each side of a model may run."),
    memory_mb: float = typer.Option(8192.0, "--memory-mb", help="Resident memory each side may use."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Absolute tolerance of the comparison (default by dtype; float32: 1e-5)."),
    image_size: Optional[int] = typer.Option(None, "--image-size", min=8, help="Image models: verify at the smallest of N, 2N, 4N, ... pixels below the model's own input size that it runs on (found on the meta device), else at its own size."),
    fmt: str = typer.Option("text", "--format", help="text, json or html (on stdout)."),
    report_file: Optional[Path] = typer.Option(None, "--report", help="Also write the HTML dashboard here."),
) -> None:
    """Port a whole model zoo as a package and verify its models one by one (docs/zoo.md).

    Exit 0: every model verified; 1: some model did not; 2: a usage error.
    """
    from porter.sources import write_atomic
    from porter.verify.specs import InputSpec, SpecError
    from porter.zoo import report as zoo_report
    from porter.zoo.executors import EXECUTORS, ExecutorError
    from porter.zoo.run import TARGETS as ZOO_TARGETS
    from porter.zoo.run import ZooError, ZooOptions, run_zoo

    if fmt not in ("text", "json", "html"):
        raise UsageError(f"unknown format {fmt!r} (text, json, html)")
    if to not in ZOO_TARGETS:
        raise UsageError(f"unknown target {to!r} ({', '.join(ZOO_TARGETS)})")
    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r} ({', '.join(EXECUTORS)})")
    try:
        for spec in inputs:
            InputSpec.parse(spec)
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    options = ZooOptions(package, to, out.resolve(), tuple(models), tuple(select), tuple(inputs), steps, jobs,
                         executor, resume, timeout, memory_mb, atol, image_size)
    progress = None
    if sys.stderr.isatty() and fmt != "json":
        from rich.progress import TimeRemainingColumn

        progress = Progress(TextColumn("[bold]porter zoo"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), TextColumn("{task.description}"),
                            console=Console(file=sys.stderr, highlight=False), transient=True)
    try:
        if progress is None:
            run_ = run_zoo(options)
        else:
            with progress:
                task = progress.add_task("", total=None)
                run_ = run_zoo(options, on_start=lambda n: progress.update(task, total=n),
                               on_result=lambda r: progress.update(task, advance=1, description=f"{r.name}: {r.status}"))
    except (ZooError, ExecutorError) as exc:
        raise UsageError(str(exc)) from None
    if report_file is not None:
        write_atomic(report_file, zoo_report.as_html(run_).encode())
    if fmt == "json":
        typer.echo(zoo_report.as_json(run_))
    elif fmt == "html":
        typer.echo(zoo_report.as_html(run_))
    else:
        typer.echo(zoo_report.as_text(run_))
    if report_file is not None:
        say(f"porter zoo: dashboard written to {report_file}")
    raise typer.Exit(0 if all(r.status == "verified" for r in run_.results) else 1)


@app.command()
@guarded
def lsp(
    debounce_ms: int = typer.Option(150, "--debounce-ms", min=0, help="Milliseconds after the last change before a document is checked again."),
) -> None:
    """Run porter's language server on stdin/stdout: diagnostics and quick-fixes in the editor (docs/lsp.md)."""
    try:
        import pygls  # noqa: F401
    except ModuleNotFoundError:
        raise UsageError("porter lsp needs pygls: pip install 'porter[lsp]'") from None
    from porter.lsp import serve

    serve(debounce_ms / 1000)


kit_app = typer.Typer(no_args_is_help=True, help="Write a run kit for a port: a Colab notebook or Cloud TPU VM scripts (docs/tpu.md).")
app.add_typer(kit_app, name="kit")
_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}


@kit_app.command("colab", context_settings=_EXTRA)
@guarded
def kit_colab(
    ctx: typer.Context,
    port: Path = typer.Argument(..., help="The ported script (.py) or notebook (.ipynb)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the notebook into."),
    target: Optional[str] = typer.Option(None, "--target", help="torch-xla or jax; default: from the port's imports."),
    data: Optional[str] = typer.Option(None, "--data", help="gs://bucket/prefix (gcsfs, Colab auth) or drive:PATH (Drive mount)."),
) -> None:
    """A Colab notebook: install the pins, check the TPU, reach the data, run the port (arguments after --)."""
    try:
        import nbformat  # noqa: F401
    except ModuleNotFoundError:
        raise UsageError("porter kit colab needs nbformat: pip install 'porter[notebooks]'") from None
    from porter.kits import KitError, colab

    try:
        path = colab.write_kit(port, out, target, data, tuple(ctx.args))
    except KitError as exc:
        raise UsageError(str(exc)) from None
    say(f"porter kit colab: wrote {path} (File > Upload notebook in Colab, runtime type TPU)")


@kit_app.command("tpu-vm", context_settings=_EXTRA)
@guarded
def kit_tpu_vm(
    ctx: typer.Context,
    port: Path = typer.Argument(..., help="The ported script (.py)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the scripts into."),
    accelerator: str = typer.Option("v5litepod-8", "--accelerator", help="Accelerator type (docs/tpu.md lists them)."),
    zone: Optional[str] = typer.Option(None, "--zone", help="Zone; default: the first documented zone of the accelerator."),
    project: Optional[str] = typer.Option(None, "--project", help="Google Cloud project; default: gcloud's configured one."),
    name: Optional[str] = typer.Option(None, "--name", help="TPU VM name; default: porter-<port name>."),
    data: Optional[str] = typer.Option(None, "--data", help="gs://bucket/prefix to stage onto every worker's disk."),
    target: Optional[str] = typer.Option(None, "--target", help="torch-xla or jax; default: from the port's imports."),
) -> None:
    """Scripts that create a TPU VM, install, stage data, copy, run (arguments after --), fetch and delete."""
    from porter.kits import KitError, tpu_vm

    try:
        files = tpu_vm.write_kit(port, out, accelerator, zone, project, name, data, target, tuple(ctx.args))
    except KitError as exc:
        raise UsageError(str(exc)) from None
    note = tpu_vm.zone_note(accelerator, zone)
    if note:
        say(f"porter: warning: {note}")
    say(f"porter kit tpu-vm: wrote {len(files)} files to {out}; start with {out / 'all.sh'} --dry-run")


def render_rule_doc(rule) -> str:
    from porter.docs import rule_markdown

    return rule_markdown(rule)


def main(argv: Optional[List[str]] = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main()
