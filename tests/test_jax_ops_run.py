"""Every entry of the torch -> JAX op table, run: the torch expression and porter's rewrite of
it on the same random inputs, compared (exactly for integers and booleans, 1e-6 for floats).

The cases come from the table itself (codemods/jax/_ops_table.py): adding an entry adds its
tests. Each case is a small module whose `forward` returns the torch expression; porter's JX1
rules rewrite it; the original runs on torch tensors, the rewrite on JAX arrays.
"""
import re
import textwrap
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from porter import engine, registry  # noqa: E402
from porter._layout import mapped_package  # noqa: E402

mapped_package("porter.codemods", "codemods")
from porter.codemods.jax import _ops_table as ops  # noqa: E402

RULES = tuple(r for r in registry.rules_for("jax") if r.code.startswith("JX1"))
CASES = [pytest.param(o, c, id=f"{o.name}:{c.expr}") for o in ops.TABLE for c in o.cases]
CASES += [pytest.param(o, c, id=f"{o.name}:{c.expr}") for o in ops.LOSSES for c in o.cases]

_SPEC = re.compile(r"^([fpuisb])([\d,]*)(?::(\d+))?$")


def make_input(spec: str, rng: np.random.Generator) -> np.ndarray:
    m = _SPEC.match(spec)
    assert m, spec
    kind, dims, hi = m.group(1), m.group(2), m.group(3)
    shape = tuple(int(d) for d in dims.split(",") if d)
    if kind == "f":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "p":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if kind == "u":
        return rng.uniform(0.05, 0.95, shape).astype(np.float32)
    if kind == "i":
        return rng.integers(0, int(hi or 5), shape).astype(np.int64)
    if kind == "s":
        return rng.integers(-int(hi or 5), int(hi or 5), shape).astype(np.int64)
    return rng.random(shape) > 0.5


def module_source(case: ops.Case) -> str:
    """A module whose forward returns the case's expression (``stmt; stmt; expr``: statements
    first, the last part returned)."""
    params = ", ".join(["self"] + [n for n, _ in case.inputs])
    *statements, expr = case.expr.split("; ")
    body = "".join(f"        {s}\n" for s in statements)
    return (
        "import numpy as np\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        f"class M(nn.Module):\n    def forward({params}):\n{body}        return {expr}\n"
    )


def to_numpy(value):
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        return type(value)(to_numpy(v) for v in value) if not hasattr(value, "_fields") else tuple(to_numpy(v) for v in value)
    if isinstance(value, jax.Array):
        if value.dtype == jax.numpy.bfloat16:
            value = value.astype(jax.numpy.float32)
        return np.asarray(value)
    return value


def assert_same(t, j, where="result"):
    if isinstance(t, (tuple, list)):
        assert isinstance(j, (tuple, list)), f"{where}: torch gave a sequence, the port {type(j).__name__}"
        assert len(t) == len(j), f"{where}: lengths {len(t)} != {len(j)}"
        for k, (a, b) in enumerate(zip(t, j)):
            assert_same(a, b, f"{where}[{k}]")
        return
    if isinstance(t, (bool, int, float)) and not isinstance(t, np.ndarray) and np.ndim(j) == 0:
        tv, jv = np.asarray(t), np.asarray(j)
    else:
        tv, jv = np.asarray(t), np.asarray(j)
    assert tv.shape == jv.shape, f"{where}: shape {tv.shape} (torch) != {jv.shape} (port)"
    if tv.dtype.kind == "f" or jv.dtype.kind == "f":
        assert tv.dtype.kind == jv.dtype.kind, f"{where}: dtype {tv.dtype} (torch) vs {jv.dtype} (port)"
        np.testing.assert_allclose(jv.astype(np.float64), tv.astype(np.float64), rtol=1e-6, atol=1e-6, err_msg=where)
    else:
        assert tv.dtype.kind in "iub" and jv.dtype.kind in "iub", (tv.dtype, jv.dtype)
        assert (tv.dtype.kind == "b") == (jv.dtype.kind == "b"), f"{where}: dtype {tv.dtype} (torch) vs {jv.dtype} (port)"
        np.testing.assert_array_equal(jv, tv, err_msg=where)


