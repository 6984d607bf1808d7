"""Which model a script's optimizer trains (porter.verify.weights.model_of), the original whose
initial weights a JAX port's side loads: the model the script built, not a layer of it that
holds the same parameters, and not a wrapper whose state dict prefixes the names."""
import torch
from torch import nn

from porter.verify.weights import model_of


class Wrapped(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.layers(x)


def test_a_model_whose_layers_are_one_sequential_is_the_model():
    model = Wrapped()
    assert model_of(torch.optim.SGD(model.parameters(), lr=0.1)) is model
    assert model_of(torch.optim.SGD(model.layers.parameters(), lr=0.1)) is model  # the same parameters


def test_a_data_parallel_wrapper_gives_way_to_its_module():
    model = Wrapped()
    wrapper = nn.DataParallel(model)
    assert model_of(torch.optim.SGD(wrapper.parameters(), lr=0.1)) is model


def test_a_part_of_a_model_trained_alone():
    model = nn.Sequential(Wrapped(), nn.Linear(2, 2))
    head = model[1]
    assert model_of(torch.optim.SGD(head.parameters(), lr=0.1)) is head


TIED = '''import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class Net(nn.Module):
    def __init__(self, vocab=7, dim=4, layers=2):
        super().__init__()
        self.transformer = nn.ModuleDict({DICT})
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(x)
'''
DICTS = {
    "dict_call": "dict(wte=nn.Embedding(vocab, dim), h=nn.ModuleList([Block(dim) for _ in range(layers)]))",
    "dict_literal": "{'wte': nn.Embedding(vocab, dim), 'h': nn.ModuleList([Block(dim), Block(dim)])}",
}


import pytest  # noqa: E402


@pytest.mark.parametrize("spelling", list(DICTS))
def test_a_model_whose_module_dict_holds_every_parameter_through_a_tied_head(spelling, tmp_path):
    """nanoGPT's layout: the head's weight is the ModuleDict's embedding, so the ModuleDict holds
    every parameter the optimizer trains; the model is still the net, its state dict under the
    net's names, and the JAX port's converter loads it and gives it back (names, values)."""
    import numpy as np

    from porter import engine, registry
    from porter.verify import weights

    src = TIED.replace("{DICT}", DICTS[spelling])
    ns: dict = {}
    exec(compile(src, "<torch>", "exec"), ns)
    net = ns["Net"]()
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    assert model_of(optimizer) is net
    weights.export(optimizer, str(tmp_path), 0)
    state, cls = weights.load(str(tmp_path), 0)
    assert cls == "Net" and set(state) == set(net.state_dict()) and "transformer.h.1.fc.weight" in state
    pytest.importorskip("jax")
    from flax import nnx

    port = engine.fix(src, engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=True)).source
    assert "nnx.Dict" in port and "nnx.List" in port, port
    pns: dict = {}
    exec(compile(port, "<port>", "exec"), pns)
    model = pns["Net"](rngs=nnx.Rngs(0))
    pns["load_torch_state_dict"](model, state)
    back = pns["torch_state_dict"](model)
    assert set(back) == set(state)
    for key in state:
        np.testing.assert_array_equal(back[key], state[key], err_msg=key)
