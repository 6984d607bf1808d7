"""Weight initialisation, module classes passed as parameters, random numbers in a module's
methods and LambdaLR, ported to JAX (JX001, JX012-JX014, JX201-JX202), run for real.

- `nn.init.*_` calls and `for m in self.modules(): if isinstance(m, nn.Conv2d): ...` loops
  become `init_*` calls on the NNX layers: constants exact, distributions with torch's fans
  and gains (the emitted `_torch_fans` / `_torch_gain` equal torch's own functions);
- an unannotated `block` parameter that receives a module class gets `rngs=rngs` at its calls;
- `torch.randn_like` in a method draws from the module's `nnx.Rngs`: fresh noise every call,
  and the jitted step compiles once;
- LambdaLR becomes an optax schedule: the learning rates the port prints equal torch's.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from porter import engine, registry

torch = pytest.importorskip("torch")


def port(source: str) -> str:
    result = engine.fix(textwrap.dedent(source), engine.Options(registry.select("jax"), unsafe_fixes=True))
    return result.source


def load(text: str) -> types.ModuleType:
    module = types.ModuleType("ported")
    exec(compile(text, "ported.py", "exec"), module.__dict__)
    return module


INIT_MODEL = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self, block, width=64, n=3):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = self._stack(block, width, n)
        self.emb = nn.Embedding(1000, 256)
        self.fc = nn.Linear(width, 512)
        self.head = nn.Linear(512, 256)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        for m in self.modules():
            if isinstance(m, Block):
                nn.init.zeros_(m.bn.weight)
        self.init_weights()

    def _stack(self, block, width, n):
        return nn.Sequential(*[block(width) for _ in range(n)])

    def init_weights(self):
        nn.init.uniform_(self.emb.weight, -0.1, 0.1)
        nn.init.xavier_uniform_(self.fc.weight, gain=2.0)
        nn.init.zeros_(self.fc.bias)
        nn.init.normal_(self.head.weight, mean=1.0, std=0.02)
        nn.init.ones_(self.head.bias)

    def forward(self, x):
        return self.head(self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3))))


def make():
    return Net(Block)
"""


@pytest.fixture(scope="module")
def init_port():
    return port(INIT_MODEL)


def test_init_code_is_ported_without_manual_markers(init_port):
    text = init_port
    assert "porter: manual" not in text
    assert "for _, m in nnx.iter_modules(self):" in text
    assert "isinstance(m, TorchConv2d)" in text and "isinstance(m, (TorchBatchNorm, TorchGroupNorm))" in text
    assert 'init_kaiming_normal_(m, "weight", mode="fan_out", nonlinearity="relu", key=rngs.params())' in text
    assert 'init_zeros_(m.bn, "weight")' in text
    assert "def init_weights(self, *, rngs: nnx.Rngs):" in text and "self.init_weights(rngs=rngs)" in text
    assert "block(width, rngs=rngs)" in text  # an unannotated parameter holding a module class
    assert "nn.init.kaiming_normal_(m.weight" not in text and "nn.init.uniform_(self" not in text
    assert "import torch.nn as nn" not in text
    assert engine.fix(text, engine.Options(registry.select("jax"), unsafe_fixes=True)).source == text


def test_emitted_fans_and_gains_are_torchs(init_port):
    ns = load(init_port)
    fans, gain = ns._torch_fans, ns._torch_gain
    for shape in [(4, 3), (8, 3, 5, 5), (2, 6, 3), (16, 4, 1, 1, 3)]:
        assert fans(shape) == torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    for name, param in [("relu", None), ("tanh", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("linear", None),
                        ("sigmoid", None), ("selu", None), ("conv2d", None)]:
        assert gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param))


