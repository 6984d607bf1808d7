"""verify_model with the float64 reference of the original (what `porter zoo` asks for): a
matching port still passes and the reference ran; real differences still fail, in the
forward (a BatchNorm eps, a missing residual term: judged against the reference) and in the
steps (a BatchNorm momentum: compared elementwise)."""
from __future__ import annotations

from pathlib import Path

import pytest

from porter.verify.model import ModelRequest, verify_model

DATA = Path(__file__).parent / "data" / "verify"

pytestmark = [pytest.mark.slow, pytest.mark.xla]


def _verify(port: Path):
    return verify_model(ModelRequest(DATA / "convnet.py", port, "ConvNet()", ("float32[4,3,16,16]",), steps=3,
                                     timeout=400, reference=True))


def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (DATA / "convnet_xla.py").read_text()
    assert old in text
    path = tmp_path / f"{name}.py"
    path.write_text(text.replace(old, new))
    return path


def test_a_matching_port_passes_and_the_reference_ran():
    report = _verify(DATA / "convnet_xla.py")
    assert report.passed, report.summary
    assert report.timings["original_reference_s"] > 0
    assert report.settings["reference"] is True


@pytest.mark.parametrize("name,old,new,where", [
    ("eps", "self.bn1 = nn.BatchNorm2d(c_out)", "self.bn1 = nn.BatchNorm2d(c_out, eps=1e-2)", "output of layer1.0.bn1"),
    ("residual", "return F.relu(self.bn2(self.conv2(y)) + x)", "return F.relu(self.bn2(self.conv2(y)) + 0.99 * x)",
     "output of layer1.0"),
])
def test_a_real_forward_difference_still_fails(tmp_path, name, old, new, where):
    report = _verify(_variant(tmp_path, name, old, new))
    assert report.status == "diverged", report.summary
    assert report.first_divergence["where"] == where


def test_a_step_difference_still_fails():
    report = _verify(DATA / "convnet_xla_bn_momentum.py")
    assert report.status == "diverged"
    assert report.first_divergence["where"] == "buffer layer1.0.bn1.running_mean at step 1"
