"""A Gluon step whose loss is computed in several autograd.record() blocks before its one
backward pass (a GAN's discriminator: the real batch's loss, then the generated batch's) is one
torch step (GL303): zero_grad() before the first block, every block's body in place. Before,
GL303 refused it ("no trainer.step(n) follows it"), as in MXNet's own DCGAN example.

Also the weights of a trainer whose model the MXNet side finds one block inside the port's
(a Sequential holding one Dense: `weight` there, `0.weight` in the port) are loaded under the
port's names; before, the port kept its own initial weights and the losses differed from step
1 (2e-4, still inside the float32 tolerance)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from porter import engine, registry
from porter.verify.weights import _aligned

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "data" / "gluon_steps" / "two_record_blocks.py"

HEAD = """
from mxnet import autograd, gluon
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
for data in loader:
"""
SPELLINGS = {
    "combined_after": """
    with autograd.record():
        err_real = loss_fn(net(data), ones)
    with autograd.record():
        err_fake = loss_fn(net(gen(data).detach()), zeros)
        err = err_real + err_fake
    err.backward()
    trainer.step(data.shape[0])
""",
    "backward_in_the_last_block": """
    with autograd.record():
        err_real = loss_fn(net(data), ones)
    log(err_real)
    with autograd.record():
        err = err_real + loss_fn(net(gen(data).detach()), zeros)
        err.backward()
    trainer.step(data.shape[0])
""",
}


def _fix(source: str) -> str:
    result = engine.fix(source, engine.Options(registry.select("torch")))
    assert not [f for f in result.remaining if f.code == "GL303"], result.remaining
    return result.source


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_several_record_blocks_make_one_step(name):
    out = _fix(HEAD + textwrap.dedent(SPELLINGS[name]).replace("\n", "\n    ").rstrip() + "\n")
    assert "autograd.record" not in out
    assert out.count("trainer.zero_grad()") == 1
    assert out.index("trainer.zero_grad()") < out.index("err_real = ")
    assert "(err.sum() / data.shape[0]).backward()" in out and "trainer.step()" in out
    assert _fix(out) == out


def test_a_forward_after_the_backward_is_another_step():
    source = HEAD + textwrap.indent(textwrap.dedent("""
        with autograd.record():
            err = loss_fn(net(data), ones)
        err.backward()
        with autograd.record():
            other = loss_fn(net(data), zeros)
        trainer.step(data.shape[0])
        """), "    ")
    result = engine.fix(source, engine.Options(registry.select("torch")))
    assert [f for f in result.remaining if f.code == "GL303"]


def test_names_one_block_apart_are_aligned():
    assert _aligned({"weight": 1, "bias": 2}, {"0.weight", "0.bias"}) == {"0.weight": 1, "0.bias": 2}
    assert _aligned({"net.0.weight": 1, "net.0.bias": 2}, {"0.weight", "0.bias"}) == {"0.weight": 1, "0.bias": 2}
    assert _aligned({"a.weight": 1}, {"b.weight"}) == {"a.weight": 1}  # not one prefix apart: as it is


@pytest.mark.slow
def test_the_port_trains_on_xla_with_the_originals_losses(tmp_path, mxnet_python):
    out = tmp_path / "ported"
    subprocess.run([sys.executable, "-m", "porter", "migrate", str(SCRIPT.parent), "--to", "torch-xla", "--out",
                    str(out)], check=True, capture_output=True, text=True)
    env = {**os.environ, "PORTER_MXNET_PYTHON": mxnet_python}
    result = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(SCRIPT), str(out / SCRIPT.name),
                             "--steps", "4", "--format", "json"], capture_output=True, text=True, env=env, timeout=600)
    report = json.loads(result.stdout)
    assert report["status"] == "passed", (report.get("summary"), result.stderr[-2000:])
    worst = max(abs(sum(s["original"]) - sum(s["port"])) for s in report["steps"])
    assert worst < 2e-5, report["steps"]  # the generator's weights are the original's too
    assert any("optimizer 1: the original's Dense weights loaded" in n for n in report["notes"]), report["notes"]
