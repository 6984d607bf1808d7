"""Running one side in its own interpreter, with a timeout and a memory limit.

The memory limit is enforced by watching the resident memory of the side's whole process
tree (an address-space rlimit would break XLA, which reserves far more address space than it
uses). A side that crashes, hangs or grows past its limit is killed with its children and
comes back as a clear cause, never as a hang or a lost exit code.

``run_side`` runs one side to its end. ``Side`` is the same, one poll at a time, so that two
sides can run at once (``watch``): model-level verification starts the port while the
original still runs, and stops it when the original fails.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import struct
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import psutil

from porter.verify import warm

POLL_S = 0.1


@dataclass(frozen=True)
class SideRun:
    returncode: Optional[int]
    seconds: float
    log: str  # stdout and stderr together (the tail)
    cause: str = ""  # "" when it exited by itself; else timeout / memory / signal description
    peak_mb: float = 0.0
    warm: bool = False  # forked by a warm interpreter (porter.verify.warm)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.cause


def side_environment(*extra: Optional[dict]) -> dict:
    """The environment of a side process: this process's, with this porter importable first
    (the side must import the same porter), string hashing pinned alike on every side unless
    the user pinned it (a vocabulary numbered in the order of a `set` of words is the same on
    both sides), then the ``extra`` entries in order."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONHASHSEED", "0")
    for entries in extra:
        env.update(entries or {})
    return env


def _tree_rss(proc: Optional[psutil.Process]) -> int:
    total = 0
    if proc is None:
        return 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def _terminal() -> "tuple[Optional[int], Any]":
    """(master fd, stdin for the side): a pseudo-terminal of 24 x 80 whose first read is an
    end of file, so that a script that asks its terminal for its size (``stty size``, as
    progress bars do) gets one, and one that reads its input gets EOF as from /dev/null.
    Where no pseudo-terminal can be opened: /dev/null."""
    try:
        import fcntl
        import pty
        import termios

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        os.write(master, b"\x04")  # end of file for the first read, in canonical mode
        return master, slave
    except (ImportError, OSError):
        return None, subprocess.DEVNULL


def _close(fd: Any) -> None:
    if isinstance(fd, int) and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


