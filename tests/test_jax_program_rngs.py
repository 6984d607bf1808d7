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
