"""porter.packages.port_package on fixtures/zoo (a zoo package of our own and a dependency
package with its own nn.Module classes): the import closure, the layout under out/, per-module
status, digests, incremental second calls; the ports import under the package's own name in
a fresh interpreter, build, and (torch-xla; JAX where its rules port the layers) match the
original forward, gradients and steps under ``porter verify``'s model level."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from porter import packages
from porter.packages import port_package, resolve_source
from porter.runner import UsageError

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "fixtures" / "zoo"
MINIZOO = {
    "minizoo", "minizoo.heads", "minizoo.heads.linear", "minizoo.layers", "minizoo.models",
    "minizoo.models.blocks", "minizoo.models.mlp", "minizoo.models.tiny", "minizoo.registry", "minizoo.weights",
}
ZOODEPS = {"zoodeps", "zoodeps.blocks", "zoodeps.util"}


@pytest.fixture(scope="module")
def zoo_path():
    """fixtures/zoo importable (as an installed package would be) while the tests port it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ZOO))
        yield ZOO


@pytest.fixture(scope="module")
def xla_port(zoo_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("xla") / "out"
    return port_package(ZOO / "minizoo", "torch-xla", out)


@pytest.fixture(scope="module")
def jax_port(zoo_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("jax") / "out"
    return port_package("minizoo", "jax", out)


def _fresh_python(code: str, root: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter with ``root`` first on sys.path, from another folder, with
    nothing of fixtures/zoo on its path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PJRT_DEVICE"] = "CPU"
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(root)!r})\n" + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, cwd=root.parent, env=env)


# ------------------------------------------------------------------------------------------
# The closure and the layout
# ------------------------------------------------------------------------------------------
def test_closure_follows_every_import_spelling(xla_port):
    p = xla_port
    assert p.name == "minizoo" and p.target == "torch-xla" and p.selected == "minizoo"
    assert set(p.modules) == MINIZOO | ZOODEPS
    # zoodeps is another package; its model code (nn.Module classes) is ported along, and with
    # it its helper module without torch (out/zoodeps/ shadows the installed package)
    assert p.external == ["zoodeps"]
    assert set(p.followed) == ZOODEPS
    tiny = p.modules["minizoo.models.tiny"].imports
    # from .. import registry / from ..heads.linear import X / from ..layers import X /
    # from minizoo.weights import X / from . import blocks / from zoodeps.blocks import X
    for dep in ("minizoo.registry", "minizoo.heads.linear", "minizoo.layers", "minizoo.weights",
                "minizoo.models.blocks", "zoodeps.blocks", "minizoo.models", "minizoo"):
        assert dep in tiny, dep
    # import minizoo.layers as L
    assert "minizoo.layers" in p.modules["minizoo.models.blocks"].imports
    # importing a module runs its packages' __init__ first
    assert p.closure("zoodeps.util") == ["zoodeps", "zoodeps.blocks", "zoodeps.util"]
    assert "minizoo.models" in p.closure("minizoo.models.mlp")
    assert p.closure("minizoo.layers") == sorted(MINIZOO | ZOODEPS)  # minizoo/__init__ imports the models
    assert p.unresolved == []


def test_layout_statuses_and_data_files(xla_port):
    p = xla_port
    for m in p.modules.values():
        rel = m.source.relative_to(ZOO)
        assert m.output == p.root / rel
        assert m.status in ("ported", "unchanged") and m.error is None, (m.name, m.error)
        if m.status == "unchanged":
            assert m.output.read_bytes() == m.source.read_bytes()
        assert len(m.digest) == 64
    assert (p.root / "minizoo" / "_meta" / "categories.json").read_bytes() == (ZOO / "minizoo" / "_meta" / "categories.json").read_bytes()
    assert p.root / "minizoo" / "_meta" / "categories.json" in p.data_files
    assert not (p.root / "README.md").exists()  # the zoo's folder, not the folder above it
    s = packages.summary(p)
    assert s["modules"] == 13 and s["failed"] == 0 and s["ported"] + s["unchanged"] == 13


def test_port_imports_and_builds_every_model_in_a_fresh_interpreter(xla_port):
    proc = _fresh_python("""
        import json, os
        import minizoo, zoodeps
        from minizoo.weights import Weights
        models = {n: type(minizoo.get_model(n)).__name__ for n in minizoo.list_models()}
        print(json.dumps({"minizoo": minizoo.__file__, "zoodeps": zoodeps.__file__, "models": models,
                          "categories": len(Weights.TINY_V1.meta["categories"]),
                          "tiny_with_weights": type(minizoo.get_model("tiny", weights=Weights.TINY_V1.value)).__name__}))
    """, xla_port.root)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["minizoo"] == str(xla_port.root / "minizoo" / "__init__.py")
    assert got["zoodeps"] == str(xla_port.root / "zoodeps" / "__init__.py")
    assert got["models"] == {"mlp": "MLP", "tiny": "TinyNet", "wide": "TinyNet"}
    assert got["categories"] == 10 and got["tiny_with_weights"] == "TinyNet"


def test_a_subpackage_selected_alone_brings_its_parents_and_what_they_import(zoo_path, tmp_path):
    by_path = port_package(ZOO / "minizoo" / "heads", "torch-xla", tmp_path / "a")
    by_name = port_package("minizoo.heads", "torch-xla", tmp_path / "b")
    for p in (by_path, by_name):
        assert p.name == "minizoo" and p.selected == "minizoo.heads"
        assert {n for n, m in p.modules.items() if m.selected} == {"minizoo.heads", "minizoo.heads.linear"}
        assert (p.root / "minizoo" / "__init__.py").is_file()  # the __init__ chain
        assert "minizoo.layers" in p.followed  # from ..layers import Flatten
        assert set(p.modules) == MINIZOO | ZOODEPS  # minizoo/__init__ imports the models
    proc = _fresh_python("import minizoo.heads; print(minizoo.heads.LinearHead(4, 2))", by_name.root)
    assert proc.returncode == 0 and "LinearHead" in proc.stdout, proc.stderr


def test_a_plain_folder_of_modules_is_ported_as_a_namespace_package(tmp_path):
    src = tmp_path / "mymodels"
    src.mkdir()
    (src / "net.py").write_text("import torch.nn as nn\n\nfrom .parts import width\n\n\n"
                                "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                                "        self.fc = nn.Linear(width(), 2)\n")
    (src / "parts.py").write_text("def width():\n    return 3\n")
    p = port_package(src, "torch-xla", tmp_path / "out")
    assert p.name == "mymodels" and set(p.modules) == {"mymodels.net", "mymodels.parts"}
    assert p.modules["mymodels.net"].imports == ["mymodels.parts"]
    proc = _fresh_python("from mymodels.net import Net; print(Net().fc)", p.root)
    assert proc.returncode == 0 and "in_features=3" in proc.stdout, proc.stderr


# ------------------------------------------------------------------------------------------
# Incremental, failures, usage errors
# ------------------------------------------------------------------------------------------
def _zoo_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "src"
    shutil.copytree(ZOO, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_a_second_call_rewrites_nothing_and_a_change_is_ported_alone(tmp_path, monkeypatch):
    src = _zoo_copy(tmp_path)
    (src / "minizoo" / "masks.py").write_text("import torch\n\n\ndef positive(x):\n    return x[x > 0]\n")
    monkeypatch.syspath_prepend(str(src))
    out = tmp_path / "out"
    first = port_package(src / "minizoo", "torch-xla", out)
    assert not any(m.reused for m in first.modules.values())
    assert [(f.code, f.position.line) for f in first.modules["minizoo.masks"].findings] == [("TX501", 5)]
    stamps = {n: (m.output.stat().st_mtime_ns, m.output.read_bytes()) for n, m in first.modules.items()}
    before = {n: first.digest(n) for n in first.modules}

    second = port_package(src / "minizoo", "torch-xla", out)
    assert all(m.reused for m in second.modules.values())
    assert {n: (m.output.stat().st_mtime_ns, m.output.read_bytes()) for n, m in second.modules.items()} == stamps
    assert {n: second.digest(n) for n in second.modules} == before
    assert [(m.status, [(f.code, f.position) for f in m.findings]) for m in second.modules.values()] == \
           [(m.status, [(f.code, f.position) for f in m.findings]) for m in first.modules.values()]

    mlp = src / "minizoo" / "models" / "mlp.py"
    mlp.write_text(mlp.read_text().replace("hidden=32", "hidden=24"))
    third = port_package(src / "minizoo", "torch-xla", out)
    assert {n for n, m in third.modules.items() if not m.reused} == {"minizoo.models.mlp"}
    assert third.modules["minizoo.models.mlp"].output.read_text() == mlp.read_text()
    assert third.digest("zoodeps.blocks") == before["zoodeps.blocks"]  # its closure did not change
    assert third.digest("minizoo.models.tiny") != before["minizoo.models.tiny"]  # minizoo/__init__ -> models -> mlp
    # a module that leaves the package leaves the port
    (src / "minizoo" / "extra.py").write_text("X = 1\n")
    assert (port_package(src / "minizoo", "torch-xla", out).modules["minizoo.extra"].output == out / "minizoo" / "extra.py")
    (src / "minizoo" / "extra.py").unlink()
    assert "minizoo.extra" not in port_package(src / "minizoo", "torch-xla", out).modules
    assert not (out / "minizoo" / "extra.py").exists()
    # another target or fix mode is another port: nothing reused
    fourth = port_package(src / "minizoo", "torch-xla", out, unsafe=False)
    assert not any(m.reused for m in fourth.modules.values())
    assert fourth.digest("zoodeps.blocks") != before["zoodeps.blocks"]


def _write_tree(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


# classes and factories of one module built in others, in every import spelling
_RNGS_TREE = {
    "rzoo/__init__.py": "from .layers import Block  # re-exported\n",
    "rzoo/layers.py": """
        import torch.nn as nn

        class Block(nn.Module):
            def __init__(self, c):
                super().__init__()
                self.conv = nn.Conv2d(c, c, 3, padding=1)

            def forward(self, x):
                return self.conv(x)

        class Wide(Block):
            pass

        def conv3x3(c):
            return nn.Conv2d(c, c, 3, padding=1)

        def act():
            return nn.ReLU()
    """,
    "rzoo/nets/__init__.py": "",
    "rzoo/nets/a.py": """
        import torch.nn as nn
        from ..layers import Block, conv3x3, act
        import rzoo.layers as L
        from .. import layers
        from rzoo import Block as Again

        class Net(nn.Module):
            def __init__(self, c=4, block=Block):
                super().__init__()
                self.a = Block(c)
                self.b = L.Wide(c)
                self.c = layers.conv3x3(c)
                self.d = Again(c)
                self.e = block(c)
                self.f = conv3x3(c)
                self.g = act()

            def forward(self, x):
                return self.g(self.f(self.e(self.d(self.c(self.b(self.a(x)))))))

        def make():
            return Net(4)
    """,
    "rzoo/nets/b.py": """
        import torch.nn as nn
        from .a import make
        from ..layers import Block

        class Stem(Block):
            def __init__(self, c, scale=2):
                super().__init__(c)
                self.scale = scale

            def forward(self, x):
                return super().forward(x) * self.scale

        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = make()

            def forward(self, x):
                return self.body(x)
    """,
}


def test_jax_package_port_passes_rngs_to_classes_and_factories_of_other_modules(tmp_path, monkeypatch):
    """The program-wide fact (porter.program): what each module of the closure spells that
    builds another module's NNX class or factory; those calls get rngs=rngs, the others not."""
    from porter.codemods.jax import _program

    src = tmp_path / "src"
    _write_tree(src, _RNGS_TREE)
    monkeypatch.syspath_prepend(str(src))
    out = tmp_path / "out"
    port = port_package(src / "rzoo", "jax", out)
    assert {m.status for m in port.modules.values()} <= {"ported", "unchanged"}, \
        [(n, m.error) for n, m in port.modules.items() if m.error]
    a = (out / "rzoo" / "nets" / "a.py").read_text()
    for call in ("Block(c, rngs=rngs)", "L.Wide(c, rngs=rngs)", "layers.conv3x3(c, rngs=rngs)", "Again(c, rngs=rngs)",
                 "block(c, rngs=rngs)", "conv3x3(c, rngs=rngs)", "def make(*, rngs: nnx.Rngs)", "Net(4, rngs=rngs)"):
        assert call in a, (call, a)
    assert "act()" in a and "act(rngs" not in a  # a factory of a function value takes no rngs
    b = (out / "rzoo" / "nets" / "b.py").read_text()
    assert "make(rngs=rngs)" in b
    # a subclass of another module's class: an NNX module whose __init__ takes rngs and passes it on
    assert "def __init__(self, c, scale=2, *, rngs: nnx.Rngs):" in b and "super().__init__(c, rngs=rngs)" in b
    assert "def __call__(self, x):" in b and "super().__call__(x)" in b
    record = json.loads((out / ".porter-package.json").read_text())["modules"]
    assert "L.Wide" in record["rzoo.nets.a"]["program"] and "make" in record["rzoo.nets.b"]["program"]

    # a change of one module's constructors re-ports the modules that build them, not the others
    layers = src / "rzoo" / "layers.py"
    layers.write_text(layers.read_text().replace("def conv3x3(c):\n    return nn.Conv2d(c, c, 3, padding=1)",
                                                 "def conv3x3(c):\n    return None"))
    again = port_package(src / "rzoo", "jax", out)
    assert {n for n, m in again.modules.items() if not m.reused} == {"rzoo.layers", "rzoo.nets.a"}
    a = (out / "rzoo" / "nets" / "a.py").read_text()
    assert "conv3x3(c)" in a and "layers.conv3x3(c)" in a and "Block(c, rngs=rngs)" in a

    # the fact alone, without porting: spellings of one module
    from porter import engine

    parsed = {name: (engine.parse(textwrap.dedent(_RNGS_TREE[rel])), rel.endswith("__init__.py"))
              for name, rel in (("rzoo", "rzoo/__init__.py"), ("rzoo.layers", "rzoo/layers.py"),
                                ("rzoo.nets", "rzoo/nets/__init__.py"), ("rzoo.nets.a", "rzoo/nets/a.py"))}
    spelled = _program.package_rngs_callables(parsed)
    assert {"Block", "conv3x3", "L.Block", "L.Wide", "L.conv3x3", "layers.Wide", "Again"} <= spelled["rzoo.nets.a"]
    assert "act" not in spelled["rzoo.nets.a"] and "L.act" not in spelled["rzoo.nets.a"]
    assert spelled["rzoo.layers"] == frozenset()


def test_jax_rules_without_a_package_port_read_the_imported_files_constructors(tmp_path):
    """`porter migrate FILE` (no package port, no program facts): the files a module imports
    from (`from ..layers import ...`, a package __init__ re-exporting) are read from disk, and
    their classes (a Sequential subclass, a subclass of it) and factories get rngs=."""
    from porter import engine, registry

    _write_tree(tmp_path, {**_RNGS_TREE, "rzoo/layers.py": textwrap.dedent(_RNGS_TREE["rzoo/layers.py"]) + textwrap.dedent("""

        class Pair(nn.Sequential):
            def __init__(self, c):
                super().__init__(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))

        class PairNorm(Pair):
            pass
    """), "rzoo/nets/c.py": """
        import torch.nn as nn
        from ..layers import PairNorm, conv3x3, act
        from .. import Block

        class Net(nn.Module):
            def __init__(self, c=4):
                super().__init__()
                self.a = PairNorm(c)
                self.b = conv3x3(c)
                self.c = Block(c)
                self.d = act()

            def forward(self, x):
                return self.d(self.c(self.b(self.a(x))))
    """})
    path = tmp_path / "rzoo" / "nets" / "c.py"
    out = engine.fix(path.read_text(), engine.Options(registry.select("jax"), True), str(path)).source
    for call in ("PairNorm(c, rngs=rngs)", "conv3x3(c, rngs=rngs)", "Block(c, rngs=rngs)", "act()"):
        assert call in out, (call, out)


def test_a_module_porter_cannot_port_fails_alone_and_is_copied_as_is(tmp_path, monkeypatch):
    src = _zoo_copy(tmp_path)
    monkeypatch.syspath_prepend(str(src))
    broken = src / "minizoo" / "broken.py"
    broken.write_bytes(b"import torch\n\ndef f(:\n    pass\n")
    undecodable = src / "minizoo" / "latin.py"
    undecodable.write_bytes(b"x = '\xe9'\n")
    p = port_package(src / "minizoo", "torch-xla", tmp_path / "out")
    for name, path, words in (("minizoo.broken", broken, "syntax error"), ("minizoo.latin", undecodable, "not valid utf-8")):
        m = p.modules[name]
        assert m.status == "failed" and words in m.error, m.error
        assert m.output.read_bytes() == path.read_bytes()
    assert packages.summary(p)["failed_modules"].keys() == {"minizoo.broken", "minizoo.latin"}
    assert all(m.status != "failed" for n, m in p.modules.items() if n not in ("minizoo.broken", "minizoo.latin"))


def test_relative_imports_out_of_a_framework_subpackage_become_absolute(tmp_path, monkeypatch):
    """A selection inside a framework (here a stand-in named torch: a package whose top-level
    name is a framework's) is rooted at its own folder; imports leaving it name the framework."""
    site = tmp_path / "site"
    zoo = site / "torch" / "contrib" / "zoo"
    zoo.mkdir(parents=True)
    for folder in (site / "torch", site / "torch" / "contrib", zoo):
        (folder / "__init__.py").write_text("")
    (zoo / "__init__.py").write_text("from .net import build\n")
    (zoo / "net.py").write_text("from ...nn import Linear\nfrom ..helpers import thing\nfrom . import parts\n\n\ndef build():\n    return Linear(2, 2)\n")
    (zoo / "parts.py").write_text("X = 1\n")
    p = port_package(zoo, "torch-xla", tmp_path / "out")
    assert p.name == "zoo" and set(p.modules) == {"zoo", "zoo.net", "zoo.parts"}
    text = p.modules["zoo.net"].output.read_text()
    assert "from torch.nn import Linear" in text and "from torch.contrib.helpers import thing" in text
    assert "from . import parts" in text
    assert p.modules["zoo.net"].status == "ported"


def test_usage_errors(zoo_path, tmp_path):
    with pytest.raises(UsageError, match="cannot find the package"):
        port_package("no_such_zoo_package_xyz", "torch-xla", tmp_path / "o")
    with pytest.raises(UsageError, match="no such file"):
        port_package(tmp_path / "missing", "torch-xla", tmp_path / "o")
    with pytest.raises(UsageError, match="unknown target"):
        port_package("minizoo", "tpu", tmp_path / "o")
    with pytest.raises(UsageError, match="lies inside the source"):
        port_package(ZOO / "minizoo", "torch-xla", ZOO / "minizoo" / "ported")
    assert not (ZOO / "minizoo" / "ported").exists()


def test_an_mxnet_package_resolves_in_the_mxnet_venv_without_importing_mxnet():
    if packages.mxnet_environment() is None:
        pytest.skip("the MXNet venv is not built (scripts/bootstrap-mxnet)")
    path, name, env = resolve_source("mxnet.gluon.model_zoo")
    assert name == "mxnet.gluon.model_zoo" and env.python is not None
    assert path.parts[-3:] == ("mxnet", "gluon", "model_zoo") and (path / "vision" / "resnet.py").is_file()
    assert "mxnet" not in sys.modules


# ------------------------------------------------------------------------------------------
# The ports run on XLA and match the original (porter verify's model level)
# ------------------------------------------------------------------------------------------
def _entries(tmp_path: Path, port_root: Path, port_extra: str = "") -> tuple[Path, Path]:
    """Model files for ``porter verify``: the original imports minizoo from fixtures/zoo, the
    port from out/ (checked: a port that fell back on the original would prove nothing)."""
    original = tmp_path / "original" / "zoo_entry.py"
    original.parent.mkdir()
    original.write_text(f"import sys\nsys.path.insert(0, {str(ZOO)!r})\nfrom minizoo import get_model  # noqa: E402\n")
    port = port_root / "zoo_entry.py"
    port.write_text(
        "import os\n\nimport minizoo\nfrom minizoo import get_model  # noqa: F401\n" + port_extra +
        "\nif not minizoo.__file__.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep):\n"
        "    raise ImportError(f'minizoo from {minizoo.__file__}, not from the port')\n"
    )
    return original, port


@pytest.mark.xla
@pytest.mark.slow
def test_torch_xla_port_matches_the_original_on_xla(xla_port, tmp_path):
    from porter.verify.model import ModelRequest, verify_model

    original, port = _entries(tmp_path, xla_port.root)
    try:
        report = verify_model(ModelRequest(original, port, 'get_model("tiny")', ("float32[4,3,16,16]",), steps=2))
    finally:
        port.unlink()
    assert report.passed, (report.summary, report.port.error if report.port else None)
    assert report.port.backend == "torch-xla"
    names = {t["name"] if isinstance(t, dict) else t.name for t in report.tensors}
    assert any("stage.stem" in n for n in names) and any("res.conv2" in n for n in names)  # minizoo's and zoodeps' layers


@pytest.mark.jax
def test_jax_port_imports_and_builds_its_supported_models(jax_port):
    proc = _fresh_python("""
        from flax import nnx
        import minizoo
        m = minizoo.get_model("mlp", rngs=nnx.Rngs(0))
        print(type(m).__name__, isinstance(m, nnx.Module))
    """, jax_port.root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["MLP", "True"]


@pytest.mark.jax
def test_jax_port_builds_a_model_made_of_layers_from_other_modules(jax_port):
    proc = _fresh_python("""
        from flax import nnx
        import minizoo
        minizoo.get_model("tiny", rngs=nnx.Rngs(0))
    """, jax_port.root)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.jax
@pytest.mark.slow
def test_jax_port_matches_the_original(jax_port, tmp_path):
    from porter.verify.model import ModelRequest, verify_model

    original, port = _entries(tmp_path, jax_port.root, "import flax.nnx as nnx  # noqa: F401\n"
                              "from minizoo.models.mlp import load_torch_state_dict, torch_state_dict  # noqa: F401\n")
    try:
        report = verify_model(ModelRequest(original, port, 'get_model("mlp")', ("float32[4,3,4,4]",), steps=2))
    finally:
        port.unlink()
    assert report.passed, (report.summary, report.port.error if report.port else None)
    assert report.port.backend == "jax"


# ------------------------------------------------------------------------------------------
# porter migrate --package
# ------------------------------------------------------------------------------------------
def test_migrate_package_command(tmp_path):
    from clihelp import cli, run_porter

    src = _zoo_copy(tmp_path)
    (src / "minizoo" / "broken.py").write_text("def f(:\n")
    env = dict(os.environ, PYTHONPATH=str(src))
    first = run_porter("migrate", "minizoo", "--package", "--to", "jax", "--out", str(tmp_path / "out"), cwd=tmp_path, env=env)
    assert first.code == 1  # a module failed; the others were ported
    assert len(first.error_lines) == 1, first.err
    assert first.error_lines[0].startswith(f"{src / 'minizoo' / 'broken.py'}: error: syntax error"), first.err
    assert "minizoo: 14 module(s), 6 ported, 7 unchanged, 1 failed; 3 followed from imports (packages ported along: zoodeps)" in first.err
    assert (tmp_path / "out" / "minizoo" / "models" / "tiny.py").is_file()
    (src / "minizoo" / "broken.py").unlink()
    second = run_porter("migrate", str(src / "minizoo"), "--package", "--to", "torch-xla", "--out", str(tmp_path / "out2"), cwd=tmp_path, env=env)
    assert second.code == 0, second.err
    again = run_porter("migrate", str(src / "minizoo"), "--package", "--to", "torch-xla", "--out", str(tmp_path / "out2"), cwd=tmp_path, env=env)
    assert again.code == 0 and "(13 unchanged since the last run, not rewritten)" in again.err, again.err
    # the usage errors in this process (the same parsing and exit codes, no interpreter start-up)
    for args in (("--write",), ()):
        bad = cli("migrate", "minizoo", "--package", *args, cwd=tmp_path)
        assert bad.code == 2 and "--package needs one package" in bad.err
    missing = cli("migrate", "no_such_zoo_xyz", "--package", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert missing.code == 2 and "cannot find the package 'no_such_zoo_xyz'" in missing.err


def test_included_modules_and_several_jobs(xla_port, zoo_path, tmp_path):
    src = tmp_path / "mymodels"
    src.mkdir()
    (src / "net.py").write_text("X = 1\n")
    p = port_package(src, "torch-xla", tmp_path / "out", include=["zoodeps.util"])
    # asked for, though not model code: its package's __init__ chain (and what that imports) comes too
    assert set(p.modules) == {"mymodels.net"} | ZOODEPS and p.external == ["zoodeps"]
    with pytest.raises(UsageError, match="no such module"):
        port_package(src, "torch-xla", tmp_path / "out", include=["zoodeps.nothing_here"])
    two = port_package(ZOO / "minizoo", "torch-xla", tmp_path / "two", jobs=2)
    assert {n: (m.status, m.output.read_bytes(), [f.code for f in m.findings]) for n, m in two.modules.items()} == \
           {n: (m.status, m.output.read_bytes(), [f.code for f in m.findings]) for n, m in xla_port.modules.items()}
