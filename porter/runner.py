"""Runs the engine over files: reading, diffing, atomic writes, parallel jobs.

Every file is processed on its own and yields a plain, picklable :class:`FileOutcome`;
a failure in one file (bad input, a rule that crashes, fixes that do not converge) never
stops the batch, and nothing is written for a failed file.
"""
from __future__ import annotations

import difflib
import os
import shutil
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from porter import engine, registry
from porter.rules import Finding, Safety
from porter.sources import iter_all_files, iter_python_files, read_source, write_atomic


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs, picklable (rules are looked up again in each worker)."""

    target: str = "torch-xla"
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    unsafe_fixes: bool = False

    def options(self) -> engine.Options:
        return engine.Options(registry.select(self.target, self.select, self.ignore), self.unsafe_fixes)


@dataclass(frozen=True)
class FindingRecord:
    path: str
    code: str
    message: str
    severity: str
    line: int
    column: int
    end_line: int
    end_column: int
    fixable: bool
    safety: Optional[str]

    @classmethod
    def of(cls, path: str, f: Finding) -> "FindingRecord":
        pos = f.position
        return cls(
            path, f.code, f.message, f.severity.value,
            pos.line if pos else 1, pos.column if pos else 0,
            pos.end_line if pos else 1, pos.end_column if pos else 0,
            f.fix is not None, f.fix.safety.value if f.fix else None,
        )


@dataclass(frozen=True)
class FileOutcome:
    path: str
    status: str  # "changed" | "unchanged" | "failed"
    error: str = ""
    diff: str = ""
    findings: tuple[FindingRecord, ...] = ()
    fixed: tuple[tuple[str, int], ...] = ()


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def check_file(path: Path, settings: Settings) -> FileOutcome:
    name = _display(path)
    try:
        src = read_source(path)
        result = engine.check(src.text, settings.options(), name)
    except engine.PorterError as exc:
        return FileOutcome(name, "failed", str(exc))
    except Exception as exc:  # a rule crashed: report it against this file, go on
        return FileOutcome(name, "failed", _internal(exc))
    return FileOutcome(name, "unchanged", findings=tuple(FindingRecord.of(name, f) for f in result.findings))


def migrate_file(path: Path, settings: Settings, mode: str, out: Optional[Path] = None) -> FileOutcome:
    """``mode``: "diff" (write nothing), "write" (in place) or "out" (to ``out``)."""
    name = _display(path)
    try:
        src = read_source(path)
        result = engine.fix(src.text, settings.options(), name)
        findings = tuple(FindingRecord.of(name, f) for f in result.remaining)
        fixed = tuple(sorted(result.fixed.items()))
        if mode == "out" and out is not None:
            if result.changed:
                write_atomic(out, src.encode(result.source))
            else:
                _copy(path, out)
        if not result.changed:
            return FileOutcome(name, "unchanged", findings=findings)
        diff = "".join(difflib.unified_diff(
            src.text.splitlines(keepends=True), result.source.splitlines(keepends=True),
            fromfile=f"a/{name}", tofile=f"b/{name}",
        ))
        if mode == "write":
            write_atomic(path, src.encode(result.source))
        return FileOutcome(name, "changed", diff=diff, findings=findings, fixed=fixed)
    except engine.PorterError as exc:
        return FileOutcome(name, "failed", str(exc))
    except OSError as exc:
        return FileOutcome(name, "failed", f"cannot write: {exc.strerror or exc}")
    except Exception as exc:
        return FileOutcome(name, "failed", _internal(exc))


def _internal(exc: Exception) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return f"internal error{where}: {type(exc).__name__}: {exc}".splitlines()[0]


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def _task(args):
    kind, path, settings, mode, out = args
    if kind == "check":
        return check_file(path, settings)
    return migrate_file(path, settings, mode, out)


def run(
    kind: str,
    paths: list[Path],
    settings: Settings,
    mode: str = "diff",
    out_dir: Optional[Path] = None,
    jobs: int = 1,
    on_file: Optional[Callable[[FileOutcome], None]] = None,
) -> list[FileOutcome]:
    """Process every Python file under ``paths``; ``on_file`` is called as each finishes."""
    settings.options()  # fail fast (unknown target, broken rule module) before any work
    files = iter_python_files(paths)
    tasks = []
    for path, root in files:
        out = (out_dir / path.relative_to(root)) if (out_dir is not None and mode == "out") else None
        tasks.append((kind, path, settings, mode, out))
    results: list[FileOutcome] = []
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for outcome in pool.map(_task, tasks, chunksize=max(1, min(16, len(tasks) // (jobs * 8) or 1))):
                results.append(outcome)
                if on_file:
                    on_file(outcome)
    else:
        for t in tasks:
            outcome = _task(t)
            results.append(outcome)
            if on_file:
                on_file(outcome)
    if out_dir is not None and mode == "out":
        _copy_untouched(paths, out_dir, {t[1] for t in tasks})
    return results


def _copy_untouched(paths: list[Path], out_dir: Path, python_files: set[Path]) -> None:
    """Copy the non-Python files of each walked directory into the --out tree."""
    for root in paths:
        if not root.is_dir():
            continue
        for f in iter_all_files(root):
            if f in python_files or f.suffix == ".py":
                continue
            try:
                _copy(f, out_dir / f.relative_to(root))
            except OSError:
                pass  # unreadable extras are not ours to report; sources are
