"""Model definitions ported to Flax NNX compute what the originals compute (real torch, real JAX).

For each model of tests/data/jax/models/ (MLP, LeNet-style CNN, ResNet-18, LSTM language
model, Transformer classifier with padding masks, VAE, layer factories and builder functions, module classes reached through values, named children: nn.Sequential subclasses, OrderedDict, add_module, layers built with *args / **kwargs; ModuleDict / ModuleList subclasses with their own forward, torch._assert, torch.fx.wrap, checkpointing and F.dropout in module code, attention through F.scaled_dot_product_attention): the source is ported with the jax
rules (what `porter migrate --to jax` runs), the port is executed, the original's torch
weights are converted with the port's own `load_torch_state_dict`, and then

- `torch_state_dict(model)` gives back the torch state dict exactly;
- the forward pass matches torch within 1e-4 (float32) in train mode (dropout p=0) and in
  eval mode, and after the train-mode pass the running statistics match too;
- the gradients of a scalar function of the outputs, w.r.t. every parameter, mapped back to
  torch's names and layouts, match torch's within 1e-4;
- porting the port changes nothing, and the port has no `# porter: manual` marker.
"""
from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from porter import engine, registry

from lanes import fixture_slice

MODELS = Path(__file__).parent / "data" / "jax" / "models"
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")


@dataclass
class Case:
    file: str
    build: str  # expression building the model, in the module's namespace
    inputs: Callable[[np.random.Generator], tuple]
    tol: float = 1e-4


def _images(shape):
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


def _tokens(rng):
    tokens = rng.integers(1, 50, size=(3, 12))
    lengths = np.array([12, 7, 4])
    mask = np.arange(12)[None, :] >= lengths[:, None]  # True: padding
    tokens[mask] = 0
    return tokens, mask


def _attention_inputs(rng):
    keep = np.ones((2, 5), bool)
    keep[1, 3:] = False  # the second memory is padded
    return (rng.standard_normal((2, 8, 16)).astype(np.float32), rng.standard_normal((2, 5, 16)).astype(np.float32), keep)


CASES = [
    Case("mlp.py", "MLP(dropout=0.0)", _images((4, 1, 28, 28))),
    Case("lenet.py", "LeNet()", _images((4, 1, 28, 28))),
    Case("resnet.py", "resnet18(num_classes=10)", _images((4, 3, 64, 64))),
    Case("lstm_lm.py", "RNNModel(50, dropout=0.0)", lambda rng: (rng.integers(0, 50, size=(3, 9)),)),
    Case("transformer.py", "TransformerClassifier(50, 5, dropout=0.0)", _tokens),
    Case("factories.py", "small_net(num_classes=5)", _images((2, 3, 19, 23))),
    Case("named_children.py", "Net()", _images((2, 3, 16, 20))),
    Case("block_values.py", "Net()", _images((2, 3, 16, 16))),
    Case("star_args.py", "Net()", _images((2, 3, 17, 15))),
    Case("container_blocks.py", "Net()", _images((2, 3, 16, 12))),
    Case("vae.py", "VAE()", lambda rng: (rng.random((4, 1, 28, 28), dtype=np.float32),
                                        rng.standard_normal((4, 20)).astype(np.float32))),
    Case("attention.py", "Block(dropout=0.0)", _attention_inputs),
]


def port(source: str) -> str:
    result = engine.fix(source, engine.Options(registry.select("jax")))
    return result.source


def load(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = name
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def flat(out) -> list:
    """The arrays of a model's output (tensors, tuples, nested tuples)."""
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in flat(o)]
    return [out]


def with_rngs(expr: str) -> str:
    assert expr.endswith(")")
    inner = expr[expr.index("(") + 1 : -1]
    return f"{expr[: expr.index('(')]}({inner}{', ' if inner else ''}rngs=nnx.Rngs(0))"


@pytest.fixture(scope="module")
def ports():
    return {c.file: port((MODELS / c.file).read_text()) for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.file[:-3] for c in CASES])
def test_port_is_clean_and_idempotent(case, ports):
    ported = ports[case.file]
    assert "porter: manual" not in ported
    compile(ported, case.file, "exec")
    assert port(ported) == ported
    assert "def load_torch_state_dict(model, state_dict)" in ported
    assert "def forward(" not in ported and ".forward(" not in ported and "super().__init__()" not in ported


