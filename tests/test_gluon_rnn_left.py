"""A Gluon rnn layer porter leaves for a person keeps its MXNet import, so that the port says so
(GL105 at the layer, GL901 at the import). Before, `from mxnet.gluon import rnn` became
`from torch import nn as rnn` (or was dropped beside `nn`) whatever the file used of it, and
`rnn.RNN(16, 2, input_size=8)` or `rnn.LSTMCell(16)` became torch.nn's layer of the same name
called with Gluon's arguments: a TypeError (or a NameError) when the port ran, with no finding."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from porter import engine, registry

LEFT = {
    "rnn_alone": ("from mxnet.gluon import rnn\n"
                  "layer = rnn.RNN(16, 2, input_size=8)\n", "rnn.RNN"),
    "cell_beside_nn": ("from mxnet.gluon import nn, rnn\n"
                       "class Net(nn.Block):\n"
                       "    def __init__(self):\n"
                       "        super().__init__()\n"
                       "        self.cell = rnn.LSTMCell(16, input_size=8)\n"
                       "        self.out = nn.Dense(4, in_units=16)\n", "rnn.LSTMCell"),
    "lstm_without_input_size": ("from mxnet.gluon import nn, rnn\n"
                                "class Net(nn.Block):\n"
                                "    def __init__(self):\n"
                                "        super().__init__()\n"
                                "        self.lstm = rnn.LSTM(16)\n"
                                "        self.out = nn.Dense(4, in_units=16)\n", "rnn.LSTM"),
}


def _fix(source: str):
    return engine.fix(textwrap.dedent(source), engine.Options(registry.select("torch")))


@pytest.mark.parametrize("name", sorted(LEFT))
def test_a_layer_left_for_a_person_keeps_its_import_and_is_reported(name):
    source, layer = LEFT[name]
    result = _fix(source)
    out = result.source if result.changed else source
    cst.parse_module(out)
    assert "from mxnet.gluon import rnn" in out and "nn as rnn" not in out
    codes = {(f.code, f.position.line) for f in result.remaining if f.position is not None}
    layer_line = next(i for i, line in enumerate(out.splitlines(), 1) if layer in line)
    assert ("GL105", layer_line) in codes, result.remaining
    assert any(f.code == "GL901" and "rnn" in f.message for f in result.remaining)


def test_translated_layers_still_drop_the_import():
    source = ("from mxnet.gluon import nn, rnn\n"
              "class Net(nn.Block):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.lstm = rnn.LSTM(16, input_size=8)\n"
              "        self.gru = rnn.GRU(16, input_size=8, layout='NTC')\n")
    out = _fix(source).source
    assert "mxnet" not in out and "nn.LSTM(8, 16)" in out and "nn.GRU(8, 16, batch_first=True)" in out
