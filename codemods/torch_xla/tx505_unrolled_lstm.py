from typing import Optional

import libcst as cst

from porter.astutil import insert_before, walk
from porter.rules import Example, Fix, Rule, Severity

from ._tables import imports_torch

_LSTM = ("torch.nn.LSTM", "torch.nn.modules.rnn.LSTM")
# recurrent layers torch_xla 2.9 neither scans (it replaces nn.GRU only:
# torch_xla/_patched_functions.py, `nn.GRU = ScanGRU`) nor this rule rewrites
_UNROLLED = {"torch.nn.RNN": "nn.RNN", "torch.nn.modules.rnn.RNN": "nn.RNN"}
# cells a module steps over time in a Python loop of its own
_CELLS = ("torch.nn.LSTMCell", "torch.nn.GRUCell", "torch.nn.RNNCell",
          "torch.nn.modules.rnn.LSTMCell", "torch.nn.modules.rnn.GRUCell", "torch.nn.modules.rnn.RNNCell")

SCAN_LSTM = "XlaScanLSTM"

# The layer a fixed file defines, before the first top-level statement that builds an LSTM.
# {torch}, {F}: the file's names of torch and torch.nn.functional; {lstm}: torch.nn.LSTM. Its parameters are nn.LSTM's (same names, same state_dict).
_HELPER = '''
def _xla_lstm_step(carry, x_t):
    # one time step of an LSTM layer; x_t is the input's projection W_ih x_t + b_ih
    gates = x_t + {F}.linear(carry["h"], carry["w_hh"], carry.get("b_hh"))
    i, f, g, o = gates.chunk(4, 1)
    c = {torch}.sigmoid(f) * carry["c"] + {torch}.sigmoid(i) * {torch}.tanh(g)
    h = {torch}.sigmoid(o) * {torch}.tanh(c)
    return {{**carry, "h": h, "c": c}}, h


class {name}({lstm}):
    """nn.LSTM that runs each layer and direction as one torch_xla scan over time on an XLA
    device (the graph holds one cell, not one per time step); elsewhere, and for packed,
    unbatched or projected input, it is nn.LSTM."""

    def forward(self, input, hx=None):
        if (isinstance(input, {torch}.nn.utils.rnn.PackedSequence) or input.device.type != "xla"
                or input.dim() != 3 or self.proj_size):
            return super().forward(input, hx)
        from torch_xla.experimental.scan import scan

        x = input.transpose(0, 1) if self.batch_first else input
        directions = 2 if self.bidirectional else 1
        if hx is None:
            zeros = x.new_zeros(self.num_layers * directions, x.size(1), self.hidden_size)
            hx = (zeros, zeros)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for reverse in range(directions):
                suffix = f"_l{{layer}}" + ("_reverse" if reverse else "")
                k = layer * directions + reverse
                carry = {{"h": hx[0][k], "c": hx[1][k], "w_hh": getattr(self, "weight_hh" + suffix)}}
                if self.bias:
                    carry["b_hh"] = getattr(self, "bias_hh" + suffix)
                w_ih = getattr(self, "weight_ih" + suffix)
                b_ih = getattr(self, "bias_ih" + suffix) if self.bias else None
                xs = {F}.linear(x.flip(0) if reverse else x, w_ih, b_ih)
                last, out = scan(_xla_lstm_step, carry, xs)
                outputs.append(out.flip(0) if reverse else out)
                h_n.append(last["h"])
                c_n.append(last["c"])
            x = {torch}.cat(outputs, 2) if directions == 2 else outputs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = {F}.dropout(x, self.dropout, training=True)
        output = x.transpose(0, 1) if self.batch_first else x
        return output, ({torch}.stack(h_n), {torch}.stack(c_n))
'''


_EXAMPLE_BEFORE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = {lstm}(28, 128, num_layers=2, batch_first=True, dropout=0.1)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return F.log_softmax(out[:, -1], dim=-1)


