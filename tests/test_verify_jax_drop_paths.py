"""verify switches a stochastic-depth layer off on both sides: torchvision's StochasticDepth on
the original's side (p = 0, like dropout), and on the JAX side the port's module of the same
name, whatever class the port gave it, where it keeps the same probability attribute (`p`) as a
number: a package's own StochasticDepth ported along with the model (a plain nnx.Module drawing
its own keys) is switched off too. A port whose layer keeps the probability under another name
still drops rows and diverges at that layer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from porter import engine, registry

DATA = Path(__file__).parent / "data" / "verify" / "jax"
ORIGINAL = DATA / "drop_path_net.py"

pytestmark = [pytest.mark.slow, pytest.mark.jax]

ROW_DROP = '''

class RowDrop(nnx.Module):
    """Each sample zeroed with probability {attr}, the rest scaled by 1 / (1 - {attr})."""

    def __init__(self, p, *, rngs: nnx.Rngs):
        self.{attr} = p
        self.rngs = rngs

    def __call__(self, x):
        if self.{attr} == 0.0:
            return x
        keep = jax.random.bernoulli(self.rngs.dropout(), 1.0 - self.{attr}, (x.shape[0],) + (1,) * (x.ndim - 1))
        return x * keep / (1.0 - self.{attr})
'''


def _port(tmp_path: Path, attr: str) -> Path:
    text = engine.fix(ORIGINAL.read_text(), engine.Options(registry.select("jax"))).source
    old = 'self.drop = TorchStochasticDepth(0.5, "row", rngs=rngs)'
    assert text.count(old) == 1, text
    text = text.replace(old, "self.drop = RowDrop(0.5, rngs=rngs)")
    text = text.replace("\n\nclass Net(", ROW_DROP.format(attr=attr) + "\n\nclass Net(", 1)
    path = tmp_path / f"port_{attr}.py"
    path.write_text("import jax\n" + text)
    return path


def _verify(port: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", str(ORIGINAL), str(port), "--model", "Net()",
                           "--input", "float32[8,3,6,6]", "--steps", "1", "--format", "json"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.stdout, proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def test_the_ports_own_stochastic_depth_is_switched_off_by_name(tmp_path):
    rc, report = _verify(_port(tmp_path, "p"))
    assert rc == 0 and report["status"] == "passed", report["summary"]
    assert any("dropout switched off for the comparison in: drop" in n for n in report["notes"]), report["notes"]


def test_another_attribute_is_left_alone_and_diverges(tmp_path):
    rc, report = _verify(_port(tmp_path, "keep_out"))
    assert rc == 1 and report["status"] == "diverged", report["summary"]
    assert report["first_divergence"]["where"] == "output of drop"
