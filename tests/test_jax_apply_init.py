"""JX016 / JX012 in whole ports, run under JAX: `net.apply(weights_init)` in several spellings (class-name
tests, isinstance tests, tensor-method and nn.init initialisers) and a module's own
`init_weights` with `.data.uniform_` / `.zero_()`, `self.apply(...)` from a constructor and GPT-style
`self.named_parameters()` init loops; the ported initialisation runs and draws
what torch's draws (checked on the statistics of the initialised parameters)."""
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")

pytestmark = pytest.mark.slow  # ports and runs nine initialisations under JAX (~1 minute on a loaded 2-core machine)

from porter import engine, registry  # noqa: E402

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=True)

NET = '''
import torch
import torch.nn as nn


class G(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 3)
        self.bn = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, 256)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))

'''

CASES = {
    "classname-data-methods": '''
        def weights_init(m):
            classname = m.__class__.__name__
            if classname.find('Conv') != -1:
                m.weight.data.normal_(0.0, 0.02)
            elif classname.find('BatchNorm') != -1:
                m.weight.data.normal_(1.0, 0.02)
                m.bias.data.fill_(0)
            elif classname.find('Linear') != -1:
                m.weight.data.uniform_(-0.1, 0.1)
                m.bias.data.zero_()

        torch.manual_seed(3)
        net = G()
        net.apply(weights_init)
    ''',
    "isinstance-nn-init": '''
        def init_params(module):
            if isinstance(module, nn.Conv2d):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.normal_(module.weight, 1.0, 0.02)
                nn.init.constant_(module.bias, 0)
            elif isinstance(module, nn.Linear):
                nn.init.uniform_(module.weight, -0.1, 0.1)
                nn.init.zeros_(module.bias)

        def build():
            model = G()
            model.apply(init_params)
            return model

        net = build()
    ''',
}


def _port_and_run(body: str) -> dict:
    result = engine.fix(NET + textwrap.dedent(body), JAX)
    src = result.source
    assert ".apply(" not in src and ".data" not in src, src
    assert not [f for f in result.remaining if f.code in ("JX016", "JX012", "JX102", "JX104", "JX901")], result.remaining
    assert "porter: manual" not in src.split("def torch_state_dict", 1)[1], src
    ns: dict = {"__name__": "port"}
    exec(compile(src, "<port>", "exec"), ns)
    return ns


@pytest.mark.parametrize("name", list(CASES))
def test_apply_init_ports_and_draws_torchs_distributions(name):
    ns = _port_and_run(CASES[name])
    net = ns["net"]
    conv = np.asarray(net.conv.kernel[...])
    assert abs(conv.std() - 0.02) < 0.002 and abs(conv.mean()) < 0.002
    scale = np.asarray(net.bn.scale[...])
    assert abs(scale.mean() - 1.0) < 0.01 and 0.01 < scale.std() < 0.03
    assert np.all(np.asarray(net.bn.bias[...]) == 0)
    fc = np.asarray(net.fc.kernel[...])
    assert fc.min() >= -0.1 and fc.max() <= 0.1 and fc.std() > 0.05  # uniform(-0.1, 0.1): std 0.0577
    assert np.all(np.asarray(net.fc.bias[...]) == 0)
    out = net(jax.numpy.ones((2, 3, 8, 8)))
    assert out.shape == (2, 256)


def test_module_init_weights_method_with_tensor_initialisers():
    ns = _port_and_run('''
        class LM(nn.Module):
            def __init__(self, ntoken, nhid):
                super().__init__()
                self.encoder = nn.Embedding(ntoken, nhid)
                self.decoder = nn.Linear(nhid, ntoken)
                self.init_weights()

            def init_weights(self):
                initrange = 0.1
                self.encoder.weight.data.uniform_(-initrange, initrange)
                self.decoder.bias.data.zero_()
                self.decoder.weight.data.uniform_(-initrange, initrange)

        net = G()
        lm = LM(500, 64)
    ''')
    lm = ns["lm"]
    emb = np.asarray(lm.encoder.embedding[...])
    assert emb.min() >= -0.1 and emb.max() <= 0.1 and abs(emb.std() - 0.2 / np.sqrt(12)) < 0.003
    assert np.all(np.asarray(lm.decoder.bias[...]) == 0)


def test_apply_of_a_lambda_is_reported():
    result = engine.fix(NET + "net = G()\nnet.apply(lambda m: print(type(m)))\n", JAX)
    assert any(f.code == "JX016" and "no apply()" in f.message for f in result.remaining), result.remaining


