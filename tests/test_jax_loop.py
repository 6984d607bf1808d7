"""The loop rules (JX3xx) on their own, run for real: a script whose models, losses and
optimizers are already Flax NNX / optax but whose loop is still written the PyTorch way
(`zero_grad`, `backward`, `clip_grad_norm_`, `step`) is rewritten by the JX3 rules only,
executed under JAX, and compared step by step with the same loop in PyTorch from the same
weights: a GAN at a script's top level (two optimizers, the generator's output computed in
the discriminator's window and read by the generator's step), and a function with a loss of
several model outputs, gradient clipping, a host read between backward and step, a Python
number used as a shape, and an output read after the step.
"""
import textwrap

import libcst as cst
import numpy as np
import pytest

from porter import engine, registry

LOOP_RULES = registry.select("jax", ("JX3",))


def port(source: str) -> str:
    result = engine.fix(textwrap.dedent(source), engine.Options(LOOP_RULES, unsafe_fixes=True))
    cst.parse_module(result.source)
    again = engine.fix(result.source, engine.Options(LOOP_RULES, unsafe_fixes=True))
    assert not again.changed, "the loop rules are not idempotent"
    return result.source


GAN = '''
import jax
import jax.numpy as jnp
import optax
import torch
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, sizes, *, rngs):
        self.fc1 = nnx.Linear(sizes[0], sizes[1], rngs=rngs)
        self.fc2 = nnx.Linear(sizes[1], sizes[2], rngs=rngs)

    def __call__(self, x):
        return self.fc2(jnp.tanh(self.fc1(x)))


def bce_with_logits(logits, target):
    return optax.sigmoid_binary_cross_entropy(logits[:, 0], target).mean()


netG = MLP((4, 16, 8), rngs=nnx.Rngs(0))
netD = MLP((8, 16, 1), rngs=nnx.Rngs(1))
optD = nnx.Optimizer(netD, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
optG = nnx.Optimizer(netG, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
criterion = bce_with_logits
losses = []
for real, noise in batches:
    ones = jnp.ones(real.shape[0])
    zeros = jnp.zeros(real.shape[0])
    fake = netG(noise)
    optD.zero_grad()
    lossD = criterion(netD(real), ones) + criterion(netD(jax.lax.stop_gradient(fake)), zeros)
    lossD.backward()
    optD.step()
    optG.zero_grad()
    lossG = criterion(netD(fake), ones)
    lossG.backward()
    optG.step()
    losses.append((lossD.item(), lossG.item()))
'''


def test_gan_source_is_rewritten_into_two_steps():
    text = port(GAN)
    assert "def train_step_optD(netD, optD, netG, noise, real, ones, zeros):" in text
    assert "def train_step_optG(netG, optG, noise, netD, ones):" in text
    assert "lossD = train_step_optD(netD, optD, netG, noise, real, ones, zeros)" in text
    assert ".backward()" not in text and "zero_grad" not in text


def _torch_mlp(sizes):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(sizes[0], sizes[1]), nn.Tanh(), nn.Linear(sizes[1], sizes[2]))


def _copy_into(nnx_model, torch_model):
    import jax.numpy as jnp

    for name, index in (("fc1", 0), ("fc2", 2)):
        layer = getattr(nnx_model, name)
        layer.kernel[...] = jnp.asarray(torch_model[index].weight.detach().numpy().T)
        layer.bias[...] = jnp.asarray(torch_model[index].bias.detach().numpy())


