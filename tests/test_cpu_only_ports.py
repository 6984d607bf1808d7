"""A script that places nothing on a device (a CPU-only tutorial) is ported in default mode into
one that trains on the XLA device with the original's losses (TX109), or the port says, at the
line, why it stays on the CPU.

The scripts are the kinds of CPU-only training code found in tutorials, each spelled one way
of several TX109 follows: parameters updated by hand (`p -= lr * p.grad` in a loop over
`model.parameters()`, no optimizer) and a layer read back (`model[0].bias`); a model built
again to load saved weights and fed a batch of `next(iter(loader))`; inputs made by a helper
function of the file and wrapped in `autograd.Variable`, a loss summed into a tensor; a model
whose `forward` makes a tensor (a hidden state) and whose `init_hidden` makes one with no input
to follow; the loss of each step appended to a list.
"""
import textwrap

import pytest
from scripthelp import verify_json

from porter import engine, registry

from lanes import fixture_slice

pytestmark = [pytest.mark.xla, pytest.mark.slow]

SCRIPTS = {
    "manual_update": """
        import torch

        xs = torch.linspace(-1.0, 1.0, 64)
        ys = torch.cos(xs)
        powers = torch.tensor([1, 2, 3])
        feats = xs.unsqueeze(-1).pow(powers)

        net = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0, 1))
        criterion = torch.nn.MSELoss(reduction="sum")
        step_size = 1e-3
        for it in range(6):
            loss = criterion(net(feats), ys)
            print("loss", it, loss.item())
            net.zero_grad()
            loss.backward()
            with torch.no_grad():
                for w in net.parameters():
                    w -= step_size * w.grad

        first = net[0]
        print(f"bias {first.bias.item():.4f} slope {first.weight[:, 0].item():.4f}")
    """,
    "rebuilt_for_eval": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from torch.utils.data import DataLoader, TensorDataset


        class Small(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(8, 16)
                self.fc2 = nn.Linear(16, 3)

            def forward(self, x):
                return self.fc2(F.relu(self.fc1(x)))


        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        train_loader = DataLoader(data, batch_size=16, shuffle=False)
        test_loader = DataLoader(data, batch_size=16, shuffle=False)

        model = Small()
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for epoch in range(2):
            for i, batch in enumerate(train_loader):
                inputs, labels = batch
                opt.zero_grad()
                loss = loss_fn(model(inputs), labels)
                loss.backward()
                opt.step()
                print("loss", loss.item())
        torch.save(model.state_dict(), "small.pth")

        batches = iter(test_loader)
        batch_x, batch_y = next(batches)
        model = Small()
        model.load_state_dict(torch.load("small.pth"))
        _, guess = torch.max(model(batch_x), 1)
        hits = {0: 0, 1: 0, 2: 0}
        for label, pred in zip(batch_y, guess):
            if label == pred:
                hits[int(label)] += 1
        print("right", (guess == batch_y).sum().item(), hits)
    """,
    "helper_made_inputs": """
        import torch
        import torch.autograd as autograd
        import torch.nn as nn
        import torch.nn.functional as F
        import torch.optim as optim

        pairs = [("the cat sat".split(), ["D", "N", "V"]), ("a dog ran".split(), ["D", "N", "V"])]
        word_ix = {}
        for words, _ in pairs:
            for w in words:
                word_ix.setdefault(w, len(word_ix))
        tag_ix = {"D": 0, "N": 1, "V": 2}


        def encode(seq, table):
            ids = torch.zeros(len(seq), dtype=torch.long)
            for i, s in enumerate(seq):
                ids[i] = table[s]
            return ids.view(-1)


        class Tagger(nn.Module):
            def __init__(self, vocab, dim, tags):
                super().__init__()
                self.embed = nn.Embedding(vocab, dim)
                self.out = nn.Linear(dim, tags)

            def forward(self, sentence):
                return F.log_softmax(self.out(torch.tanh(self.embed(sentence))), dim=1)


        torch.manual_seed(1)
        tagger = Tagger(len(word_ix), 6, 3)
        nll = nn.NLLLoss()
        sgd = optim.SGD(tagger.parameters(), lr=0.1)
        history = []
        for epoch in range(3):
            total = torch.Tensor([0])
            for words, tags in pairs:
                tagger.zero_grad()
                scores = tagger(autograd.Variable(encode(words, word_ix)))
                loss = nll(scores, autograd.Variable(torch.LongTensor([tag_ix[t] for t in tags])))
                loss.backward()
                sgd.step()
                total += loss.data
            history.append(total)
        print(history)
    """,
    "state_made_in_forward": """
        import torch
        import torch.nn as nn


        class Rnn(nn.Module):
            def __init__(self, n_in, n_hidden, n_out):
                super().__init__()
                self.n_hidden = n_hidden
                self.cell = nn.GRUCell(n_in, n_hidden)
                self.head = nn.Linear(n_hidden, n_out)

            def init_hidden(self):
                return torch.zeros(1, self.n_hidden)

            def forward(self, seq, h):
                noise = torch.randn(seq.shape[0], self.n_hidden) * 0.01
                h = h.expand(seq.size(0), -1) + noise
                for t in range(seq.size(1)):
                    h = self.cell(seq[:, t], h)
                return self.head(h)


        torch.manual_seed(0)
        x = torch.randn(4, 5, 3)
        y = torch.randn(4, 2)
        rnn = Rnn(3, 8, 2)
        opt = torch.optim.Adam(rnn.parameters(), lr=0.01)
        losses = []
        for i in range(6):
            opt.zero_grad()
            loss = nn.functional.mse_loss(rnn(x, rnn.init_hidden()), y)
            loss.backward()
            opt.step()
            losses.append(loss)
        print([round(float(v), 4) for v in losses])
    """,
}


def _port(source: str) -> engine.FixResult:
    options = engine.Options(registry.select("torch-xla"), unsafe_fixes=False)
    return engine.fix(source, options, "train.py")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_cpu_only_script_is_placed_on_xla(name):
    result = _port(textwrap.dedent(SCRIPTS[name]))
    left = [f.message for f in result.remaining if f.code == "TX109"]
    assert not left, left
    assert "torch_xla.device()" in result.source


@pytest.mark.parametrize("name", fixture_slice(sorted(SCRIPTS), 2))  # half of them per run of the suite
def test_cpu_only_script_trains_on_xla_with_the_original_losses(name, tmp_path):
    original = textwrap.dedent(SCRIPTS[name])
    result = _port(original)
    report = verify_json(tmp_path, original, result.source, 3)
    assert report["status"] == "passed" or "losses match" in report["summary"], report["summary"]
    assert [s["ok"] for s in report["steps"]] == [True, True, True], report["summary"]
    executions = [s["executions"] for s in report["health"]["steps"]]
    assert all(e >= 1 for e in executions), executions  # every step ran XLA graphs: it trained on the device


def test_forward_makes_its_tensors_on_the_input_device():
    text = _port(textwrap.dedent(SCRIPTS["state_made_in_forward"])).source
    assert "torch.zeros(1, self.n_hidden, device=next(self.parameters()).device)" in text
    assert "torch.randn(seq.shape[0], self.n_hidden).to(seq.device) * 0.01" in text  # the CPU generator's numbers


def test_a_batch_taken_from_an_iterator_is_moved_where_the_model_takes_it():
    text = _port(textwrap.dedent(SCRIPTS["rebuilt_for_eval"])).source
    assert text.count("model = Small().to(torch_xla.device())") == 2
    assert "model(batch_x.to(torch_xla.device()))" in text
    assert "enumerate(pl.MpDeviceLoader(train_loader, torch_xla.device()))" in text


REFUSED = {
    # the hidden state kept as a plain attribute: `.to()` leaves it on the CPU
    "plain_attribute": ("""
        import torch
        import torch.nn as nn


        class Rnn(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = nn.GRUCell(3, 8)
                self.hidden = self.init_hidden()

            def init_hidden(self):
                return torch.zeros(1, 8)

            def forward(self, x):
                self.hidden = self.cell(x, self.hidden)
                return self.hidden.sum()


        rnn = Rnn()
        opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
        loss = rnn(torch.randn(1, 3))
        loss.backward()
        opt.step()
    """, "self.hidden = self.init_hidden()", "plain attribute"),
    # a tensor made in a submodule's method with nothing to take the device from
    "no_device_to_follow": ("""
        import torch
        import torch.nn as nn


        class Bias(nn.Module):
            def offset(self):
                return torch.ones(3)

            def forward(self, x):
                return x + self.offset()


        model = nn.Sequential(nn.Linear(3, 3), Bias())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            loss = model(torch.randn(2, 3)).sum()
            loss.backward()
            opt.step()
    """, "return torch.ones(3)", "cannot tell which device"),
    # a device value handed to a library porter does not know
    "handed_to_a_library": ("""
        import numpy as np
        import torch

        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 2)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        print(np.mean(model(x).detach()))
    """, "np.mean(", "np.mean"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_porter_cannot_place_is_reported_and_nothing_moves(name):
    source, line_text, words = REFUSED[name]
    result = _port(textwrap.dedent(source))
    refused = [f for f in result.remaining if f.code == "TX109"]
    assert len(refused) == 1, [f.message for f in refused]
    at = result.source.splitlines()[refused[0].position.line - 1]
    assert line_text in at and words in refused[0].message, (at, refused[0].message)
    assert ".to(torch_xla.device())" not in result.source
