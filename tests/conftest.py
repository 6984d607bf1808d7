"""Fixtures shared by the test modules that run real MXNet (see mxnethelp.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

import mxnethelp


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    return mxnethelp.mxnet_python()


@pytest.fixture(scope="session")
def script_steps_mxnet(tmp_path_factory) -> tuple[Path, dict]:
    """script_steps.py's original runs in MXNet, once per test session: (the folder holding
    init_<loss>.params and the final parameters, (optimizer, loss) -> (losses, final file))."""
    folder = tmp_path_factory.mktemp("script_steps")
    return folder, mxnethelp.run_script_steps(folder)