@pytest.mark.slow
def test_gan_port_runs_and_matches_pytorch():
    import jax.numpy as jnp
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32))
            for _ in range(6)]
    torch.manual_seed(0)
    tG, tD = _torch_mlp((4, 16, 8)), _torch_mlp((8, 16, 1))
    namespace = {"batches": [(jnp.asarray(r), jnp.asarray(z)) for r, z in data]}
    source = port(GAN)
    # the models are built by the script: give them the torch weights before the loop runs
    head, loop = source.split("losses = []\n")
    exec(compile(head, "gan_port", "exec"), namespace)
    _copy_into(namespace["netG"], tG)
    _copy_into(namespace["netD"], tD)
    exec(compile("losses = []\n" + loop, "gan_port", "exec"), namespace)

    optD = torch.optim.SGD(tD.parameters(), lr=0.1, momentum=0.9)
    optG = torch.optim.SGD(tG.parameters(), lr=0.1, momentum=0.9)
    expected = []
    for real, noise in data:
        real, noise = torch.from_numpy(real), torch.from_numpy(noise)
        ones, zeros = torch.ones(16), torch.zeros(16)
        fake = tG(noise)
        optD.zero_grad()
        lossD = F.binary_cross_entropy_with_logits(tD(real)[:, 0], ones) + \
            F.binary_cross_entropy_with_logits(tD(fake.detach())[:, 0], zeros)
        lossD.backward()
        optD.step()
        optG.zero_grad()
        lossG = F.binary_cross_entropy_with_logits(tD(fake)[:, 0], ones)
        lossG.backward()
        optG.step()
        expected.append((lossD.item(), lossG.item()))
    np.testing.assert_allclose(np.array(namespace["losses"]), np.array(expected), rtol=1e-5, atol=1e-6)
    for name in ("train_step_optD", "train_step_optG"):
        assert namespace[name].jitted_fn._cache_size() == 1, name


REGRESSION = '''
import argparse

import jax.numpy as jnp
import optax
import torch
from flax import nnx


class Net(nnx.Module):
    def __init__(self, *, rngs):
        self.fc1 = nnx.Linear(6, 32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 12, rngs=rngs)

    def __call__(self, x):
        hidden = jnp.tanh(self.fc1(x))
        return self.fc2(hidden), hidden


def fit(model, batches, args):
    optimizer = nnx.Optimizer(model, optax.adam(args.lr), wrt=nnx.Param)
    total = 0.0
    width = args.width
    errors = []
    for x, y in batches:
        optimizer.zero_grad()
        out, hidden = model(x)
        loss = jnp.mean((out.reshape(-1, width) - y) ** 2) + 0.01 * jnp.mean(hidden ** 2)
        loss.backward()
        total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        errors.append(float(jnp.mean(jnp.abs(out.reshape(-1, width) - y))))
    return total, errors
'''


def test_regression_source():
    text = port(REGRESSION)
    assert '@nnx.jit(static_argnames=("width", "clip"))' in text
    assert "def train_step(model, optimizer, x, y, width, clip):" in text
    assert "(loss, out), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)" in text
    assert "grads, _ = optax.clip_by_global_norm(clip).update(grads, optax.EmptyState())" in text
    assert "loss, out = train_step(model, optimizer, x, y, width, args.clip)\n        total += loss\n" in text  # JX309


@pytest.mark.slow
def test_regression_port_runs_and_matches_pytorch():
    import argparse

    import jax.numpy as jnp
    import torch
    import torch.nn as nn
    from flax import nnx

    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((24, 4)).astype(np.float32))
            for _ in range(6)]
    args = argparse.Namespace(lr=1e-2, clip=0.05, width=4)
    torch.manual_seed(1)
    t = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 12))

    namespace: dict = {}
    exec(compile(port(REGRESSION), "regression_port", "exec"), namespace)
    model = namespace["Net"](rngs=nnx.Rngs(0))
    _copy_into(model, t)
    total, errors = namespace["fit"](model, [(jnp.asarray(x), jnp.asarray(y)) for x, y in data], args)
    assert namespace["train_step"].jitted_fn._cache_size() == 1

    opt = torch.optim.Adam(t.parameters(), lr=args.lr)
    want_total, want_errors = 0.0, []
    for x, y in data:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        opt.zero_grad()
        hidden = torch.tanh(t[0](x))
        out = t[2](hidden)
        loss = torch.mean((out.reshape(-1, 4) - y) ** 2) + 0.01 * torch.mean(hidden ** 2)
        loss.backward()
        want_total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(t.parameters(), args.clip)
        assert norm > args.clip  # the clip is active in this test
        opt.step()
        want_errors.append(float(torch.mean(torch.abs(out.detach().reshape(-1, 4) - y))))
    np.testing.assert_allclose(total, want_total, rtol=1e-5)
    np.testing.assert_allclose(errors, want_errors, rtol=1e-4, atol=1e-6)


