"""Tied weights (one Parameter shared by two modules: a language model's embedding and output
layer) ported in default mode and run on XLA: the port keeps one shared Parameter through
`.to(device)` (TX203's swap flag; without it torch_xla gives each module a copy of its own and
the two train apart) and its losses are the CPU original's, step by step.

Spellings: the tie made in the model's `__init__` (`self.head.weight = self.embed.weight`), made
by the script on a built model (`model.decoder.weight = model.encoder.weight`, then
`model.cuda()`), made in a model file of its own that the training script imports, and an LSTM
language model that reloads its best state (`load_state_dict` runs with the flag off: an RNN's
weakly referenced parameters cannot be swapped), written in one file, with its model in a module of
its own (`import lm`), and in a package (`from models import RNNModel`, `models/__init__.py`
star-importing `models/rnn.py`): the script's loads run with the flag off too.
"""
import textwrap

import pytest
from scripthelp import run_script

from porter import engine, registry

pytestmark = [pytest.mark.xla, pytest.mark.slow]

_MODEL = """
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.mix(self.embed(idx))))
"""

_TRAIN = """
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = TinyLM().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
data = torch.randint(0, 11, (6, 4, 5))
for step in range(6):
    x = data[step].to(device)
    logits = model(x[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 11), x[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.6f}")
print("tied", model.head.weight is model.embed.weight)
"""

_SCRIPT_TIE = """
import torch
import torch.nn as nn


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(6, 6, bias=False)
        self.decoder = nn.Linear(6, 6, bias=False)

    def forward(self, x):
        return self.decoder(torch.relu(self.encoder(x)))


torch.manual_seed(0)
model = AutoEncoder()
model.decoder.weight = model.encoder.weight
if torch.cuda.is_available():
    model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
data = torch.randn(6, 8, 6)
for step in range(6):
    x = data[step]
    if torch.cuda.is_available():
        x = x.cuda()
    loss = ((model(x) - x) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.6f}")
print("tied", model.decoder.weight is model.encoder.weight)
"""

_LSTM_LM = """
import copy
import torch
import torch.nn as nn


class RNNModel(nn.Module):
    def __init__(self, ntoken=11, ninp=8):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight

    def forward(self, x):
        out, _ = self.rnn(self.encoder(x))
        return self.decoder(out)


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = RNNModel().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
data = torch.randint(0, 11, (6, 5, 3))
best = None
for step in range(6):
    x = data[step].to(device)
    loss = nn.functional.cross_entropy(model(x[:-1]).reshape(-1, 11), x[1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.6f}")
    if step == 2:
        best = copy.deepcopy(model.state_dict())
model.load_state_dict(best)
print("tied", model.decoder.weight is model.encoder.weight)
"""

# the LSTM language model in a module of its own, the script reloading its best state: the model
# module sets the flag; the script's loads run with it off (TX203 reads the module it imports)
_LSTM_MODEL = _LSTM_LM.split("torch.manual_seed(0)")[0]
_LSTM_SCRIPT = "import copy\nimport torch\nimport torch.nn as nn\n" + "{import}" + \
    "torch.manual_seed(0)" + _LSTM_LM.split("torch.manual_seed(0)")[1]

# name -> {file name: source}; train.py is run
PROGRAMS = {
    "tied_lstm_in_a_model_file": {"lm.py": _LSTM_MODEL, "train.py": _LSTM_SCRIPT.replace(
        "{import}", "import lm\nRNNModel = lm.RNNModel\n")},
    "tied_lstm_in_a_model_package": {"models/__init__.py": "from .rnn import *\n", "models/rnn.py": _LSTM_MODEL,
                                     "train.py": _LSTM_SCRIPT.replace("{import}", "from models import RNNModel\n")},
    "tied_in_init": {"train.py": _MODEL + _TRAIN},
    "tied_by_the_script": {"train.py": _SCRIPT_TIE},
    "tied_lstm_reloaded": {"train.py": _LSTM_LM},
    "tied_in_a_model_file": {"model.py": _MODEL, "train.py": "import torch\nimport torch.nn as nn\n"
                             "from model import TinyLM\n" + _TRAIN},
}


def _write(folder, files: dict, port: bool) -> None:
    """The program's files, or their ports (each file ported as it lies in the original's folder,
    beside the files it imports)."""
    options = engine.Options(registry.select("torch-xla"), unsafe_fixes=False)
    for name, source in files.items():
        source = textwrap.dedent(source)
        if port:
            source = engine.fix(source, options, str(folder.parent / "original" / name)).source
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(source, encoding="utf-8")


def _losses(stdout: str) -> list[float]:
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("loss ")]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_tied_weights_stay_tied_and_train_like_the_original(name, tmp_path):
    files = PROGRAMS[name]
    _write(tmp_path / "original", files, port=False)
    _write(tmp_path / "port", files, port=True)
    assert any("set_swap_module_params_on_conversion(True)" in p.read_text() for p in (tmp_path / "port").rglob("*.py"))
    original = run_script(tmp_path / "original" / "train.py", [], tmp_path / "original", xla=False)
    assert original.returncode == 0, original.stderr[-3000:]
    port = run_script(tmp_path / "port" / "train.py", [], tmp_path / "port", xla=True)
    assert port.returncode == 0, port.stderr[-3000:]
    assert "tied True" in original.stdout and "tied True" in port.stdout, port.stdout
    assert int(port.stdout.strip().splitlines()[-1].split(": ")[1]) >= 6, port.stdout  # trained on XLA
    expected, got = _losses(original.stdout), _losses(port.stdout)
    assert len(got) == len(expected) == 6
    assert got == pytest.approx(expected, abs=2e-5), (expected, got)
