"""`porter verify --script` gives both sides the same dropout masks for the channel dropouts
(`nn.Dropout2d`, `F.dropout2d`, `nn.Dropout1d`), on the torch-xla and the JAX port alike: a
classic MNIST-style CNN with `Dropout2d` after its convolutions diverged at step 1 (the CPU
original drew its masks with torch's native kernel, the XLA port with XLA's generator). The
dropout inside an RNN kernel cannot be aligned: the report says so."""
import textwrap

import pytest
import torch

from porter import engine, registry

from scripthelp import verify_json

from lanes import fixture_slice

ORIGINAL = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3)
            self.conv2 = nn.Conv2d(4, 8, 3)
            self.drop = nn.Dropout2d(0.25)
            self.fc = nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.dropout2d(F.relu(self.conv2(x)), 0.1, training=self.training)
            x = self.drop(F.max_pool2d(x, 2))
            return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument('--no-cuda', action='store_true', default=False)
        args = parser.parse_args()
        use_cuda = not args.no_cuda and torch.cuda.is_available()
        device = torch.device('cuda' if use_cuda else 'cpu')
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 1, 12, 12), torch.randint(0, 10, (64,)))
        loader = DataLoader(data, batch_size=16, shuffle=True)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print('loss', loss.item())


    if __name__ == '__main__':
        main()
''').lstrip("\n")


# the same net with a Dropout2d after its first Linear (2-D input: torch zeroes whole rows, with a
# deprecation warning; an RNN classifier's head): nnx.Dropout's broadcast_dims=(2, 3) raised there
ORIGINAL_2D = ORIGINAL.replace(
    "        self.fc = nn.Linear(8 * 4 * 4, 10)\n",
    "        self.fc = nn.Linear(8 * 4 * 4, 10)\n        self.head_drop = nn.Dropout2d(0.5)\n").replace(
    "F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)", "F.log_softmax(self.head_drop(self.fc(torch.flatten(x, 1))), dim=1)")


def _verify(tmp_path, target: str, original: str = ORIGINAL) -> dict:
    port = engine.fix(original, engine.Options(tuple(registry.rules_for(target))), "train.py").source
    return verify_json(tmp_path, original, port, 3, port_name=f"port_{target.replace('-', '_')}.py")


# each target per run of the suite (the JAX side with one of its two inputs; both with
# PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("target,original", [pytest.param("torch-xla", ORIGINAL, marks=pytest.mark.xla)] + fixture_slice([
    pytest.param("jax", ORIGINAL_2D, marks=pytest.mark.jax, id="jax-2d-input"),
    pytest.param("jax", ORIGINAL, marks=pytest.mark.jax)], 2))
def test_channel_dropout_masks_are_the_same_on_both_sides(tmp_path, target, original):
    assert "head_drop(self.fc(" in ORIGINAL_2D and "self.head_drop = " in ORIGINAL_2D
    report = _verify(tmp_path, target, original)
    assert report["passed"], report["summary"]
    assert report["settings"]["dtype"] == "float64"
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]


def test_channel_dropout_noise_shape():
    from porter.verify.trace import _channel_dropout_shape

    assert _channel_dropout_shape((8, 4, 5, 5), 2) == (8, 4, 1, 1)
    assert _channel_dropout_shape((4, 5, 5), 2) == (4, 1, 1)  # unbatched: one draw per channel
    assert _channel_dropout_shape((8, 4, 7), 1) == (8, 4, 1)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_an_rnn_run_layer_by_layer_is_the_fused_kernel(cls, batch_first, bidirectional):
    """Without its dropout, the layer-by-layer run under HostRandomMode gives the fused kernel's
    outputs and states exactly: only where the dropout is drawn changes."""
    from porter.verify.trace import HostRandomMode

    torch.manual_seed(0)
    model = cls(4, 6, num_layers=3, dropout=0.4, batch_first=batch_first, bidirectional=bidirectional).double()
    fused = cls(4, 6, num_layers=3, batch_first=batch_first, bidirectional=bidirectional).double()
    fused.load_state_dict(model.state_dict())
    x = torch.randn(5, 2, 4, dtype=torch.float64)
    mode = HostRandomMode()
    mode._dropout = lambda x, p=0.5, training=True, inplace=False: x
    with mode:
        out, state = model(x)
    want, want_state = fused(x)
    assert torch.equal(out, want)
    for a, b in zip(state if isinstance(state, tuple) else (state,), want_state if isinstance(want_state, tuple)
                    else (want_state,)):
        assert torch.equal(a, b)


LM = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class LM(nn.Module):
        def __init__(self, vocab=20, size=16):
            super().__init__()
            self.embed = nn.Embedding(vocab, size)
            self.rnn = nn.RNNKIND(size, size, num_layers=2, dropout=0.3, batch_first=BATCH_FIRST)
            self.out = nn.Linear(size, vocab)

        def forward(self, x):
            h, _ = self.rnn(self.embed(x))
            return self.out(h)


    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.manual_seed(0)
    model = LM().to(device)
    lr = 0.5
    model.train()
    for i in range(4):
        tokens = torch.randint(0, 20, (4, 7), device=device)
        model.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 20), tokens[:, 1:].reshape(-1))
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
''').lstrip("\n")


