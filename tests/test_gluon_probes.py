"""A Gluon library that probes its frameworks when it is imported (GL009).

gluoncv's `__init__.py` calls `_require_mxnet_version('1.4.0', '2.0.0')` and
`_require_pytorch_version('1.4.0', '2.0.0')` inside `try: ... except ImportError:`, with its
subpackages imported in the same `try` as the MXNet probe: ported as it is, the package refuses
torch 2.9 at import (RuntimeError) and, without MXNet, silently skips its subpackages. The package
here is written for these tests (several spellings of a probe: distutils' LooseVersion,
packaging.version, version tuples, importlib.metadata, `raise RuntimeError` / `ImportError` /
`warnings.warn`, `assert`); the original imports in the MXNet venv, and its ports (torch-xla and
jax) import in the main venv with their subpackages loaded.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import mxnethelp
from clihelp import cli, write
from porter import engine, registry

PACKAGE = {
    "__init__.py": '''\
"""A Gluon toolkit that optionally depends on mxnet or torch."""
from .check import require_mxnet_version, require_torch_version, warn_untested_torch

__version__ = "0.1.0"

HAS_MXNET = HAS_TORCH = False
try:
    require_mxnet_version("1.4.0", "2.0.0")
    from . import model_zoo
    from .utils import helpers
    HAS_MXNET = True
except ImportError:
    pass

try:
    require_torch_version("1.4.0", "2.0.0")
    HAS_TORCH = True
except ImportError:
    pass
warn_untested_torch()

if not (HAS_MXNET or HAS_TORCH):
    raise ImportError("install mxnet or torch")
''',
    "check.py": '''\
"""Checks of the frameworks this toolkit was written for."""
import warnings


def require_mxnet_version(low, high="2.0.0"):
    try:
        import mxnet as mx
    except ImportError as ex:
        raise ImportError("mxnet is required") from ex
    current = tuple(int(p) for p in mx.__version__.split(".")[:3])
    if current < tuple(int(p) for p in low.split(".")) or current >= tuple(int(p) for p in high.split(".")):
        raise RuntimeError("mxnet>=%s,<%s is required, found %s" % (low, high, mx.__version__))


def require_torch_version(low, high="2.0.0"):
    try:
        import torch
        from distutils.version import LooseVersion
    except ImportError as ex:
        raise ImportError("torch is required") from ex
    if LooseVersion(torch.__version__) < LooseVersion(low) or \\
            LooseVersion(torch.__version__) >= LooseVersion(high):
        msg = "torch>={},<{} is required, found {}".format(low, high, torch.__version__)
        raise RuntimeError(msg)


def warn_untested_torch():
    try:
        from importlib.metadata import version as dist_version
        from packaging import version
        installed = dist_version("torch")
    except Exception:
        return
    if version.parse(installed) >= version.parse("2.0"):
        warnings.warn("torch %s is not tested with this toolkit" % installed)
''',
    "model_zoo/__init__.py": "from .tiny import TinyNet, get_model\n",
    "model_zoo/tiny.py": '''\
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn

assert tuple(map(int, mx.__version__.split(".")[:2])) >= (1, 4), "mxnet>=1.4 is required"


class TinyNet(gluon.HybridBlock):
    def __init__(self, classes=3, **kwargs):
        super(TinyNet, self).__init__(**kwargs)
        with self.name_scope():
            self.output = nn.Dense(classes, in_units=8)

    def hybrid_forward(self, F, x):
        return self.output(x)


def get_model(classes=3):
    return TinyNet(classes)
''',
    "utils/__init__.py": "from . import helpers\n",
    "utils/helpers.py": "from mxnet import nd\n\n\ndef ones(n):\n    return nd.ones((n,))\n",
}

# the package imported; what it loaded, and the warnings it gave
PROBE = '''\
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import probekit
print(json.dumps({"mxnet": probekit.HAS_MXNET, "torch": probekit.HAS_TORCH,
                  "model_zoo": hasattr(probekit, "model_zoo") and hasattr(probekit.model_zoo, "TinyNet"),
                  "helpers": hasattr(probekit, "utils") and callable(probekit.utils.helpers.ones),
                  "warnings": [str(w.message) for w in caught if "probekit" in (w.filename or "")]}))
'''


def _package(root: Path) -> Path:
    for rel, text in PACKAGE.items():
        write(root / "probekit" / rel, text)
    return root / "probekit"


def _import(python: str, root: Path) -> dict:
    env_python = subprocess.run([python, "-c", PROBE, str(root)], capture_output=True, text=True, timeout=300,
                                cwd=root)
    assert env_python.returncode == 0, env_python.stderr[-3000:]
    return json.loads(env_python.stdout.strip().splitlines()[-1])


def _port(tmp_path: Path, target: str) -> Path:
    pkg = _package(tmp_path / "src")
    out = tmp_path / f"out-{target}"
    r = cli("migrate", str(pkg), "--to", target, "--out", str(out / "probekit"), cwd=tmp_path)
    assert r.code == 0, r.out + r.err
    return out


def test_the_ports_have_no_refusal_and_no_import_in_the_probes_try(tmp_path):
    for target in ("torch-xla", "jax"):
        out = _port(tmp_path, target)
        init = (out / "probekit" / "__init__.py").read_text()
        check = (out / "probekit" / "check.py").read_text()
        tiny = (out / "probekit" / "model_zoo" / "tiny.py").read_text()
        body = init.split("try:", 1)[1].split("except ImportError", 1)[0]
        assert "from . import model_zoo" not in body and "from .utils import helpers" not in body, init
        assert "from . import model_zoo\nfrom .utils import helpers\n" in init
        assert "LooseVersion(torch.__version__)" not in check and "version.parse(installed)" not in check, check
        assert "mxnet" not in tiny.replace("MXNet", "") or "# porter: manual" in tiny, tiny
        assert "__version__" not in tiny, tiny


@pytest.mark.mxnet
def test_the_original_imports_with_mxnet(tmp_path):
    _package(tmp_path)
    got = _import(mxnethelp.mxnet_python(), tmp_path)
    assert got["mxnet"] and got["model_zoo"] and got["helpers"], got


@pytest.mark.xla
@pytest.mark.slow
def test_the_torch_xla_port_imports_with_its_subpackages(tmp_path):
    got = _import(sys.executable, _port(tmp_path, "torch-xla"))
    assert got == {"mxnet": False, "torch": True, "model_zoo": True, "helpers": True, "warnings": []}, got


@pytest.mark.jax
@pytest.mark.slow
def test_the_jax_port_imports_with_its_subpackages(tmp_path):
    got = _import(sys.executable, _port(tmp_path, "jax"))
    assert got == {"mxnet": False, "torch": True, "model_zoo": True, "helpers": True, "warnings": []}, got


# --- spellings, run as Python (no framework: stand-in modules with a version) -----------------
SPELLINGS = [
    pytest.param('''\
        import mxnet
        import torch
        from distutils.version import LooseVersion
        if LooseVersion(torch.__version__) >= LooseVersion("2.0.0"):
            raise RuntimeError("torch<2.0.0 is required")
        ''', id="LooseVersion-raise"),
    pytest.param('''\
        import mxnet as mx
        import torch as th
        from packaging.version import parse as V
        if V(th.__version__) >= V("2.0"):
            raise ImportError("torch<2 is required")
        elif_free = True
        ''', id="packaging-alias"),
    pytest.param('''\
        import warnings
        import mxnet as mx
        import torch
        _TV = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if _TV > (1, 13):
            warnings.warn("torch %s is not supported" % torch.__version__)
        ''', id="tuple-warn"),
    pytest.param('''\
        import mxnet as mx
        from importlib import metadata
        if metadata.version("torch").startswith("2."):
            raise RuntimeError("torch 1.x only")
        if metadata.version("mxnet") < "1.9":
            raise RuntimeError("mxnet>=1.9")
        ''', id="importlib-metadata"),
    pytest.param('''\
        import mxnet as mx
        import pkg_resources
        def _check():
            torch = __import__("torch")
            assert pkg_resources.get_distribution("mxnet").version >= "1.6", "old mxnet"
            if torch.__version__ >= "2":
                raise RuntimeError("torch<2")
            return None
        _check()
        ''', id="function-assert-pkg_resources"),
]


@pytest.mark.parametrize("target", ["torch-xla", "jax"])
@pytest.mark.parametrize("source", SPELLINGS)
def test_a_probe_spelling_no_longer_refuses_the_ports_torch(source, target, monkeypatch):
    source = textwrap.dedent(source)
    result = engine.fix(source, engine.Options(registry.select(target)))
    assert result.fixed.get("GL009"), result
    assert not [f for f in result.remaining if f.code == "GL009"]
    # the ported code runs where torch is 2.9 and MXNet is whatever is installed (here: an old one)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="2.9.0+cpu"))
    monkeypatch.setitem(sys.modules, "mxnet", types.SimpleNamespace(__version__="1.2.0"))
    monkeypatch.setattr("importlib.metadata.version", lambda name: {"torch": "2.9.0", "mxnet": "1.2.0"}[name])

    class Dist:
        version = "1.2.0"

    monkeypatch.setitem(sys.modules, "pkg_resources", types.SimpleNamespace(get_distribution=lambda name: Dist()))
    with _no_warnings():
        exec(compile(result.source, "<port>", "exec"), {"__name__": "port"})


class _no_warnings:
    def __enter__(self):
        import warnings
        self._ctx = warnings.catch_warnings(record=True)
        self._caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        assert not [w for w in self._caught if w.filename == "<port>"], [str(w.message) for w in self._caught]
        return False


def test_an_unguarded_mxnet_probe_goes_and_a_guarded_one_answers_not_installed(monkeypatch):
    source = textwrap.dedent('''\
        def check_mxnet_version(minimum):
            import mxnet
            from packaging import version
            if version.parse(mxnet.__version__) < version.parse(minimum):
                raise RuntimeError("mxnet>=" + minimum)

        check_mxnet_version("1.6.0")
        try:
            check_mxnet_version("1.6.0")
            from . import gluon_parts
            FOUND = True
        except ImportError:
            FOUND = False
        ''')
    result = engine.fix(source, engine.Options(registry.select("torch-xla")))
    assert result.fixed.get("GL009") == 3, result
    port = result.source
    assert port.count("check_mxnet_version(\"1.6.0\")") == 1  # the guarded call stays
    assert "except ImportError:\n    FOUND = False\nfrom . import gluon_parts\n" in port
    code = port.replace("from . import gluon_parts\n", "")
    namespace: dict = {}
    exec(compile(code, "<port>", "exec"), namespace)
    assert namespace["FOUND"] is False  # the port does not use MXNet: the probe says "not installed"


@pytest.mark.parametrize("line", [
    'major = int(torch.__version__.split(".")[0])',
    'parts = torch.__version__.split("+")[0].split(".")',
    'head, tail = checkpoint_name.split("/", 1)',
    'words = line.strip().split(" ")',
])
def test_str_split_is_not_a_tensor_split_in_a_jax_port(line):
    source = f"import torch\nimport torch.nn as nn\n\nlayer = nn.Linear(2, 2)\n{line}\n"
    result = engine.fix(source, engine.Options(registry.select("jax")))
    assert line in (result.source or source) and "torch_split" not in (result.source or source), result.source
