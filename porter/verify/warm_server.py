"""A warm interpreter: a Python process that has imported a framework once and then forks a
side per request, each child becoming ``python -m MODULE ARGS...`` as if just started.

    python porter/verify/warm_server.py SOCKET PRELOAD[,PRELOAD...] IDLE_S OWNER_PID

(SOCKET: a file name in the working directory, a Unix socket's address being short.)

It is run as a file, not as a module of porter, and imports only the standard library and the
PRELOAD modules: porter itself is imported fresh by each child, from the files on disk. The
client (``porter.verify.warm``) sends a request over the Unix socket SOCKET: a JSON object
(``module``, ``args``, ``cwd``, ``env``) and two file descriptors (the side's stdin and its
log). The server forks; the child starts a session of its own, takes the two descriptors as
its stdin and stdout/stderr, the working directory, the environment (the request's, with the
variables the preloads set at import set as they set them), ``sys.argv`` and ``sys.path[0]``
of a fresh ``python -m``, drops this file's globals, and runs the module as ``__main__``
(``runpy._run_module_as_main``, what ``python -m`` runs); its exit is the interpreter's own.
The server answers ``{"pid": N}`` once the child leads a session of its own, and ``{"status": S}``
(the ``waitpid`` status) when the child ends.

Signals by process id go only to a child this server has not reaped yet (its id, which is also
its process group's, cannot have been given to another process): a ``kill`` line from the
client kills the child's group; a client that goes away (the connection closed) kills it too
(a side never outlives the porter that started it); and the child's group is killed once more
as it ends, before it is reaped (processes it left behind: daemons, data loader workers).

The server ends after IDLE_S seconds with no child and no request, when OWNER_PID (0: none)
has ended (a process id is checked with its start time: never a later process given the same
id; its running children are killed then: the run they belong to is over), or when its socket
is removed or replaced; it waits for the running children before it exits.
"""
import os
import sys

if __name__ == "__main__":
    del sys.path[0]  # this file's folder (porter/verify: trace.py, datasets.py...) must shadow no module

import importlib  # noqa: E402
import json  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

MAX_REQUEST = 1 << 24


def _read_request(conn):
    """(request, [stdin fd, log fd]); the request is sent as its length (8 hex digits) and
    then the JSON text."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 2)
    while len(data) < 8 or len(data) < 8 + int(data[:8], 16):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("request cut short")
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError("request too large")
    return json.loads(data[8:8 + int(data[:8], 16)].decode("utf-8")), list(fds)


def _send(conn, message):
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _started(pid):
    """(the start time of process PID, its state) from /proc; None where it is gone (or where
    /proc cannot tell: then only ``kill(pid, 0)`` can)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19], fields[0]


def _owner_check(owner):
    """A function that says whether OWNER (0: none) is still alive: the same process, by its
    start time, and not a zombie."""
    if not owner:
        return lambda: True
    first = _started(owner)
    if first is None and os.path.exists("/proc/self/stat"):
        return lambda: False

    def alive():
        if first is not None:
            now = _started(owner)
            return now is not None and now[0] == first[0] and now[1] != b"Z"
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    return alive


def _kill_group(pid):
    """Kill the process group of PID, a child of this server not reaped yet."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap_ended(children, connections):
    """Reap the children that have ended, each after killing what is left of its group, and
    send each one's status to its client. True when one ended."""
    ended = False
    while children:
        try:  # (WNOWAIT: the child stays a zombie, its id its own, while its group is killed)
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is None or info.si_pid == 0:
            break
        pid = info.si_pid
        _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        conn = children.pop(pid, None)
        if conn is not None:
            connections.pop(conn.fileno(), None)
            _send(conn, {"status": status})
            conn.close()
        ended = True
    return ended


def _same_socket(path, ident):
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def _from_client(conn, connections, children):
    """A client's line while its child runs: ``kill`` kills the child's group; the end of the
    connection (the client is gone) kills it too. The child is reaped, and its status sent,
    by the main loop."""
    pid = connections.get(conn.fileno())
    try:
        data = conn.recv(64)
    except OSError:
        data = b""
    if pid is not None and pid in children and (not data or b"kill" in data):
        _kill_group(pid)
    if not data:
        connections.pop(conn.fileno(), None)


