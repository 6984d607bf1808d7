"""The fast test lane's tripwire: with PORTER_TEST_NO_FRAMEWORKS set, importing torch_xla, JAX
(jax, jaxlib, flax, optax) or MXNet raises FrameworkStarted, in this interpreter and in every
Python subprocess that inherits the environment (tests/conftest.py puts this folder on
PYTHONPATH, so Python imports it as ``sitecustomize`` at start-up). Each attempt is also
appended to the file PORTER_TEST_TRIPWIRE_LOG names, so a test that swallows the failure (one
that expects a subprocess to fail, say) is still caught by conftest's check after the test.

Standard library only: the MXNet venv's interpreter imports it too.
"""
from __future__ import annotations

import importlib.abc
import os
import sys

BLOCKED = ("torch_xla", "jax", "jaxlib", "flax", "optax", "mxnet")
ENV = "PORTER_TEST_NO_FRAMEWORKS"
LOG_ENV = "PORTER_TEST_TRIPWIRE_LOG"


class FrameworkStarted(RuntimeError):
    pass


class _Refuse(importlib.abc.Loader):
    """Loads nothing: executing the module raises. (Finding it is allowed, so that a check like
    ``importlib.util.find_spec("torch_xla")`` still sees what is installed.)"""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        top = module.__name__.partition(".")[0]
        message = (f"{top} imported in the fast test lane ({ENV}=1, pid {os.getpid()}): the test that "
                   "did this starts a framework; add it to FRAMEWORK_TESTS in tests/conftest.py")
        log = os.environ.get(LOG_ENV)
        if log:
            try:
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(f"{top} {os.getpid()} {' '.join(sys.argv)[:300]}\n")
            except OSError:
                pass
        raise FrameworkStarted(message)


class _Tripwire(importlib.abc.MetaPathFinder):
    """A meta path finder in front of the others: a framework package (or submodule) that they
    find is handed to _Refuse; one that is not installed stays not found. (The class can be
    loaded twice, as sitecustomize and by tests/conftest.py: instances know each other by the
    attribute, not the class.)"""

    porter_tripwire = True

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED or not os.environ.get(ENV):
            return None
        for finder in sys.meta_path:
            if getattr(finder, "porter_tripwire", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Refuse()
                return spec
        return None


def install() -> None:
    if not any(getattr(f, "porter_tripwire", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Tripwire())


if os.environ.get(ENV):
    install()
