"""Warm interpreters (porter.verify.warm): a side forked from a process that imported its
framework once must be the side a fresh ``python -m`` would have been, in every way a script
can see, and must come back (exit status, signals, time and memory limits) as a fresh one does.

The mechanics run with a standard-library preload (no framework: these are in the fast lane);
one test traces the same torch_xla script fresh and warm and compares the records."""
from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from porter.verify import warm
from porter.verify.process import run_side, side_environment

PRELOAD = ("decimal",)  # any module the probe imports first

PROBE = textwrap.dedent('''
    import decimal
    import json, os, random, sys
    action = os.environ.get("PORTER_PROBE_ACTION", "")
    print(json.dumps({
        "argv": sys.argv, "path": sys.path[:2], "cwd": os.getcwd(), "name": __name__,
        "file": sys.modules["__main__"].__file__, "hash": hash("porter"), "tty": sys.stdin.isatty(),
        "stdin": sys.stdin.read(), "device": os.environ.get("PJRT_DEVICE"), "value": os.environ.get("PORTER_PROBE"),
        "leader": os.getpgid(0) == os.getpid(), "main_names": sorted(n for n in dir() if not n.startswith("__")),
        "random": random.random(), "decimal": "decimal" in sys.modules,
    }), flush=True)
    if action == "exit":
        sys.exit(3)
    if action == "raise":
        raise ValueError("from the probe")
    if action == "kill":
        os.kill(os.getpid(), 9)
    if action == "sleep":
        import time
        time.sleep(60)
    if action == "grow":
        import time
        hog = bytearray(400 * 2**20)
        time.sleep(60)
    if action == "leave":  # a process left in the side's group (a daemon, a loader worker)
        import subprocess
        print(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid, flush=True)
''')


@pytest.fixture()
def place(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "probe.py").write_text(PROBE)
    monkeypatch.setenv(warm.DIR_VARIABLE, str(tmp_path / "warm"))
    monkeypatch.setenv("PORTER_WARM_IDLE", "60")
    monkeypatch.delenv("PORTER_WARM_OWNER", raising=False)
    yield tmp_path
    warm.stop_all(tmp_path / "warm")


def _run(place: Path, n: int = 0, timeout: float = 60, memory_mb: float = 4000, preload=PRELOAD, **env: str):
    environment = side_environment({"PJRT_DEVICE": "CPU", **env})
    return run_side([sys.executable, "-m", "probe", "one", "two"], environment, place / f"log{n}.txt", timeout,
                    memory_mb, cwd=place / "work", preload=preload)


def _ready(place: Path, **env: str) -> None:
    environment = side_environment({"PJRT_DEVICE": "CPU", **env})
    assert warm.prepare(sys.executable, PRELOAD, environment, wait=60)


def _record(run) -> dict:
    return json.loads(run.log.splitlines()[0])


def test_warm_side_sees_what_a_fresh_one_sees(place, monkeypatch):
    monkeypatch.delenv(warm.DIR_VARIABLE)
    fresh = _run(place, 0, PORTER_PROBE="a")
    monkeypatch.setenv(warm.DIR_VARIABLE, str(place / "warm"))
    _ready(place, PORTER_PROBE="a")
    forked = [_run(place, i, PORTER_PROBE=value, PJRT_DEVICE=device)
              for i, (value, device) in enumerate([("a", "CPU"), ("b", "TPU")], 1)]
    assert not fresh.warm and all(run.warm for run in forked)
    a, b = _record(forked[0]), _record(forked[1])
    expected = _record(fresh)
    for key in ("argv", "path", "cwd", "name", "file", "hash", "tty", "stdin", "device", "value", "leader",
                "main_names"):
        assert a[key] == expected[key], key
    assert expected["argv"] == [str(place / "work" / "probe.py"), "one", "two"]
    assert expected["path"][0] == str(place / "work") and expected["leader"] and expected["tty"]
    assert expected["main_names"] == ["action", "decimal", "json", "os", "random", "sys"]
    # the variables read after the imports are the side's own; the generators are seeded anew
    assert (b["value"], b["device"]) == ("b", "TPU")
    assert a["random"] != b["random"]
    assert fresh.returncode == forked[0].returncode == forked[1].returncode == 0