def serve(sock_path, preload, idle_s, owner):
    start_env = dict(os.environ)
    stopped = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    for name in preload:
        importlib.import_module(name)
    imported_env = dict(os.environ)  # what the preloads' imports set, set alike in each child
    tmp = f"{sock_path}.{os.getpid()}.tmp"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, sock_path)  # clients see the socket only once it accepts
    st = os.stat(sock_path)
    ident = (st.st_dev, st.st_ino)
    children = {}  # pid -> its client's connection
    connections = {}  # a client connection's fd -> the pid of its child
    owner_alive = _owner_check(owner)
    last = time.monotonic()
    accepting = True
    while True:
        if _reap_ended(children, connections):
            last = time.monotonic()
        owner_gone = not owner_alive()
        for pid in children if owner_gone else ():
            _kill_group(pid)  # (the run they belong to is over; not reaped yet: still its own)
        if accepting and (stopped or owner_gone or not _same_socket(sock_path, ident)
                          or (not children and time.monotonic() - last > idle_s)):
            accepting = False
            listener.close()
            if _same_socket(sock_path, ident):
                os.unlink(sock_path)
                try:  # the client's start marker: the next start may begin
                    os.unlink(sock_path[:-len(".sock")] + ".starting")
                except OSError:
                    pass
        if not accepting and not children:
            return None
        watched = [children[pid] for pid in connections.values()]
        ready, _, _ = select.select(([listener] if accepting else []) + watched, [], [], 0.05)
        for conn in ready:
            if conn is not listener:
                _from_client(conn, connections, children)
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        last = time.monotonic()
        try:
            conn.settimeout(10)
            request, fds = _read_request(conn)
            conn.settimeout(None)
        except (OSError, ValueError) as exc:
            _send(conn, {"error": f"{type(exc).__name__}: {exc}"})
            conn.close()
            continue
        if len(fds) != 2:
            _send(conn, {"error": "a request carries two file descriptors (stdin, log)"})
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        led, leading = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(led)
            listener.close()
            conn.close()
            for other in children.values():
                other.close()
            os.setsid()  # before the client hears its id: its group is then its own to kill
            os.close(leading)
            return request, fds, start_env, imported_env
        os.close(leading)
        os.read(led, 1)  # (end of file: the child leads its session)
        os.close(led)
        for fd in fds:
            os.close(fd)
        children[pid] = conn
        connections[conn.fileno()] = pid
        _send(conn, {"pid": pid})


def _child_environment(request_env, start_env, imported_env):
    env = dict(request_env)
    for key in set(start_env) | set(imported_env):
        if start_env.get(key) != imported_env.get(key) and request_env.get(key) == start_env.get(key):
            if key in imported_env:
                env[key] = imported_env[key]
            else:
                env.pop(key, None)
    return env


def become(request, fds, start_env, imported_env):
    """Turn this forked child (the leader of a session of its own) into ``python -m MODULE
    ARGS`` started in CWD with ENV."""
    stdin_fd, log_fd = fds
    os.dup2(stdin_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in {stdin_fd, log_fd} - {0, 1, 2}:
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    env = _child_environment(request["env"], start_env, imported_env)
    os.environ.clear()
    os.environ.update(env)
    # a fresh interpreter's generators are seeded from the system's entropy: so are this one's
    # (Python's `random` reseeds itself after a fork)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    sys.argv = ["-m", *request["args"]]
    sys.path.insert(0, os.getcwd())  # what `python -m` puts first
    module = request["module"]
    import runpy

    run = runpy._run_module_as_main
    main_globals = sys.modules["__main__"].__dict__
    builtins = main_globals["__builtins__"]
    main_globals.clear()  # a fresh __main__: this file's names are gone (locals hold what is left to do)
    main_globals["__builtins__"] = builtins
    main_globals["__name__"] = "__main__"
    run(module, True)


if __name__ == "__main__":
    _started = serve(sys.argv[1], [m for m in sys.argv[2].split(",") if m], float(sys.argv[3]), int(sys.argv[4]))
    if _started is not None:
        become(*_started)
