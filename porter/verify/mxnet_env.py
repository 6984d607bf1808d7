"""Where the MXNet venv's python is: the interpreter that runs MXNet/Gluon originals.

mxnet 1.9.1 needs numpy 1.23.5 and cannot share porter's venv (jax needs numpy 2), so
``scripts/bootstrap-mxnet`` builds it apart, once per hash of ``requirements-mxnet.lock``, as
``<cache>/mxnet-<first 16 hex digits of the lock file's sha256>`` (cache: ``$PORTER_CACHE``,
else ``$XDG_CACHE_HOME/porter``, else ``~/.cache/porter``; the same rule as the script), and
marks it finished with a ``.complete`` file.

Lookup, in order:
1. ``PORTER_MXNET_PYTHON``: an interpreter the user names (it must exist);
2. the cache path computed from the lock file's hash, when that venv is complete.
Otherwise ``MXNetEnvError`` says how to build it. Standard library only: importable from any
interpreter. ``python -m porter.verify.mxnet_env`` prints the path.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements-mxnet.lock"
ENV_VAR = "PORTER_MXNET_PYTHON"


class MXNetEnvError(RuntimeError):
    pass


def cache_dir() -> Path:
    if os.environ.get("PORTER_CACHE"):
        return Path(os.environ["PORTER_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg if xdg else Path.home() / ".cache") / "porter"


def lock_hash(lock: Path = LOCK) -> str:
    """The first 16 hex digits of the lock file's sha256 (as ``sha256sum | cut -c1-16``)."""
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16]


def venv_dir(lock: Path = LOCK) -> Path:
    return cache_dir() / f"mxnet-{lock_hash(lock)}"


def mxnet_python() -> str:
    """The python of the MXNet venv; ``MXNetEnvError`` when there is none."""
    named = os.environ.get(ENV_VAR)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise MXNetEnvError(f"{ENV_VAR}={named} is not an executable file")
        return named
    if not LOCK.is_file():
        raise MXNetEnvError(f"no {LOCK.name} beside porter ({REPO}); set {ENV_VAR} to an interpreter "
                            "with mxnet 1.9.1 and numpy 1.23.5")
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file() or not python.is_file():
        raise MXNetEnvError(f"the MXNet venv is not built ({venv} is missing or incomplete): run "
                            f"{REPO / 'scripts' / 'bootstrap-mxnet'}, or set {ENV_VAR} to an interpreter "
                            "with mxnet 1.9.1 and numpy 1.23.5")
    return str(python)


if __name__ == "__main__":
    try:
        print(mxnet_python())
    except MXNetEnvError as exc:
        print(f"porter: {exc}", file=sys.stderr)
        sys.exit(2)
