"""Both sides of a model-level verification run at once: the port warms up while the original
runs and waits for its weights; a side's end is seen at once, a failing original stops the
waiting port, and the timeout/memory limits hold for each side."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porter.verify.process import Side, run_side, watch

DATA = Path(__file__).parent / "data"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_ending_side_can_stop_the_other(tmp_path):
    first = Side(_python("import sys; sys.exit(3)"), dict(os.environ), tmp_path / "a.log", 60, 4096)
    second = Side(_python("import time; time.sleep(60)"), dict(os.environ), tmp_path / "b.log", 60, 4096)
    ended = []

    def on_end(side):
        ended.append(side)
        if side is first:
            second.kill("stopped: the original failed")

    t0 = time.monotonic()
    watch([first, second], on_end)
    assert time.monotonic() - t0 < 30
    assert ended == [first, second]
    assert first.result().returncode == 3 and not first.result().cause
    assert second.result().cause == "stopped: the original failed" and not second.result().ok


def test_restarted_clock_gives_the_full_timeout_from_then(tmp_path):
    # it sleeps past its 3 s timeout; restarted at 2.5 s, it may run until 5.5 s (slack for a slow start)
    side = Side(_python("import time; time.sleep(3.5)"), dict(os.environ), tmp_path / "c.log", 3.0, 4096)
    time.sleep(2.5)
    side.restart_clock()
    assert side.wait().ok
    late = run_side(_python("import time; time.sleep(30)"), dict(os.environ), tmp_path / "d.log", 1.0, 4096)
    assert late.cause == "timed out after 1 s; killed" and late.returncode is not None and late.seconds < 20


@pytest.mark.slow
@pytest.mark.xla
def test_a_failing_original_stops_the_waiting_port():
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "porter", "verify", DATA / "trace" / "convnet_orig_fails.py", DATA / "verify" / "convnet_xla.py",
         "--model", "ConvNet()", "--input", "float32[2,3,16,16]", "--timeout", "500", "--format", "json"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert proc.returncode == 2 and report["status"] == "side-failed"
    assert report["summary"].startswith("the original could not run: RuntimeError: the original's forward pass is broken")
    assert "the port, started alongside the original, was stopped when the original failed" in report["notes"]
    assert time.monotonic() - t0 < 400  # not left waiting until its 500 s timeout


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "exit"])
def test_porter_stopped_kills_its_running_sides(tmp_path, how):
    """A side runs in its own session (a signal to porter's process group does not reach it):
    porter ended by SIGTERM / SIGHUP or exiting while a side runs leaves no side behind."""
    import psutil

    script = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        # a terminal's dispositions, also when this suite runs under nohup or as a background job
        "signal.signal(signal.SIGHUP, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        "from porter.verify.process import Side\n"
        f"side = Side([sys.executable, '-c', 'import time; time.sleep(120)'], dict(os.environ), Path({str(tmp_path / 's.log')!r}), 300, 4096)\n"
        "print(side.proc.pid, flush=True)\n"
        # 'exit': once told to (the side seen running first), else wait for the signal
        f"(sys.stdin.readline(), sys.exit(0)) if {how == 'exit'!r} else time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    if how == "exit":
        parent.stdin.write("\n")
        parent.stdin.flush()
    else:
        parent.send_signal(getattr(__import__("signal"), how))
    assert parent.wait(timeout=30) != 0 or how == "exit"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail(f"the side {child} outlived porter ({how})")
