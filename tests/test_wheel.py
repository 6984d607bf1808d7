"""porter as a user installs it: the sdist and the wheel built from this checkout, the wheel
installed (not editable) into a fresh venv, and porter run from there, away from the checkout.

One build for the module: the sdist from a copy of the working tree, then the wheel from the
unpacked sdist (the way pip builds from PyPI), both without network or build isolation. The
venv is layered on the cached framework venv the way scripts/bootstrap layers .venv (a .pth
adding the base venv's site-packages), so torch_xla, JAX and MXNet are not installed again. Every
command runs with its working directory outside the checkout and no PYTHONPATH, and the test
checks that the porter it runs is the installed one.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from porter import registry
from porter.verify import mxnet_env

REPO = Path(__file__).resolve().parent.parent
BASE = Path((REPO / ".venv" / ".porter-base").read_text().strip()) if (REPO / ".venv" / ".porter-base").is_file() else None
CODE = re.compile(r"\b([A-Z]{2}\d{3})\b")
# what a copy of the working tree leaves out: version control, venvs, build outputs, caches
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                     ".pytest_cache", "ported", ".whl", ".gl")

# building and installing takes seconds and starts no framework; the migrate + verify runs do
pytestmark = pytest.mark.slow


def _run(cmd, cwd: Path, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    environment.update(PJRT_DEVICE="CPU", JAX_PLATFORMS="cpu", COLUMNS="200", **env)
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    return proc


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _source_files(root: Path) -> set[str]:
    """The package's files in a source tree, as paths relative to it: every module under
    porter/ and codemods/, every file under templates/."""
    found = set()
    for folder, pattern in (("porter", "*.py"), ("codemods", "*.py"), ("templates", "*")):
        found |= {p.relative_to(root).as_posix() for p in (root / folder).rglob(pattern)
                  if p.is_file() and "__pycache__" not in p.parts}
    return found


def _installed_name(path: str) -> str:
    """Where a source file lands in the wheel: codemods/ and templates/ go inside porter/."""
    top, _, rest = path.partition("/")
    return f"porter/{path}" if top in ("codemods", "templates") else path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the source copy, the sdist, the wheel)."""
    if BASE is None or not (BASE / "bin" / "python").is_file():
        pytest.skip("no cached framework venv (.venv/.porter-base): run scripts/bootstrap")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCE, symlinks=True)
    dist = root / "dist"
    dist.mkdir()
    # setuptools' PEP 517 hook, in this interpreter's environment (no isolation, no network)
    hook = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    name = _ok(_run([sys.executable, "-c", hook, dist], cwd=src)).strip().splitlines()[-1]
    sdist = dist / name
    unpacked = root / "unpacked"
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    (tree,) = unpacked.iterdir()
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "--disable-pip-version-check", "-w", dist, tree], cwd=root))
    (wheel,) = dist.glob("*.whl")
    return src, sdist, wheel


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A fresh venv on the cached framework venv, with the wheel installed."""
    _, _, wheel = built
    root = tmp_path_factory.mktemp("venv")
    env = root / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", env], cwd=root))
    base_site = _ok(_run([BASE / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         cwd=root)).strip()
    site = _ok(_run([env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=root)).strip()
    Path(site, "_porter_base.pth").write_text(f"import site; site.addsitedir({base_site!r})\n")
    _ok(_run([env / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
              wheel], cwd=root))
    return env


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The folder the installed porter runs in (outside the checkout), with copies of the fixtures."""
    work = tmp_path_factory.mktemp("work")
    for kind, name in (("torch_xla", "mnist_cnn"), ("jax", "mlp"), ("mxnet", "mlp")):
        shutil.copytree(REPO / "fixtures" / kind / name, work / kind, ignore=_NOT_SOURCE)
    return work


def test_sdist_has_every_source_file(built):
    src, sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = _source_files(src) - names
    assert not missing, sorted(missing)
    assert {"pyproject.toml", "setup.py", "README.md", "requirements-mxnet.lock", "scripts/bootstrap-mxnet"} <= names
    rules = {p for p in names if re.match(r"codemods/(torch_xla|jax|gluon)/[a-z]{2}\d{3}_\w+\.py$", p)}
    assert {p.split("/")[1] for p in rules} == {"torch_xla", "jax", "gluon"}


