"""JX004 on code that reads an nn.Sequential as a sequence: `seq[i]` (init code reaching a
layer's weight, a head replaced in place), `seq[:k]` (the first k layers as a model),
`for layer in seq`, `enumerate(seq)`, `len(seq)`. nnx.Sequential is neither subscriptable
nor iterable (flax 0.12: "'Sequential' object is not subscriptable"); its layers are
`.layers`, an nnx.List, and a slice is a Sequential again as in torch. Each spelling is
ported and checked by `porter verify --script`."""
import pytest

from porter import engine, registry

from scripthelp import verify_json

from lanes import fixture_slice

SAFE = engine.Options(tuple(registry.rules_for("jax")))

SCRIPT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)
        INIT

    def forward(self, x):
        FORWARD


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(48, 10), torch.randint(0, 4, (48,))), batch_size=8)
for x, y in loader:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(loss.item())
'''

SPELLINGS = {
    "index-init": ("nn.init.zeros_(self.features[0].bias)", "return self.head(self.features(x))"),
    "negative-index": ("nn.init.ones_(self.features[-2].weight)", "return self.head(self.features[-1](self.features(x)))"),
    "slice": ("pass", "h = self.features[:2](x)\n        return self.head(self.features[2:](h))"),
    "for": ("pass", "for layer in self.features:\n            x = layer(x)\n        return self.head(x)"),
    "enumerate-len": ("pass", "for i, layer in enumerate(self.features):\n            if i < len(self.features):\n"
                              "                x = layer(x)\n        return self.head(x)"),
}


def original(name: str) -> str:
    init, forward = SPELLINGS[name]
    return SCRIPT.replace("INIT", init).replace("FORWARD", forward)


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_sequence_reads_of_a_sequential_go_through_its_layers(name):
    result = engine.fix(original(name), SAFE)
    src = result.source
    assert "self.features.layers" in src, src
    for gone in ("self.features[", "in self.features:", "enumerate(self.features)", "len(self.features)"):
        assert gone not in src, (gone, src)
    if name == "slice":
        assert "nnx.Sequential(*self.features.layers[:2])(x)" in src, src
    assert not [f for f in result.remaining if f.code in ("JX004", "JX901")], result.remaining


@pytest.mark.jax
# half the spellings per run of the suite (their ports: test_sequence_reads_of_a_sequential_go_through_its_layers)
@pytest.mark.parametrize("name", fixture_slice(["index-init", "negative-index", "slice", "enumerate-len"], 2))
def test_the_port_matches_its_original_in_verify(tmp_path, name):
    src = original(name)
    port = engine.fix(src, SAFE).source
    report = verify_json(tmp_path, src, port, 3)
    assert report["passed"], (report["summary"], report["notes"])
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]
