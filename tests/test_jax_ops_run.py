"""Every entry of the torch -> JAX op table, run: the torch expression and porter's rewrite of
it on the same random inputs, compared (exactly for integers and booleans, 1e-6 for floats).

The cases come from the table itself (codemods/jax/_ops_table.py): adding an entry adds its
tests. Each case is a small module whose `forward` returns the torch expression; porter's JX1
rules rewrite it; the original runs on torch tensors, the rewrite on JAX arrays.
"""
import re
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

# about a thousand small cases (~3 minutes in all on 2 cores): the module is slow, each case is not
pytestmark = pytest.mark.slow

from optimhelp import assert_same_traces, jax_trace, torch_trace, training_script  # noqa: E402
from porter import engine, registry  # noqa: E402
from porter._layout import mapped_package  # noqa: E402

mapped_package("porter.codemods", "codemods")
from porter.codemods.jax import _nnx as nnx_helpers  # noqa: E402
from porter.codemods.jax import _ops_table as ops  # noqa: E402

# the op rules, and JX011 for the functions some rewrites call (pool_nd for F.max_pool2d ...)
RULES = tuple(r for r in registry.rules_for("jax") if r.code.startswith("JX1")) + (registry.find("JX011"),)
MODULE_RANDOM = registry.find("JX014")
MODULE_SAMPLERS = nnx_helpers.SAMPLERS  # the torch samplers JX014 takes
def _code(o: ops.Op, c: ops.Case) -> str:
    """The rule that ports the case (test ids start with it: `pytest -k JX102`)."""
    if o in ops.LOSSES:
        return "JX151" if "nn." in c.expr else "JX150"
    return "JX102" if o.is_method else "JX101"


CASES = [pytest.param(o, c, id=f"{_code(o, c)}-{o.name}:{c.expr}") for o in ops.TABLE for c in o.cases]
CASES += [pytest.param(o, c, id=f"{_code(o, c)}-{o.name}:{c.expr}") for o in ops.LOSSES for c in o.cases]

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


SDPA = "torch.nn.functional.scaled_dot_product_attention"
_PORT_HELPERS = re.compile(r"\btorch_(sdpa|split)\(")  # functions the port defines (JX011), named after torch's


def _sdpa_dropout_in_eval_mode(src: str, case: ops.Case) -> None:
    """F.scaled_dot_product_attention(..., dropout_p=p if self.training else 0) in a module:
    torch_sdpa drawing from the module's nnx.Rngs (kept by the __init__ JX001 writes); in
    eval mode (no dropout) torch's numbers."""
    ported = engine.fix(src, engine.Options(registry.select("jax"))).source  # the module rules too
    assert "torch_sdpa(" in ported and "rngs=self.rngs)" in ported and "self.rngs = rngs" in ported, ported
    assert "F." not in ported.split("def __call__", 1)[1], ported
    rng = np.random.default_rng(zlib.crc32(case.expr.encode()))
    arrays = [make_input(spec, rng) for _, spec in case.inputs]
    namespace: dict = {"__name__": "case"}
    exec(compile(src, "<case>", "exec"), namespace)
    with torch.no_grad():
        expected = namespace["M"]().eval().forward(*[torch.from_numpy(np.array(a)) for a in arrays])
    namespace = {"__name__": "port"}
    exec(compile(ported, "<port>", "exec"), namespace)
    model = namespace["M"](rngs=namespace["nnx"].Rngs(0))
    model.eval()
    assert_same(to_numpy(expected), to_numpy(model(*[jax.numpy.asarray(a) for a in arrays])), case.expr)


# torch pins memory only with a CUDA driver; `x.pin_memory()` copies the tensor into pinned
# memory (its values: a copy's), so on a CPU-only machine the reference computes that copy
_CPU_REFERENCE = {".pin_memory": (".pin_memory()", ".clone()")}


# the dropouts JX107 ports in module code (the channel ones by their spatial dimensions)
_JX107_DROPOUTS = {"torch.nn.functional.dropout": 0, "torch.nn.functional.dropout1d": 1,
                   "torch.nn.functional.dropout2d": 2}