def test_wheel_has_every_module_inside_porter(built):
    src, _, wheel = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = {_installed_name(p) for p in _source_files(src)} - names
    assert not missing, sorted(missing)
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"porter"}, tops
    metadata = next(zf for zf in names if zf.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as zf:
        extras = set(re.findall(r"^Provides-Extra: (\S+)$", zf.read(metadata).decode(), re.M))
    assert {"torch-xla", "jax", "lsp", "test"} <= extras, extras


def test_the_installed_porter_is_the_one_that_runs(venv, work):
    python = venv / "bin" / "python"
    out = _ok(_run([python, "-c", "import porter, porter.codemods, porter.templates; print(porter.__file__); "
                    "print(porter.codemods.__file__); print(porter.templates.__file__)"], cwd=work))
    for line in out.split():
        assert Path(line).resolve().is_relative_to(venv.resolve()), line
    # codemods/ and templates/ are not top-level import names
    proc = _run([python, "-c", "import importlib.util as u; print([u.find_spec(m) for m in ('codemods', 'templates')])"],
                cwd=work)
    assert _ok(proc).strip() == "[None, None]"


def test_porter_rules_lists_every_target(venv, work):
    out = _ok(_run([venv / "bin" / "porter", "rules"], cwd=work))
    listed = set(CODE.findall(out))
    expected = {info.code for info in registry.infos(None)}
    assert listed == expected, (sorted(expected - listed), sorted(listed - expected))
    assert {c[:2] for c in listed} >= {"TX", "JX", "GL"}


def _conf(folder: Path) -> dict:
    return tomllib.loads((folder / "port.toml").read_text(encoding="utf-8"))


def _migrate(venv: Path, work: Path, kind: str, target: str, expected: str) -> Path:
    folder = work / kind
    out = folder / f"out_{target}"
    _ok(_run([venv / "bin" / "porter", "migrate", "train.py", "--to", target, *_conf(folder)["migrate"],
              "--out", out], cwd=folder))
    port = out / "train.py"
    # the installed rules port the fixture exactly as the checkout's expected port says
    assert port.read_text(encoding="utf-8") == (folder / expected).read_text(encoding="utf-8")
    return port


def _verify(venv: Path, work: Path, kind: str, port: Path, **env) -> dict:
    folder = work / kind
    conf = _conf(folder)
    inputs = [a for spec in conf["inputs"] for a in ("--input", spec)]
    proc = _run([venv / "bin" / "porter", "verify", "train.py", port, "--model", conf["model"], *inputs,
                 "--steps", "2", "--format", "json", *(["--atol", str(conf["verify_atol"])] if "verify_atol" in conf else [])],
                cwd=folder, timeout=900, **env)
    assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], (report.get("summary"), proc.stderr[-3000:])
    return report


@pytest.mark.xla
def test_torch_xla_migrate_and_verify(venv, work):
    port = _migrate(venv, work, "torch_xla", "torch-xla", "expected.py")
    report = _verify(venv, work, "torch_xla", port)
    assert report["health"]["within_budget"], report["health"]["problems"]


@pytest.mark.jax
def test_jax_migrate_and_verify(venv, work):
    port = _migrate(venv, work, "jax", "jax", "expected.py")
    _verify(venv, work, "jax", port)


@pytest.mark.mxnet
@pytest.mark.jax
def test_gluon_migrate_and_verify(venv, work):
    port = _migrate(venv, work, "mxnet", "jax", "expected_jax.py")
    try:
        python = mxnet_env.mxnet_python()
    except mxnet_env.MXNetEnvError as exc:
        pytest.skip(f"no MXNet venv to verify the Gluon original with: {exc}")
    # an installed porter has no checkout beside it to find the MXNet venv from: it is named
    _verify(venv, work, "mxnet", port, **{mxnet_env.ENV_VAR: python})