@pytest.mark.parametrize("action, code, cause, text", [
    ("exit", 3, "", ""),
    ("raise", 1, "", "ValueError: from the probe"),
    ("kill", -9, "killed by signal SIGKILL", ""),
])
def test_warm_side_ends_as_a_fresh_one_does(place, action, code, cause, text):
    _ready(place, PORTER_PROBE_ACTION=action)
    run = _run(place, PORTER_PROBE_ACTION=action)
    assert run.warm
    assert (run.returncode, run.cause) == (code, cause)
    assert text in run.log


def test_warm_side_limits_hold(place):
    _ready(place, PORTER_PROBE_ACTION="sleep")
    slow = _run(place, 1, timeout=2, PORTER_PROBE_ACTION="sleep")
    assert slow.warm and slow.cause.startswith("timed out after 2 s")
    big = _run(place, 2, memory_mb=300, PORTER_PROBE_ACTION="grow")
    assert big.warm and big.cause.startswith("memory limit exceeded")


def test_other_environment_other_interpreter(place):
    """A variable read at import time (any but RUN_VARIABLES) that differs: a fresh side, never
    the interpreter that imported under another value; the second side of that key starts one."""
    _ready(place)
    assert _run(place, 1).warm
    other = [_run(place, i, OMP_NUM_THREADS="1") for i in range(2, 4)]
    assert [run.warm for run in other] == [False, False]
    assert _record(other[0])["value"] is None
    _ready(place, OMP_NUM_THREADS="1")
    assert _run(place, 5, OMP_NUM_THREADS="1").warm
    assert len(list((place / "warm").glob("*.sock"))) == 2


def test_keys_hold_what_the_preloads_read():
    """JAX reads JAX_PLATFORMS as it is imported (torch does not): with JAX's stack preloaded,
    a side on another platform is another interpreter's."""
    cpu, tpu = {"JAX_PLATFORMS": "cpu", "A": "1"}, {"JAX_PLATFORMS": "tpu", "A": "1"}
    assert warm._key(sys.executable, ("torch",), cpu) == warm._key(sys.executable, ("torch",), tpu)
    assert warm._key(sys.executable, warm.JAX_STACK, cpu) != warm._key(sys.executable, warm.JAX_STACK, tpu)
    assert warm._key(sys.executable, ("torch",), cpu) != warm._key(sys.executable, ("torch",), {**cpu, "A": "2"})
    assert warm._key(sys.executable, ("torch",), cpu) != warm._key(sys.executable, warm.TORCH_XLA_STACK, cpu)


