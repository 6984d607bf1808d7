"""A file's port must not depend on whether the other files of its program, which a rule reads
from disk next to it, are still the originals or already ported.

``porter migrate FILES --out DIR`` ports each file against its neighbours as they are in the
source tree; migrating the output tree again reads the ported neighbours. A rule's facts about
another file (here JX304's: which imported names construct, once ported, a model taking
``rngs``) must come out the same from both readings, else the first port misses a
construction that the second one fixes (not idempotent, and the first port fails where the
missed construction runs). The packages below spell the factories several ways: a model built
in a local variable, a factory calling another factory of the same file, a factory of one file
calling a class of a third file, through a package's star import, under an alias.
Pure LibCST (the runner in this process), no framework started."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from porter.runner import Settings, run

MODELS = '''
    import torch.nn as nn
    from .layers import Block


    class Net(nn.Module):
        def __init__(self, width, classes=10):
            super().__init__()
            self.fc = nn.Linear(width, classes)

        def forward(self, x):
            return self.fc(x)


    def net_direct(classes):
        return Net(4, classes)


    def net_built(classes):
        model = Net(4, classes)
        model.name = "built"
        return model


    def net_chain(classes):
        return net_direct(classes)


    def block_of_other_file():
        block = Block()
        return block


    def width():
        return 8
'''

LAYERS = '''
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)


    def make_block():
        layer = Block()
        return layer
'''

PACKAGES = {
    "relative": {
        "pkg/__init__.py": "",
        "pkg/layers.py": LAYERS,
        "pkg/models.py": MODELS,
        "pkg/train.py": '''
            import torch
            from .models import Net, net_direct, net_built, net_chain, block_of_other_file, width
            from .layers import make_block as block


            def main(seed):
                torch.manual_seed(seed)
                return Net(width()), net_direct(3), net_built(3), net_chain(3), block_of_other_file(), block()
        ''',
    },
    "star": {
        "lib/__init__.py": "from .models import *\nfrom .layers import *\n",
        "lib/layers.py": LAYERS,
        "lib/models.py": MODELS,
        "train.py": '''
            import torch
            from lib import *

            torch.manual_seed(1)
            nets = [Net(width()), net_direct(3), net_built(3), net_chain(3), block_of_other_file(), make_block()]
        ''',
    },
}

# the constructions each script must get rngs for, on the first run already
BUILT = ("Net(width(), rngs=", "net_direct(3, rngs=", "net_built(3, rngs=", "net_chain(3, rngs=",
         "block_of_other_file(rngs=", "block(rngs=")


@pytest.fixture(scope="module", params=sorted(PACKAGES))
def twice(request, tmp_path_factory):
    files = PACKAGES[request.param]
    src = tmp_path_factory.mktemp(f"src-{request.param}")
    out = tmp_path_factory.mktemp(f"out-{request.param}") / "out"
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    settings = Settings(target="jax")
    first = run("migrate", sorted(src / n for n in files), settings, mode="out", out_dir=out, jobs=1)
    written = sorted(Path(o.out) for o in first if o.status == "changed")
    again = run("migrate", written, settings, mode="diff", jobs=1)
    script = next(Path(o.out) for o in first if Path(o.path).name == "train.py")
    return first, again, script.read_text()


def test_first_run_ports_every_file(twice):
    first, _, _ = twice
    assert [o.error for o in first if o.status == "failed"] == []
    assert sum(o.status == "changed" for o in first) >= 3


def test_second_run_over_the_ported_tree_changes_nothing(twice):
    _, again, _ = twice
    changed = {Path(o.path).name: o.fixed for o in again if o.status != "unchanged"}
    assert changed == {}


def test_first_run_gives_every_imported_factory_rngs(twice):
    _, _, script = twice
    for call in BUILT:
        assert call in script, script
    assert "width(rngs" not in script


# MXNet/Gluon sources: the front end translates each file to PyTorch before the JAX rules read
# it, so the facts read from a Gluon neighbour are those of its translation (a HybridBlock or
# Block subclass is a model class, a function returning a Gluon layer a factory taking rngs),
# as they are read from its port in the output tree. Spellings: a base class of another file
# subclassed, a class imported under an alias, a plain Block, a factory returning a layer,
# through a relative import and through a package's star import.
GLUON_BLOCKS = '''
    from mxnet import gluon
    from mxnet.gluon import nn
    from mxnet.gluon.nn import HybridBlock


    def conv3(channels, stride=1):
        return nn.Conv2D(channels, kernel_size=3, strides=stride, padding=1)


    class Trunk(HybridBlock):
        def __init__(self, channels, **kwargs):
            super(Trunk, self).__init__(**kwargs)
            self.conv = conv3(channels)
            self.bn = nn.BatchNorm()

        def hybrid_forward(self, F, x):
            return F.relu(self.bn(self.conv(x)))


    class Classifier(gluon.HybridBlock):
        def __init__(self, classes):
            super().__init__()
            self.fc = nn.Dense(classes)

        def hybrid_forward(self, F, x):
            return self.fc(x)


    class Gate(gluon.Block):
        def __init__(self, units):
            super().__init__()
            self.fc = nn.Dense(units)

        def forward(self, x):
            return self.fc(x)
'''

GLUON_NET = '''
    from mxnet.gluon import nn
    {imports}


    class Net({trunk}):
        def __init__(self, channels, classes, **kwargs):
            super(Net, self).__init__(channels, **kwargs)
            self.down = conv3(channels, 2)
            self.head = {classifier}(classes)
            self.gate = Gate(classes)

        def hybrid_forward(self, F, x):
            return self.gate(self.head(self.down(super(Net, self).hybrid_forward(F, x))))
'''

GLUON_PACKAGES = {
    "gluon-relative": {
        "seg/__init__.py": "",
        "seg/blocks.py": GLUON_BLOCKS,
        "seg/net.py": GLUON_NET.format(imports="from .blocks import Trunk, Classifier as Head, Gate, conv3",
                                       trunk="Trunk", classifier="Head"),
    },
    "gluon-star": {
        "zoo/__init__.py": "from .blocks import *\n",
        "zoo/blocks.py": GLUON_BLOCKS,
        "net.py": GLUON_NET.format(imports="from zoo import *", trunk="Trunk", classifier="Classifier"),
    },
}

# the net's own constructor takes rngs and hands them to every construction, on the first run
GLUON_BUILT = ("def __init__(self, channels, classes, *, rngs: nnx.Rngs", "**kwargs, rngs=rngs)",
               "conv3(channels, 2, rngs=rngs)", "(classes, rngs=rngs)\n        self.gate = Gate(classes, rngs=rngs)")


@pytest.fixture(scope="module", params=sorted(GLUON_PACKAGES))
def gluon_twice(request, tmp_path_factory):
    files = GLUON_PACKAGES[request.param]
    src = tmp_path_factory.mktemp(f"src-{request.param}")
    out = tmp_path_factory.mktemp(f"out-{request.param}") / "out"
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    settings = Settings(target="jax")
    first = run("migrate", sorted(src / n for n in files), settings, mode="out", out_dir=out, jobs=1)
    written = sorted(Path(o.out) for o in first if o.status == "changed")
    again = run("migrate", written, settings, mode="diff", jobs=1)
    net = next(Path(o.out) for o in first if Path(o.path).name == "net.py")
    return first, again, net.read_text()


def test_gluon_second_run_over_the_ported_tree_changes_nothing(gluon_twice):
    first, again, _ = gluon_twice
    assert [o.error for o in first if o.status == "failed"] == []
    changed = {Path(o.path).name: o.fixed for o in again if o.status != "unchanged"}
    assert changed == {}


def test_gluon_first_run_gives_every_imported_construction_rngs(gluon_twice):
    _, _, net = gluon_twice
    for text in GLUON_BUILT:
        assert text in net, net


def test_gluon_package_port_facts_read_the_modules_as_translated():
    """The package port's program fact (porter.packages) reads each module through the front
    end too: the net module's imported Gluon blocks and factory construct models taking rngs."""
    import libcst as cst

    from porter._layout import mapped_package

    mapped_package("porter.codemods", "codemods")
    from porter.codemods.jax import _program

    files = GLUON_PACKAGES["gluon-relative"]
    modules = {name[:-3].replace("/__init__", "").replace("/", "."):
               (cst.parse_module(textwrap.dedent(text).lstrip("\n")), name.endswith("__init__.py"))
               for name, text in files.items()}
    spelled = _program.package_rngs_callables(modules)
    assert spelled["seg.net"] == {"Trunk", "Head", "Gate", "conv3"}
