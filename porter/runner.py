"""Runs the engine over files: finding them, reading, verifying, diffing, writing, parallel jobs.

Every file is processed on its own and yields a plain, picklable :class:`FileOutcome`; a
failure in one file (bad input, a rule that crashes, fixes that do not converge, output that
LibCST or CPython would not read back) never stops the batch, and nothing is written for a
failed file. Problems with the request itself (unknown rule codes, an ``--out`` folder that
overlaps the sources) raise :class:`UsageError` before any file is touched.
"""
from __future__ import annotations

import ast
import difflib
import multiprocessing
import os
import shutil
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from porter import engine, program, registry
from porter.gcsdata import GcsDataRule
from porter.platforms import PinnedVersionsRule, check_pin_file, iter_pin_files
from porter.rules import Finding
from porter.sources import (
    TMP_SUFFIX, copy_atomic, iter_other_files, iter_python_files, read_source, write_atomic,
)

if TYPE_CHECKING:  # pragma: no cover
    import libcst as cst

MODES = ("diff", "write", "out")
# Per-file budgets by default. The largest real file measured, torch's
# testing/_internal/common_methods_invocations.py (1.2 MB), takes 29 s of CPU time and
# 0.9 GB (maximum resident set) to migrate (145 s of wall-clock time on 2 cores at load 17:
# hence a CPU-time budget); a 9.9 MB generated file took 480 s and 11.4 GB before the budgets.
DEFAULT_TIME_LIMIT = 300.0
DEFAULT_MEMORY_MB = 4096


