"""A module that keeps state between calls on itself (a recurrent tagger's `self.hidden`, reset
by the training loop before each forward): the JAX port declares the tuple of arrays as NNX data
(JX018), the jitted step carries what the forward stores on the model without returning the
model, and `porter verify --script` matches the original (its float64 widening leaves that state
to the forward)."""
import pytest

from porter import engine, registry

from scripthelp import verify_json

ORIGINAL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self, vocab, dim, tags):
        super().__init__()
        self.dim = dim
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim)
        self.out = nn.Linear(dim, tags)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return (torch.zeros(1, 1, self.dim), torch.zeros(1, 1, self.dim))

    def forward(self, sentence):
        embeds = self.embed(sentence)
        lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)
        return F.log_softmax(self.out(lstm_out.view(len(sentence), -1)), dim=1)


torch.manual_seed(0)
model = Tagger(10, 6, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randint(0, 10, (5,)), torch.randint(0, 3, (5,))) for _ in range(4)]
for epoch in range(2):
    for sentence, tags in data:
        model.zero_grad()
        model.hidden = model.init_hidden()
        scores = model(sentence)
        loss = F.nll_loss(scores, tags)
        loss.backward()
        optimizer.step()
'''


def _port() -> str:
    return engine.fix(ORIGINAL, engine.Options(tuple(registry.rules_for("jax")))).source


def test_the_state_is_nnx_data_and_the_step_does_not_return_the_model():
    port = _port()
    assert "self.hidden = nnx.data(self.init_hidden())" in port, port
    assert "model.hidden = model.init_hidden()" in port.split("def train_step", 1)[1], port
    assert "return loss\n" in port and "loss = train_step(model, optimizer" in port, port


@pytest.mark.jax
def test_the_port_matches_the_original(tmp_path):
    report = verify_json(tmp_path, ORIGINAL, _port(), 3)
    assert report["passed"], (report["summary"], report["notes"])
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]
