"""JX304 across the files of one program: a script building a model class (or factory) of
another file of its tree (`from models import *` through a package's star imports, `from model
import Net`, relative imports) gives the construction `rngs=`, as the other file's port takes
it; names that are not models get nothing. The ported tree is then run under JAX."""
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=True)

FILES = {
    "models/__init__.py": "from .mlp import *\nfrom .blocks import *\n",
    "models/mlp.py": '''
        import torch.nn as nn


        class MLP(nn.Module):
            def __init__(self, hidden=8):
                super().__init__()
                self.fc = nn.Linear(4, hidden)

            def forward(self, x):
                return self.fc(x)


        def small_mlp():
            return MLP(hidden=4)


        def width():
            return 8
    ''',
    "models/blocks.py": '''
        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return self.fc(x).relu()
    ''',
    "model.py": '''
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)
    ''',
    "train.py": '''
        import torch
        from models import *
        from model import Net as Classifier

        torch.manual_seed(5)
        a = MLP(width())
        b = small_mlp()
        c = Block()
        d = Classifier()
        x = torch.ones(3, 4)
        print(tuple(a(x).shape), tuple(b(x).shape), tuple(c(x).shape), tuple(d(x).shape))
    ''',
}


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("out")
    for name, text in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(textwrap.dedent(text).lstrip("\n"))
    results = {}
    for name in FILES:
        result = engine.fix((src / name).read_text(), JAX, path=str(src / name))
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(result.source)
        results[name] = result
    return out, results


def test_constructions_of_models_of_other_files_get_rngs(ported):
    _, results = ported
    src = results["train.py"].source
    for call in ("MLP(width(), rngs=nnx.Rngs(5))", "small_mlp(rngs=nnx.Rngs(5))", "Block(rngs=nnx.Rngs(5))",
                 "Classifier(rngs=nnx.Rngs(5))"):
        assert call in src, src
    assert "width(rngs" not in src


@pytest.mark.slow
def test_the_ported_program_runs_under_jax(ported):
    out, _ = ported
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "train.py"], cwd=out, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "(3, 8) (3, 4) (3, 4) (3, 2)", proc.stdout


def test_no_file_next_to_it_changes_nothing():
    src = "import torch\nfrom somewhere_else import Net\nnet = Net()\n"
    assert engine.fix(src, JAX, path="/nonexistent/train.py").source.count("rngs") == 0


# constructions reached through a class or a module: classmethods and staticmethods that build
# the model (`cls(...)`, `Net(...)`, another factory), `import model as m` + `m.Net(...)`, a
# factory given a dict of the script's with `**`, and the same class's methods in its own file
METHOD_FILES = {
    "nets/__init__.py": "",
    "nets/core.py": '''
        import torch.nn as nn


        class Net(nn.Module):
            def __init__(self, width=4, out=2):
                super().__init__()
                self.fc = nn.Linear(width, out)

            def forward(self, x):
                return self.fc(x)

            @classmethod
            def from_config(cls, cfg):
                return cls(**cfg)

            @staticmethod
            def tiny():
                return Net(out=1)

            def describe(self):
                return "net"


        class Wide(Net):
            @classmethod
            def make(cls, out):
                model = Wide(out=out)
                return model


        def build(**kw):
            return Net(**kw)


        local = Net.from_config(dict(out=5))
    ''',
    "model.py": '''
        import torch.nn as nn


        class Head(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.fc = nn.Linear(4, n)

            def forward(self, x):
                return self.fc(x)
    ''',
    "train.py": '''
        import torch
        import model as m
        import nets.core
        from nets.core import Net as Model, Wide, build

        torch.manual_seed(3)
        cfg = dict(out=3)
        nets_ = [
            Model.from_config(cfg),
            Model.tiny(),
            Wide.make(6),
            Wide.from_config({"out": 7}),
            m.Head(2),
            nets.core.Net(out=8),
            nets.core.Net.tiny(),
            build(**cfg),
            Model(**cfg),
        ]
        x = torch.ones(2, 4)
        print(" ".join(str(tuple(n(x).shape)) for n in nets_), Model.tiny().describe())
    ''',
}


@pytest.fixture(scope="module")
def ported_methods(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("out")
    for name, text in METHOD_FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(textwrap.dedent(text).lstrip("\n"))
    results = {}
    for name in METHOD_FILES:
        result = engine.fix((src / name).read_text(), JAX, path=str(src / name))
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(result.source)
        results[name] = result
    return src, out, results


def test_constructions_through_classes_and_modules_get_rngs(ported_methods):
    _, _, results = ported_methods
    src = results["train.py"].source
    for call in ("Model.from_config(cfg, rngs=nnx.Rngs(3))", "Model.tiny(rngs=nnx.Rngs(3))",
                 "Wide.make(6, rngs=nnx.Rngs(3))", 'Wide.from_config({"out": 7}, rngs=nnx.Rngs(3))',
                 "m.Head(2, rngs=nnx.Rngs(3))", "nets.core.Net(out=8, rngs=nnx.Rngs(3))",
                 "nets.core.Net.tiny(rngs=nnx.Rngs(3))", "build(**cfg, rngs=nnx.Rngs(3))",
                 "Model(**cfg, rngs=nnx.Rngs(3))"):
        assert call in src, src
    assert "describe(rngs" not in src
    core = results["nets/core.py"].source
    assert "local = Net.from_config(dict(out=5), rngs=nnx.Rngs(0))" in core, core
    assert "return cls(**cfg, rngs=rngs)" in core, core  # the classmethod passes its rngs on
    assert "return Net(out=1, rngs=rngs)" in core, core
    assert "return Net(**kw)" in core, core  # the factory's callers give rngs in **kw


def test_a_second_migrate_of_the_ported_tree_changes_nothing(ported_methods, tmp_path):
    _, out, results = ported_methods
    for name in METHOD_FILES:
        again = engine.fix((out / name).read_text(), JAX, path=str(out / name))
        assert again.source == results[name].source, name


@pytest.mark.slow
def test_the_ported_method_program_runs_under_jax(ported_methods):
    _, out, _ = ported_methods
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "train.py"], cwd=out, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == \
        "(2, 3) (2, 1) (2, 6) (2, 7) (2, 2) (2, 8) (2, 1) (2, 3) (2, 3) net", proc.stdout
