"""The Gluon model rules (GL1xx, GL2xx) on the five MXNet fixtures' models, against real MXNet.

For each fixture (port.toml's ``model`` and ``inputs``): the model code of train.py (its
imports and the classes and functions the model expression reaches) is ported with the
"torch" rules, as ``porter migrate --to torch`` ports it; the port imports nothing of MXNet;
the model it builds has exactly the ``state_dict`` names porter's MXNet side
(porter.verify.side_mxnet, run in the MXNet venv) gives the Gluon model; loaded with the
Gluon model's weights, its forward (training mode, dropout off, as the MXNet side runs it)
gives Gluon's outputs within 1e-5.
"""
from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

from porter import engine, registry
from porter.fixtures import fixtures

REPO = Path(__file__).resolve().parents[1]
FIXTURES = {fx.name: fx for fx in fixtures("mxnet")}
# the layers the port leaves lazy (their input size is the data's, not the code's)
LAZY = {
    "mlp": ["0"],
    "cnn_bn_dropout": ["conv1", "fc1"],
    "lstm_lm": [],
    "dcgan": ["0"],
    "resnet": ["features.0"],
}


@pytest.fixture(scope="module")
def mxnet_python() -> str:
    if os.environ.get("PORTER_MXNET_PYTHON"):
        return os.environ["PORTER_MXNET_PYTHON"]
    out = subprocess.run([str(REPO / "scripts" / "bootstrap-mxnet")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def model_source(path: Path, expr: str) -> str:
    """The imports of ``path`` and the top-level classes and functions ``expr`` reaches."""
    module = cst.parse_module(path.read_text())
    defs = {s.name.value: s for s in module.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))}
    wanted: set[str] = set()
    todo = [n.value for n in _names(cst.parse_expression(expr))]
    while todo:
        name = todo.pop()
        if name in defs and name not in wanted:
            wanted.add(name)
            todo.extend(n.value for n in _names(defs[name]))
    body = [s for s in module.body if _is_import(s) or (isinstance(s, (cst.ClassDef, cst.FunctionDef)) and s.name.value in wanted)]
    return module.with_changes(body=body).code


def _names(node: cst.CSTNode):
    found = []

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.append(n)

    node.visit(V())
    return found


def _is_import(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def port(source: str) -> str:
    result = engine.fix(source, engine.Options(registry.select("torch")))
    return result.source


def run_mxnet_side(mxnet_python: str, file: Path, model: str, inputs, work: Path):
    request = {"model": model, "inputs": list(inputs), "steps": 1, "optimizer": "sgd", "lr": 0.01, "seed": 0,
               "cuda_shim": False, "file": str(file), "device": "cpu", "meta": str(work / "mx.meta.json"),
               "out": str(work / "mx.npz")}
    (work / "mx.request.json").write_text(json.dumps(request))
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([mxnet_python, "-m", "porter.verify.side_mxnet", str(work / "mx.request.json")],
                          capture_output=True, text=True, timeout=300, env=env)
    meta = json.loads((work / "mx.meta.json").read_text()) if (work / "mx.meta.json").is_file() else {}
    assert proc.returncode == 0 and meta.get("ok"), f"{meta.get('error')}\n{proc.stderr[-3000:]}"
    return meta, np.load(work / "mx.npz")


def load_port(text: str, path: Path) -> dict:
    path.write_text(text)
    mod = types.ModuleType("gluon_port")
    mod.__file__ = str(path)
    exec(compile(text, str(path), "exec"), mod.__dict__)
    return mod.__dict__


def forward_parity(name: str, mxnet_python: str, tmp_path: Path) -> tuple[float, str]:
    import torch

    fx = FIXTURES[name]
    source = model_source(fx.original, fx.model)
    ported = port(source)
    assert "mxnet" not in ported, f"the port still refers to MXNet:\n{ported}"
    assert "porter: manual" not in ported
    meta, data = run_mxnet_side(mxnet_python, fx.original, fx.model, fx.inputs, tmp_path)
    ns = load_port(ported, tmp_path / f"{name}_port.py")
    torch.manual_seed(0)
    model = eval(fx.model, ns)
    assert isinstance(model, torch.nn.Module)
    lazy = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.lazy.LazyModuleMixin)]
    assert lazy == LAZY[name]
    state = {k[len("init/"):]: torch.from_numpy(data[k]) for k in data.files if k.startswith("init/")}
    assert set(model.state_dict()) == set(state)
    model.load_state_dict(state)  # materializes the lazy layers from Gluon's shapes
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        elif isinstance(m, torch.nn.RNNBase):
            m.dropout = 0.0
    model.train()
    inputs = [torch.from_numpy(data[f"input/{i}"]) for i in range(int(data["n_inputs"]))]
    with torch.no_grad():
        out = model(*inputs)
    flat = {}

    def walk(prefix, value):
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}" if prefix else str(i), v)
        else:
            flat[prefix] = value

    if isinstance(out, (tuple, list)):
        walk("", out)
    else:
        flat["0"] = out
    expected = {k[len("output/"):]: data[k] for k in data.files if k.startswith("output/")}
    assert set(flat) == set(expected)
    worst = 0.0
    for k, want in expected.items():
        got = flat[k].numpy()
        assert got.shape == want.shape, (k, got.shape, want.shape)
        worst = max(worst, float(np.abs(got - want).max()))
    return worst, ported


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_ported_model_matches_gluon(name, mxnet_python, tmp_path):
    worst, _ = forward_parity(name, mxnet_python, tmp_path)
    print(f"{name}: forward max abs error {worst:.3g}")
    assert worst <= 1e-5, f"{name}: forward max abs error {worst:.3g}"
