"""Running one side in its own interpreter, with a timeout and a memory limit.

The memory limit is enforced by watching the resident memory of the side's whole process
tree (an address-space rlimit would break XLA, which reserves far more address space than it
uses). A side that crashes, hangs or grows past its limit is killed with its children and
comes back as a clear cause, never as a hang or a lost exit code.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import psutil


@dataclass(frozen=True)
class SideRun:
    returncode: Optional[int]
    seconds: float
    log: str  # stdout and stderr together (the tail)
    cause: str = ""  # "" when it exited by itself; else timeout / memory / signal description
    peak_mb: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.cause


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
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


def _kill_tree(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_side(cmd: Sequence[str], env: dict, log_path: Path, timeout: float, memory_mb: float,
             cwd: Optional[Path] = None, tail_chars: int = 20000) -> SideRun:
    start = time.monotonic()
    peak = 0
    cause = ""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        watcher = psutil.Process(proc.pid)
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            rss = _tree_rss(watcher)
            peak = max(peak, rss)
            if rss > memory_mb * 1024 * 1024:
                cause = f"memory limit exceeded ({rss / 2**20:.0f} MB > {memory_mb:.0f} MB); killed"
            elif time.monotonic() - start > timeout:
                cause = f"timed out after {timeout:.0f} s; killed"
            if cause:
                _kill_tree(proc.pid)
                code = proc.wait()
                break
        _kill_tree(proc.pid)  # leftovers of a side that exited (daemons, workers)
    seconds = time.monotonic() - start
    text = log_path.read_bytes()[-tail_chars:].decode("utf-8", "replace")
    if not cause and code is not None and code < 0:
        try:
            cause = f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            cause = f"killed by signal {-code}"
    return SideRun(code, seconds, text, cause, peak / 2**20)
