"""The test lanes: the fast lane's tripwire refuses every framework, in this process and in
Python subprocesses, and the table of framework tests in tests/conftest.py names tests that exist."""
from __future__ import annotations

import ast
import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent
_PROBE = """
import importlib.util, sys
print(importlib.util.find_spec("{name}") is not None)
try:
    import {name}
except Exception as exc:
    print(type(exc).__name__)
else:
    print("imported")
"""


def _probe(name: str, **env) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k != conftest.tripwire.ENV}
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(conftest.TRIPWIRE), os.environ.get("PYTHONPATH")) if p)
    environment.update(env)
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(name=name)], capture_output=True, text=True,
                          timeout=120, env=environment)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_tripwire_refuses_each_framework_in_a_subprocess(tmp_path):
    log = tmp_path / "tripwire.log"
    for name in conftest.tripwire.BLOCKED:
        # found when installed (so "is it installed?" checks still see it), never executed
        found, outcome = _probe(name, **{conftest.tripwire.ENV: "1", conftest.tripwire.LOG_ENV: str(log)})
        assert outcome in ("FrameworkStarted", "ModuleNotFoundError"), (name, outcome)
        assert (found == "True") == (outcome == "FrameworkStarted"), (name, found, outcome)
    refused = [line.split()[0] for line in log.read_text().splitlines()]
    assert {"torch_xla", "jax", "flax", "optax"} <= set(refused), refused


def test_the_tripwire_leaves_other_imports_and_unset_lanes_alone():
    assert _probe("json", **{conftest.tripwire.ENV: "1"}) == ["True", "imported"]
    # on PYTHONPATH without the variable, the tripwire does nothing
    assert _probe("json") == ["True", "imported"]
    environment = {k: v for k, v in os.environ.items() if k != conftest.tripwire.ENV}
    environment["PYTHONPATH"] = str(conftest.TRIPWIRE)
    code = "import sys; print(any(getattr(f, 'porter_tripwire', False) for f in sys.meta_path))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environment)
    assert out.stdout.strip() == "False", out.stderr


def test_the_fast_lane_sets_the_tripwire_for_subprocesses():
    if conftest._fast_lane():
        assert str(conftest.TRIPWIRE) in os.environ["PYTHONPATH"].split(os.pathsep)
        assert any(getattr(f, "porter_tripwire", False) for f in sys.meta_path)


def _test_names(module: Path) -> set[str]:
    tree = ast.parse(module.read_text(encoding="utf-8"))
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")}


def test_every_framework_table_entry_names_existing_tests():
    stale = []
    for pattern in conftest.FRAMEWORK_TESTS:
        module, _, test = pattern.partition("::")
        path = TESTS / module
        if not path.is_file():
            stale.append(pattern)
            continue
        # a node id is module::name[params]: the name part must match the pattern's name part
        if test and not any(fnmatch.fnmatchcase(name, test) or fnmatch.fnmatchcase(name, test.rstrip("*"))
                            or fnmatch.fnmatchcase(f"{name}[x]", test) for name in _test_names(path)):
            stale.append(pattern)
    assert not stale, f"FRAMEWORK_TESTS entries that match no test: {stale}"


def test_framework_markers_of_node_ids():
    assert conftest.framework_markers("tests/test_jax_modules.py::test_anything[p]") == {"jax"}
    assert conftest.framework_markers("tests/test_gluon_ops.py::test_op_matches_mxnet[3-add]") == {"mxnet"}
    assert conftest.framework_markers("tests/test_gluon_ops.py::test_something_else") == set()
    assert conftest.framework_markers("test_verify_mxnet.py") == {"mxnet", "xla"}