# each target and each layer once per run of the suite (all four pairs with PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("target,kind,batch_first", fixture_slice([
    pytest.param(target, kind, batch_first, marks=getattr(pytest.mark, "xla" if target == "torch-xla" else "jax"))
    for target in ("torch-xla", "jax") for kind, batch_first in (("LSTM", True), ("GRU", False))], 3))
def test_dropout_between_rnn_layers_is_the_same_on_both_sides(tmp_path, target, kind, batch_first):
    """A word-level LM whose multi-layer LSTM/GRU drops out between its layers, trained by
    manual SGD: it diverged at step 1 (the kernel drew its masks on each side's own
    generator); the masks are now drawn on the host between the layers on both sides."""
    original = LM.replace("RNNKIND", kind).replace("BATCH_FIRST", str(batch_first))
    port = engine.fix(original, engine.Options(tuple(registry.rules_for(target))), "train.py").source
    report = verify_json(tmp_path, original, port, 3)
    assert report["passed"], report["summary"]
    assert report["settings"]["dtype"] == "float64"
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]


@pytest.mark.jax
def test_an_rnn_chosen_by_name_ports_and_matches(tmp_path):
    """The word-level LM spelling `if rnn_type in ['LSTM', 'GRU']: getattr(nn, rnn_type)(...)`:
    the JAX port builds the emitted TorchLSTM through a table of the allowed names (it kept
    torch's LSTM, given JAX arrays: "LinearizeTracer has no attribute dim")."""
    original = LM.replace("RNNKIND", "LSTM").replace("BATCH_FIRST", "False").replace(
        "def __init__(self, vocab=20, size=16):", "def __init__(self, vocab=20, size=16, rnn_type='LSTM'):").replace(
        "self.rnn = nn.LSTM(size, size,",
        "if rnn_type in ['LSTM', 'GRU']:\n            self.rnn = getattr(nn, rnn_type)(size, size,")
    port = engine.fix(original, engine.Options(tuple(registry.rules_for("jax"))), "train.py").source
    assert "{'LSTM': TorchLSTM, 'GRU': TorchGRU}[rnn_type](" in port, port
    report = verify_json(tmp_path, original, port, 3)
    assert report["passed"], report["summary"]
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]



# attention dropout, three spellings in one model: nn.TransformerEncoderLayer (its
# MultiheadAttention with need_weights=False: scaled_dot_product_attention's dropout_p), a
# MultiheadAttention asked for its weights (F.dropout of the weights), and
# F.scaled_dot_product_attention called with dropout_p and is_causal
ATTENTION = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.embed = nn.Embedding(20, d)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 2, 32, dropout=0.2, batch_first=True), 1)
            self.attn = nn.MultiheadAttention(d, 2, dropout=0.3, batch_first=True)
            self.qkv = nn.Linear(d, 3 * d)
            self.head = nn.Linear(d, 4)

        def forward(self, tokens):
            x = self.encoder(self.embed(tokens))
            x = x + self.attn(x, x, x, need_weights=True)[0]
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            x = x + F.scaled_dot_product_attention(q, k, v, dropout_p=0.25 if self.training else 0.0, is_causal=True)
            return self.head(x.mean(1))


    def main():
        torch.manual_seed(0)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        data = TensorDataset(torch.randint(0, 20, (32, 6)), torch.randint(0, 4, (32,)))
        loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
        model = Net().to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        model.train()
        for tokens, labels in loader:
            tokens, labels = tokens.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(tokens), labels)
            loss.backward()
            optimizer.step()


    if __name__ == '__main__':
        main()
''').lstrip("\n")


@pytest.mark.xla
def test_attention_dropout_masks_are_the_same_on_both_sides(tmp_path):
    report = _verify(tmp_path, "torch-xla", ATTENTION)
    assert report["passed"], report["summary"]
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]