class UsageError(Exception):
    """The request cannot be carried out as asked (exit code 2); nothing was touched."""


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs, picklable (rules are looked up again in each worker)."""

    target: str = "torch-xla"
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    # Per-file budgets (0: none). A file is processed in a worker process (also with one
    # job) that is stopped past ``time_limit`` seconds of CPU time (RLIMIT_CPU; the parent
    # also kills it at WALL_FACTOR times that in wall-clock time) and whose address
    # space is capped at ``memory_mb`` MB above what it starts with.
    time_limit: float = DEFAULT_TIME_LIMIT
    memory_mb: int = DEFAULT_MEMORY_MB
    # --data gs://bucket/prefix: the target's data rule (porter.gcsdata) runs, configured with it
    data: str = ""
    # library model code ported along (porter.program's ported_libraries): (module, names) pairs
    libraries: tuple = ()

    def program_facts(self) -> Optional[program.ProgramFacts]:
        """What the rules know of the rest of the program (None: they read it themselves)."""
        return program.ProgramFacts(ported_libraries=self.libraries) if self.libraries else None

    @property
    def limited(self) -> bool:
        return self.time_limit > 0 or self.memory_mb > 0

    def options(self) -> engine.Options:
        rules = registry.select(self.target, self.select, self.ignore)
        if self.data:  # the target's data rule, configured with the bucket path (unless ignored)
            rules = tuple(r for r in rules if not issubclass(r, GcsDataRule)) + tuple(
                r.configured(self.data) for r in registry.rules_for(self.target)
                if issubclass(r, GcsDataRule) and r.target == self.target
                and not any(r.code.startswith(i.upper()) or r.name == i for i in self.ignore))
        return engine.Options(rules, self.unsafe_fixes)

    def validate(self, origin: str = "") -> None:
        """Raise UsageError for a select/ignore entry that names no rule of the target."""
        rules = registry.rules_for(self.target)
        for option, values in (("select", self.select), ("ignore", self.ignore)):
            for value in values:
                if not any(r.code.startswith(value.upper()) or r.name == value for r in rules):
                    where = f" ({origin})" if origin else ""
                    raise UsageError(
                        f"unknown rule code {value!r} in --{option}{where}: no {self.target} rule has "
                        "this code, code prefix or name; `porter rules` lists them"
                    )


@dataclass(frozen=True)
class FindingRecord:
    """A finding as plain data. ``line`` 1-based; ``column``/``end_column`` 0-based code points,
    ``end_column`` exclusive (LibCST's convention; the renderers convert)."""

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
    # notebooks (porter/notebook.py): the 1-based cell number, line/column then being within
    # the cell; and (line, column, end_line, end_column) of the place in the .ipynb's text
    cell: Optional[int] = None
    file_region: Optional[tuple[int, int, int, int]] = None

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
    status: str  # "changed" | "unchanged" | "failed" | "copied" (a non-Python file, --out)
    error: str = ""
    diff: str = ""
    findings: tuple[FindingRecord, ...] = ()
    fixed: tuple[tuple[str, int], ...] = ()
    out: str = ""  # where the file was written (--out), for messages


def display(path: Path) -> str:
    """The path as the user would type it: relative to the working folder when inside it."""
    p = str(path)
    if os.path.isabs(p):
        try:
            rel = os.path.relpath(p)
        except ValueError:
            return p
        return p if rel.startswith("..") else rel
    return os.path.normpath(p)


def internal_error(exc: BaseException) -> str:
    """One line: the exception, where porter's own code raised it (not LibCST's frames)."""
    return f"internal error (a bug in porter): {engine.describe_exception(exc)}"


def memory_message(settings: "Settings") -> str:
    return (f"over the memory limit of {settings.memory_mb} MB (--memory-limit); file left unchanged"
            if settings.memory_mb else "out of memory; file left unchanged")


def parse_error_message(exc: engine.PorterError, text: str) -> str:
    """The engine's message for a file LibCST cannot parse, with CPython's position and
    wording when CPython rejects it too (LibCST's native parser often points a line off)."""
    message = str(exc)
    if not message.startswith(("syntax error", "cannot parse")):
        return message
    try:
        compile(text, "<file>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as err:
        where = f"line {err.lineno}" + (f", column {err.offset}" if err.offset else "")
        hint = " (this looks like Python 2 code; porter reads Python 3)" if "Python 2" in message else ""
        return f"syntax error at {where}: {err.msg}{hint}"
    except (ValueError, RecursionError, MemoryError):
        return message
    return f"LibCST cannot parse this file although CPython can ({message})"


def check_file(path: Path, settings: Settings) -> FileOutcome:
    with program.facts(settings.program_facts()):
        return _check_file(path, settings)


def _check_file(path: Path, settings: Settings) -> FileOutcome:
    if path.suffix == ".ipynb":
        from porter import notebook

        return notebook.check_file(path, settings)
    name = display(path)
    src = None
    try:
        src = read_source(path)
        result = engine.check(src.text, settings.options(), name)
    except engine.PorterError as exc:
        return FileOutcome(name, "failed", parse_error_message(exc, src.text) if src else str(exc))
    except MemoryError:
        return FileOutcome(name, "failed", memory_message(settings))
    except Exception as exc:  # a bug in porter outside the rules: report it against this file, go on
        return FileOutcome(name, "failed", internal_error(exc))
    return FileOutcome(name, "unchanged", findings=tuple(FindingRecord.of(name, f) for f in result.findings))


def pin_rule(settings: Settings):
    """The target's pinned-versions rule (PV) when it is enabled, else None."""
    return next((r for r in settings.options().rules if isinstance(r, type) and issubclass(r, PinnedVersionsRule)
                 and r.target == settings.target), None)


def check_pin_files(paths: Sequence[Path], settings: Settings) -> list[FileOutcome]:
    """The requirement and constraint files under ``paths`` checked against the target's
    profile (porter.platforms), when the target's pinned-versions rule is enabled."""
    rule = pin_rule(settings)
    if rule is None:
        return []
    out = []
    for path in iter_pin_files(paths):
        name = display(path)
        result = check_pin_file(path, settings.target)
        if result.error:
            out.append(FileOutcome(name, "failed", result.error))
            continue
        out.append(FileOutcome(name, "unchanged", findings=tuple(
            FindingRecord(name, rule.code, f.message, rule.severity.value, f.line, f.column, f.line, f.end_column, False, None)
            for f in result.findings)))
    return out


def verify_output(before: str, after: str, parsed: Optional[cst.Module] = None) -> None:
    """Refuse output that is not what the fixes meant, or not Python.

    LibCST does not reproduce a few inputs byte for byte (platform-facts.md: ``'pass\\n\\n '``
    loses a line); fixing such a file would also change code no rule touched. And the output
    must compile with CPython whenever the input did. ``parsed``: ``before`` already parsed
    (``engine.FixResult.source_module``), not parsed again.
    """
    if (parsed if parsed is not None else engine.parse(before)).code != before:
        raise engine.PorterError(
            "LibCST cannot reproduce this file byte for byte (a LibCST limitation with its "
            "whitespace); left unchanged, port it by hand"
        )
    try:
        compile(before, "<before>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return  # CPython cannot read the input either (newer syntax?); LibCST's check stands
    try:
        compile(after, "<after>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as exc:
        raise engine.PorterError(
            f"internal error: the converted code does not compile (line {exc.lineno}: {exc.msg}); "
            "file left unchanged"
        ) from None


def unified_diff(before: str, after: str, name: str) -> str:
    """A unified diff that `patch -p1` and `git apply` accept, also for files that do not end
    with a newline (marked ``\\ No newline at end of file``)."""
    out = []
    for line in difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{name}", tofile=f"b/{name}",
    ):
        if not line.endswith(("\n", "\r")):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def migrate_file(path: Path, settings: Settings, mode: str, out: Optional[Path] = None) -> FileOutcome:
    """``mode``: "diff" (write nothing), "write" (in place) or "out" (to ``out``)."""
    with program.facts(settings.program_facts()):
        return _migrate_file(path, settings, mode, out)


def _migrate_file(path: Path, settings: Settings, mode: str, out: Optional[Path] = None) -> FileOutcome:
    if path.suffix == ".ipynb":
        from porter import notebook

        return notebook.migrate_file(path, settings, mode, out)
    name = display(path)
    out_name = display(out) if out is not None else ""
    src = None
    try:
        src = read_source(path)
        result = engine.fix(src.text, settings.options(), name)
        if result.changed:
            verify_output(src.text, result.source, result.source_module)
            data = src.encode(result.source)
        shown = out_name if mode == "out" else name
        findings = tuple(FindingRecord.of(shown, f) for f in result.remaining)
        if mode == "out":
            assert out is not None
            write_atomic(out, data if result.changed else src.raw, src.mode, follow_symlinks=False)
            if not result.changed:
                keep_times(path, out)
        if not result.changed:
            return FileOutcome(name, "unchanged", findings=findings, out=out_name)
        if mode == "write":
            write_atomic(path, data, src.mode)
        diff = unified_diff(src.text, result.source, name) if mode == "diff" else ""
        fixed = tuple(sorted(result.fixed.items()))
        return FileOutcome(name, "changed", diff=diff, findings=findings, fixed=fixed, out=out_name)
    except engine.PorterError as exc:
        return FileOutcome(name, "failed", parse_error_message(exc, src.text) if src else str(exc))
    except OSError as exc:
        where = f" {display(Path(exc.filename))}" if exc.filename else ""
        return FileOutcome(name, "failed", f"cannot write{where}: {exc.strerror or exc}")
    except MemoryError:
        return FileOutcome(name, "failed", memory_message(settings))
    except Exception as exc:
        return FileOutcome(name, "failed", internal_error(exc))


def keep_times(src: Path, dst: Path) -> None:
    try:
        st = os.stat(src)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError:
        pass


def copy_other(src: Path, dst: Path) -> FileOutcome:
    """Copy a non-Python file into the --out tree: symlinks as symlinks, files atomically."""
    name = display(src)
    try:
        st = os.lstat(src)
        if stat.S_ISLNK(st.st_mode):
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}{TMP_SUFFIX}")
            os.symlink(os.readlink(src), tmp)
            try:
                os.replace(tmp, dst)
            except BaseException:
                os.unlink(tmp)
                raise
        elif stat.S_ISREG(st.st_mode):
            copy_atomic(src, dst)
        else:
            return FileOutcome(name, "failed", "not a regular file; not copied to --out")
    except engine.PorterError as exc:
        return FileOutcome(name, "failed", f"not copied to --out: {exc}")
    except OSError as exc:
        return FileOutcome(name, "failed", f"cannot copy to --out: {exc.strerror or exc}")
    return FileOutcome(name, "copied", out=display(dst))


def _task(args):
    kind, path, settings, mode, out = args
    if kind == "check":
        return check_file(path, settings)
    return migrate_file(path, settings, mode, out)


# --------------------------------------------------------------------------------------
# --out planning
# --------------------------------------------------------------------------------------
def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def out_base(paths: Sequence[Path]) -> Path:
    """The folder whose layout the --out tree mirrors: the folder given when there is one
    folder, else the deepest folder holding every path given."""
    if len(paths) == 1 and paths[0].is_dir():
        return Path(os.path.abspath(paths[0]))
    anchors = [os.path.abspath(p) if p.is_dir() else os.path.dirname(os.path.abspath(p)) for p in paths]
    return Path(os.path.commonpath(anchors))


def plan_out(paths: Sequence[Path], files: Sequence[Path], out_dir: Path) -> Callable[[Path], Path]:
    """Check that --out cannot touch the sources; return source path -> output path."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} exists and is not a folder")
    out_real = os.path.realpath(out_dir)
    for p in paths:
        if p.is_dir():
            real = os.path.realpath(p)
            if _inside(out_real, real):
                same = "is" if out_real == real else "lies inside"
                raise UsageError(
                    f"--out {out_dir} {same} the source folder {p}; choose a folder outside it "
                    f"(e.g. {os.path.join(os.path.dirname(real.rstrip(os.sep)) or os.sep, os.path.basename(real.rstrip(os.sep)) + '_xla')})"
                )
            if _inside(real, out_real):
                raise UsageError(f"the source folder {p} lies inside --out {out_dir}; the output could overwrite it")
    base = out_base(paths)
    out_abs = Path(os.path.abspath(out_dir))

    def target(f: Path) -> Path:
        return out_abs / os.path.relpath(os.path.abspath(f), base)

    sources = {os.path.realpath(f) for f in files}
    for f in files:
        if os.path.realpath(target(f)) in sources:
            raise UsageError(f"--out {out_dir} would overwrite the source file {display(f)}")
    return target


# --------------------------------------------------------------------------------------
# The batch
# --------------------------------------------------------------------------------------
def _pool_context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def run(
    kind: str,
    paths: Sequence[Path],
    settings: Settings,
    mode: str = "diff",
    out_dir: Optional[Path] = None,
    jobs: int = 1,
    on_file: Optional[Callable[[FileOutcome], None]] = None,
    on_start: Optional[Callable[[int], None]] = None,
) -> list[FileOutcome]:
    """Process every Python file under ``paths``; results in file order.

    ``on_start(n)`` is called once the n files are known, ``on_file`` as each one finishes.
    With ``mode="out"`` the non-Python files of each folder given are copied to ``out_dir``
    too (their failures are outcomes with status "failed").
    """
    if kind not in ("check", "migrate"):
        raise ValueError(kind)
    if mode not in MODES:
        raise ValueError(mode)
    if mode == "out" and out_dir is None:
        raise UsageError("--out needs a folder")
    paths = [Path(p) for p in paths]
    settings.options()  # fail fast (unknown target, broken rule module) before any work
    files, walk_errors = iter_python_files(paths)
    if kind == "migrate" and mode == "write":
        files = _unique_targets(files)
    target = plan_out(paths, files, out_dir) if (kind == "migrate" and mode == "out" and out_dir is not None) else None
    tasks = [(kind, f, settings, mode, target(f) if target else None) for f in files]
    if on_start:
        on_start(len(tasks))

    results: list[Optional[FileOutcome]] = [None] * len(tasks)

    def done(i: int, outcome: FileOutcome) -> None:
        results[i] = outcome
        if on_file:
            on_file(outcome)

    if tasks and (settings.limited or (jobs > 1 and len(tasks) > 1)):
        _run_workers(tasks, min(jobs, len(tasks)), done, settings)
    else:  # no budgets, one job: in this process
        for i, t in enumerate(tasks):
            done(i, _task(t))
    outcomes = [r for r in results if r is not None]
    outcomes += [FileOutcome(display(p), "failed", msg) for p, msg in walk_errors]
    if kind == "check":
        outcomes += check_pin_files(paths, settings)
    if target is not None:
        py = {os.path.abspath(f) for f in files}
        for root in paths:
            if root.is_dir():
                for f in iter_other_files(root):
                    if os.path.abspath(f) not in py:
                        outcomes.append(copy_other(f, target(f)))
    return outcomes


class _Worker:
    """One worker process and the pipe to it; processes one file at a time."""

    def __init__(self, ctx, memory_mb: int) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, memory_mb), daemon=True)
        self.proc.start()
        child.close()
        self.task: Optional[int] = None
        self.deadline = 0.0

    def stop(self, kill: bool = False) -> None:
        """Kill it, or let it finish its file (its result is read and dropped, so that it
        never blocks on a full pipe) and stop."""
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        while self.proc.is_alive():
            self.proc.join(0.05)
            try:
                while not self.conn.closed and self.conn.poll():
                    self.conn.recv()
            except (EOFError, OSError):
                pass
        self.proc.join()
        self.conn.close()


WALL_FACTOR = 4  # a worker still on its file after this many times its CPU budget (wall clock) is killed
_WALL_EXTRA = 60.0


def _worker_main(conn, memory_mb: int) -> None:
    _worker_init()
    if not os.environ.get("PORTER_DEBUG"):
        # what native code prints as it dies (Rust's "memory allocation of N bytes failed"):
        # the parent reports the file in one line instead
        try:
            import faulthandler

            faulthandler.disable()  # (a test runner's, inherited through fork)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        except OSError:
            pass
    if memory_mb:
        _limit_memory(memory_mb)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        i, task = msg
        _limit_cpu(task[2].time_limit)
        try:
            outcome = _task(task)
        except MemoryError:
            outcome = FileOutcome(display(task[1]), "failed", memory_message(task[2]))
        except Exception as exc:
            outcome = FileOutcome(display(task[1]), "failed", internal_error(exc))
        conn.send((i, outcome))


def _limit_cpu(seconds: float) -> None:
    """The kernel stops this process (SIGXCPU) once it has used ``seconds`` more CPU time
    than now: the budget of the file it starts on. No core file."""
    if seconds <= 0:
        return
    try:
        import math
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        limit = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, OSError, ValueError):
        pass


def _limit_memory(memory_mb: int) -> None:
    """Cap this process's address space at ``memory_mb`` MB above its current size: Python
    then raises MemoryError, and a native allocation that fails aborts the process (which
    the parent reports)."""
    try:
        import resource

        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[0])
        size = pages * os.sysconf("SC_PAGE_SIZE") + memory_mb * 1024 * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            size = min(size, hard)
        resource.setrlimit(resource.RLIMIT_AS, (size, hard))
    except (ImportError, OSError, ValueError):
        pass  # no /proc or no RLIMIT_AS on this platform: no memory budget


def _death(exitcode: Optional[int], settings: Settings) -> str:
    """Why a worker stopped with ``exitcode`` while on a file, for the user."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = {
            "SIGSEGV": "a crash in native code, usually LibCST's parser running out of stack",
            "SIGABRT": "an abort in native code, usually an allocation refused at the memory limit"
                       + (f" of {settings.memory_mb} MB" if settings.memory_mb else ""),
            "SIGKILL": "killed from outside porter (by the out-of-memory killer?)",
            "SIGBUS": "a crash in native code",
        }.get(name, "")
        detail = f"{name}: {why}" if why else name
    else:
        detail = f"exit status {exitcode}"
    return f"porter's worker process died on this file ({detail}); file left unchanged, the other files were processed"


def _run_workers(tasks: list, jobs: int, done: Callable[[int, FileOutcome], None], settings: Settings) -> None:
    """Run tasks in ``jobs`` worker processes, one file at a time each, within the per-file
    budgets of ``settings``: a file past its time is stopped (its worker killed), a worker
    that dies (a native crash, the memory limit) fails its one file, and a fresh worker
    takes the next; the batch goes on. On Ctrl-C the workers finish their file and stop."""
    import time
    from collections import deque
    from multiprocessing.connection import wait as wait_any

    ctx = _pool_context()
    # Largest files first (longest-processing-time-first) with several jobs: the last files
    # to finish are small ones, so the workers run out of work at nearly the same time.
    order = list(range(len(tasks)))
    if jobs > 1:
        order.sort(key=lambda i: -_size(tasks[i][1]))
    queue = deque(order)
    workers: list[_Worker] = []
    limit = settings.time_limit
    try:
        workers = [_Worker(ctx, settings.memory_mb) for _ in range(jobs)]
        while queue or any(w.task is not None for w in workers):
            for w in workers:
                if w.task is None and queue:
                    i = queue.popleft()
                    wall = limit * WALL_FACTOR + _WALL_EXTRA
                    w.task, w.deadline = i, (time.monotonic() + wall if limit > 0 else float("inf"))
                    try:
                        w.conn.send((i, tasks[i]))
                    except OSError:
                        pass  # it died before the task reached it: found below
            busy = [w for w in workers if w.task is not None]
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            wait_any([x for w in busy for x in (w.conn, w.proc.sentinel)], timeout=None if timeout == float("inf") else timeout)
            for k, w in enumerate(workers):
                if w.task is None:
                    continue
                i = w.task
                outcome = None
                if w.conn.poll():
                    try:
                        got, outcome = w.conn.recv()
                    except (EOFError, OSError):
                        outcome = None
                if outcome is not None:
                    w.task = None
                    done(i, outcome)
                    continue
                if not w.proc.is_alive():
                    w.proc.join()
                    if w.proc.exitcode == -signal.SIGXCPU:
                        _remove_temporaries(tasks[i])
                        message = f"over the time limit of {limit:g} s of CPU time for one file (--time-limit); file left unchanged"
                    else:
                        message = _death(w.proc.exitcode, settings)
                elif time.monotonic() >= w.deadline:
                    w.stop(kill=True)
                    _remove_temporaries(tasks[i])
                    message = (f"still running after {WALL_FACTOR * limit + _WALL_EXTRA:g} s of wall-clock time "
                               f"({WALL_FACTOR}x the time limit of {limit:g} s, plus {_WALL_EXTRA:g} s); file left unchanged")
                else:
                    continue
                done(i, FileOutcome(display(tasks[i][1]), "failed", message))
                w.conn.close()
                workers[k] = _Worker(ctx, settings.memory_mb)
    finally:
        for w in workers:
            w.stop()


def _remove_temporaries(task) -> None:
    """The temporary file a killed worker may have left beside the file it was writing."""
    kind, path, _, mode, out = task
    target = out if mode == "out" and out is not None else path
    if kind != "migrate" or mode == "diff" or target is None:
        return
    folder = Path(os.path.realpath(target)).parent
    for leftover in folder.glob(f".{Path(os.path.realpath(target)).name}.*{TMP_SUFFIX}"):
        try:
            leftover.unlink()
        except OSError:
            pass


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the parent stops the batch (exit 130) and
    # shuts the pool down; workers finish or drop their file quietly instead of each
    # printing a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _unique_targets(files: list[Path]) -> list[Path]:
    """In-place writes go to the real file; two names for one file are processed once."""
    seen: set[str] = set()
    out = []
    for f in files:
        real = os.path.realpath(f)
        if real not in seen:
            seen.add(real)
            out.append(f)
    return out
