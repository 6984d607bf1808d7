"""Model-zoo constructs of Gluon code (fixtures/mxnet/zoo_blocks/zooblocks.py, our own): the
torch-xla port imports no MXNet and leaves nothing for a person, and it computes what MXNet
computes (porter verify's model level: the original in real MXNet 1.9.1, the port on XLA).

Constructs: contrib's HybridConcurrent (imported by name and through a module alias) with
Identity and name_scope, `F.<op>` bound to a name (with MXNet's `is_np_array()` switch),
`F.clip(..., name=)`, BatchNorm appended to a container after helper-made layers and
BatchNorm(scale=False, center=False), `Conv2D(use_bias=False, **kwargs)`, a container passed
to a helper function and returned by a method, a string initializer, `base.data_dir()` and
the model store's `get_model_file`.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mxnethelp
from porter import engine, registry

REPO = Path(__file__).resolve().parents[1]
ORIGINAL = REPO / "fixtures" / "mxnet" / "zoo_blocks" / "zooblocks.py"


@pytest.fixture(scope="module")
def port(tmp_path_factory) -> Path:
    result = engine.fix(ORIGINAL.read_text(encoding="utf-8"), engine.Options(registry.select("torch-xla")))
    out = tmp_path_factory.mktemp("zooblocks") / "zooblocks.py"
    out.write_text(result.source, encoding="utf-8")
    return out


def test_port_imports_no_mxnet_and_needs_no_person(port):
    tree = ast.parse(port.read_text(encoding="utf-8"))
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in modules if m == "mxnet" or m.startswith("mxnet.")], modules
    errors = [f for f in engine.fix(port.read_text(encoding="utf-8"), engine.Options(registry.select("torch-xla"))).remaining
              if f.severity.value == "error"]
    assert not errors, [(f.code, f.position, f.message) for f in errors]
    assert "porter: manual" not in port.read_text(encoding="utf-8")
    again = engine.fix(port.read_text(encoding="utf-8"), engine.Options(registry.select("torch-xla")))
    assert not again.changed


def test_pretrained_weights_come_from_a_local_file(port, tmp_path, monkeypatch):
    """get_model_file of the port (plain Python, run here): a clear error naming the folder, or
    the file that is there; gluon_data_dir follows MXNET_HOME as MXNet's base.data_dir does."""
    tree = ast.parse(port.read_text(encoding="utf-8"))
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("gluon_data_dir", "get_model_file")]
    assert len(helpers) == 2
    namespace: dict = {}
    exec(compile(ast.Module(helpers, type_ignores=[]), str(port), "exec"), namespace)
    with pytest.raises(FileNotFoundError, match="pretrained weights are not downloaded by the port") as err:
        namespace["get_model_file"]("zoonet", root=str(tmp_path))
    assert str(tmp_path) in str(err.value)
    (tmp_path / "zoonet-0123abcd.params").write_bytes(b"")
    assert namespace["get_model_file"]("zoonet", root=str(tmp_path)) == str(tmp_path / "zoonet-0123abcd.params")
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    assert namespace["gluon_data_dir"]() == str(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "zoonet.params").write_bytes(b"")
    assert namespace["get_model_file"]("zoonet") == str(tmp_path / "models" / "zoonet.params")


@pytest.mark.slow
def test_port_matches_mxnet(port):
    os.environ.setdefault("PORTER_MXNET_PYTHON", mxnethelp.mxnet_python())
    args = [sys.executable, "-m", "porter", "verify", str(ORIGINAL), str(port), "--model", "get_zoonet()",
            "--input", "float32[2,3,16,16]", "--steps", "3", "--format", "json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    forward = [t["max_abs"] for t in report["tensors"] if t["phase"] in ("layer", "output")]
    assert forward and max(forward) <= 1e-4
    grads = {t["key"] for t in report["tensors"] if t["phase"] == "gradient"}
    # BatchNorm(scale=False, center=False): gamma and beta are not trained, on both sides
    assert "grad/features.0.weight" not in grads and "grad/features.0.bias" not in grads
    assert "grad/features.1.weight" in grads
    assert report["health"]["within_budget"], report["health"]


RUNTIME_CONV = REPO / "tests" / "data" / "gluon" / "conv_arguments.py"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["torch-xla", "jax"])
def test_convolutions_bound_at_run_time_match_mxnet(target, tmp_path):
    """`Conv2D(**kwargs)`, `Conv2D(c, k, *args, ...)`, `Conv2D(**dict(..., activation=))` ->
    gluon_conv, in its torch form and in its JAX form (NNX layers with the caller's rngs, the
    activation inside the layer): the port needs no person and computes what MXNet computes."""
    os.environ.setdefault("PORTER_MXNET_PYTHON", mxnethelp.mxnet_python())
    result = engine.fix(RUNTIME_CONV.read_text(encoding="utf-8"),
                        engine.Options(registry.select(target), unsafe_fixes=target == "jax"))
    assert not [f for f in result.remaining if f.severity.value == "error"], \
        [(f.code, f.position, f.message) for f in result.remaining]
    assert result.source.count("gluon_conv(2, ") == 3 and "porter: manual" not in result.source
    if target == "jax":
        assert "rngs: nnx.Rngs" in result.source.split("def gluon_conv(", 1)[1].split(")", 1)[0]
        assert "register_forward_hook" not in result.source and "import torch" not in result.source
    port = tmp_path / "conv_arguments.py"
    port.write_text(result.source, encoding="utf-8")
    args = [sys.executable, "-m", "porter", "verify", str(RUNTIME_CONV), str(port), "--model", "ArgsNet()",
            "--input", "float32[2,3,16,16]", "--steps", "3", "--format", "json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"})
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    grads = {t["key"] for t in report["tensors"] if t["phase"] == "gradient"}
    assert {"grad/a.0.weight", "grad/b.weight", "grad/b.bias", "grad/c.weight"} <= grads
    assert max(t["max_abs"] for t in report["tensors"] if t["phase"] in ("layer", "output")) <= 1e-4
