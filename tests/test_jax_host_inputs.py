"""Arrays the forward pass makes from host data (a target looked up from a Python string, a row
of a Python list) are made where the jitted step is called and passed in (JX301): inside the
step a Python string cannot be a jitted argument, and NumPy would see tracers or values frozen
at the first trace. Spellings: a torch legacy constructor of a looked-up index wrapped in
`autograd.Variable` as the loss's target, `torch.tensor(..., dtype=torch.long)` of a label
index, `torch.from_numpy(np.array(row))` as the model's input; each ported in default mode and
verified against its original."""
import textwrap

import pytest
from scripthelp import verify_json

from porter import engine, registry

from lanes import fixture_slice

pytestmark = [pytest.mark.jax, pytest.mark.slow]

HEAD = """
import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
words = ["ab", "cd", "ef", "gh"]
word_ix = {w: i for i, w in enumerate(words)}
rows = [[0.5, -1.0, 2.0], [1.5, 0.0, -0.5], [0.1, 0.2, 0.3], [-1.0, 1.0, 0.0]]
model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

LOOPS = {
    "legacy_constructor_target": """
        for epoch in range(2):
            for i, word in enumerate(words):
                model.zero_grad()
                scores = F.log_softmax(model(torch.tensor([rows[i]])), dim=1)
                loss = F.nll_loss(scores, autograd.Variable(torch.LongTensor([word_ix[word]])))
                loss.backward()
                optimizer.step()
                print("loss", loss.item())
    """,
    "tensor_label": """
        for epoch in range(2):
            for row, word in zip(rows, words):
                optimizer.zero_grad()
                out = model(torch.tensor([row]))
                loss = F.cross_entropy(out, torch.tensor([word_ix[word]], dtype=torch.long))
                loss.backward()
                optimizer.step()
                print("loss", loss.item())
    """,
    "numpy_row_input": """
        for epoch in range(2):
            for i in range(len(rows)):
                optimizer.zero_grad()
                out = model(torch.from_numpy(np.array([rows[i]], dtype=np.float32)))
                loss = F.cross_entropy(out, torch.tensor([i]))
                loss.backward()
                optimizer.step()
                print("loss", loss.item())
    """,
}


def _port(source: str) -> str:
    result = engine.fix(source, engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False), "train.py")
    assert not [f for f in result.remaining if f.code in ("JX301", "JX901")], \
        [(f.code, f.message) for f in result.remaining]
    return result.source


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_host_made_arrays_are_passed_into_the_step(name):
    port = _port(HEAD + textwrap.dedent(LOOPS[name]))
    step = port[port.index("def train_step("):port.index("    return ", port.index("def train_step("))]
    assert "word_ix" not in step and "rows" not in step, step  # the lookups run on the host
    assert "_array" in step.splitlines()[0], step.splitlines()[0]  # ... and come in as arguments


@pytest.mark.parametrize("name", fixture_slice(sorted(LOOPS), 2))  # half of them per run of the suite
def test_the_port_matches_its_original_in_verify(name, tmp_path):
    original = HEAD + textwrap.dedent(LOOPS[name])
    port = _port(original)
    report = verify_json(tmp_path, original, port, 3)
    assert report["status"] == "passed", report["summary"]
