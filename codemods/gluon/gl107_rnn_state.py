import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model


def rnn_attributes(cls: cst.ClassDef, ctx) -> dict:
    """``self.<attr>`` -> "LSTM"/"GRU" for the Gluon recurrent layers a block class builds."""
    out = {}
    for node in astutil.walk(cls.body, into_functions=True):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call):
            t = node.targets[0].target
            kind = _model.gluon_layer(node.value.func, ctx)
            if (kind in ("LSTM", "GRU", "RNN") and isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name)
                    and t.value.value == "self"):
                out[t.attr.value] = kind
    return out


class GluonRnnState(Rule):
    """
    ## What it does
    The calling conventions of Gluon's recurrent layers, for the layers a block builds
    (`self.rnn = rnn.LSTM(...)`):

    - `self.rnn.begin_state(batch_size=n, func=mx.nd.zeros, ctx=ctx)` -> `begin_state(self.rnn,
      batch_size=n, func=..., ctx=ctx)`, an emitted function that returns `[h, c]`, each
      `(layers * directions, n, hidden)`, made by `func` (`torch.zeros` by default) on `ctx`;
    - `self.rnn(x)` without states: Gluon returns the output alone, torch `(output, states)`
      -> `self.rnn(x)[0]`.

    - `begin_state(..., func=mx.nd.zeros)` (any `begin_state` call) -> `func=torch.zeros`
      (`mx.nd.ones` -> `torch.ones`): the emitted `begin_state` calls `func(shape,
      device=ctx)`.

    `begin_state` of a GRU (torch takes its state as one tensor, Gluon as a list) is reported
    for a person.

    ## Why
    torch's `nn.LSTM` has no `begin_state` and always returns the states.

    ## Fix safety
    Safe: the same zero states, the same outputs.
    """

    code = "GL107"
    name = "gluon-rnn-state"
    target = "torch"
    summary = "rnn layer begin_state(...) -> begin_state(layer, ...); layer(x) -> layer(x)[0]"
    severity = Severity.ERROR
    needs_text = ("rnn", "begin_state")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon
            from mxnet.gluon import rnn

            class LM(gluon.Block):
                def __init__(self):
                    super(LM, self).__init__()
                    self.rnn = rnn.LSTM(32, 2, input_size=16)

                def forward(self, x):
                    return self.rnn(x)

                def begin_state(self, *args, **kwargs):
                    return self.rnn.begin_state(*args, **kwargs)
            """,
            """
            from mxnet import gluon
            from mxnet.gluon import rnn
            import torch


            def begin_state(rnn, batch_size=0, func=None, ctx=None, **kwargs):
                \"\"\"Gluon's begin_state of an LSTM layer: the initial [h, c], each (layers * directions,
                batch, hidden), made by `func` (zeros by default) on `ctx`.\"\"\"
                func = func or torch.zeros
                shape = (rnn.num_layers * (2 if rnn.bidirectional else 1), batch_size, rnn.hidden_size)
                return [func(shape, device=ctx, **kwargs) for _ in range(2)]


            class LM(gluon.Block):
                def __init__(self):
                    super(LM, self).__init__()
                    self.rnn = rnn.LSTM(32, 2, input_size=16)

                def forward(self, x):
                    return self.rnn(x)[0]

                def begin_state(self, *args, **kwargs):
                    return begin_state(self.rnn, *args, **kwargs)
            """,
        ),
    ]
    valid = ["import torch.nn as nn\nh = model.begin_state(batch_size=4)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        if astutil.method_name(node) != "begin_state" and not (
                isinstance(node.func, cst.Name) and node.func.value == "begin_state"):
            return
        func = astutil.arg(node, "func")
        if func is None:
            return
        q = self.ctx.qualname(func.value)
        for ns in ("mxnet.nd.", "mxnet.ndarray."):
            if q in (ns + "zeros", ns + "ones"):
                torch, imports = _model.torch_name(self.ctx)
                new = cst.parse_expression(f"{torch}.{q.rsplit('.', 1)[1]}")
                self.report(func.value, "begin_state's func: torch's", Fix((self.replace(func.value, new),), imports=imports))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not _model.is_block_class(node, self.ctx):
            return
        rnns = rnn_attributes(node, self.ctx)
        if not rnns:
            return
        subscripted = set()
        for n in astutil.walk(node.body, into_functions=True):
            if isinstance(n, cst.Subscript):
                subscripted.add(id(n.value))
        for stmt in node.body.body:
            if not isinstance(stmt, cst.FunctionDef):
                continue
            for call in astutil.walk(stmt.body, into_functions=True):
                if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
                    continue
                f = call.func
                # self.rnn.begin_state(...)
                if (f.attr.value == "begin_state" and isinstance(f.value, cst.Attribute)
                        and isinstance(f.value.value, cst.Name) and f.value.value.value == "self"
                        and f.value.attr.value in rnns):
                    if rnns[f.value.attr.value] != "LSTM":
                        self.report(call, f"manual port needed: begin_state of a {rnns[f.value.attr.value]} "
                                    "(torch takes one state tensor)", severity=Severity.ERROR)
                        continue
                    edit, imports = _model.helpers_edit(self.ctx, ["begin_state"])
                    owner = f.value
                    self.report(call, "begin_state of a Gluon LSTM: the emitted begin_state()", Fix((
                        self.replace(call, lambda c, owner=owner: c.with_changes(
                            func=cst.Name("begin_state"), args=[cst.Arg(c.func.value), *c.args])), edit), imports=imports))
                # self.rnn(x) without states
                elif (isinstance(f.value, cst.Name) and f.value.value == "self" and f.attr.value in rnns
                      and stmt.name.value in ("forward", "hybrid_forward") and id(call) not in subscripted
                      and len([a for a in call.args if a.keyword is None and not a.star]) == 1
                      and not any(a.star for a in call.args) and not any(a.keyword for a in call.args)):
                    self.report(call, "a Gluon rnn layer called without states returns the output alone", Fix((
                        self.replace(call, lambda c: cst.Subscript(c, [cst.SubscriptElement(cst.Index(cst.Integer("0")))])),)))