def encoder(bidirectional):
    return {second}(10, 20, bidirectional=bidirectional)
"""


class UnrolledLstm(Rule):
    """
    ## What it does
    Rewrites `nn.LSTM(...)` layers to `XlaScanLSTM(...)`, a subclass of `nn.LSTM` the fix
    defines in the file (before the first top-level statement that builds one), whose forward
    on an XLA device runs each layer and direction as one `torch_xla.experimental.scan` over
    time. Reports `nn.RNN(...)` layers, and the loops of a module's methods that step its
    `nn.LSTMCell` / `nn.GRUCell` / `nn.RNNCell` over time by hand.

    ## Why
    On an XLA device `nn.LSTM` and `nn.RNN` are traced one time step at a time: the graph of a
    training step holds sequence length x layers (x 2 when bidirectional) copies of the cell,
    and as many in the backward pass, and XLA compiles that graph before the first step runs
    (again for each new sequence length). Measured on XLA:CPU (torch_xla 2.9, float32, 2-layer
    `nn.LSTM(28, 128)`, batch 4, forward, backward and an SGD step, a shared 2-core machine;
    torch_xla.debug.metrics' CompileTime): one compile of 28 s for sequences of 4 steps and 82
    s for 16; the tutorials' 28 steps took 4 min 41 s. The same training step with the scanned
    layer at 28 steps: two compiles of 9.9 s and 12.2 s, then 0.7 s a step. torch_xla 2.9 runs
    `nn.GRU` through `xla::scan` itself (unidirectional only) but not `nn.LSTM` or `nn.RNN`.

    ## Fix safety
    Safe: the class is `nn.LSTM` (same constructor, parameters, `state_dict` and
    `isinstance`), its forward computes nn.LSTM's equations with its weights, and it returns
    `(output, (h_n, c_n))` of nn.LSTM's shapes for `batch_first`, `bidirectional`,
    `num_layers`, `bias` and given or zero `(h_0, c_0)`: measured against `nn.LSTM` in float64,
    outputs, states and parameter gradients agree to 1e-14. Off the XLA device (the original
    run on CPU, a model kept on the host) and for `PackedSequence`, unbatched or `proj_size`
    input it calls `nn.LSTM.forward`. Between layers, dropout draws its masks with
    `F.dropout` (the same distribution as nn.LSTM's, other draws).
    """

    code = "TX505"
    name = "unrolled-lstm"
    target = "torch-xla"
    summary = "nn.LSTM -> a scan-over-time subclass defined in the file; report nn.RNN and loops stepping RNN cells (unrolled on XLA)"
    severity = Severity.WARNING
    needs_text = ("LSTM", "RNN", "GRUCell")
    examples = [
        Example(
            _EXAMPLE_BEFORE.format(lstm="nn.LSTM", second="torch.nn.modules.rnn.LSTM"),
            _EXAMPLE_BEFORE.format(lstm=SCAN_LSTM, second=SCAN_LSTM).replace("\n\n\nclass Tagger", "\n\n\n" + _HELPER.format(
                name=SCAN_LSTM, lstm="torch.nn.LSTM", torch="torch", F="F").strip("\n") + "\n\n\nclass Tagger", 1),
            title="every spelling of nn.LSTM becomes the subclass, defined once before the first",
        ),
        Example(
            """
            import torch.nn as nn

            class Tagger(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.RNN(128, 64, bidirectional=True)
            """,
            None,
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            class Sequence(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.cell = nn.LSTMCell(1, 51)
                    self.head = nn.Linear(51, 1)

                def forward(self, x):
                    h = c = x.new_zeros(x.size(0), 51)
                    outputs = []
                    for x_t in x.split(1, dim=1):
                        h, c = self.cell(x_t, (h, c))
                        outputs.append(self.head(h))
                    return torch.cat(outputs, dim=1)
            """,
            None,
            title="a cell stepped over time by the module's own loop is reported",
        ),
    ]
    valid = [
        "import torch.nn as nn\ngru = nn.GRU(28, 128)\n",
        "import torch.nn as nn\ncell = nn.LSTMCell(28, 128)\n",
        "lstm = LSTM(28, 128)\n",  # not torch's
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # a file ported before defines the class already
        self._defined = any(isinstance(s, cst.ClassDef) and s.name.value == SCAN_LSTM for s in ctx.module.body)

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.qualname(node.func) or ""
        if not imports_torch(self.ctx):
            return
        layer = _UNROLLED.get(name)
        if layer is not None:
            self.report(node, f"{layer} is unrolled over the sequence on XLA (torch_xla 2.9 scans nn.GRU only): "
                        "the step's graph holds one cell per time step and layer, forward and backward, and its "
                        "first compile grows with the sequence length; for long sequences write the recurrence "
                        "with torch_xla.experimental.scan over a cell step")
        elif name in _LSTM:
            self.report(node, "nn.LSTM is unrolled over the sequence on XLA: the step's graph holds one cell per "
                        f"time step and layer, and its first compile grows with the sequence length; {SCAN_LSTM} "
                        "is nn.LSTM with a scan over time on the XLA device", self._fix(node))

    def visit_For(self, node: cst.For) -> None:
        """A loop of a module's method that steps one of its RNN cells (`for x_t in
        x.split(1, dim=1): h, c = self.lstm1(x_t, (h, c))`): the same unrolling, written by
        hand."""
        cls = self.ctx.enclosing(cst.ClassDef)
        if cls is None or not imports_torch(self.ctx):
            return
        cells = {}
        for n in walk(cls, into_functions=True):  # type: ignore[arg-type]
            if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) \
                    and (self.ctx.qualname(n.value.func) or "") in _CELLS:
                for t in n.targets:
                    if isinstance(t.target, cst.Attribute) and isinstance(t.target.value, cst.Name) \
                            and t.target.value.value == "self":
                        cells[t.target.attr.value] = (self.ctx.qualname(n.value.func) or "").rsplit(".", 1)[-1]
        stepped = sorted({cells[c.func.attr.value] for c in walk(node.body) if isinstance(c, cst.Call)
                          and isinstance(c.func, cst.Attribute) and isinstance(c.func.value, cst.Name)
                          and c.func.value.value == "self" and c.func.attr.value in cells})
        if stepped:
            self.report(node, f"this loop steps nn.{'/'.join(stepped)} over time in Python: on XLA each iteration is "
                        "traced into the step's graph (one cell per time step, forward and backward, compiled before "
                        "the first step runs, and again for each new length); for long sequences the compile's time "
                        "and memory grow with the length: write the recurrence as torch_xla.experimental.scan(step, "
                        "carry, xs) over the time axis")

    def _fix(self, node: cst.Call) -> Fix:
        edits = [self.replace(node.func, cst.Name(SCAN_LSTM))]
        top = self._top_statement()
        if not self._defined and top is not None:
            self._defined = True
            torch = self.ctx.module_alias("torch")
            # torch.nn.functional is loaded by `import torch`: the file's name for it, or its path
            functional = self.ctx.module_names.get("torch.nn.functional", f"{torch}.nn.functional")
            helper = cst.parse_module(_HELPER.format(name=SCAN_LSTM, lstm=f"{torch}.nn.LSTM", torch=torch,
                                                     F=functional)).body
            edits.append(self.replace(top, insert_before([s.with_changes(leading_lines=_blank(2)) for s in helper])))
        return Fix(tuple(edits), imports=("torch",), description=f"nn.LSTM -> {SCAN_LSTM}")

    def _top_statement(self) -> Optional[cst.CSTNode]:
        stack = self.ctx.ancestors
        return stack[1] if len(stack) > 1 and isinstance(stack[0], cst.Module) else None


def _blank(n: int) -> list[cst.EmptyLine]:
    return [cst.EmptyLine() for _ in range(n)]
