"""Warm interpreters for verification sides: a side forked from a process that has already
imported its framework, instead of a fresh ``python -m`` that imports it again.

Importing torch takes 2-3 s of CPU, and torch_xla's import of torch's compiler stack
(torch._dynamo, torch._inductor, functorch) another 3-4 s: most of a short side's time. With
``PORTER_WARM_SIDES=DIR`` set, a side whose command is ``PYTHON -m MODULE ARGS`` and whose
caller names modules it imports before any code of the user's runs (``preload``) is started as
a fork of a warm interpreter (``porter/verify/warm_server.py``) that imported them: the child
becomes ``python -m MODULE ARGS`` in the side's working directory, with the side's environment,
stdin and log, in a session of its own, and its exit status comes back as a subprocess's does.

A warm interpreter serves only sides that a fresh interpreter would have started alike: it is
keyed by the Python executable, the preloaded modules and the whole environment, except the
variables read after the imports (``RUN_VARIABLES``: the device a side runs on, torchrun's
rendezvous, porter's, pytest's and Ray's own). It is started, in the background, the second time a
key is asked for (the first side, and every side while it imports, start fresh: nothing ever
waits for it), and ends after ``PORTER_WARM_IDLE`` seconds (default 300) without a side, when
``PORTER_WARM_OWNER`` (a process id) has ended, or when DIR is removed. ``stop_all(DIR)``
ends the ones in DIR. Without ``PORTER_WARM_SIDES`` every side starts fresh.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import psutil

DIR_VARIABLE = "PORTER_WARM_SIDES"
SERVER = Path(__file__).with_name("warm_server.py")

# read after the preloaded imports (at the device's or the process group's start, by porter's
# tracers): a side may differ from its warm interpreter in these and still be served by it
RUN_VARIABLES = frozenset({
    "PJRT_DEVICE", "CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS",
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "PWD", "OLDPWD", "_", "SHLVL", "COLUMNS", "LINES",
})
RUN_PREFIXES = ("PORTER_", "PYTEST_", "RAY_")  # porter's, pytest's and Ray's own (a Ray worker's differ)

# torch, and the part of it that torch.optim's first optimizer imports (its `_disable_dynamo`
# imports torch._dynamo, 2 s, on the first call): every training side imports both
TORCH = ("torch", "torch._dynamo")

# the part of torch that `import torch_xla` imports (its stablehlo export and dynamo bridge):
# torch's own modules, imported ahead for a side whose script imports torch_xla
TORCH_XLA_STACK = ("torch", "torch._dynamo", "torch._inductor.lowering", "torch._inductor.fx_passes.post_grad",
                   "torch._functorch.aot_autograd", "functorch.compile", "torch.utils.hipify.hipify_python")


def enabled() -> Optional[Path]:
    value = os.environ.get(DIR_VARIABLE)
    return Path(value) if value else None


# JAX reads its JAX_* variables (JAX_PLATFORMS too) as it is imported
JAX_STACK = ("jax", "optax", "flax.nnx")


def _key(python: str, preload: Sequence[str], env: dict) -> str:
    run_only = RUN_VARIABLES - {"JAX_PLATFORMS"} if set(preload) & set(JAX_STACK) else RUN_VARIABLES
    kept = sorted((k, v) for k, v in env.items() if k not in run_only and not k.startswith(RUN_PREFIXES))
    st = SERVER.stat()
    text = json.dumps([os.path.realpath(python), list(preload), [st.st_size, st.st_mtime_ns], kept])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class WarmProcess:
    """A side forked by a warm interpreter, with what ``process.Side`` uses of a Popen."""

    def __init__(self, conn: socket.socket, pid: int, args: Sequence[str]) -> None:
        self._conn = conn
        self._buffer = b""
        self.pid = pid
        self.args = list(args)
        self.returncode: Optional[int] = None
        try:  # (the child as it is now: never a later process given the same id)
            self._identity: Optional[psutil.Process] = psutil.Process(pid)
        except psutil.Error:
            self._identity = None

    def kill_tree(self) -> None:
        """Kill the side and its process group: asked of the warm interpreter, whose child it
        is (a child not reaped yet: its id cannot be another process's)."""
        if self.returncode is None:
            try:
                self._conn.sendall(b"kill\n")
            except OSError:
                self._orphaned()

    def _orphaned(self) -> None:
        """The warm interpreter went away without the child's status: end the child (if it is
        still the same process), say so."""
        try:
            if self._identity is not None and self._identity.is_running():
                os.killpg(self.pid, signal.SIGKILL)
        except (OSError, psutil.Error):
            pass
        self._end(-signal.SIGKILL)

    def _read(self, timeout: Optional[float]) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        try:
            chunk = self._conn.recv(4096)
        except OSError:
            chunk = b""
        if chunk:
            self._take(chunk)
        else:
            self._orphaned()

    def _take(self, data: bytes) -> None:
        """Data from the warm interpreter: the side's status once its line is whole."""
        self._buffer += data
        if b"\n" in self._buffer:
            status = json.loads(self._buffer.split(b"\n", 1)[0])["status"]
            self._end(os.waitstatus_to_exitcode(status))

    def _end(self, code: int) -> None:
        self.returncode = code
        self._conn.close()

    def poll(self) -> Optional[int]:
        self._read(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read(left)
        return self.returncode


def _send_request(conn: socket.socket, request: dict, fds: Sequence[int]) -> None:
    body = json.dumps(request).encode()
    data = f"{len(body):08x}".encode() + body
    sent = socket.send_fds(conn, [data[:65536]], list(fds))
    if sent < len(data):
        conn.sendall(data[sent:])


def _start_server(folder: Path, key: str, python: str, preload: Sequence[str], env: dict) -> None:
    """Start the warm interpreter for KEY in the background, once (an O_EXCL marker; one left
    by a start that died long ago is taken over)."""
    marker = folder / f"{key}.starting"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            if time.time() - marker.stat().st_mtime < 120:  # (a start takes seconds)
                return
            marker.unlink()
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            return
    os.close(fd)
    _make_room(folder)
    idle = os.environ.get("PORTER_WARM_IDLE", "300")
    owner = os.environ.get("PORTER_WARM_OWNER", "0")
    with open(folder / f"{key}.log", "ab") as log:
        proc = subprocess.Popen([python, str(SERVER), f"{key}.sock", ",".join(preload), idle, owner],
                                env=env, cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    (folder / f"{key}.pid").write_text(str(proc.pid))


def _make_room(folder: Path) -> None:
    """At most PORTER_WARM_MAX (default 6: a verification's kinds of side are torch, torch_xla,
    JAX in the tracer and in the model-level side, MXNet) warm interpreters in FOLDER: the least
    recently used ones beyond it are ended to make room for one more."""
    try:
        limit = max(1, int(os.environ.get("PORTER_WARM_MAX", "6")))
    except ValueError:
        limit = 6
    live = sorted((folder / f"{sock.stem}.seen" for sock in folder.glob("*.sock")),
                  key=lambda seen: seen.stat().st_mtime if seen.exists() else 0.0)
    for seen in live[:max(0, len(live) - limit + 1)]:
        _stop(folder, seen.stem)


def _stop(folder: Path, key: str) -> None:
    for name in (f"{key}.sock", f"{key}.starting"):
        try:
            (folder / name).unlink()  # a server whose socket is gone ends once its sides have
        except OSError:
            pass


def prepare(python: str, preload: Sequence[str], env: dict, wait: float = 120.0) -> bool:
    """Start the warm interpreter that sides of PYTHON with PRELOAD and ENV would use, now,
    and wait up to WAIT seconds for it to accept them: True once it does. (For a caller that
    knows many such sides will follow; others let the second side of a key start it.)"""
    folder = enabled()
    if folder is None or not preload:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    key = _key(python, preload, env)
    sock_path = folder / f"{key}.sock"
    if not sock_path.exists():
        _start_server(folder, key, python, preload, env)
    (folder / f"{key}.seen").touch()
    deadline = time.monotonic() + wait
    while not sock_path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _connect(conn: socket.socket, path: Path) -> None:
    """Connect to the socket PATH, also where PATH is longer than a Unix socket address may
    be (108 bytes): through the folder's descriptor (/proc/self/fd/N/NAME)."""
    if len(os.fsencode(path)) < 100:
        conn.connect(str(path))
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        conn.connect(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)


def start(cmd: Sequence[str], env: dict, cwd: Optional[os.PathLike], stdin: Any, stdout: Any,
          preload: Sequence[str]) -> Optional[WarmProcess]:
    """The side CMD (``PYTHON -m MODULE ARGS``) forked by its warm interpreter; None where it is
    to start fresh (warm sides off, no interpreter ready for its key yet, or any failure to
    reach one: a fresh start is always right)."""
    folder = enabled()
    if folder is None or not preload or len(cmd) < 3 or cmd[1] != "-m":
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        key = _key(cmd[0], preload, env)
        sock_path = folder / f"{key}.sock"
        seen = folder / f"{key}.seen"
        if not sock_path.exists():
            if seen.exists():
                _start_server(folder, key, cmd[0], preload, env)
            seen.touch()
            return None
        seen.touch()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect(conn, sock_path)
        except OSError as exc:
            conn.close()
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):  # a socket its server left behind
                _stop(folder, key)
            return None
        own_stdin = not (isinstance(stdin, int) and stdin >= 0)
        stdin_fd = os.open(os.devnull, os.O_RDONLY) if own_stdin else stdin
        try:
            conn.settimeout(30)
            _send_request(conn, {"module": cmd[2], "args": list(cmd[3:]), "cwd": os.fspath(cwd or os.getcwd()),
                                 "env": env}, [stdin_fd, stdout.fileno()])
            data = b""
            while b"\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    raise ConnectionError("the warm interpreter closed the connection")
                data += chunk
            line, rest = data.split(b"\n", 1)  # (a side that ended at once: its status may follow)
            answer = json.loads(line)
            conn.settimeout(None)
        except BaseException:
            conn.close()
            raise
        finally:
            if own_stdin:
                os.close(stdin_fd)
        if "pid" not in answer:
            conn.close()
            return None
        process = WarmProcess(conn, int(answer["pid"]), cmd)
        process._take(rest)
        return process
    except (OSError, ValueError):
        return None


def stop_all(folder: "str | os.PathLike[str]") -> None:
    """End the warm interpreters of FOLDER: their sockets are removed, and each one ends as
    soon as it sees that (a tenth of a second) and its running sides have ended. (No signal by
    a process id written down earlier: that process may have ended long ago and its id been
    given to another.)"""
    for sock in Path(folder).glob("*.sock"):
        _stop(Path(folder), sock.stem)


@contextlib.contextmanager
def session() -> Iterator[None]:
    """Warm sides for what runs inside (in this process and the processes it starts): a
    folder of warm interpreters owned by this process, ended with it. Nothing changes where
    PORTER_WARM_SIDES is already set (the caller's own folder) or set to an empty value (off)."""
    if DIR_VARIABLE in os.environ:
        yield
        return
    folder = tempfile.mkdtemp(prefix="porter-warm-")
    os.environ[DIR_VARIABLE] = folder
    owner = os.environ.get("PORTER_WARM_OWNER")
    os.environ["PORTER_WARM_OWNER"] = str(os.getpid())
    try:
        yield
    finally:
        stop_all(folder)
        shutil.rmtree(folder, ignore_errors=True)
        del os.environ[DIR_VARIABLE]
        if owner is None:
            os.environ.pop("PORTER_WARM_OWNER", None)
        else:
            os.environ["PORTER_WARM_OWNER"] = owner


def preload_for_script(script: os.PathLike, base: Sequence[str] = TORCH) -> tuple[str, ...]:
    """What a trace side of SCRIPT imports before the script's own code runs: BASE (the tracer's
    own imports), and torch's compiler stack where the script imports torch_xla (which
    imports it: ahead of time it is the same modules, imported the same way)."""
    from porter.verify.backends import imported_modules

    try:
        modules = imported_modules(Path(script).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return tuple(base)
    if "torch_xla" in modules:
        return tuple(dict.fromkeys([*base, *TORCH_XLA_STACK]))
    return tuple(base)


if __name__ == "__main__":  # pragma: no cover - `python -m porter.verify.warm stop DIR`
    if sys.argv[1:2] == ["stop"]:
        stop_all(sys.argv[2])