def run_forward(source: str, inputs):
    namespace: dict = {"__name__": "case"}
    exec(compile(source, "<case>", "exec"), namespace)
    return namespace["M"]().forward(*inputs)


@pytest.mark.parametrize("entry,case", CASES)
def test_entry(entry, case):
    src = module_source(case)
    result = engine.fix(src, engine.Options(RULES))
    if entry.manual:
        assert any("manual port needed" in f.message for f in result.remaining), result.remaining
        assert "# porter: manual" in result.source
        return
    body = result.source.split("def forward", 1)[1].split(":", 1)[1]
    assert "torch" not in body and "F." not in body, f"torch left in the port: {body}"
    assert not [f for f in result.remaining if f.code.startswith("JX1")], result.remaining
    rng = np.random.default_rng(zlib.crc32(case.expr.encode()))
    arrays = [make_input(spec, rng) for _, spec in case.inputs]
    with torch.no_grad():
        expected = run_forward(src, [torch.from_numpy(np.array(a)) for a in arrays])
    got = run_forward(result.source, [jax.numpy.asarray(a) for a in arrays])
    expected, got = to_numpy(expected), to_numpy(got)
    if entry.arbitrary:  # torch.empty: only the shape and the kind of dtype are defined
        assert np.shape(expected) == np.shape(got) and np.asarray(expected).dtype.kind == np.asarray(got).dtype.kind
        return
    assert_same(expected, got, f"{case.expr} -> {body.strip()}")


def test_table_is_large_and_every_entry_is_tested():
    ported = [o for o in ops.TABLE if not o.manual]
    assert len(ported) >= 150
    untested = [o.name for o in ops.TABLE if not o.cases]
    assert not untested, untested


def _inplace_cases():
    """For every in-place method: the first method case of its functional entry, as a
    statement (`a.add_(b)` then `return a`)."""
    out = []
    for name, o in sorted(ops.INPLACE.items()):
        base = name[:-1]
        for c in o.cases:
            if c.expr.startswith(f"a.{base}(") and c.expr.endswith(")") and c.expr.count(f".{base}(") == 1:
                out.append(pytest.param(name, c, id=f"{name}:{c.expr}"))
                break
        else:
            if name not in ("zero_", "fill_", "copy_"):
                out.append(pytest.param(name, None, id=f"{name}:no case"))
    out.append(pytest.param("zero_", ops.Case("a.zero_()", a="f3,4"), id="zero_"))
    out.append(pytest.param("fill_", ops.Case("a.fill_(2.5)", a="f3,4"), id="fill_"))
    out.append(pytest.param("copy_", ops.Case("a.copy_(b)", a="f3,4", b="f4"), id="copy_"))
    return out


@pytest.mark.parametrize("name,case", _inplace_cases())
def test_inplace(name, case):
    assert case is not None, f"{name} has no method case to derive its in-place test from"
    statement = case.expr.replace(f".{name[:-1]}(", f".{name}(", 1) if not case.expr.startswith(f"a.{name}(") else case.expr
    params = ", ".join(["self"] + [n for n, _ in case.inputs])
    src = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        f"class M(nn.Module):\n    def forward({params}):\n        {statement}\n        return a\n"
    )
    result = engine.fix(src, engine.Options(RULES))
    assert f"a = " in result.source, result.source
    rng = np.random.default_rng(zlib.crc32(statement.encode()))
    arrays = [make_input(spec, rng) for _, spec in case.inputs]
    try:
        with torch.no_grad():
            expected = run_forward(src, [torch.from_numpy(np.array(a)) for a in arrays])
    except RuntimeError as exc:  # torch refuses this in-place form (a result dtype it cannot store)
        pytest.skip(f"torch: {exc}")
    got = run_forward(result.source, [jax.numpy.asarray(a) for a in arrays])
    assert_same(to_numpy(expected), to_numpy(got), f"{statement} -> {result.source.splitlines()[-2].strip()}")
