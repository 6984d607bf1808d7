"""The model side of the MXNet/Gluon -> JAX ports (the Gluon front end, then the JAX rules):

- torch's lazy layers (Gluon's deferred input sizes) on Flax NNX: `TorchLazyLinear`,
  `TorchLazyConv2d`, `TorchLazyConvTranspose2d` (JX002/JX011) and the Gluon `LazyDense` (JX015)
  make their parameters at the first eager call, or from the torch state dict's shapes when
  `load_torch_state_dict` comes first (as torch's load_state_dict does), and then compute what
  torch computes with the same weights; before that, `torch_state_dict` gives None for them
  and nnx.Optimizer / nnx.jit fail naming the layer;
- Gluon's BatchNorm in a JAX port of Gluon code updates its running variance with the biased
  batch variance, as MXNet does (JX015 -> GluonBatchNorm);
- Gluon's `initialize()` and initializers in JAX form (JX015): Xavier with MXNet's fans,
  biases zero, BatchNorm gamma one / beta zero, a layer's own initializer first, lazy layers
  initialized when their first call makes their parameters, loaded weights kept;
- a model built by a factory (nnx.Sequential, no module class) gets the weight converter;
  a Sequential grown with append keeps its torch indices.

Each fixture's JAX port verified against real MXNet: tests/test_gluon_ports.py.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from porter import engine, registry

REPO = Path(__file__).resolve().parents[1]


def _port(source: str) -> str:
    result = engine.fix(textwrap.dedent(source), engine.Options(registry.select("jax"), unsafe_fixes=True))
    return result.source


def _load(code: str, tmp_path: Path, name: str = "port") -> dict:
    path = tmp_path / f"{name}.py"
    path.write_text(code, encoding="utf-8")
    ns: dict = {"__name__": name, "__file__": str(path)}
    exec(compile(code, str(path), "exec"), ns)
    return ns


# --------------------------------------------------------------------------------------
# torch's lazy layers
# --------------------------------------------------------------------------------------
TORCH_LAZY = """
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.LazyConv2d(6, 3, padding=1)
        self.bn = nn.LazyBatchNorm2d(momentum=0.2)
        self.up = nn.LazyConvTranspose2d(4, 2, stride=2, bias=False)
        self.fc = nn.LazyLinear(5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = self.up(x)
        return self.fc(torch.flatten(x, 1))
"""


@pytest.fixture(scope="module")
def lazy_port(tmp_path_factory):
    code = _port(TORCH_LAZY)
    assert "porter: manual" not in code
    for cls in ("TorchLazyConv2d(6, 3, padding=1, rngs=rngs)", "TorchLazyBatchNorm(momentum=0.2, rngs=rngs)",
                "TorchLazyConvTranspose2d(4, 2, stride=2, bias=False, rngs=rngs)",
                "TorchLazyLinear(5, rngs=rngs)"):
        assert cls in code
    return _load(code, tmp_path_factory.mktemp("lazy"), "lazy_port")


def _torch_lazy_model():
    import torch

    ns: dict = {}
    exec(compile(TORCH_LAZY, "torch_lazy", "exec"), ns)
    torch.manual_seed(0)
    model = ns["Net"]()
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        out = model(x)
    return model, x.numpy(), out.numpy()


@pytest.mark.slow  # JAX compiles each eager op once (~7 s)
def test_lazy_layers_materialize_from_the_state_dict_and_compute_as_torch(lazy_port):
    from flax import nnx

    model_t, x, out_t = _torch_lazy_model()
    state = {k: v.detach().numpy() for k, v in model_t.state_dict().items() if not k.endswith("num_batches_tracked")}
    model = lazy_port["Net"](rngs=nnx.Rngs(0))
    before = lazy_port["torch_state_dict"](model)
    assert set(before) == set(state)
    assert all(v is None for v in before.values())  # torch's UninitializedParameter: no shape yet
    lazy_port["load_torch_state_dict"](model, state)  # before any call: shapes from the state dict
    back = lazy_port["torch_state_dict"](model)
    for k, v in state.items():
        np.testing.assert_array_equal(back[k], v)
    np.testing.assert_allclose(np.asarray(model(x)), out_t, atol=1e-5)


def test_lazy_layers_materialize_at_the_first_eager_call_then_train_under_jit(lazy_port):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    model_t, x, _ = _torch_lazy_model()
    model = lazy_port["Net"](rngs=nnx.Rngs(0))
    model.eval()  # set before the BatchNorm has its parameters: kept once they are made
    model(jnp.asarray(x))  # one eager call: in_channels 3, 6 and in_features 4 * 10 * 10
    assert model.bn.use_running_average is True
    np.testing.assert_array_equal(np.asarray(model.bn.mean[...]), 0.0)  # eval mode: no statistics moved
    model.train()
    shapes = {k: v.shape for k, v in lazy_port["torch_state_dict"](model).items()}
    assert shapes == {k: tuple(v.shape) for k, v in model_t.state_dict().items() if not k.endswith("num_batches_tracked")}
    optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer, jnp.asarray(x))) for _ in range(3)]
    assert losses[2] < losses[0] and step.jitted_fn._cache_size() == 1
    assert jax.tree.leaves(nnx.state(model, nnx.Param))


def test_an_unmaterialized_lazy_layer_fails_clearly_under_jit_and_in_an_optimizer(lazy_port):
    import jax.numpy as jnp
    import optax
    from flax import nnx

    model = lazy_port["Net"](rngs=nnx.Rngs(0))
    with pytest.raises(RuntimeError, match=r"TorchLazy(Conv2d\(6, 3, 1, 1, 1, 1, True, 'zeros'\)|BatchNorm\(1e-05, 0.2, True, True\)) has no parameters yet"):
        nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
    with pytest.raises(RuntimeError, match="has no parameters yet"):
        nnx.jit(lambda m, x: m(x))(model, jnp.zeros((2, 3, 5, 5)))
    with pytest.raises(KeyError, match=r"missing key in the torch state dict: .(bn|conv).weight"):
        lazy_port["load_torch_state_dict"](model, {})


# --------------------------------------------------------------------------------------
# Gluon's initialize() and initializers, in JAX form
# --------------------------------------------------------------------------------------
GLUON_NET = """
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn


class Net(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super(Net, self).__init__(**kwargs)
        with self.name_scope():
            self.conv = nn.Conv2D(8, 3, padding=1)
            self.bn = nn.BatchNorm()
            self.up = nn.Conv2DTranspose(4, 2, strides=2, in_channels=8)
            self.fc = nn.Dense(16, activation="relu")
            self.out = nn.Dense(4, in_units=16, weight_initializer=mx.init.Uniform(0.5))

    def hybrid_forward(self, F, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.out(self.fc(self.up(x)))


def build():
    net = Net()
    net.initialize(mx.init.Xavier(magnitude=2.24))
    return net
"""


@pytest.fixture(scope="module")
def gluon_port(tmp_path_factory):
    code = _port(GLUON_NET)
    assert "porter: manual" not in code and "torch.nn.init" not in code
    assert "TorchLazyConv2d(8, 3, padding=1, rngs=rngs)" in code and "LazyDense(16, activation=\"relu\", rngs=rngs)" in code
    assert "initialize(net, init_xavier(magnitude=2.24), key=jax.random.key(0))" in code
    return _load(code, tmp_path_factory.mktemp("gluon"), "gluon_port")


def _xavier_bound(shape, magnitude=2.24):
    receptive = math.prod(shape[2:])
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive  # MXNet's fans
    return math.sqrt(magnitude / ((fan_in + fan_out) / 2.0))


@pytest.mark.slow  # JAX compiles each eager op once (~7 s)
def test_initialize_is_gluons_with_deferred_lazy_layers(gluon_port):
    import jax.numpy as jnp
    from flax import nnx

    net = gluon_port["build"](rngs=nnx.Rngs(0))
    pending = gluon_port["torch_state_dict"](net)
    assert pending["conv.weight"] is None and pending["fc.weight"] is None  # deferred, as Gluon's
    up = pending["up.weight"]
    assert up.shape == (8, 4, 2, 2) and 0.8 * _xavier_bound(up.shape) < np.abs(up).max() <= _xavier_bound(up.shape)
    net.eval()  # as the ports' one sample before training: no running statistics move
    net(jnp.ones((2, 3, 5, 5)))  # the first call makes and initializes the lazy layers
    net.train()
    sd = gluon_port["torch_state_dict"](net)
    for name in ("conv.weight", "up.weight", "fc.weight"):
        w = sd[name]
        bound = _xavier_bound(w.shape)
        assert 0.8 * bound < np.abs(w).max() <= bound, name  # Xavier(magnitude=2.24), uniform
        assert abs(w.std() - bound / math.sqrt(3)) < 0.2 * bound / math.sqrt(3), name
    assert sd["fc.weight"].shape == (16, 4 * 10 * 10)
    for name in ("conv.bias", "up.bias", "fc.bias", "out.bias", "bn.bias", "bn.running_mean"):
        np.testing.assert_array_equal(sd[name], 0.0, err_msg=name)
    np.testing.assert_array_equal(sd["bn.weight"], 1.0)  # gamma
    np.testing.assert_array_equal(sd["bn.running_var"], 1.0)
    out = sd["out.weight"]  # its own weight_initializer: Uniform(0.5) wins over the model's Xavier
    assert 0.4 < np.abs(out).max() <= 0.5 and out.shape == (4, 16)
    # the key decides: the same seed gives the same weights, another seed others
    again = gluon_port["build"](rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(gluon_port["torch_state_dict"](again)["up.weight"], up)


def test_weights_loaded_before_the_first_call_are_kept(gluon_port):
    import jax.numpy as jnp
    from flax import nnx

    net = gluon_port["build"](rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    shapes = {"conv.weight": (8, 3, 3, 3), "conv.bias": (8,), "bn.weight": (8,), "bn.bias": (8,),
              "bn.running_mean": (8,), "bn.running_var": (8,), "up.weight": (8, 4, 2, 2), "up.bias": (4,),
              "fc.weight": (16, 400), "fc.bias": (16,), "out.weight": (4, 16), "out.bias": (4,)}
    state = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    state["bn.running_var"] = np.abs(state["bn.running_var"]) + 0.5
    gluon_port["load_torch_state_dict"](net, state)
    net.eval()
    net(jnp.ones((2, 3, 5, 5)))  # no deferred initialization after a load
    back = gluon_port["torch_state_dict"](net)
    for k, v in state.items():
        np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_gluon_initializers_in_jax_form(gluon_port, tmp_path):
    import jax

    key = jax.random.key(1)
    xavier = gluon_port["init_xavier"](rnd_type="gaussian", factor_type="in", magnitude=2)
    w = np.asarray(xavier(key, (64, 32, 3, 3)))
    assert abs(w.std() - math.sqrt(2 / (32 * 9))) < 0.05 * math.sqrt(2 / (32 * 9))
    with pytest.raises(ValueError, match="vector"):
        xavier(key, (5,))
    code = _port("""
        import mxnet as mx

        inits = [mx.init.Normal(0.02), mx.init.Constant(0.3), mx.init.Zero(), mx.init.One()]
    """)
    ns = _load(code, tmp_path, "inits")
    normal, constant, zero, one = ns["inits"]
    assert abs(np.asarray(normal(key, (100, 100))).std() - 0.02) < 0.002
    np.testing.assert_array_equal(np.asarray(constant(key, (2, 3))), np.float32(0.3))
    np.testing.assert_array_equal(np.asarray(zero(key, (2,))), 0.0)
    np.testing.assert_array_equal(np.asarray(one(key, (2,))), 1.0)


# --------------------------------------------------------------------------------------
# containers: factories and Sequential.append
# --------------------------------------------------------------------------------------
def test_factory_models_get_the_converter_and_appended_layers_keep_their_indices(tmp_path):
    import torch
    from flax import nnx

    source = """
        import torch.nn as nn


        def make(width):
            net = nn.Sequential()
            net.append(nn.Linear(3, width))
            net.append(nn.ReLU())
            block = nn.Sequential(nn.Linear(width, width))
            block.append(nn.Tanh())
            net.append(block)
            return net
    """
    code = _port(source)
    assert "net.layers.append(" in code and "block.layers.append(" in code and "def load_torch_state_dict" in code
    ns = _load(code, tmp_path, "factory")
    tns: dict = {}
    exec(compile(textwrap.dedent(source), "factory_torch", "exec"), tns)
    torch.manual_seed(0)
    model_t = tns["make"](4)
    model = ns["make"](4, rngs=nnx.Rngs(0))
    state = {k: v.detach().numpy() for k, v in model_t.state_dict().items()}
    assert set(ns["torch_state_dict"](model)) == set(state) == {"0.weight", "0.bias", "2.0.weight", "2.0.bias"}
    ns["load_torch_state_dict"](model, state)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(model(x)), model_t(torch.as_tensor(x)).numpy(), atol=1e-6)


ACTIVATED = """
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn


class Net(gluon.HybridBlock):
    def __init__(self, **kwargs):
        super(Net, self).__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential()
            self.features.add(nn.Conv2D(6, 3, activation="relu"))
            self.features.add(nn.BatchNorm())
            self.features.add(nn.Conv2D(4, 3, in_channels=6, activation="tanh"))
            self.head = nn.Dense(3, activation="sigmoid")

    def hybrid_forward(self, F, x):
        return self.head(self.features(x))
"""


@pytest.mark.slow  # two ports and JAX's eager compilations
def test_a_gluon_model_ported_to_jax_computes_what_its_torch_port_computes(tmp_path):
    """Conv2D(activation=...) (with_activation), deferred input sizes and a HybridSequential
    grown with add(): the JAX port, given the torch port's weights before any call, computes
    the torch port's forward (the torch port is the one verified against MXNet)."""
    import torch
    from flax import nnx

    torch_code = engine.fix(ACTIVATED, engine.Options(registry.select("torch"), unsafe_fixes=True)).source
    jax_code = _port(ACTIVATED)
    assert "with_activation(" in jax_code and "porter: manual" not in jax_code
    tns, jns = _load(torch_code, tmp_path, "activated_torch"), _load(jax_code, tmp_path, "activated_jax")
    torch.manual_seed(0)
    model_t = tns["Net"]()
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7)).astype(np.float32)
    model_t.eval()
    with torch.no_grad():
        want = model_t(torch.as_tensor(x)).numpy()
    model = jns["Net"](rngs=nnx.Rngs(0))
    jns["load_torch_state_dict"](model, {k: v.numpy() for k, v in model_t.state_dict().items()})
    model.eval()
    np.testing.assert_allclose(np.asarray(model(x)), want, atol=1e-5)
    assert type(model.features.layers[0]).__name__ == "TorchLazyConv2d"  # the activation keeps the class's name
    # Gluon's BatchNorm: the running variance moves with the biased batch variance (MXNet's update)
    bn = model.features.layers[1]
    assert type(bn).__name__ == "GluonBatchNorm"
    h = np.asarray(model.features.layers[0](x), np.float64)
    mean0, var0 = np.asarray(bn.mean[...], np.float64), np.asarray(bn.var[...], np.float64)
    model.train()
    model(x)
    np.testing.assert_allclose(np.asarray(bn.var[...]), 0.9 * var0 + 0.1 * h.var(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(bn.mean[...]), 0.9 * mean0 + 0.1 * h.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


LM = """
import mxnet as mx
from mxnet import gluon
from mxnet.gluon import rnn


class LM(gluon.Block):
    def __init__(self, **kwargs):
        super(LM, self).__init__(**kwargs)
        with self.name_scope():
            self.rnn = rnn.LSTM(8, num_layers=2, input_size=4)

    def forward(self, x, hidden=None):
        if hidden is None:
            hidden = self.begin_state(batch_size=x.shape[1], ctx=x.context)
        return self.rnn(x, hidden)

    def begin_state(self, *args, **kwargs):
        return self.rnn.begin_state(*args, **kwargs)


def first_state(model, ctx):
    return model.begin_state(func=mx.nd.zeros, batch_size=3, ctx=ctx)
"""


@pytest.mark.slow  # two ports and a jitted LSTM
def test_begin_state_in_jax_form_runs_under_jit(tmp_path):
    """begin_state on the JAX port: jnp.zeros by default, `func=mx.nd.zeros` -> jnp.zeros, no
    `ctx=` (a traced array has no device): the LM's forward with its own first state runs
    under nnx.jit and computes the torch port's."""
    import torch
    from flax import nnx

    torch_code = engine.fix(LM, engine.Options(registry.select("torch"), unsafe_fixes=True)).source
    jax_code = _port(LM)
    assert "self.begin_state(batch_size=x.shape[1])" in jax_code
    assert "model.begin_state(func=jnp.zeros, batch_size=3)" in jax_code
    tns, jns = _load(torch_code, tmp_path, "lm_torch"), _load(jax_code, tmp_path, "lm_jax")
    torch.manual_seed(0)
    model_t = tns["LM"]()
    model = jns["LM"](rngs=nnx.Rngs(0))
    jns["load_torch_state_dict"](model, {k: v.detach().numpy() for k, v in model_t.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 3, 4)).astype(np.float32)
    with torch.no_grad():
        out_t, (h_t, c_t) = model_t(torch.as_tensor(x))
    out, (h, c) = nnx.jit(lambda m, x: m(x))(model, x)
    np.testing.assert_allclose(np.asarray(out), out_t.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(c), c_t.numpy(), atol=1e-5)
    state = jns["first_state"](model, None)
    assert [tuple(s.shape) for s in state] == [(2, 3, 8), (2, 3, 8)] and not np.asarray(state[0]).any()
