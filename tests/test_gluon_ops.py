"""Every entry of the MXNet op table (codemods/gluon/_ops_table.py), checked numerically: each
case runs as ``mx.nd.<op>(...)`` in the MXNet venv (mxnet 1.9.1) on seeded inputs, written to
an .npz; the same call is ported by rule GL201 (as ``porter migrate --to torch`` ports it) and
the torch expression runs in porter's venv on the same inputs. Values (within float32
rounding), shapes and dtypes must agree. The ``F.<op>`` spelling inside ``hybrid_forward``
ports to the same torch code."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

from porter import engine, registry
from porter.codemods.gluon import _model, _ops_table

REPO = Path(__file__).resolve().parents[1]
GL201 = registry.find("GL201")


def _cases():
    out = []
    for ns, table in (("nd", _ops_table.OPS), ("np", _ops_table.NP_OPS), ("npx", _ops_table.NPX_OPS)):
        for name, op in sorted(table.items()):
            for i, case in enumerate(op.cases):
                out.append((f"{ns}.{name}-{i}", f"{ns}.{name}", case))
    return out


CASES = _cases()


def _inputs(case, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {}
    for k, spec in case.inputs.items():
        if isinstance(spec, str) and spec.startswith("int:"):
            shape = eval(spec[4:])
            arrays[k] = rng.integers(0, 5, size=shape).astype(np.float32)  # MXNet indices are float arrays
        else:
            arrays[k] = rng.standard_normal(spec).astype(np.float32)
    return arrays


_MXNET_SCRIPT = """
import json, sys
import numpy as np
import mxnet as mx
from mxnet import nd

cases = json.load(open(sys.argv[1]))
inputs = np.load(sys.argv[2])
out, errors = {}, {}
for cid, expr, names in cases:
    env = {"nd": nd, "mx": mx, "np": mx.np, "npx": mx.npx}
    make = nd.array if cid.startswith("nd.") else mx.np.array
    for n in names:
        env[n] = make(inputs[f"{cid}/{n}"], dtype="float32")
    try:
        y = eval(expr, env)
    except Exception as exc:
        errors[cid] = f"{type(exc).__name__}: {exc}"
        continue
    if isinstance(y, (list, tuple)):
        for i, v in enumerate(y):
            out[f"{cid}/{i}"] = v.asnumpy()
        out[f"{cid}/n"] = np.array(len(y))
    else:
        out[f"{cid}/y"] = y.asnumpy()
np.savez(sys.argv[3], **out)
json.dump(errors, open(sys.argv[4], "w"))
"""


@pytest.fixture(scope="module")
def mxnet_results(tmp_path_factory):
    python = os.environ.get("PORTER_MXNET_PYTHON")
    if not python:
        out = subprocess.run([str(REPO / "scripts" / "bootstrap-mxnet")], capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr
        python = out.stdout.strip().splitlines()[-1]
    work = tmp_path_factory.mktemp("gluon_ops")
    cases, inputs = [], {}
    for seed, (cid, name, case) in enumerate(CASES):
        arrays = _inputs(case, seed)
        inputs.update({f"{cid}/{k}": v for k, v in arrays.items()})
        cases.append((cid, case.expr.replace("OP", name), sorted(arrays)))
    (work / "cases.json").write_text(json.dumps(cases))
    np.savez(work / "inputs.npz", **inputs)
    (work / "run.py").write_text(_MXNET_SCRIPT)
    proc = subprocess.run([python, str(work / "run.py"), str(work / "cases.json"), str(work / "inputs.npz"),
                           str(work / "out.npz"), str(work / "errors.json")], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(work / "out.npz"), json.loads((work / "errors.json").read_text()), np.load(work / "inputs.npz")


def _port(expr: str) -> str:
    src = f"import mxnet as mx\nfrom mxnet import nd\ny = {expr.replace('np.', 'mx.np.').replace('npx.', 'mx.npx.')}\n"
    result = engine.fix(src, engine.Options((GL201,)))
    lines = [l for l in result.source.splitlines() if l.startswith("y = ")]
    assert len(lines) == 1 and "nd." not in lines[0] and "mx." not in lines[0] and "porter: manual" not in result.source, result.source
    assert "gluon_reshape(" not in lines[0] or "def gluon_reshape(" in result.source
    return lines[0][len("y = "):]


def _port_f(expr: str) -> str:
    src = textwrap.dedent(f"""\
        from mxnet import gluon

        class Net(gluon.HybridBlock):
            def hybrid_forward(self, F, a, b=None, c=None):
                y = {expr}
                return y
        """)
    result = engine.fix(src, engine.Options((GL201,)))
    lines = [l.strip() for l in result.source.splitlines() if l.strip().startswith("y = ")]
    return lines[0][len("y = "):]


@pytest.mark.slow
@pytest.mark.parametrize("cid, name, case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_mxnet(cid, name, case, mxnet_results):
    import torch

    out, errors, inputs = mxnet_results
    assert cid not in errors, f"MXNet rejected the case: {errors[cid]}"
    expr = case.expr.replace("OP", name)
    torch_expr = _port(expr)
    if name.startswith("nd."):
        assert _port_f(case.expr.replace("OP", f"F.{name[3:]}")) == torch_expr
    env = {"torch": torch}
    if "gluon_reshape(" in torch_expr:  # the emitted helper, as the port has it
        exec(cst.Module(_model.render(["gluon_reshape"], "torch", "torch.nn")).code, env)
    for k in case.inputs:
        env[k] = torch.from_numpy(inputs[f"{cid}/{k}"])
    got = eval(torch_expr, env)
    if f"{cid}/n" in out.files:
        want = [out[f"{cid}/{i}"] for i in range(int(out[f"{cid}/n"]))]
        assert isinstance(got, (list, tuple)) and len(got) == len(want), torch_expr
    else:
        want, got = [out[f"{cid}/y"]], [got]
    for g, w in zip(got, want):
        g = g.numpy()
        assert g.shape == w.shape, f"{torch_expr}: shape {g.shape} != MXNet's {w.shape}"
        assert g.dtype == w.dtype, f"{torch_expr}: dtype {g.dtype} != MXNet's {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=case.rtol, atol=1e-6, err_msg=torch_expr)


@pytest.mark.slow
def test_array_reshape_with_special_codes(mxnet_results):
    """``x.reshape((-3, -1))`` (an array's method, as Gluon scripts write it) -> gluon_reshape."""
    import torch

    src = "import mxnet as mx\ny = a.reshape((-3, -1))\nz = a.reshape(0, -1)\nw = a.reshape((-1,))\n"
    result = engine.fix(src, engine.Options((GL201,)))
    assert "y = gluon_reshape(a, (-3, -1))" in result.source and "z = gluon_reshape(a, (0, -1))" in result.source
    assert "w = a.reshape((-1,))" in result.source  # torch reads that one the same way
    env = {"torch": torch, "a": torch.arange(24.0).reshape(2, 3, 4)}
    exec(cst.Module(_model.render(["gluon_reshape"], "torch", "torch.nn")).code, env)
    assert tuple(eval("gluon_reshape(a, (-3, -1))", env).shape) == (6, 4)
    assert tuple(eval("gluon_reshape(a, (0, -1))", env).shape) == (2, 12)
