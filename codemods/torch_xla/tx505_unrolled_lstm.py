import libcst as cst

from porter.rules import Example, Rule, Severity

from ._tables import imports_torch

# recurrent layers torch_xla 2.9 does not replace by a scan (it replaces nn.GRU only:
# torch_xla/_patched_functions.py, `nn.GRU = ScanGRU`)
_UNROLLED = {
    "torch.nn.LSTM": "nn.LSTM",
    "torch.nn.modules.rnn.LSTM": "nn.LSTM",
    "torch.nn.RNN": "nn.RNN",
    "torch.nn.modules.rnn.RNN": "nn.RNN",
}


class UnrolledLstm(Rule):
    """
    ## What it does
    Reports `nn.LSTM(...)` and `nn.RNN(...)` layers in a file ported to torch_xla.

    ## Why
    On an XLA device these layers are traced one time step at a time: the graph of a training
    step holds sequence length x layers (x 2 when bidirectional) copies of the cell, and as many
    in the backward pass, and XLA compiles that graph before the first step runs (again for each
    new sequence length). The compile grows with the sequence; measured on XLA:CPU (torch_xla
    2.9, float32, 2-layer `nn.LSTM(28, 128)`, batch 4, forward, backward and an SGD step, a
    shared 2-core machine at a load average of ~20; torch_xla.debug.metrics' CompileTime): one
    compile in three steps at every length, of 28 s for sequences of 4 and 8 steps and 82 s for
    16 (the steps after it: 0.3 s, 0.3 s, 0.9 s); the tutorials' 28 steps took 4 min 41 s in
    float64 at a load average of ~50. torch_xla 2.9 runs
    `nn.GRU` through `xla::scan` (an XLA While loop: one cell in the graph) but not `nn.LSTM` or
    `nn.RNN`. For long sequences, write the recurrence as `torch_xla.experimental.scan` over an
    `nn.LSTMCell` step, or expect a long first compile (and keep the sequence length fixed, so
    that it is the only one).
    """

    code = "TX505"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "unrolled-lstm"
    target = "torch-xla"
    summary = "report nn.LSTM / nn.RNN: unrolled over the sequence in the XLA graph (long compiles)"
    severity = Severity.WARNING
    needs_text = ("LSTM", "RNN")
    examples = [
        Example(
            """
            import torch.nn as nn

            class Tagger(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lstm = nn.LSTM(28, 128, num_layers=2, batch_first=True)
                    self.rnn = nn.RNN(128, 64, bidirectional=True)
            """,
            None,
        ),
    ]
    valid = [
        "import torch.nn as nn\ngru = nn.GRU(28, 128)\n",
        "import torch.nn as nn\ncell = nn.LSTMCell(28, 128)\n",
        "lstm = LSTM(28, 128)\n",  # not torch's
    ]

    def visit_Call(self, node: cst.Call) -> None:
        layer = _UNROLLED.get(self.ctx.qualname(node.func) or "")
        if layer is None or not imports_torch(self.ctx):
            return
        self.report(node, f"{layer} is unrolled over the sequence on XLA (torch_xla 2.9 scans nn.GRU only): the step's "
                    "graph holds one cell per time step and layer, forward and backward, and its first compile grows "
                    "with the sequence length; for long sequences write the recurrence with "
                    "torch_xla.experimental.scan over an nn.LSTMCell step")