def test_unported_pieces_are_marked_manual():
    text = port('''
        import torch

        def f(model, optimizer, loader):
            for x in loader:
                optimizer.zero_grad()
                loss = model(x).sum()
                if loss.item() > 10:
                    loss.backward()
                optimizer.step()

        def g(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ''')
    assert "# porter: manual (JX301): loss.backward() is nested in a block of the loop body" in text
    found = engine.check(text, engine.Options(LOOP_RULES)).findings
    assert [f.code for f in found if not f.fixable] == ["JX301"]


RECURRENT = '''
import jax.numpy as jnp
import optax
import torch
from flax import nnx


class Cell(nnx.Module):
    def __init__(self, *, rngs):
        self.fc1 = nnx.Linear(3, 5, rngs=rngs)
        self.fc2 = nnx.Linear(5, 2, rngs=rngs)

    def __call__(self, x, h):
        h = jnp.tanh(self.fc1(x) + h)
        return self.fc2(h), h


def fit(model, windows):
    optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
    hidden = jnp.zeros((4, 5))
    losses = []
    for x, y in windows:
        optimizer.zero_grad()
        out, hidden = model(x, hidden)
        loss = jnp.mean((out - y) ** 2)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
'''


@pytest.mark.slow
def test_state_carried_across_steps():
    """`out, hidden = model(x, hidden)`: hidden is read and rebound by the forward pass; it is
    a parameter of loss_fn, returned by the step, and fed back (no gradient flows across
    steps, as with PyTorch's detached hidden state)."""
    import jax.numpy as jnp
    import torch
    import torch.nn as nn
    from flax import nnx

    text = port(RECURRENT)
    assert "    def loss_fn(model, hidden):" in text
    assert "loss, hidden = train_step(model, optimizer, x, hidden, y)" in text
    rng = np.random.default_rng(2)
    windows = [(rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32))
               for _ in range(5)]
    torch.manual_seed(2)
    t = nn.Sequential(nn.Linear(3, 5), nn.Identity(), nn.Linear(5, 2))
    namespace: dict = {}
    exec(compile(text, "recurrent_port", "exec"), namespace)
    model = namespace["Cell"](rngs=nnx.Rngs(0))
    _copy_into(model, t)
    got = namespace["fit"](model, [(jnp.asarray(x), jnp.asarray(y)) for x, y in windows])
    opt = torch.optim.SGD(t.parameters(), lr=0.5)
    h = torch.zeros(4, 5)
    want = []
    for x, y in windows:
        opt.zero_grad()
        h = torch.tanh(t[0](torch.from_numpy(x)) + h.detach())
        loss = torch.mean((t[2](h) - torch.from_numpy(y)) ** 2)
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-5)


# a plain copy of the loss (or of a forward value) written between the last backward and the
# step: it is not a forward statement, so it stays after the step call and reads the step's
# returned value (the planner used to look it up among the forward candidates: KeyError)
ALIAS_BETWEEN = {
    "loss copy": "    total = loss\n",
    "two names": "    total, last = loss, out\n",
    "after clip": "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    total = loss\n",
}


@pytest.mark.parametrize("between", ALIAS_BETWEEN.values(), ids=ALIAS_BETWEEN)
def test_plain_alias_between_backward_and_step(between):
    source = (
        "import torch\nimport torch.nn as nn\n\n"
        "model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]\n"
        "for x, y in data:\n    opt.zero_grad()\n    out = model(x)\n    loss = ((out - y) ** 2).mean()\n"
        "    loss.backward()\n" + between + "    opt.step()\n    print(total.item())\n"
    )
    options = engine.Options(registry.select("jax"), unsafe_fixes=True)
    found = [f.message for f in engine.check(source, options).findings]
    assert any("train_step" in m for m in found) and not any("internal error" in m for m in found), found
    result = engine.fix(source, options)
    assert "def train_step(" in result.source
    step, loop = result.source.split("for x, y in data:")
    assert "total" not in step and "total" in loop
