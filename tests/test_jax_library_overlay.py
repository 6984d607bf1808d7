"""A JAX port of a script that builds its model with a torch library (torchvision's model
builders): `porter migrate SCRIPT --to jax --out DIR --with torchvision` ports the library's model
code the script uses into DIR/torchvision, an overlay of the installed package (its datasets,
transforms and native code stay the installed ones), and the script's port builds its model
from it (rngs passed, nnx.Optimizer over an NNX module), trains in JAX and matches the original.

Spellings of picking the model: the builder by attribute, imported by name, by name at run
time (`models.__dict__[arch]`, `getattr(models, arch)`), and built inside a module of the
script (a backbone with a head).
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from porter.packages import HOST_SUBPACKAGES, overlay_init, overlay_selection, port_package

from lanes import fixture_slice

_TRAIN = """
torch.manual_seed(0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
loader = DataLoader(data, batch_size=4, shuffle=False)
model.train()
for x, y in loader:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.5f}")
"""
_HEAD = """
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
"""
SCRIPTS = {
    "attribute": _HEAD + "import torchvision\nmodel = torchvision.models.resnet18(num_classes=10)\n" + _TRAIN,
    "imported": _HEAD + "from torchvision.models import resnet18\nmodel = resnet18(num_classes=10)\n" + _TRAIN,
    "by name": _HEAD + "import torchvision.models as models\narch = 'resnet18'\n"
               "model = models.__dict__[arch](num_classes=10)\n" + _TRAIN,
    "getattr": _HEAD + "from torchvision import models\nmodel = getattr(models, 'resnet18')(num_classes=10)\n" + _TRAIN,
    # built inside the program's own module: the module's rngs are passed on
    "in a module": _HEAD + "import torch.nn as nn\nimport torchvision\n\n\nclass Net(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n"
                   "        self.backbone = torchvision.models.resnet18(num_classes=16)\n"
                   "        self.head = nn.Linear(16, 10)\n\n    def forward(self, x):\n"
                   "        return self.head(self.backbone(x))\n\n\nmodel = Net()\n" + _TRAIN,
}


def _migrate(script: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porter", "migrate", str(script), "--to", "jax", "--out", str(out),
                           "--with", "torchvision"], capture_output=True, text=True, timeout=600)


# the two run-time spellings each port the whole of torchvision.models (the script may build any
# of its models): one of them per run of the suite, both with PORTER_TEST_EVERY_FIXTURE=1 (their
# selections: test_the_selection_follows_the_names_the_scripts_use)
BUILT = [name for name in SCRIPTS if name not in ("by name", "getattr")] + fixture_slice(["by name", "getattr"], 2)


@pytest.mark.parametrize("name", BUILT)
def test_the_script_builds_its_model_from_the_overlay(name, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPTS[name])
    proc = _migrate(script, tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    port = (tmp_path / "out" / "train.py").read_text()
    assert ("resnet18(num_classes=16, rngs=rngs)" in port if name == "in a module" else "rngs=nnx.Rngs(0)" in port), port
    assert "nnx.Optimizer(model" in port and "@nnx.jit" in port, port
    # the model is no torch library's model any more: nothing about it is left for a human
    assert "train.py" not in proc.stdout.split("Left for a human:")[-1].split("porter migrate --to jax")[0], proc.stdout
    ported = {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out" / "torchvision").rglob("*.py")}
    assert "torchvision/models/resnet.py" in ported
    assert not any(part in HOST_SUBPACKAGES for p in ported for part in p.split("/")), ported
    if name in ("attribute", "imported", "in a module"):  # the scripts name resnet18: its module (and what it imports) only
        assert ported == {"torchvision/__init__.py", "torchvision/models/__init__.py", "torchvision/models/_utils.py",
                          "torchvision/models/resnet.py"}, ported


@pytest.mark.jax
@pytest.mark.slow
# one of them per run of the suite (each ports and verifies resnet18 in JAX: 30-60 s on 2 cores)
@pytest.mark.parametrize("name", fixture_slice(["attribute", "in a module"], 2))
def test_the_port_trains_in_jax_and_matches(name, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPTS[name])
    assert _migrate(script, tmp_path / "out").returncode == 0
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(script),
                           str(tmp_path / "out" / "train.py"), "--steps", "3", "--format", "json"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert report["passed"], report["summary"]
    assert len(report["steps"]) == 3


def test_the_overlay_serves_the_installed_package_for_the_rest(tmp_path):
    port = port_package("torchvision", "jax", tmp_path, unsafe=False, whole_folder=False,
                        include=["torchvision.models.resnet"], overlay=True)
    assert not [m.error for m in port.modules.values() if m.status == "failed"]
    code = textwrap.dedent("""
        import torchvision, torchvision.datasets, torchvision.transforms, torchvision.models.vgg
        from torchvision.models import resnet
        print(resnet.__file__.startswith(sys.argv[1]), torchvision.datasets.__file__.startswith(sys.argv[1]),
              torchvision.models.vgg.__file__.startswith(sys.argv[1]), "nnx" in resnet.ResNet.__mro__[1].__module__)
        """)
    proc = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the ported resnet from the overlay (an NNX module); datasets and vgg are the installed ones
    assert proc.stdout.split() == ["True", "False", "False", "True"], proc.stdout


def test_overlay_init_keeps_the_docstring_and_future_imports_first():
    text = '"""Doc."""\nfrom __future__ import annotations\nimport os\n'
    out = overlay_init(text)
    module = cst.parse_module(out)
    assert out.startswith('"""Doc."""\nfrom __future__ import annotations\n# porter: an overlay'), out
    assert "__path__ = _porter_pkgutil.extend_path(__path__, __name__)\nimport os\n" in out
    assert len(module.body) == 5


def test_the_selection_follows_the_names_the_scripts_use():
    used = ["torchvision", "torchvision.datasets", "torchvision.models"]
    named = overlay_selection("torchvision", used, ["m = torchvision.models.vgg11()"])
    assert named == ["torchvision.models.vgg"], named
    dynamic = overlay_selection("torchvision", used, ["m = models.__dict__[args.arch]()"])
    assert {"torchvision.models.resnet", "torchvision.models.vgg", "torchvision.models.alexnet"} <= set(dynamic)
    assert not any(".datasets" in m or ".transforms" in m for m in dynamic)
    assert overlay_selection("torchvision", used, ["m = getattr(models, args.arch)()"]) == dynamic