def test_interpreter_lifetime(place, monkeypatch):
    monkeypatch.setenv("PORTER_WARM_IDLE", "1")
    _ready(place)
    assert _run(place, 1).warm
    deadline = time.monotonic() + 30
    while list((place / "warm").glob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list((place / "warm").glob("*.sock")), "an idle warm interpreter ends and removes its socket"
    assert not _run(place, 2).warm  # and the next side starts fresh (then warm again)
    _ready(place)
    assert _run(place, 3).warm


def test_a_dead_interpreter_is_never_an_error(place):
    _ready(place)
    pid = int(next((place / "warm").glob("*.pid")).read_text())
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    run = _run(place, 1)  # its socket is left behind: refused, removed, the side starts fresh
    assert (run.warm, run.returncode) == (False, 0)
    assert not list((place / "warm").glob("*.sock"))


def _ended(proc: psutil.Process, within: float = 30) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("warm_side", [False, True])
def test_what_a_side_leaves_in_its_group_is_killed(place, monkeypatch, warm_side):
    if warm_side:
        _ready(place, PORTER_PROBE_ACTION="leave")
    else:
        monkeypatch.delenv(warm.DIR_VARIABLE)
    run = _run(place, PORTER_PROBE_ACTION="leave")
    assert (run.warm, run.returncode) == (warm_side, 0)
    assert _ended(psutil.Process(int(run.log.splitlines()[1])))


CLIENT = """
import sys
from porter.verify import warm
from porter.verify.process import side_environment
env = side_environment({"PJRT_DEVICE": "CPU", "PORTER_PROBE_ACTION": "sleep"})
with open(sys.argv[1], "wb") as log:
    side = warm.start([sys.executable, "-m", "probe"], env, sys.argv[2], -1, log, sys.argv[3].split(","))
print(side.pid, flush=True)
sys.stdin.read()
"""


def test_a_side_ends_with_the_porter_that_started_it(place):
    """A porter process killed outright (no exit handlers) while its warm side runs: the warm
    interpreter sees the connection end and kills the side, as porter's exit does its sides."""
    import subprocess

    _ready(place, PORTER_PROBE_ACTION="sleep")
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(place / "log.txt"), str(place / "work"),
                               ",".join(PRELOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    side = psutil.Process(int(client.stdout.readline()))
    assert side.is_running()
    client.kill()
    client.wait()
    assert _ended(side)


def test_stop_signals_no_process_by_a_written_id(place):
    """stop_all ends interpreters through their sockets: an id written down when one started
    may be another process's by now."""
    import subprocess

    _ready(place)
    server = psutil.Process(int(next((place / "warm").glob("*.pid")).read_text()))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (place / "warm" / "gone.pid").write_text(str(other.pid))
        warm.stop_all(place / "warm")
        assert _ended(server)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_owner_and_stop(place, monkeypatch):
    """A warm interpreter ends with its owner (the run that started it), and kills the sides
    still running then; stop_all ends the others."""
    import subprocess

    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setenv("PORTER_WARM_OWNER", str(owner.pid))
    _ready(place, PORTER_PROBE_ACTION="sleep")
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(place / "log.txt"), str(place / "work"),
                               ",".join(PRELOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    side = psutil.Process(int(client.stdout.readline()))
    owner.kill()
    owner.wait()
    assert _ended(side), "a side still running when the owner ended"
    client.stdin.close()
    client.wait()
    deadline = time.monotonic() + 30
    while list((place / "warm").glob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list((place / "warm").glob("*.sock")), "a warm interpreter ends with its owner"
    monkeypatch.delenv("PORTER_WARM_OWNER")
    _ready(place)
    warm.stop_all(place / "warm")
    deadline = time.monotonic() + 30
    while list((place / "warm").glob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list((place / "warm").glob("*.sock"))


SCRIPT = textwrap.dedent('''
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(4, 8).to(device)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch_xla.sync()
        if step == 3:
            print(loss.item())
''')


@pytest.mark.framework
def test_trace_is_the_same_warm_and_fresh(tmp_path, monkeypatch):
    from porter.verify.trace import trace_script

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv(warm.DIR_VARIABLE, str(tmp_path / "warm"))
    monkeypatch.delenv("PORTER_WARM_OWNER", raising=False)
    try:
        env = {"PJRT_DEVICE": "CPU"}
        records = []
        for attempt in range(2):
            if attempt:
                assert warm.prepare(sys.executable, warm.preload_for_script(script), side_environment(env))
            (tmp_path / f"run{attempt}").mkdir()
            records.append(trace_script(script, [], cwd=tmp_path / f"run{attempt}", env=env, host_random=True,
                                        seed=0, max_steps=4))
        fresh, forked = records
        assert fresh["status"] == forked["status"] == "ok", (fresh["output"], forked["output"])
        assert (fresh["warm"], forked["warm"]) == (False, True)
        assert fresh["num_steps"] == 4 and fresh["losses"] == forked["losses"]
        assert [s["xla_delta"] for s in fresh["steps"]] == [s["xla_delta"] for s in forked["steps"]]
    finally:
        warm.stop_all(tmp_path / "warm")


def test_session_owns_its_interpreters(tmp_path, monkeypatch):
    """What `porter zoo` runs in: a folder of its own while it runs, its interpreters ended and
    the folder gone after; a PORTER_WARM_SIDES of the caller's (an empty one: off) is kept."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "probe.py").write_text(PROBE)
    monkeypatch.delenv(warm.DIR_VARIABLE, raising=False)
    monkeypatch.delenv("PORTER_WARM_OWNER", raising=False)
    with warm.session():
        folder = Path(os.environ[warm.DIR_VARIABLE])
        assert os.environ["PORTER_WARM_OWNER"] == str(os.getpid())
        _ready(tmp_path)
        assert _run(tmp_path, 1).warm
        pid = int(next(folder.glob("*.pid")).read_text())
    assert warm.DIR_VARIABLE not in os.environ and "PORTER_WARM_OWNER" not in os.environ
    assert not folder.exists()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # ended (this process reaps it later)
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the session's warm interpreter outlived it")
    monkeypatch.setenv(warm.DIR_VARIABLE, "")
    with warm.session():
        assert os.environ[warm.DIR_VARIABLE] == ""
        assert not _run(tmp_path, 2).warm
