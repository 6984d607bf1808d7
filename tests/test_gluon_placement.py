"""Where Gluon puts its arrays, in the spellings scripts use (GL003, GL006, GL307): the context
given by keyword (`as_in_context(context=ctx)`, MXNet 2's `as_in_ctx(ctx=ctx)`), `copyto` onto a
context (a new copy there) and into an existing array (which it returns), `nd.array` of any value
with its dtype given; and the CPU warm-up of lazy layers, which needs the loader that feeds the
model to exist where the model is moved. Before, `as_in_context(context=ctx)` became
`.to(context=device)` (a TypeError) and `copyto` stayed (an AttributeError), neither reported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from porter import engine, registry

SCRIPT = Path(__file__).parent / "data" / "gluon_placement" / "copies.py"
HEAD = "import mxnet as mx\nfrom mxnet import nd\n\nctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()\n"
# spelling -> (code after HEAD, what the port holds)
SPELLINGS = {
    "context keyword": ("def f(x):\n    return x.as_in_context(context=ctx)\n", "return x.to(device)"),
    "ctx keyword (MXNet 2)": ("def f(x):\n    return x.as_in_ctx(ctx=ctx)\n", "return x.to(device)"),
    "copyto a context name": ("def f(x):\n    return x.copyto(ctx)\n", "return x.to(device, copy=True)"),
    "copyto a context call": ("def f(x):\n    return x.copyto(mx.cpu())\n", "x.to(torch.device(\"cpu\"), copy=True)"),
    "copyto an element of a context list": (
        "devices = [mx.gpu(i) for i in range(2)]\n\ndef f(x):\n    return x.copyto(devices[0])\n",
        "x.to(devices[0], copy=True)"),
    "copyto an array": ("buf = nd.zeros((2, 3))\n\ndef f(x):\n    x.copyto(buf)\n    return buf\n",
                        "    buf.copy_(x)\n"),
    "copyto an array, its result kept": ("def f(x):\n    out = nd.zeros((2, 3))\n    kept = (x + 1).copyto(out)\n"
                                         "    return kept\n", "kept = out.copy_(x + 1)"),
    "nd.array of a numpy value, its dtype given": (
        "import numpy as np\nrows = nd.array(np.ones((2, 3)), dtype='float64', ctx=ctx)\n",
        "rows = torch.tensor(np.ones((2, 3)), dtype=torch.float64, device=device)"),
}
# spelling -> (code after HEAD, a word of the finding's message); nothing is written there
REPORTED = {
    "copyto of an unknown value": ("def f(x, where):\n    return x.copyto(where)\n", "copyto"),
    "nd.array of a numpy value without a dtype": ("import numpy as np\nrows = nd.array(np.ones((2, 3)))\n", "dtype"),
}


def _fix(source: str) -> engine.FixResult:
    return engine.fix(source, engine.Options(registry.select("torch")), "train.py")


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_placement_spelling_is_translated(name):
    code, expected = SPELLINGS[name]
    result = _fix(HEAD + code)
    cst.parse_module(result.source)
    assert expected in result.source, result.source
    assert "copyto" not in result.source and "as_in_c" not in result.source and "context=" not in result.source
    assert not [f for f in result.remaining if f.code in ("GL003", "GL006", "GL901")], \
        [(f.code, f.message) for f in result.remaining]


@pytest.mark.parametrize("name", sorted(REPORTED))
def test_what_porter_cannot_tell_is_reported_at_its_line(name):
    code, word = REPORTED[name]
    result = _fix(HEAD + code)
    line = next(i for i, text in enumerate(result.source.splitlines(), 1)
                if ("copyto" if word == "copyto" else "nd.array") in text)
    found = [f for f in result.remaining if f.code in ("GL003", "GL006") and word in f.message]
    assert found and found[0].position.line == line, [(f.code, f.position, f.message) for f in result.remaining]


_MODEL = """\
net = nn.Sequential()
net.add(nn.Dense(4))
net.initialize(ctx=ctx)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
"""
_DATA = """\
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(nd.ones((8, 3)), nd.zeros((8,))), batch_size=4)
"""
_LOOP = """\
for data, label in loader:
    with autograd.record():
        loss = (net(data.as_in_context(ctx)) ** 2).sum()
    loss.backward()
    trainer.step(4)
"""
_IMPORTS = "import mxnet as mx\nfrom mxnet import autograd, gluon, nd\nfrom mxnet.gluon import nn\n\nctx = mx.cpu()\n"


def test_a_model_fed_an_input_moved_in_the_call_takes_its_shapes_from_the_loader():
    """`net(data.as_in_context(ctx))`: the input is the batch's item, moved where the model is
    called; the lazy layers' warm-up reads the loader's first sample before the model moves."""
    result = engine.fix(_IMPORTS + _DATA + _MODEL + _LOOP, engine.Options(registry.select("torch-xla")), "train.py")
    port = result.source
    assert "net(torch.utils.data.default_collate([loader.dataset[0]])[0])" in port, port
    assert port.index("loader.dataset[0]") < port.index("net.to(device)"), port


def test_a_loader_made_after_the_model_moves_is_reported_not_read_before_it_exists():
    """The warm-up reads the loader's first sample where the model is moved: a loader made after
    that (a script that builds its data after its model) is reported there, and no warm-up
    reads it before it exists (before: a NameError in the port, no finding)."""
    result = _fix(_IMPORTS + _MODEL + _DATA + _LOOP)
    assert "loader.dataset[0]" not in result.source, result.source
    assert any(f.code == "GL307" and "made after" in f.message for f in result.remaining), \
        [(f.code, f.message) for f in result.remaining]


@pytest.mark.slow
def test_the_script_of_these_spellings_trains_on_xla_with_the_originals_losses(tmp_path, mxnet_python):
    out = tmp_path / "ported"
    subprocess.run([sys.executable, "-m", "porter", "migrate", str(SCRIPT), "--to", "torch-xla", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    port = (out / SCRIPT.name).read_text(encoding="utf-8")
    assert "mxnet" not in port and "scores.copy_(out)" in port, port
    env = {**os.environ, "PORTER_MXNET_PYTHON": mxnet_python, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(SCRIPT), str(out / SCRIPT.name),
                           "--steps", "4", "--format", "json"], capture_output=True, text=True, env=env, timeout=600)
    report = json.loads(proc.stdout)
    assert report["status"] == "passed", (report.get("summary"), proc.stderr[-2000:])
    assert len(report["steps"]) == 4
