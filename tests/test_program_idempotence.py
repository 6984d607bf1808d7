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
