"""Packing a batch into a PackedSequence for an RNN is an error in a torch-xla port, reported at
the line (TX502): its shape follows the data, and torch_xla's RNNs reject it (its nn.GRU asserts
"PackedSequence is not supported"; the LSTM fails on it), which crashed ports with no finding."""
from __future__ import annotations

import pytest

from porter import engine, registry

DEFAULT = engine.Options(tuple(registry.rules_for("torch-xla")))


@pytest.mark.parametrize("src,line", [
    ("import torch\nfrom torch.nn.utils.rnn import pack_padded_sequence\n\n"
     "packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)\nout, h = rnn(packed)\n", 4),
    ("import torch.nn as nn\n\nout, h = rnn(nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False))\n", 3),
    ("import torch\n\n\ndef forward(self, x, n):\n    p = torch.nn.utils.rnn.pack_padded_sequence(x, n.cpu())\n"
     "    return self.gru(p)\n", 5),
])
def test_packing_is_an_error_at_its_line(src, line):
    found = [f for f in engine.fix(src, DEFAULT).remaining if f.code == "TX502"]
    assert [(f.position.line, f.severity.name) for f in found] == [(line, "ERROR")], found
    assert "PackedSequence" in found[0].message and "padded batch" in found[0].message


def test_padding_alone_is_not_packing():
    src = "import torch\nfrom torch.nn.utils.rnn import pad_sequence\n\nx = pad_sequence(seqs, batch_first=True)\n"
    assert not [f for f in engine.fix(src, DEFAULT).remaining if f.code == "TX502"]
