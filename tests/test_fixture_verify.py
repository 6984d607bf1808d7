"""Every torch_xla fixture's port verified the way a user verifies it: `porter verify` on the
command line at model level (port.toml's `model` and `inputs`), the JSON report read back. The
script level (port.toml's `run` arguments) is test_fixture_ports.py's run of original and port
side by side, which is `porter verify --script` over the whole epoch.

Where an unsafe fix deliberately changes what is computed (port.toml's `reference_rules`:
drop_last, SparseAdam -> Adam, dense embeddings), the port is verified against the reference:
the original with only those fixes applied (Fixture.reference()), written next to nothing else
in a temporary folder (every fixture is self-contained).

The runs are kept short: 3 model-level steps.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from porter.fixtures import fixtures

from lanes import fixture_rest

FIXTURES = fixtures()

pytestmark = [pytest.mark.xla, pytest.mark.slow]


def verify(*args):
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--format", "json", *map(str, args)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def reference_of(fx, tmp_path: Path) -> Path:
    """The file the port is compared with: the original, or where the port applies unsafe fixes
    that change what is computed, the original with only those fixes."""
    if not fx.reference_rules:
        return fx.original
    path = tmp_path / "reference" / "train.py"
    path.parent.mkdir()
    path.write_text(fx.reference(), encoding="utf-8")
    return path


def test_every_fixture_names_a_model_and_inputs():
    for fx in FIXTURES:
        assert fx.model and fx.inputs, f"{fx.folder / 'port.toml'}: model and inputs for model-level verification"


# the fixtures test_fixture_ports.py does not run at script level in this run of the suite
@pytest.mark.parametrize("fx", fixture_rest(FIXTURES, 3, offset=1), ids=lambda fx: fx.name)
def test_model_level(fx, tmp_path):
    inputs = [arg for spec in fx.inputs for arg in ("--input", spec)]
    code, report = verify(reference_of(fx, tmp_path), fx.expected, "--model", fx.model, *inputs, "--steps", "3")
    assert code == 0 and report["passed"], report["summary"]
    assert report["status"] == "passed" and report["first_divergence"] is None
    health = report["health"]
    assert health["within_budget"], health["problems"]
    assert health["compiles_after_warmup"] == 0 and health["max_transfers_per_step"] == 0
    # every layer's output, the gradients and 3 steps of parameters were compared
    phases = {t["phase"] for t in report["tensors"]}
    assert {"layer", "gradient", "loss", "parameter"} <= phases, phases
    assert sum(t["phase"] == "loss" for t in report["tensors"]) == 3
