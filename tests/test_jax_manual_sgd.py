"""JX204 in whole ports: hand-written SGD updates, in several spellings, become an optimizer and
then one jitted train step (JX201, JX301) with nothing of torch's autograd left; a rate the
script changes is reported and the loop left alone. fixtures/jax/manual_sgd runs one such port
against its original."""
import textwrap

import pytest

from porter import engine, registry

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=True)

HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


model = Net()
learning_rate = 0.05
'''

UPDATES = {
    "isub-no-grad": "    with torch.no_grad():\n        for p in model.parameters():\n            p -= learning_rate * p.grad\n",
    "data-isub": "    for p in model.parameters():\n        p.data -= learning_rate * p.grad.data\n",
    "add-alpha": "    for p in model.parameters():\n        p.data.add_(p.grad, alpha=-learning_rate)\n",
    "add-old-api": "    for f in model.parameters():\n        f.data.add_(-learning_rate, f.grad.data)\n",
    "sub": "    for p in model.parameters():\n        p.data.sub_(p.grad * learning_rate)\n",
    "assign": "    for w in model.parameters():\n        w.data = w.data - learning_rate * w.grad\n",
    "literal-rate-and-zero": "    with torch.no_grad():\n        for p in model.parameters():\n            p.sub_(0.05 * p.grad)\n            p.grad.zero_()\n",
    "grad-none": "    for p in model.parameters():\n        p.data.add_(-learning_rate * p.grad)\n        p.grad = None\n",
}


def script(update: str, zero: str = "    model.zero_grad()\n") -> str:
    loop = "for x, y in loader:\n" + zero + "    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n" + update
    return HEAD + loop


@pytest.mark.parametrize("name", list(UPDATES))
def test_manual_update_becomes_the_jitted_step(name):
    zero = "" if "zero" in name or "none" in name else "    model.zero_grad()\n"
    result = engine.fix(script(UPDATES[name], zero), JAX)
    src = result.source
    assert "def train_step(model, optimizer, x, y):" in src, src
    assert "optax.sgd(learning_rate)" in src or "optax.sgd(0.05)" in src, src
    for gone in (".backward()", ".grad", "zero_grad", "model.parameters()"):
        assert gone not in src, (gone, src)
    assert not [f for f in result.remaining if f.code in ("JX204", "JX301", "JX901")], result.remaining
    compile(src, "<port>", "exec")


def test_a_rate_the_script_changes_is_reported():
    src = HEAD + textwrap.dedent("""
        for epoch in range(3):
            for x, y in loader:
                model.zero_grad()
                F.cross_entropy(model(x), y).backward()
                for p in model.parameters():
                    p.data -= learning_rate * p.grad
            learning_rate = learning_rate * 0.5
    """)
    result = engine.fix(src, JAX)
    found = [f for f in result.remaining if f.code == "JX204"]
    assert found and "rate the script changes" in found[0].message, result.remaining
    assert "for p in model.parameters():  # porter: manual" in result.source
    assert any(f.code == "JX901" and "backward" in f.message for f in result.remaining), result.remaining
