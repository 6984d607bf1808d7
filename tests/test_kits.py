"""porter kit colab / tpu-vm: the notebook validates and its set-up cell runs (dry run); every
generated script passes bash -n and shellcheck; the dry-run transcript of the TPU VM kit is
checked command by command; with a stand-in gcloud on PATH the scripts skip what exists."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from porter import platforms

ROOT = Path(__file__).resolve().parent.parent
PORTER = [sys.executable, "-m", "porter"]
SCRIPTS = ("env.sh", "create.sh", "install.sh", "stage.sh", "copy.sh", "run.sh", "fetch.sh", "delete.sh", "all.sh")

TX_PORT = "import torch\nimport torch_xla\n\nx = torch.ones(2, device=torch_xla.device())\nprint(x.sum())\n"
JAX_PORT = "import jax.numpy as jnp\nfrom flax import nnx\n\nprint(jnp.ones(2).sum())\n"


def porter(*args, cwd=ROOT, check=True):
    run = subprocess.run([*PORTER, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)
    if check:
        assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    d = tmp_path_factory.mktemp("ports")
    (d / "train_xla.py").write_text(TX_PORT)
    (d / "train_jax.py").write_text(JAX_PORT)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a port"),
                nbformat.v4.new_code_cell("!pip install -q torch_xla==2.9.0\nimport torch_xla\nimport torch"),
                nbformat.v4.new_code_cell("print(torch.ones(2, device=torch_xla.device()))")]
    nbformat.write(nb, d / "nb_port.ipynb")
    (d / "plain.py").write_text("import torch\nprint(torch.ones(2))\n")
    return d


# ---------------------------------------------------------------------------------------
# TPU VM
# ---------------------------------------------------------------------------------------
CASES = {
    "v5e-8-xla": ("train_xla.py", "v5litepod-8", ["--data", "gs://my-bucket/mnist"], ["--epochs", "1", "--lr", "0.1 0.2"]),
    "v5e-16-jax": ("train_jax.py", "v5litepod-16", ["--project", "proj-1", "--zone", "us-west4-a"], ["--steps", "3"]),
    "v6e-8-xla": ("train_xla.py", "v6e-8", ["--name", "my-tpu"], []),
    "v4-8-jax": ("train_jax.py", "v4-8", ["--data", "gs://bkt-2/prefix/p"], []),
}


@pytest.fixture(scope="module")
def kits(tmp_path_factory, ports):
    out = {}
    for key, (port, acc, opts, args) in CASES.items():
        d = tmp_path_factory.mktemp(key)
        porter("kit", "tpu-vm", ports / port, "--out", d, "--accelerator", acc, *opts, "--", *args)
        out[key] = d
    return out


@pytest.mark.parametrize("key", CASES)
def test_scripts_pass_bash_n_and_shellcheck(kits, key):
    d = kits[key]
    for name in SCRIPTS:
        text = (d / name).read_text()
        assert "set -euo pipefail" in text or name == "env.sh"
        assert subprocess.run(["bash", "-n", str(d / name)], capture_output=True).returncode == 0, name
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (scripts/bootstrap installs it)")
        pytest.skip("shellcheck not installed")
    run = subprocess.run(["shellcheck", "-x", *SCRIPTS], cwd=d, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def transcript(d: Path, script="all.sh", env=None) -> list[list[str]]:
    run = subprocess.run([str(d / script), "--dry-run"], cwd=d, capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})})
    assert run.returncode == 0, run.stderr
    return [shlex.split(line[2:]) for line in run.stdout.splitlines() if line.startswith(("+ ", "? "))]


def _value(cmd, flag):
    for i, w in enumerate(cmd):
        if w == flag:
            return cmd[i + 1]
        if w.startswith(flag + "="):
            return w.split("=", 1)[1]
    return None


def step_of(cmd: list[str]) -> str:
    if cmd[:1] == ["mkdir"]:
        return "fetch-mkdir"
    verb = " ".join(cmd[1:5])
    if "describe" in cmd:
        return "describe"
    if verb.startswith("compute tpus tpu-vm create") or verb.startswith("compute tpus queued-resources create"):
        return "create"
    if "delete" in cmd:
        return "delete"
    if verb.startswith("compute tpus tpu-vm scp"):
        return "fetch" if any(w.startswith("--worker=") and w != "--worker=all" for w in cmd) else "scp"
    if verb.startswith("compute tpus tpu-vm ssh"):
        remote = _value(cmd, "--command")
        if "pip install" in remote:
            return "install"
        if "gcloud storage rsync" in remote:
            return "stage"
        if "python3" in remote:
            return "run"
        return "ssh-mkdir"
    return "other"


@pytest.mark.parametrize("key", CASES)
def test_dry_run_transcript_command_by_command(kits, key):
    port, acc_name, opts, args = CASES[key]
    acc = platforms.accelerator(acc_name)
    prof = platforms.profile("jax" if "jax" in port else "torch-xla")
    cmds = transcript(kits[key])
    steps = [s for s in map(step_of, cmds) if s not in ("describe", "ssh-mkdir", "fetch-mkdir")]
    data = "--data" in opts
    hosts = acc.hosts or 1
    want = ["create", "install"] + (["stage"] if data else []) + ["scp", "run"] + ["fetch"] * hosts + ["delete"]
    assert steps == want, cmds
    for cmd in cmds:
        assert cmd[0] in ("gcloud", "mkdir")
        if cmd[0] == "gcloud":
            assert _value(cmd, "--zone") in acc.zones
            if "--project" in opts:
                assert _value(cmd, "--project") == opts[opts.index("--project") + 1]
    create = next(c for c in cmds if step_of(c) == "create")
    if acc.queued:
        assert create[1:5] == ["compute", "tpus", "queued-resources", "create"]
        assert _value(create, "--runtime-version") == acc.runtime and _value(create, "--accelerator-type") == acc.name
        assert _value(create, "--node-id") == (opts[1] if "--name" in opts else "porter-" + port[:-3].replace("_", "-"))
    else:
        assert create[1:5] == ["compute", "tpus", "tpu-vm", "create"]
        assert _value(create, "--version") == acc.runtime and _value(create, "--accelerator-type") == acc.name
    # describe before create, and before delete
    assert step_of(cmds[0]) == "describe"
    install = _value(next(c for c in cmds if step_of(c) == "install"), "--command")
    for name, version in prof.pins:
        assert f"\"{name}\": \"{version}\"" in install
    assert shlex.split(prof.tpu_install[0])[2] in install
    for c in cmds:
        if step_of(c) in ("install", "stage", "run", "scp"):
            assert "--worker=all" in c
    remote_run = _value(next(c for c in cmds if step_of(c) == "run"), "--command")
    assert remote_run.startswith("set -o pipefail; ") and remote_run.endswith("2>&1 | tee out/run.log")
    tail = shlex.join(args) if args else ""
    if prof.target == "torch-xla":
        assert f"PJRT_DEVICE=TPU python3 {port}" in remote_run
    else:
        assert f"PORTER_HOSTS={hosts} python3 launch_jax.py {port}" in remote_run
    assert shlex.split(remote_run.split(port, 1)[1].split(" 2>&1")[0]) == args, tail
    if data:
        stage = _value(next(c for c in cmds if step_of(c) == "stage"), "--command")
        assert "gs://" in stage and "gcsfs" in install.split("||")[1] and '["gcsfs"]' in install.split("||")[0]
    fetch_workers = [_value(c, "--worker") for c in cmds if step_of(c) == "fetch"]
    assert fetch_workers == [str(w) for w in range(hosts)]
    delete = next(c for c in cmds if step_of(c) == "delete")
    assert ("queued-resources" in delete) == bool(acc.queued)


@pytest.mark.parametrize("key", ["v5e-8-xla", "v4-8-jax"])
def test_install_check_runs_here(kits, key):
    """The install step's check, run in this venv (which holds porter's pins and gcsfs): it
    passes; with a pin it cannot meet it fails, so the install runs."""
    check = subprocess.run(["bash", "-c", "source env.sh; echo \"$CHECK\""], cwd=kits[key], capture_output=True, text=True)
    command = check.stdout.strip().replace("python3 ", shlex.quote(sys.executable) + " ", 1)
    assert subprocess.run(["bash", "-c", command], capture_output=True).returncode == 0, command
    wrong = command.replace("2.9.0", "0.0.1").replace("0.10.2", "0.0.1")
    assert subprocess.run(["bash", "-c", wrong], capture_output=True).returncode != 0
    missing = command.replace('"gcsfs"', '"no-such-package-porter"')
    assert subprocess.run(["bash", "-c", missing], capture_output=True).returncode != 0


def test_jax_kit_ships_the_launcher_that_initializes_multi_host(kits):
    launcher = (kits["v5e-16-jax"] / "code" / "launch_jax.py").read_text()
    assert "jax.distributed.initialize()" in launcher
    assert (kits["v5e-16-jax"] / "code" / "train_jax.py").read_text() == JAX_PORT
    assert not (kits["v5e-8-xla"] / "code" / "launch_jax.py").exists()


FAKE_GCLOUD = textwrap.dedent('''\
    #!/usr/bin/env bash
    echo "$*" >> "$GCLOUD_LOG"
    case "$*" in
      *"queued-resources describe"*--format*) echo "${GCLOUD_QR_STATE:-}"; exit 0 ;;
      *describe*) [ -n "${GCLOUD_EXISTS:-}" ] && exit 0 || exit 1 ;;
    esac
    exit 0
''')


def test_steps_skip_what_exists_with_a_stand_in_gcloud(kits, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    log = tmp_path / "gcloud.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GCLOUD_LOG": str(log)}
    d = kits["v5e-8-xla"]
    for exists in ("", "1"):
        log.write_text("")
        run = subprocess.run([str(d / "create.sh")], cwd=d, env={**env, "GCLOUD_EXISTS": exists},
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        calls = log.read_text().splitlines()
        assert calls[0].startswith("compute tpus tpu-vm describe")
        assert any(c.startswith("compute tpus tpu-vm create") for c in calls) == (not exists), calls
    log.write_text("")
    run = subprocess.run([str(d / "delete.sh")], cwd=d, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "is gone" in run.stdout
    assert not any(" delete " in f" {c} " for c in log.read_text().splitlines())
    q = kits["v6e-8-xla"]
    for state, rc in (("ACTIVE", 0), ("FAILED", 1), ("", 1)):
        log.write_text("")
        run = subprocess.run([str(q / "create.sh")], cwd=q, capture_output=True, text=True, timeout=60,
                             env={**env, "GCLOUD_QR_STATE": state, "QUEUED_WAIT_TRIES": "2", "QUEUED_WAIT_S": "0"})
        assert run.returncode == rc, (state, run.stdout, run.stderr)
        calls = log.read_text().splitlines()
        assert [c.split(" --")[0] for c in calls[:3]] == [
            "compute tpus tpu-vm describe my-tpu", "compute tpus queued-resources describe my-tpu-qr",
            "compute tpus queued-resources create my-tpu-qr"], calls
        assert sum("--format" in c for c in calls) == (1 if state else 2)


def test_dry_run_twice_gives_the_same_transcript(kits):
    d = kits["v5e-16-jax"]
    assert transcript(d) == transcript(d)


def test_kit_errors_are_usage_errors(ports, tmp_path):
    bad = porter("kit", "tpu-vm", ports / "train_xla.py", "--out", tmp_path / "a", "--accelerator", "v9-8", check=False)
    assert bad.returncode == 2 and "unknown accelerator type 'v9-8'" in bad.stderr
    zone = porter("kit", "tpu-vm", ports / "train_xla.py", "--out", tmp_path / "b", "--zone", "mars-1a", check=False)
    assert zone.returncode == 0 and "not among the documented zones of v5litepod-8" in zone.stderr
    assert "ZONE=${ZONE:-mars-1a}" in (tmp_path / "b" / "env.sh").read_text()
    plain = porter("kit", "colab", ports / "plain.py", "--out", tmp_path / "c", check=False)
    assert plain.returncode == 2 and "imports neither torch_xla nor jax" in plain.stderr
    data = porter("kit", "colab", ports / "train_xla.py", "--out", tmp_path / "d", "--data", "s3://x", check=False)
    assert data.returncode == 2 and "gs://BUCKET/PREFIX or drive:PATH" in data.stderr
    nb = porter("kit", "tpu-vm", ports / "nb_port.ipynb", "--out", tmp_path / "e", check=False)
    assert nb.returncode == 2 and "a TPU VM runs scripts" in nb.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


# ---------------------------------------------------------------------------------------
# Colab
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def notebooks(tmp_path_factory, ports):
    d = tmp_path_factory.mktemp("colab")
    porter("kit", "colab", ports / "train_xla.py", "--out", d / "xla", "--data", "gs://my-bucket/mnist", "--", "--epochs", "1")
    porter("kit", "colab", ports / "train_jax.py", "--out", d / "jax", "--data", "drive:datasets/mnist")
    porter("kit", "colab", ports / "nb_port.ipynb", "--out", d / "nb")
    return {k: nbformat.read(next((d / k).glob("*.ipynb")), 4) for k in ("xla", "jax", "nb")}


def _setup(nb):
    cells = [c for c in nb.cells if "porter-setup" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    return cells[0].source


@pytest.mark.parametrize("key", ["xla", "jax", "nb"])
def test_notebook_validates(notebooks, key):
    nbformat.validate(notebooks[key])
    assert notebooks[key].nbformat == 4


def test_cells_follow_the_target(notebooks):
    xla = [c.source for c in notebooks["xla"].cells]
    assert any("xr.global_runtime_device_count()" in s and "subprocess.run" in s for s in xla)
    assert any("google.colab.auth" in s or "from google.colab import auth" in s for s in xla)
    assert any("gcsfs.GCSFileSystem()" in s for s in xla)
    assert xla[-1].strip() == "!PJRT_DEVICE=TPU python train_xla.py --epochs 1"
    assert any("write_text(" in s and "train_xla.py" in s for s in xla) and not any("%%writefile" in s for s in xla)
    jax_cells = [c.source for c in notebooks["jax"].cells]
    assert any("jax.devices()" in s and "subprocess.run([sys.executable, '-c', CHECK]" in s for s in jax_cells)
    assert any("drive.mount('/content/drive')" in s and "/content/drive/MyDrive/datasets/mnist" in s for s in jax_cells)
    assert jax_cells[-1].strip() == "!python train_jax.py"
    nb_cells = [c.source for c in notebooks["nb"].cells]
    # a notebook port runs in the kernel, so the check does too (no child process)
    assert any("xr.global_runtime_device_count()" in s and "subprocess" not in s for s in nb_cells)
    assert nb_cells[-2:] == ["!pip install -q torch_xla==2.9.0\nimport torch_xla\nimport torch",
                             "print(torch.ones(2, device=torch_xla.device()))"]


def _run_setup(source: str, isolated: bool, dry: str = "1") -> subprocess.CompletedProcess:
    flags = ["-I", "-S"] if isolated else []  # -S: no site-packages, so nothing is installed
    return subprocess.run([sys.executable, *flags, "-c", source], env={**os.environ, "DRY_RUN": dry},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("key,target", [("xla", "torch-xla"), ("jax", "jax")])
def test_setup_cell_dry_run(notebooks, key, target):
    source = _setup(notebooks[key])
    prof = platforms.profile(target)
    here = _run_setup(source, isolated=False)
    assert here.returncode == 0, here.stderr
    # this venv holds porter's pins: nothing to install (the data packages are there too)
    assert "nothing to do" in here.stdout and "would run" not in here.stdout
    bare = _run_setup(source, isolated=True)
    assert bare.returncode == 0, bare.stderr
    would = [line for line in bare.stdout.splitlines() if line.startswith("would run: ")]
    assert would, bare.stdout
    words = would[0].split()
    assert words[3:7] == ["-m", "pip", "install", "-q"]
    assert words[7:] == shlex.split(prof.tpu_install[0])[2:]
    for name, version in prof.pins:
        assert f"{name}: installed none, pinned {version}  <- differs" in bare.stdout
    if key == "xla":
        assert would[1].endswith("pip install -q gcsfs")


def test_notebook_json_is_stable(ports, tmp_path):
    porter("kit", "colab", ports / "train_xla.py", "--out", tmp_path)
    first = (tmp_path / "train_xla_colab.ipynb").read_bytes()
    porter("kit", "colab", ports / "train_xla.py", "--out", tmp_path)
    assert (tmp_path / "train_xla_colab.ipynb").read_bytes() == first
    json.loads(first)


@pytest.mark.parametrize("key,printed", [("xla", "TPU device(s), device type CPU"), ("jax", "1 device(s): [CpuDevice(id=0)]")])
def test_device_check_runs_and_refuses_a_cpu(notebooks, key, printed):
    """The check cell's child-process code, run here on the CPU backend: it counts the devices
    with the real framework and stops with its message, since there is no TPU."""
    cell = next(c.source for c in notebooks[key].cells if "CHECK = " in c.source)
    namespace: dict = {}
    exec(cell.split("subprocess.run(")[0].split("import os, subprocess, sys\n")[1], namespace)
    run = subprocess.run([sys.executable, "-c", namespace["CHECK"]], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PJRT_DEVICE": "CPU", "JAX_PLATFORMS": "cpu"})
    assert run.returncode != 0 and printed in run.stdout, (run.stdout, run.stderr[-2000:])
    assert "no TPU: choose a TPU runtime" in run.stderr


@pytest.mark.parametrize("code,target", [
    ("import torch_xla.core.xla_model as xm\n", "torch-xla"),
    ("from torch_xla import runtime as xr\n", "torch-xla"),
    ("import torch\nimport torch_xla\n", "torch-xla"),
    ("from flax import nnx\n", "jax"),
    ("import jax.numpy as jnp\n", "jax"),
    ("import optax\n", "jax"),
    ("def f():\n    import jax\n", "jax"),
    ("import torch\n", None),
    ("from . import jax\n", None),
])
def test_target_detection(code, target):
    from porter.kits import detect_target

    assert detect_target(code) == target


@pytest.mark.parametrize("fixture,target", [("fixtures/torch_xla/mnist_cnn/expected.py", "torch-xla"),
                                            ("fixtures/jax/mlp/expected.py", "jax")])
def test_kits_for_porters_own_ports(fixture, target, tmp_path):
    """The expected ports of porter's fixtures: the target is detected, both kits are written."""
    port = ROOT / fixture
    porter("kit", "tpu-vm", port, "--out", tmp_path / "vm", "--", "--epochs", "1")
    env = (tmp_path / "vm" / "env.sh").read_text()
    assert f"TARGET={target}" in env and (tmp_path / "vm" / "code" / "expected.py").read_bytes() == port.read_bytes()
    cmds = transcript(tmp_path / "vm")
    assert [step_of(c) for c in cmds].count("run") == 1
    porter("kit", "colab", port, "--out", tmp_path / "colab")
    nb = nbformat.read(tmp_path / "colab" / "expected_colab.ipynb", 4)
    nbformat.validate(nb)
    assert target in _setup(nb)