class _Fresh:
    """A side started as a subprocess of porter's, in a session of its own. Its process group is
    signalled only while the side is not reaped yet (its id, the group's, cannot then have been
    given to another process): ``poll()`` sees that it ended without reaping it (``WNOWAIT``),
    kills what it left in its group (daemons, data loader workers), then reaps it."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid

    def poll(self) -> Optional[int]:
        if self.popen.returncode is None:
            try:
                if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return None
            except ChildProcessError:  # reaped already
                return self.popen.poll()
            self.kill_tree()
        return self.popen.wait()

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.popen.args, timeout or 0)
            time.sleep(delay)
            delay = min(2 * delay, POLL_S)
        return code

    def kill_tree(self) -> None:
        if self.popen.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# the sides still running, killed when porter exits: each runs in its own session (so that its
# whole tree can be killed), so a signal to porter's process group does not reach it
_LIVE: "weakref.WeakSet[Side]" = weakref.WeakSet()
_GUARDED = {"exit": False, "signals": False}


def _stop_live_sides() -> None:
    for side in list(_LIVE):
        side.kill("stopped: porter itself was stopped")


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _guard() -> None:
    """Once per process: at exit the sides still running are killed with their trees, and
    SIGTERM / SIGHUP (whose default ends porter at once, no cleanup run) end it through
    SystemExit where nothing else handles them (set from the main thread: a zoo run whose
    sides start in worker threads calls this from its main thread first)."""
    if not _GUARDED["exit"]:
        _GUARDED["exit"] = True
        atexit.register(_stop_live_sides)
    if not _GUARDED["signals"] and threading.current_thread() is threading.main_thread():
        _GUARDED["signals"] = True  # (signal handlers can only be set from the main thread)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _exit_on_signal)


class Side:
    """One side's process (its own session, so its whole tree can be killed), watched by
    ``poll()``: past ``timeout`` seconds of its clock or ``memory_mb`` of resident memory it is
    killed and the cause kept. ``restart_clock()`` starts the timeout over (a side that waited
    for another one is timed from when it could start its own work). ``preload``: the modules
    the side's command imports before any code of the user's runs, which a warm interpreter
    may have imported for it (``porter.verify.warm``; empty: always a fresh interpreter)."""

    def __init__(self, cmd: Sequence[str], env: dict, log_path: Path, timeout: float, memory_mb: float,
                 cwd: Optional[Path] = None, tail_chars: int = 20000, preload: Sequence[str] = ()) -> None:
        self.log_path = Path(log_path)
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.tail_chars = tail_chars
        self.start = self.clock = time.monotonic()
        self.peak = 0
        self.cause = ""
        self.code: Optional[int] = None
        self.done = False
        self.end = self.start
        self._log = open(self.log_path, "wb")
        self._terminal, stdin = _terminal()
        self.proc: Union[_Fresh, warm.WarmProcess]
        try:
            forked = warm.start(cmd, env, cwd, stdin, self._log, preload) if preload else None
            self.warm = forked is not None
            self.proc = forked or _Fresh(subprocess.Popen(list(cmd), stdout=self._log, stderr=subprocess.STDOUT,
                                                          stdin=stdin, env=env, cwd=cwd, start_new_session=True))
        except BaseException:
            self._log.close()
            _close(self._terminal)
            raise
        finally:
            _close(stdin)
        try:
            self._watcher: Optional[psutil.Process] = psutil.Process(self.proc.pid)
        except psutil.Error:  # a warm side that ended at once (reaped by its interpreter)
            self._watcher = None
        _guard()
        _LIVE.add(self)

    def restart_clock(self) -> None:
        self.clock = time.monotonic()

    def poll(self) -> bool:
        """Check the side once; True when it has ended (by itself or killed)."""
        if self.done:
            return True
        code = self.proc.poll()
        if code is not None:
            self._finish(code)
            return True
        rss = _tree_rss(self._watcher)
        self.peak = max(self.peak, rss)
        if rss > self.memory_mb * 1024 * 1024:
            self.kill(f"memory limit exceeded ({rss / 2**20:.0f} MB > {self.memory_mb:.0f} MB); killed")
        elif time.monotonic() - self.clock > self.timeout:
            self.kill(f"timed out after {self.timeout:.0f} s; killed")
        return self.done

    def kill(self, cause: str) -> None:
        if self.done:
            return
        self.cause = cause
        self.proc.kill_tree()
        self._finish(self.proc.wait())

    def _finish(self, code: int) -> None:
        self.code = code
        self.end = time.monotonic()
        self._log.close()
        _close(self._terminal)
        self._terminal = None
        self.done = True
        _LIVE.discard(self)

    def wait(self) -> "SideRun":
        while not self.poll():
            try:
                self.proc.wait(timeout=POLL_S)  # returns as soon as the side exits
            except subprocess.TimeoutExpired:
                pass
        return self.result()

    def result(self) -> SideRun:
        assert self.done, "the side is still running"
        text = self.log_path.read_bytes()[-self.tail_chars:].decode("utf-8", "replace")
        cause = self.cause
        code = self.code
        if not cause and code is not None and code < 0:
            try:
                cause = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                cause = f"killed by signal {-code}"
        return SideRun(code, self.end - self.start, text, cause, self.peak / 2**20, self.warm)


def run_side(cmd: Sequence[str], env: dict, log_path: Path, timeout: float, memory_mb: float,
             cwd: Optional[Path] = None, tail_chars: int = 20000, preload: Sequence[str] = ()) -> SideRun:
    return Side(cmd, env, log_path, timeout, memory_mb, cwd, tail_chars, preload).wait()


def watch(sides: Sequence[Side], on_end: Callable[[Side], None] = lambda side: None) -> None:
    """Poll SIDES until all have ended; ``on_end(side)`` runs once as each one ends (it may
    kill the others or restart their clocks)."""
    seen: set[int] = set()
    try:
        while True:
            for side in sides:
                if side.poll() and id(side) not in seen:
                    seen.add(id(side))
                    on_end(side)
            if all(side.done for side in sides):
                return
            time.sleep(POLL_S)
    finally:  # an exception here (Ctrl-C) must not leave a side running
        for side in sides:
            if not side.done:
                side.kill("stopped: porter itself was interrupted")


def traced_record(side: SideRun, target: Path, script: Any, timeout: float, memory_mb: float) -> dict:
    """What a tracer side (porter.verify.trace / trace_mxnet) recorded in ``target``, with its
    exit status, log tail and peak memory; a record of why there is none when the side ran out
    of time or memory (killed by porter: no exit status of its own) or wrote nothing."""
    base = {"returncode": side.returncode, "output": side.log, "script": str(script), "peak_mb": round(side.peak_mb, 1),
            "warm": side.warm}
    if side.cause.startswith("timed out"):
        return {**base, "returncode": None, "status": "timeout", "timeout_s": timeout, "cause": side.cause}
    if side.cause.startswith("memory"):
        return {**base, "returncode": None, "status": "memory", "memory_mb": memory_mb, "cause": side.cause}
    if not target.exists():
        return {**base, "status": "crashed", "cause": side.cause}
    record = json.loads(target.read_text(encoding="utf-8"))
    record.update(base)
    return record
