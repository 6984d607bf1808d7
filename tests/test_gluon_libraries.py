"""Gluon libraries a script imports (GL008) and `porter migrate --with PACKAGE`.

The library is a small Gluon package written here (named `gluoncv` to stand in for the real
one, and `gluonkit`, a name GL008 does not know): a model zoo module with a HybridBlock, a
utility module, and a module the script does not use. The script trains with it in MXNet 1.9.1
(the MXNet venv, the package beside the script), and its port with `--with` trains under
torch_xla with the ported library imported from --out: same losses.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mxnethelp
from clihelp import cli, write
from porter import engine, registry
from porter.packages import used_modules

TORCH = engine.Options(registry.select("torch"))

LIBRARY = {
    "__init__.py": "from . import model_zoo, utils\n__version__ = '0.0.1'\n",
    "model_zoo/__init__.py": "from PKG.model_zoo.simple import get_model\n",  # an absolute import of itself
    "model_zoo/simple.py": '''\
from mxnet import gluon
from mxnet.gluon import nn


class TinyNet(gluon.HybridBlock):
    def __init__(self, classes, **kwargs):
        super(TinyNet, self).__init__(**kwargs)
        with self.name_scope():
            self.hidden = nn.Dense(16, activation="relu", in_units=8)
            self.output = nn.Dense(classes, in_units=16)

    def hybrid_forward(self, F, x):
        return self.output(self.hidden(x))


def get_model(name, classes=3):
    if name != "tiny":
        raise ValueError(name)
    return TinyNet(classes)
''',
    "utils/__init__.py": "from .history import TrainingHistory\n",
    "utils/history.py": '''\
class TrainingHistory:
    def __init__(self, labels):
        self.labels = labels
        self.rows = []

    def update(self, values):
        self.rows.append(list(values))
''',
    "data/__init__.py": "",
    "data/unused.py": "from mxnet import nd\n\n\ndef never_imported(x):\n    return nd.relu(x)\n",
}

SCRIPT = '''\
import mxnet as mx
from mxnet import autograd, gluon

import {name} as lib
from {name} import model_zoo

net = model_zoo.get_model("tiny", classes=3)
net.initialize(mx.init.Constant(0.05))
history = lib.utils.TrainingHistory(["loss"])
trainer = gluon.Trainer(net.collect_params(), "sgd", {{"learning_rate": 0.1}})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
data = mx.nd.arange(32).reshape((4, 8)) / 32
label = mx.nd.array([0, 1, 2, 1])
for step in range(4):
    with autograd.record():
        loss = loss_fn(net(data), label)
    loss.backward()
    trainer.step(4)
    history.update([loss.mean().asscalar()])
    print("loss %.6f" % loss.mean().asscalar())
'''


def _project(root: Path, name: str) -> Path:
    for rel, text in LIBRARY.items():
        write(root / "src" / name / rel, text.replace("PKG", name))
    return write(root / "src" / "train.py", SCRIPT.format(name=name))


def _losses(stdout: str) -> list[float]:
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("loss ")]


@pytest.mark.parametrize("source, line", [
    ("from gluoncv import model_zoo\nimport mxnet as mx\n", 1),
    ("import mxnet as mx\nimport gluoncv as gcv\n", 2),
    ("import gluoncv.model_zoo\nfrom mxnet import gluon\n", 1),
    ("from mxnet import nd\nfrom gluoncv.utils import TrainingHistory\n", 2),
    ("import mxnet\ndef main():\n    from gluonnlp import data\n", 3),
    ("import os, gluonts\nimport mxnet as mx\n", 1),
])
def test_gluon_library_import_is_reported_at_the_import(source, line):
    findings = [f for f in engine.check(source, TORCH).findings if f.code == "GL008"]
    assert [f.position.line for f in findings] == [line]
    assert "--with " in findings[0].message and findings[0].fix is None


@pytest.mark.parametrize("target", ["torch", "torch-xla", "jax"])
def test_the_port_of_a_script_that_imports_the_library_reports_it(target):
    """A migrate's findings are those of its last pass, when GL001 has dropped the script's
    MXNet imports: the library's imports, still there, are still the script's."""
    script = ("import mxnet as mx\nfrom mxnet import gluon\nimport gluoncv as gcv\nfrom gluoncv.model_zoo import get_model\n"
              "net = get_model('cifar_resnet20_v1', classes=10)\nnet.initialize(mx.init.Xavier(), ctx=mx.cpu())\n")
    result = engine.fix(script, engine.Options(registry.select(target)))
    assert "mxnet" not in result.source.replace("gluoncv", ""), result.source
    lines = sorted(f.position.line for f in result.remaining if f.code == "GL008")
    assert len(lines) == 2 and all("gluoncv" in result.source.splitlines()[n - 1] for n in lines), result.source


def test_a_port_importing_the_ported_library_is_not_reported():
    port = "import torch\nimport gluoncv as gcv\nnet = gcv.model_zoo.get_model('tiny')\n"
    for target in ("torch", "torch-xla", "jax"):
        findings = engine.check(port, engine.Options(registry.select(target))).findings
        assert not [f for f in findings if f.code == "GL008"], target


def test_used_modules_are_the_imported_ones(tmp_path, monkeypatch):
    _project(tmp_path, "gluonkit")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    script = SCRIPT.format(name="gluonkit")
    assert used_modules("gluonkit", [script]) == ["gluonkit", "gluonkit.model_zoo", "gluonkit.utils"]
    assert used_modules("gluonkit", ["from gluonkit.model_zoo.simple import TinyNet\n"]) == [
        "gluonkit", "gluonkit.model_zoo", "gluonkit.model_zoo.simple"]
    assert used_modules("gluonkit", ["import gluonkit as g\nx = g.data.unused.never_imported\n"]) == [
        "gluonkit", "gluonkit.data", "gluonkit.data.unused"]


def test_migrate_with_ports_the_used_modules_and_drops_their_findings(tmp_path, monkeypatch):
    train = _project(tmp_path, "gluoncv")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    without = cli("check", str(train), cwd=tmp_path)
    assert without.out.count("GL008") == 2, without.out  # `import gluoncv as lib`, `from gluoncv import model_zoo`

    r = cli("migrate", str(train), "--to", "torch-xla", "--out", "out", "--with", "gluoncv", cwd=tmp_path)
    assert r.code == 0, r.out + r.err
    assert "GL008" not in r.out + r.err  # the script's imports, and the library's own import of itself
    out = tmp_path / "out"
    ported = {p.relative_to(out).as_posix() for p in out.rglob("*.py")}
    assert ported == {"train.py", "gluoncv/__init__.py", "gluoncv/model_zoo/__init__.py", "gluoncv/model_zoo/simple.py",
                      "gluoncv/utils/__init__.py", "gluoncv/utils/history.py"}  # not data/: the script does not use it
    for rel in ported:
        text = (out / rel).read_text()
        assert "mxnet" not in text and "# porter: manual" not in text, (rel, text)
    assert "gluoncv.model_zoo" in r.err and "gluoncv.utils" in r.err  # the summary names what was used


def test_migrate_with_needs_out(tmp_path):
    train = _project(tmp_path, "gluonkit")
    r = cli("migrate", str(train), "--with", "gluonkit", cwd=tmp_path)
    assert r.code == 2 and "--with needs --out" in r.out + r.err


def test_port_with_its_library_trains_as_mxnet(tmp_path, monkeypatch):
    """The original (MXNet, the library beside it) and the port (torch_xla on the CPU, the ported
    library from --out beside it): the same four losses."""
    train = _project(tmp_path, "gluonkit")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    mx = subprocess.run([mxnethelp.mxnet_python(), str(train)], cwd=tmp_path, capture_output=True, text=True,
                        timeout=300)
    assert mx.returncode == 0, mx.stderr[-3000:]
    expected = _losses(mx.stdout)
    assert len(expected) == 4 and expected[-1] < expected[0]

    r = cli("migrate", str(train), "--to", "torch-xla", "--out", "out", "--with", "gluonkit", cwd=tmp_path)
    assert r.code == 0, r.out + r.err
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    port = subprocess.run([sys.executable, str(tmp_path / "out" / "train.py")], cwd=tmp_path / "out",
                          capture_output=True, text=True, timeout=300, env={**env, "PJRT_DEVICE": "CPU"})
    assert port.returncode == 0, port.stderr[-3000:]
    assert "out/gluonkit" not in port.stderr
    assert _losses(port.stdout) == pytest.approx(expected, rel=1e-4)