# `self.apply(fn)` from a module's constructor (GPT-style `_init_weights`): a method, a
# module-level def and a staticmethod, called from __init__ or from a method __init__ calls.
# Each original builds LM(); the test compares the port's arrays with torch's on their statistics.
OWN_APPLY = {
    "method-isinstance-nn-init": '''
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(1000, 256)
                self.fc = nn.Linear(256, 512)
                self.apply(self._init_weights)

            def _init_weights(self, module):
                if isinstance(module, nn.Linear):
                    torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                    if module.bias is not None:
                        torch.nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    torch.nn.init.normal_(module.weight, mean=0.0, std=0.1)

            def forward(self, idx):
                return self.fc(self.emb(idx))
    ''',
    "def-data-methods-from-init-weights": '''
        def _init(m):
            if isinstance(m, nn.Linear):
                m.weight.data.normal_(0.0, 0.02)
                m.bias.data.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.data.uniform_(-0.1, 0.1)

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(1000, 256)
                self.fc = nn.Linear(256, 512)
                self.init_weights()

            def init_weights(self):
                self.apply(_init)

            def forward(self, idx):
                return self.fc(self.emb(idx))
    ''',
    "staticmethod-classname": '''
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(1000, 256)
                self.fc = nn.Linear(256, 512)
                self.apply(self._init)

            @staticmethod
            def _init(m):
                name = m.__class__.__name__
                if name.find('Linear') != -1:
                    nn.init.normal_(m.weight, 0.0, 0.02)
                    m.bias.data.fill_(0)
                elif name.find('Embed') != -1:
                    nn.init.normal_(m.weight, std=0.1)

            def forward(self, idx):
                return self.fc(self.emb(idx))
    ''',
}


@pytest.mark.parametrize("name", list(OWN_APPLY))
def test_self_apply_in_the_constructor_draws_torchs_distributions(name):
    body = textwrap.dedent(OWN_APPLY[name])
    torch_ns: dict = {"__name__": "original"}
    exec(compile(NET + body + "\ntorch.manual_seed(0)\nlm = LM()\n", "<original>", "exec"), torch_ns)
    original = torch_ns["lm"]
    ns = _port_and_run(body + "\nlm = LM()\n")
    lm = ns["lm"]
    pairs = [(original.fc.weight.detach().numpy().T, np.asarray(lm.fc.kernel[...])),
             (original.emb.weight.detach().numpy(), np.asarray(lm.emb.embedding[...]))]
    for want, got in pairs:
        assert want.shape == got.shape
        assert abs(got.mean() - want.mean()) < 0.003 and abs(got.std() - want.std()) < 0.003 * want.std() / 0.02
        assert abs(np.abs(got).max() - np.abs(want).max()) < 2 * want.std()  # same family: uniform's bound, normal's tail
    assert np.all(np.asarray(lm.fc.bias[...]) == 0) and np.all(original.fc.bias.detach().numpy() == 0)
    assert lm(jax.numpy.ones((2, 3), dtype=jax.numpy.int32)).shape == (2, 3, 512)


# `for name, p in self.named_parameters(): if <test of name>: nn.init.*(p, ...)`: torch's names
# (a Sequential's 0, 1, ..., a ModuleList's index) select the same parameters in the port.
NAMED = '''
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
        self.c_proj = nn.Linear(128, 128)

    def forward(self, x):
        return self.c_proj(self.mlp(x))


class LM(nn.Module):
    def __init__(self, n_layer):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.apply(self._init_weights)
        {loop}

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            torch.nn.init.zeros_(module.bias)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x
'''
LOOPS = {
    "endswith-normal": '''for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))''',
    "in-and-index-constant": '''for name, param in self.named_parameters():
            if "mlp.2" in name and name.endswith("bias"):
                nn.init.constant_(param, 0.5)
            elif name.startswith("blocks.1.c_proj.w"):
                nn.init.normal_(param, std=0.1)''',
    "split-suffix-uniform": '''for n, w in self.named_parameters():
            if n.split(".")[-2:] == ["c_proj", "weight"]:
                nn.init.uniform_(w, a=-0.01, b=0.01)''',
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_named_parameters_init_loop_selects_torchs_names(name):
    body = "import math\n" + NAMED.replace("{loop}", LOOPS[name])
    torch_ns: dict = {"__name__": "original"}
    exec(compile(NET + body + "\ntorch.manual_seed(0)\nlm = LM(3)\n", "<original>", "exec"), torch_ns)
    original = dict(torch_ns["lm"].named_parameters())
    ns = _port_and_run(body + "\nlm = LM(3)\n")
    lm = ns["lm"]
    ported = {k: np.asarray(v[0][...]) for k, v in ns["_torch_names"](lm).items()}
    assert sorted(ported) == sorted(original)
    for key, tensor in original.items():
        want, got = tensor.detach().numpy(), ported[key]
        want = want.T if want.ndim == 2 else want  # a Linear's kernel is weight.T
        assert want.shape == got.shape, key
        if want.std() == 0:
            assert np.all(got == want), key  # zeros_ / constant_: exactly
        else:
            assert abs(got.std() - want.std()) < 0.1 * want.std() and abs(got.mean()) < 0.1 * want.std(), key
    assert lm(jax.numpy.ones((2, 128))).shape == (2, 128)


def test_named_parameters_loop_using_the_tensor_otherwise_is_reported():
    body = NAMED.replace("{loop}", '''for pn, p in self.named_parameters():
            p.requires_grad = False''')
    result = engine.fix(NET + body + "\nlm = LM(2)\n", JAX)
    assert any(f.code == "JX090" and "named_parameters" in f.message for f in result.remaining), result.remaining


def test_self_apply_in_forward_is_reported():
    body = NET.replace("    def forward(self, x):\n", "    def _init(self, m):\n        nn.init.normal_(m.weight)\n\n"
                       "    def forward(self, x):\n        self.apply(self._init)\n")
    result = engine.fix(body + "net = G()\n", JAX)
    assert "self.apply(self._init)" in result.source
    assert any(f.code == "JX016" and "forward has no rngs" in f.message for f in result.remaining), result.remaining
