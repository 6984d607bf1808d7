"""Model definitions ported to Flax NNX compute what the originals compute (real torch, real JAX).

For each model of tests/data/jax/models/ (MLP, LeNet-style CNN, ResNet-18, LSTM language
model, Transformer classifier with padding masks, VAE, layer factories and builder functions, module classes reached through values, named children: nn.Sequential subclasses, OrderedDict, add_module, layers built with *args / **kwargs): the source is ported with the jax
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
    Case("vae.py", "VAE()", lambda rng: (rng.random((4, 1, 28, 28), dtype=np.float32),
                                        rng.standard_normal((4, 20)).astype(np.float32))),
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


@pytest.mark.parametrize("case", CASES, ids=[c.file[:-3] for c in CASES])
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