# a third of the models per run of the suite (every port: test_port_is_clean_and_idempotent)
@pytest.mark.parametrize("case", fixture_slice(CASES, 3), ids=lambda c: c.file[:-3])
def test_port_computes_what_torch_computes(case, ports):
    rng = np.random.default_rng(0)
    original = load(f"orig_{case.file[:-3]}", (MODELS / case.file).read_text())
    ported = load(f"port_{case.file[:-3]}", ports[case.file])
    torch.manual_seed(0)
    tmodel = eval(case.build, original.__dict__)
    # non-trivial running statistics, so that eval mode tests the stored ones
    with torch.no_grad():
        for name, buf in tmodel.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(torch.randn(buf.shape) * 0.1)
            elif name.endswith("running_var"):
                buf.copy_(torch.rand(buf.shape) + 0.5)
    state = {k: v.detach().numpy().copy() for k, v in tmodel.state_dict().items()}
    jmodel = eval(with_rngs(case.build), {**ported.__dict__, "nnx": nnx})
    ported.load_torch_state_dict(jmodel, state)

    # the way back gives the torch state dict exactly
    back = ported.torch_state_dict(jmodel)
    expected = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    assert sorted(back) == sorted(expected)
    for key, value in expected.items():
        assert back[key].shape == value.shape, key
        np.testing.assert_array_equal(back[key], value, err_msg=key)

    inputs = case.inputs(rng)
    for mode in ("eval", "train"):
        tmodel.train(mode == "train")
        getattr(jmodel, mode)()
        touts = flat(tmodel(*[torch.from_numpy(np.asarray(a)) for a in inputs]))
        projections = [torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32)) for t in touts]
        tmodel.zero_grad()
        sum((t * p).sum() for t, p in zip(touts, projections)).backward()

        def loss_fn(model):
            outs = flat(model(*[jnp.asarray(a) for a in inputs]))
            return sum((o * jnp.asarray(p.numpy())).sum() for o, p in zip(outs, projections)), outs

        # jitted: the same computation, compiled once instead of dispatched op by op
        (_, jouts), grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(jmodel)
        assert len(jouts) == len(touts)
        for i, (j, t) in enumerate(zip(jouts, touts)):
            err = np.abs(np.asarray(j) - t.detach().numpy()).max()
            assert err <= case.tol, f"{mode} output {i}: max abs error {err:.3g}"
        g = nnx.clone(jmodel)
        nnx.update(g, grads)
        jgrads = ported.torch_state_dict(g)
        for name, p in tmodel.named_parameters():
            tg = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
            err = np.abs(jgrads[name] - tg).max()
            assert err <= case.tol, f"{mode} gradient of {name}: max abs error {err:.3g}"
        # running statistics after the pass (train mode updates them in both)
        now = ported.torch_state_dict(jmodel)
        for name, buf in tmodel.named_buffers():
            if name.endswith("num_batches_tracked"):
                continue
            err = np.abs(now[name] - buf.numpy()).max()
            assert err <= case.tol, f"{mode}: buffer {name} after the pass: max abs error {err:.3g}"