def test_initial_values_follow_torchs_distributions(init_port):
    from flax import nnx

    ns = load(init_port)
    model = ns.Net(ns.Block, rngs=nnx.Rngs(0))
    sd = ns.torch_state_dict(model)
    ref = torch.nn.Module.state_dict(_torch_model())
    assert set(sd) == {k for k in ref if not k.endswith("num_batches_tracked")}
    # constants: exact
    np.testing.assert_array_equal(sd["blocks.0.bn.weight"], 0.0)
    np.testing.assert_array_equal(sd["fc.bias"], 0.0)
    np.testing.assert_array_equal(sd["head.bias"], 1.0)
    np.testing.assert_array_equal(sd["blocks.1.bn.bias"], 0.0)
    # kaiming_normal_(fan_out, relu) on the stem (64, 3, 3, 3): std sqrt(2 / (64 * 9)), in torch's layout
    w = sd["stem.weight"]
    assert w.shape == (64, 3, 3, 3)
    assert w.std() == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.1)
    assert sd["blocks.2.conv.weight"].std() == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.05)
    # uniform_(-0.1, 0.1); xavier_uniform_(gain 2) on fc.weight (512, 64); normal_(1, 0.02)
    e = sd["emb.weight"]
    assert -0.1 <= e.min() < -0.099 and 0.099 < e.max() < 0.1
    bound = 2.0 * math.sqrt(6 / (64 + 512))
    f = sd["fc.weight"]
    assert f.shape == (512, 64) and -bound <= f.min() < -0.98 * bound and 0.98 * bound < f.max() <= bound
    h = sd["head.weight"]
    assert h.mean() == pytest.approx(1.0, abs=0.002) and h.std() == pytest.approx(0.02, rel=0.05)
    # the model runs on the initial weights
    out = model(np.zeros((2, 3, 8, 8), np.float32))
    assert out.shape == (2, 256)


def _torch_model():
    ns = {}
    exec(compile(INIT_MODEL, "original.py", "exec"), ns)
    return ns["make"]()


def test_init_of_a_tensor_that_is_not_a_layer_parameter_is_marked():
    text = port("""
        import torch.nn as nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)
                nn.init.sparse_(self.fc.weight, 0.5)
                for p in self.parameters():
                    nn.init.normal_(p)
        """)
    assert "nn.init.sparse_(self.fc.weight, 0.5)  # porter: manual (JX012): nn.init.sparse_ is not translated" in text
    assert "for p in self.parameters():  # porter: manual (JX090)" in text


RANDOM_MODEL = """
import torch
import torch.nn as nn


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        return h + torch.randn_like(h) + torch.rand(h.shape[0], 3)
"""