@pytest.mark.parametrize("entry,case", CASES)
def test_entry(entry, case):
    src = module_source(case)
    result = engine.fix(src, engine.Options(RULES))
    if entry.name in MODULE_SAMPLERS:  # in a module method: JX014's, with the module's nnx.Rngs
        assert entry.manual and not result.changed  # elsewhere the table's entry says manual
        ported = engine.fix(src, engine.Options(RULES + (MODULE_RANDOM,))).source
        assert "jax.random." in ported and "self.rngs.noise()" in ported and "torch.rand" not in ported, ported
        return
    if entry.name in _JX107_DROPOUTS:  # in a module method: JX107's torch_dropout, with the module's nnx.Rngs
        ported = engine.fix(src, engine.Options(RULES + (registry.find("JX001"),))).source
        spatial = _JX107_DROPOUTS[entry.name]
        call = "torch_dropout(a, 0.5, True, self.rngs" + (f", spatial={spatial})" if spatial else ")")
        assert call in ported and "self.rngs = rngs" in ported, ported
        return  # its numbers: tests/test_jax_modules_run.py::test_functional_dropout_has_torchs_semantics
    if entry.name == SDPA and "self.training" in case.expr:  # attention dropout in a module method: the module's nnx.Rngs
        _sdpa_dropout_in_eval_mode(src, case)
        return
    if entry.manual:
        assert any("manual port needed" in f.message for f in result.remaining), result.remaining
        assert "# porter: manual" in result.source
        return
    body = result.source.split("def forward", 1)[1].split(":", 1)[1]
    assert "torch" not in _PORT_HELPERS.sub("", body) and "F." not in body, f"torch left in the port: {body}"
    assert not [f for f in result.remaining if f.code.startswith("JX1")], result.remaining
    rng = np.random.default_rng(zlib.crc32(case.expr.encode()))
    arrays = [make_input(spec, rng) for _, spec in case.inputs]
    with torch.no_grad():
        reference = src.replace(*_CPU_REFERENCE[entry.name]) if entry.name in _CPU_REFERENCE and not torch.cuda.is_available() else src
        expected = run_forward(reference, [torch.from_numpy(np.array(a)) for a in arrays])
    got = run_forward(result.source, [jax.numpy.asarray(a) for a in arrays])
    expected, got = to_numpy(expected), to_numpy(got)
    if entry.arbitrary:  # torch.empty: only the shape and the kind of dtype are defined
        assert np.shape(expected) == np.shape(got) and np.asarray(expected).dtype.kind == np.asarray(got).dtype.kind
        return
    assert_same(expected, got, f"{case.expr} -> {body.strip()}")


def test_JX101_JX102_table_is_large_and_every_entry_is_tested():
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
                out.append(pytest.param(name, c, id=f"JX104-{name}:{c.expr}"))
                break
        else:
            if name not in ("zero_", "fill_", "copy_"):
                out.append(pytest.param(name, None, id=f"JX104-{name}:no case"))
    out.append(pytest.param("zero_", ops.Case("a.zero_()", a="f3,4"), id="JX104-zero_"))
    out.append(pytest.param("fill_", ops.Case("a.fill_(2.5)", a="f3,4"), id="JX104-fill_"))
    out.append(pytest.param("copy_", ops.Case("a.copy_(b)", a="f3,4", b="f4"), id="JX104-copy_"))
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


# --------------------------------------------------------------------------------------
# Optimizers and LR schedulers: 20 steps in torch and in the port (JX201)
# --------------------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd": "torch.optim.SGD(model.parameters(), lr=0.1)",
    "sgd_momentum": "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)",
    "sgd_nesterov_wd": "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)",
    "adam": "torch.optim.Adam(model.parameters(), lr=0.01)",
    "adam_betas_wd": "torch.optim.Adam(model.parameters(), lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)",
    "adamw": "torch.optim.AdamW(model.parameters(), lr=0.01)",
    "adamw_wd": "torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.2, betas=(0.85, 0.98))",
    "rmsprop": "torch.optim.RMSprop(model.parameters(), lr=0.01)",
    "rmsprop_centered": "torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, centered=True, momentum=0.5, weight_decay=0.01)",
}
SCHEDULERS = {  # name: (constructor, stepped per "epoch" or per "batch")
    "none": (None, None),
    "step": ("torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)", "epoch"),
    "multistep": ("torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1, 3], gamma=0.3)", "epoch"),
    "exponential": ("torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)", "epoch"),
    "cosine": ("torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3)", "epoch"),
    "cosine_eta_min": ("torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2, eta_min=0.001)", "epoch"),
    "onecycle": ("torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=20, cycle_momentum=False)", "batch"),
    "step_per_batch": ("torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)", "batch"),
    "step_in_function": ("torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.6)", "function"),
}
OPT_PAIRS = [pytest.param(o, s, id=f"JX201-{o}-{s}") for o in OPTIMIZERS for s in ("none", "step")]
OPT_PAIRS += [pytest.param(o, s, id=f"JX201-{o}-{s}") for o, s in [
    ("sgd_momentum", "multistep"), ("sgd_momentum", "exponential"), ("sgd_momentum", "cosine"), ("adam", "cosine_eta_min"),
    ("sgd_momentum", "onecycle"), ("adamw", "onecycle"), ("rmsprop", "step_per_batch"), ("sgd_nesterov_wd", "step_in_function"),
    ("adam", "exponential"), ("rmsprop_centered", "cosine"),
]]


@pytest.mark.parametrize("opt,sched", OPT_PAIRS)
def test_optimizer_and_scheduler(opt, sched):
    src = training_script(OPTIMIZERS[opt], *SCHEDULERS[sched])
    result = engine.fix(src, engine.Options(RULES + tuple(r for r in registry.rules_for("jax") if r.code.startswith("JX2"))))
    assert "nnx.Optimizer(model" in result.source, result.source
    assert not [f for f in result.remaining if f.code.startswith("JX2")], result.remaining
    head = result.source.split("\nfor epoch", 1)[0]
    assert "torch.optim" not in head, head

    assert_same_traces(torch_trace(src), jax_trace(head))