def test_migrate_command_ports_the_models(tmp_path):
    """What a user types: `porter migrate DIR --to jax --out OUT` writes the same ports."""
    out = tmp_path / "ported"
    proc = subprocess.run(
        [sys.executable, "-m", "porter", "migrate", str(MODELS), "--to", "jax", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    for case in CASES:
        assert (out / case.file).read_text() == port((MODELS / case.file).read_text())


_DROPOUT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


def outside(x, p, training):
    return F.dropout(x, p, training)


class Drop(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, p=self.p, training=self.training), torch.dropout(x, self.p, self.training)
'''


def test_functional_dropout_has_torchs_semantics():
    """F.dropout in module code (JX107): torch's distribution and scaling in training, the
    identity in eval mode and at p=0, zeros at p=1, torch's error outside [0, 1]; outside a
    module the port raises where it would draw a mask (no key) and runs where it need not."""
    ported = load("port_dropout", port(_DROPOUT))
    assert "porter: manual" not in port(_DROPOUT)
    x = np.arange(1, 20001, dtype=np.float32).reshape(100, 200) / 1000
    for p in (0.2, 0.7):
        m = ported.Drop(p, rngs=nnx.Rngs(0))
        m.train()
        for out in m(jnp.asarray(x)):
            out = np.asarray(out)
            kept = out != 0
            assert abs(1 - kept.mean() - p) < 0.02, (p, kept.mean())  # 20,000 draws: 4 sigma < 0.013
            np.testing.assert_allclose(out[kept], x[kept] / (1 - p), rtol=1e-6)
        a, b = (np.asarray(o) for o in m(jnp.asarray(x)))
        assert (a != 0).mean() != 1 and not np.array_equal(a != 0, b != 0)  # fresh keys each draw
        m.eval()
        for out in m(jnp.asarray(x)):
            np.testing.assert_array_equal(np.asarray(out), x)
    for p in (0.0, 1.0):  # no draw: the same values as torch's
        expected = torch.nn.functional.dropout(torch.from_numpy(x), p, True).numpy()
        for out in ported.Drop(p, rngs=nnx.Rngs(0))(jnp.asarray(x)):
            np.testing.assert_array_equal(np.asarray(out), expected)
    with pytest.raises(ValueError, match="between 0 and 1"):
        ported.Drop(1.5, rngs=nnx.Rngs(0))(jnp.asarray(x))
    with pytest.raises(ValueError):
        torch.nn.functional.dropout(torch.from_numpy(x), 1.5, True)
    np.testing.assert_array_equal(np.asarray(ported.outside(jnp.asarray(x), 0.5, False)), x)
    np.testing.assert_array_equal(np.asarray(ported.outside(jnp.asarray(x), 0.0, True)), x)
    with pytest.raises(ValueError, match="PRNG key"):
        ported.outside(jnp.asarray(x), 0.5, True)


def test_attention_dropout_in_eval_mode_gives_torchs_numbers():
    """F.scaled_dot_product_attention with dropout_p=p if self.training else 0 (causal, a
    boolean mask with a scale, a float mask; three spellings), ported: torch_sdpa with the
    module's nnx.Rngs. With torch's weights, eval mode computes torch's output (eager and
    jitted); train mode drops attention weights, with a fresh mask each step of one compiled
    step, and gives torch's output again at eval."""
    source = (MODELS / "attention.py").read_text()
    ported_source = port(source)
    assert "porter: manual" not in ported_source and "hasattr" not in ported_source
    assert ported_source.count("rngs=self.rngs)") == 3 and "scaled_dot_product_attention(" not in ported_source.split("class CausalSelfAttention")[1]
    original = load("orig_attention", source)
    ported = load("port_attention", ported_source)
    torch.manual_seed(0)
    tmodel = original.Block(dropout=0.3).eval()
    jmodel = ported.Block(dropout=0.3, rngs=nnx.Rngs(0))
    ported.load_torch_state_dict(jmodel, {k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    x, memory, keep = _attention_inputs(np.random.default_rng(1))
    with torch.no_grad():
        expected = tmodel(*(torch.from_numpy(a) for a in (x, memory, keep))).numpy()
    jmodel.eval()
    step = nnx.jit(lambda m, *a: m(*a))
    for run in (jmodel, lambda *a: step(jmodel, *a)):
        np.testing.assert_allclose(np.asarray(run(x, memory, keep)), expected, rtol=1e-5, atol=1e-5)
    jmodel.train()
    a, b = (np.asarray(step(jmodel, x, memory, keep)) for _ in range(2))
    assert np.isfinite(a).all() and np.abs(a - expected).max() > 1e-3 and np.abs(a - b).max() > 1e-3
    jmodel.eval()
    np.testing.assert_allclose(np.asarray(step(jmodel, x, memory, keep)), expected, rtol=1e-5, atol=1e-5)


def test_attention_dropout_drops_torchs_share_of_the_weights():
    """torch_sdpa in training: each attention weight is kept with probability 1 - p and the
    kept ones scaled by 1 / (1 - p), as torch's dropout on the weights (value rows one-hot, so
    the output is the dropped weight matrix itself)."""
    ported = load("port_attention_stats", port((MODELS / "attention.py").read_text()))
    p, n = 0.25, 64
    rng = np.random.default_rng(0)
    q, k = (jnp.asarray(rng.standard_normal((4, 2, n, 8)).astype(np.float32)) for _ in range(2))
    v = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32), (4, 2, n, n))
    plain = np.asarray(ported.torch_sdpa(q, k, v))
    dropped = np.asarray(ported.torch_sdpa(q, k, v, dropout_p=p, rngs=nnx.Rngs(0)))
    kept = dropped != 0
    assert abs(kept.mean() - (1 - p)) < 0.01, kept.mean()  # 32,768 draws
    np.testing.assert_allclose(dropped[kept], plain[kept] / (1 - p), rtol=1e-5)
    with pytest.raises(ValueError, match="PRNG key"):
        ported.torch_sdpa(q, k, v, dropout_p=p)  # no rngs: no mask


_FILLS = '''
import torch
import torch.nn as nn


class Embed(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.pos = nn.Parameter(torch.empty(1, n).normal_(mean=1.0, std=0.5))
        self.box = nn.Parameter(torch.zeros(n).uniform_(-2.0, 3.0))
'''


def test_fresh_random_fill_draws_torchs_distribution():
    """torch.empty(shape).normal_(mean, std) / .uniform_(a, b) in __init__ (JX108): the same
    shapes and distributions as torch's, from the module's rngs (different seeds: other numbers)."""
    ported_source = port(_FILLS)
    assert "porter: manual" not in ported_source
    ported = load("port_fills", ported_source)
    original = load("orig_fills", _FILLS)
    n = 20000
    t = original.Embed(n)
    a, b = ported.Embed(n, rngs=nnx.Rngs(0)), ported.Embed(n, rngs=nnx.Rngs(1))
    pos, box = np.asarray(a.pos[...]), np.asarray(a.box[...])
    assert pos.shape == tuple(t.pos.shape) and box.shape == tuple(t.box.shape)
    for mine, theirs in ((pos, t.pos.detach().numpy()), (box, t.box.detach().numpy())):
        assert abs(mine.mean() - theirs.mean()) < 0.05 and abs(mine.std() - theirs.std()) < 0.03
    assert abs(pos.mean() - 1.0) < 0.02 and abs(pos.std() - 0.5) < 0.02
    assert box.min() >= -2.0 and box.max() < 3.0 and abs(box.mean() - 0.5) < 0.05
    assert not np.array_equal(pos, np.asarray(b.pos[...]))  # drawn from the module's key stream
