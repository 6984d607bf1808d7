"""`model.train(mode)` in a JAX port (JX322): NNX's `train()` takes no positional mode, so torch's
spellings of the switch (a literal, a keyword, a flag the caller passes, a model held by a
trainer class) become `train()` / `eval()`; a trainer's own `train(epochs)` is left alone. The
port of a script that switches modes through a flag trains and evaluates as its original."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 16)
            self.drop = nn.Dropout(0.25)
            self.fc2 = nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(self.drop(F.relu(self.fc1(x))))


    class Runner:
        def __init__(self, model):
            self.model = model

        def set_phase(self, training):
            self.model.train(mode=training)


    def train_epoch(model, loader, optimizer):
        model.train(True)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    def evaluate(net, loader, training=False):
        net.train(training)
        total = 0.0
        with torch.no_grad():
            for x, y in loader:
                total += F.cross_entropy(net(x), y).item()
        return total


    def main():
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
        loader = DataLoader(data, batch_size=16, shuffle=False)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        runner = Runner(model)
        for epoch in range(2):
            runner.set_phase(False)
            train_epoch(model, loader, optimizer)
            print("eval", evaluate(model, loader))
            model.train(False)


    if __name__ == "__main__":
        main()
''')


@pytest.fixture(scope="module")
def port() -> str:
    return engine.fix(SCRIPT, JAX).source


def test_every_spelling_of_the_mode_becomes_train_or_eval(port):
    assert "self.model.train() if training else self.model.eval()" in port  # a keyword mode, a trainer's model
    assert "net.train() if training else net.eval()" in port  # a parameter named as a model
    assert "model.train()\n" in port and "model.eval()\n" in port and "model.train(False)" not in port  # literals
    assert ".train(True)" not in port and ".train(training)" not in port, port
    assert engine.fix(port, JAX).source == port


def test_a_trainers_own_train_is_left_alone():
    src = "import torch\n\ntrainer = Trainer(cfg)\ntrainer.train(10)\nmodel = Net()\nmodel.train(True)\n"
    out = engine.fix("import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def forward(self, x):\n        return x\n\n\n"
                     + src.split("\n", 2)[2], JAX).source
    assert "trainer.train(10)" in out and "model.train()" in out, out


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
def test_the_port_trains_and_evaluates_like_its_original(port, tmp_path):
    report = verify_json(tmp_path, SCRIPT, port, 6)
    assert report["passed"], (report["summary"], report["notes"])