def test_random_numbers_in_a_method_come_from_the_modules_rngs():
    import jax
    from flax import nnx

    text = port(RANDOM_MODEL)
    assert "self.rngs = rngs" in text
    assert "jax.random.normal(self.rngs.noise(), h.shape, h.dtype)" in text
    assert "jax.random.uniform(self.rngs.noise(), (h.shape[0], 3))" in text
    assert "porter: manual" not in text
    ns = load(text)
    model = ns.Noisy(rngs=nnx.Rngs(0))
    zeros = np.zeros((2, 4), np.float32)

    @nnx.jit
    def step(model, x):
        return model(x)

    a, b, c = (np.asarray(step(model, zeros)) for _ in range(3))
    assert a.shape == (2, 3) and not np.allclose(a, b) and not np.allclose(b, c)
    assert step._cache_size() == 1 if hasattr(step, "_cache_size") else step.jitted_fn._cache_size() == 1
    # the same seed, the same numbers
    again = ns.Noisy(rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(np.asarray(step(again, zeros)), a)
    del jax


LAMBDA_SCRIPT = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    device = torch.device("cpu")
    loader = DataLoader(TensorDataset(torch.zeros(40, 4), torch.zeros(40, dtype=torch.int64)), batch_size=4)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.01)
    total_steps = 2 * len(loader)
    warmup = 3

    def lr_lambda(step):
        if step < warmup:
            return (step + 1) / warmup
        elif step > 12:
            return 0.05
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            print(f"lr {scheduler.get_last_lr()[0]:.8f}")


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_lambda_lr_port_prints_torchs_learning_rates(tmp_path):
    original = tmp_path / "train.py"
    original.write_text(LAMBDA_SCRIPT)
    text = port(LAMBDA_SCRIPT)
    assert "LambdaLR" not in text and "porter: manual" not in text, text
    assert "scheduler = lambda step: 0.5 * lr_lambda(step)" in text
    assert "optax.adamw(scheduler, weight_decay=0.01)" in text
    assert "jnp.where(" in text and "jnp.maximum(" in text
    ported = tmp_path / "port.py"
    ported.write_text(text)
    env = dict(os.environ, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    want = subprocess.run([sys.executable, str(original)], capture_output=True, text=True, timeout=300, env=env)
    got = subprocess.run([sys.executable, str(ported)], capture_output=True, text=True, timeout=300, env=env)
    assert want.returncode == 0, want.stderr[-2000:]
    assert got.returncode == 0, got.stderr[-3000:]
    w = [line.split() for line in want.stdout.splitlines()]
    g = [line.split() for line in got.stdout.splitlines()]
    assert [a for a, _ in w] == [a for a, _ in g] and len(w) == 20
    np.testing.assert_allclose([float(b) for _, b in g], [float(b) for _, b in w], rtol=1e-6)


def test_lambda_lr_with_host_only_code_is_left_manual():
    text = port("""
        import torch

        def main(model, loader):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 1.0 if int(e) % 2 and e > 3 else 0.5)
            for x in loader:
                optimizer.step()
                scheduler.step()
        """)
    assert "LambdaLR(optimizer, lambda e: 1.0 if int(e) % 2 and e > 3 else 0.5)  # porter: manual" in text


def test_lambda_lr_lambda_becomes_a_traceable_schedule():
    import jax.numpy as jnp

    text = port("""
        import torch

        def main(model, loader):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.9 ** epoch if epoch < 4 else min(0.5, 1 / (epoch + 1)))
            for epoch in range(10):
                for x in loader:
                    optimizer.step()
                scheduler.step()
        """)
    line = next(l.strip() for l in text.splitlines() if l.strip().startswith("scheduler = "))
    assert line == "scheduler = lambda epoch: 0.1 * jnp.where(epoch < 4, 0.9 ** epoch, jnp.minimum(0.5, 1 / (epoch + 1)))"
    assert "optax.sgd(lambda step: scheduler(step // len(loader)))" in text
    schedule = eval(line.split("=", 1)[1], {"jnp": jnp})
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    ref = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.9 ** epoch if epoch < 4 else min(0.5, 1 / (epoch + 1)))
    for epoch in range(10):
        assert float(schedule(jnp.int32(epoch))) == pytest.approx(ref.get_last_lr()[0], rel=1e-6)
        opt.step()
        ref.step()


ALIAS_MODEL = """
import torch
import torch.nn as nn
from torch.nn import init


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.wide = nn.Conv2d(2, 6, 3)          # weight (6, 2, 3, 3): 6 rows of 18
        self.tall = nn.Linear(4, 32)            # weight (32, 4): 32 rows of 4
        self.out = nn.Linear(32, 8)
        init.orthogonal(self.wide.weight, init.calculate_gain('relu'))   # the deprecated spellings
        nn.init.orthogonal_(self.tall.weight)
        init.normal(self.out.weight, 0.0, 0.02)
        init.constant(self.out.bias, 0.5)

    def forward(self, x):
        return self.out(self.tall(x))
"""


@pytest.mark.jax
def test_orthogonal_and_the_deprecated_init_spellings():
    from flax import nnx

    text = port(ALIAS_MODEL)
    assert "porter: manual" not in text and "init.orthogonal(" not in text and "init.normal(" not in text, text
    ns = load(text)
    sd = ns.torch_state_dict(ns.Net(rngs=nnx.Rngs(0)))
    gain = math.sqrt(2.0)
    wide = sd["wide.weight"].reshape(6, -1)
    np.testing.assert_allclose(wide @ wide.T, gain ** 2 * np.eye(6), atol=1e-5)  # orthonormal rows, times the gain
    tall = sd["tall.weight"]
    assert tall.shape == (32, 4)
    np.testing.assert_allclose(tall.T @ tall, np.eye(4), atol=1e-5)  # orthonormal columns
    np.testing.assert_array_equal(sd["out.bias"], 0.5)
    assert sd["out.weight"].std() == pytest.approx(0.02, rel=0.2)
    # torch's own orthogonal_ gives the same structure
    ref = torch.empty(6, 2, 3, 3)
    torch.nn.init.orthogonal_(ref, gain)
    flat = ref.reshape(6, -1).numpy()
    np.testing.assert_allclose(flat @ flat.T, gain ** 2 * np.eye(6), atol=1e-5)
