from __future__ import annotations

import dataclasses
import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _nnx


class NnxLayer(Rule):
    """
    ## What it does
    Rewrites the construction of torch.nn layers into Flax NNX, with torch's semantics written
    out where Flax's defaults differ (the table is `codemods/jax/_layers.py`). A layer chosen by
    name, `getattr(nn, name)(...)`, is translated where the name is a literal or the body of
    `if name in ['LSTM', 'GRU']:` allows only literals whose translations differ in the class
    alone (`{'LSTM': TorchLSTM, 'GRU': TorchGRU}[name](..., rngs=rngs)`):

    - `nn.Linear(a, b, bias=False)` -> `nnx.Linear(a, b, use_bias=False, rngs=rngs)`;
      `nn.LayerNorm(d)` -> `nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)` (Flax's default is 1e-6);
      `nn.Embedding(n, d)` -> `nnx.Embed(n, d, rngs=rngs)`; `nn.Dropout(p)` ->
      `nnx.Dropout(p, rngs=rngs)` (`Dropout1d/2d/3d`: `TorchDropoutNd(p, n, rngs=rngs)`, whole channels, on
      any rank of input torch takes).
    - Layers whose layout or semantics differ in NNX become small classes emitted into the
      port (rule JX011) that take torch's own arguments: `nn.Conv1d/2d/3d` ->
      `TorchConv2d(...)` (an `nnx.Conv` with torch's zero padding, stride, dilation, groups,
      applied to NCHW input through explicit transposes), `nn.ConvTranspose2d` ->
      `TorchConvTranspose2d`, `nn.BatchNorm1d/2d/3d` -> `TorchBatchNorm` (an `nnx.BatchNorm`
      over axis 1 with momentum `1 - 0.1`, eps 1e-5 and torch's unbiased running variance),
      `nn.GroupNorm` -> `TorchGroupNorm`, `nn.MaxPool1d/2d/3d` / `nn.AvgPool1d/2d/3d` /
      `nn.AdaptiveAvgPool1d/2d/3d` / `nn.AdaptiveMaxPool1d/2d/3d` on channels-first input with
      torch's output sizes (`ceil_mode`), divisors (`count_include_pad`, `divisor_override`)
      and overlapping adaptive windows, `nn.Embedding(padding_idx=i)` ->
      `TorchEmbedding` (no gradient into the padding row), `nn.LSTM` / `nn.GRU` /
      `nn.MultiheadAttention` with torch's parameter layout and gate order. torch's lazy
      layers (`nn.LazyLinear`, `nn.LazyConv1d/2d/3d`, `nn.LazyConvTranspose1d/2d/3d`,
      `nn.LazyBatchNorm1d/2d/3d`) -> `TorchLazyLinear` / `TorchLazyConv2d` / ... /
      `TorchLazyBatchNorm`: their parameters are made at the first
      eager call from the input's size, or by `load_torch_state_dict` from the state dict's
      shapes (as torch's `load_state_dict` materializes lazy modules).
    - Stateless layers become functions: `nn.ReLU()` -> `nnx.relu`, `nn.GELU()` ->
      `functools.partial(nnx.gelu, approximate=False)` (jax's default is the tanh
      approximation), `nn.Softmax(dim=1)` -> `functools.partial(nnx.softmax, axis=1)`,
      `nn.Flatten()` -> `lambda x: x.reshape(x.shape[0], -1)`, `nn.Identity()` -> `lambda x: x`.

    Layers built by script code (outside module classes, factory functions and methods)
    draw their parameters from a local `rngs = nnx.Rngs(seed)` inserted once before the
    first such statement of the scope, seeded with the scope's `torch.manual_seed` argument
    (else 0).

    `*args` / `**kwargs` of a construction (`nn.Conv2d(cin, cout, bias=False, **kwargs)`) go
    as they are to an emitted class whose parameters are torch's and which raises at run time
    on the values it does not translate (a padding mode, `return_indices=True`); the other
    layers with star arguments are reported by JX090.

    Layers and arguments without a faithful translation (`return_indices=True`, a bidirectional
    LSTM, grouped transposed convolutions...) are left alone and reported by JX090.

    ## Why
    NNX layers differ from torch's in their defaults (Conv padding 'SAME', LayerNorm epsilon
    1e-6, BatchNorm momentum 0.99 and biased running variance, tanh-approximated GELU), in
    their layout (channels-last convolutions and pooling) and in their parameter layout (LSTM
    gates). Written out, the port computes what the original computes, and the weight
    converter (JX010) maps the original's weights onto it.

    ## Fix safety
    Safe: each translation was checked against torch (outputs, gradients and running
    statistics) in tests/test_jax_modules.py. Initial weights are drawn by Flax's
    initializers, not torch's: load the original's state dict with `load_torch_state_dict` to
    start from the same weights.
    """

    code = "JX002"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-layer"
    target = "jax"
    summary = "torch.nn layers -> Flax NNX layers with torch's semantics made explicit"
    severity = Severity.ERROR
    needs_text = ("nn",)
    examples = [
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(784, 10, bias=False)
                    self.norm = nn.LayerNorm(10)
                    self.drop = nn.Dropout(0.1)
                    self.act = nn.GELU()
            """,
            """
            import torch.nn as nn
            import functools
            import flax.nnx as nnx

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nnx.Linear(784, 10, use_bias=False, rngs=rngs)
                    self.norm = nnx.LayerNorm(10, epsilon=1e-5, rngs=rngs)
                    self.drop = nnx.Dropout(0.1, rngs=rngs)
                    self.act = functools.partial(nnx.gelu, approximate=False)
            """,
            title="layers with an NNX counterpart: torch's defaults written out",
        ),
        Example(
            """
            from torch import nn

            class Block(nn.Module):
                def __init__(self, cin, cout, stride=1):
                    super().__init__()
                    self.conv = nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)
                    self.bn = nn.BatchNorm2d(cout)
                    self.relu = nn.ReLU(inplace=True)
                    self.pool = nn.MaxPool2d(2)
            """,
            """
            from torch import nn
            import flax.nnx as nnx

            class Block(nn.Module):
                def __init__(self, cin, cout, stride=1):
                    super().__init__()
                    self.conv = TorchConv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False, rngs=rngs)
                    self.bn = TorchBatchNorm(cout, rngs=rngs)
                    self.relu = nnx.relu
                    self.pool = TorchMaxPool2d(2)
            """,
            title="channels-first layers: classes with torch's arguments (emitted by JX011)",
        ),
    ]
    examples = [*examples, Example(
        """
        import torch
        import torch.nn as nn

        torch.manual_seed(args.seed)
        model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
        """,
        """
        import torch
        import torch.nn as nn
        import flax.nnx as nnx

        torch.manual_seed(args.seed)
        rngs = nnx.Rngs(args.seed)
        model = nn.Sequential(nnx.Linear(784, 128, rngs=rngs), nnx.relu, nnx.Linear(128, 10, rngs=rngs))
        """,
        title="layers built by script code: a local nnx.Rngs from the script's seed",
    ), Example(
        """
        import torch.nn as nn

        class ConvBN(nn.Module):
            def __init__(self, cin, cout, *args, **kwargs):
                super().__init__()
                self.conv = nn.Conv2d(cin, cout, *args, bias=False, **kwargs)
                self.pool = nn.AvgPool2d(**kwargs)
                self.bn = nn.BatchNorm2d(cout, **kwargs)
        """,
        """
        import torch.nn as nn

        class ConvBN(nn.Module):
            def __init__(self, cin, cout, *args, **kwargs):
                super().__init__()
                self.conv = TorchConv2d(cin, cout, *args, bias=False, **kwargs, rngs=rngs)
                self.pool = TorchAvgPool2d(**kwargs)
                self.bn = nn.BatchNorm2d(cout, **kwargs)
        """,
        title="*args / **kwargs go to an emitted class that takes torch's arguments and checks the values it does not translate (not to BatchNorm, whose momentum=None would pass unseen)",
    ), Example(
        """
        import torch.nn as nn

        class RNNModel(nn.Module):
            def __init__(self, rnn_type, ninp, nhid, nlayers, dropout=0.5):
                super().__init__()
                if rnn_type in ['LSTM', 'GRU']:
                    self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
                self.act = getattr(nn, 'Tanh')()
        """,
        """
        import torch.nn as nn
        import flax.nnx as nnx

        class RNNModel(nn.Module):
            def __init__(self, rnn_type, ninp, nhid, nlayers, dropout=0.5):
                super().__init__()
                if rnn_type in ['LSTM', 'GRU']:
                    self.rnn = {'LSTM': TorchLSTM, 'GRU': TorchGRU}[rnn_type](ninp, nhid, nlayers, dropout=dropout, rngs=rngs)
                self.act = nnx.tanh
        """,
        title="a layer chosen by name (`getattr(nn, rnn_type)`): the names an `if ... in [...]` allows, "
              "when their translations differ only in the class",
    )]
    valid = [
        "import flax.nnx as nnx\nfc = nnx.Linear(2, 3, rngs=nnx.Rngs(0))\n",
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        self.pool = nn.MaxPool2d(2, return_indices=True)\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._streams: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if not qual:
            result = self._by_name(node)
            if result is None:
                return
        else:
            result = _layers.plan(node, qual, self.ctx)
        if result is None or isinstance(result, _layers.Manual):
            return
        if _layers.inside_manual_construct(self.ctx):
            return  # part of a construction left for a manual port (JX090)
        edits = [self.replace(node, result.new)]
        imports = result.imports
        if result.rngs and not _nnx.in_rngs_scope(self.ctx):
            where = _nnx.scope_statement(self.ctx)
            if where is None:
                return  # in a class body or a method that is not __init__: JX090 reports it
            scope, anchor = where
            # script code building layers: a local stream, seeded like the script (once per scope)
            if id(scope) not in self._streams:
                self._streams.add(id(scope))
                nnx = _nnx.nnx_name(self.ctx)
                line = cst.parse_statement(f"rngs = {nnx}.Rngs({_nnx.seed_in(scope, anchor, self.ctx)})")
                edits.append(self.replace(anchor, astutil.insert_before([line])))
                imports = (*imports, "flax.nnx")
        self.report(
            node,
            f"{_nnx.code(node.func)}(...) -> {_nnx.code(result.new.func) if isinstance(result.new, cst.Call) else _nnx.code(result.new)}: "
            "the Flax NNX layer with torch's semantics",
            Fix(tuple(edits), imports=imports,
                remove_imports=(("torch.nn", None), ("torch", "nn"), ("torch", None))),
        )

    def _by_name(self, node: cst.Call):
        """A layer chosen by name, `getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)`:
        its plan when the names it can take are literals (`getattr(nn, 'GRU')`, or the body of
        `if rnn_type in ['LSTM', 'GRU']:`) whose translations differ only in the class, as
        `{'LSTM': TorchLSTM, 'GRU': TorchGRU}[rnn_type](...)`; None otherwise."""
        getter = node.func
        if not (isinstance(getter, cst.Call) and isinstance(getter.func, cst.Name) and getter.func.value == "getattr"
                and len(getter.args) == 2 and self.ctx.qualname(getter.args[0].value) == "torch.nn"):
            return None
        which = getter.args[1].value
        names = _literal_names(which, self.ctx, node)
        if not names:
            return None
        plans = []
        for name in names:
            synthetic = node.with_changes(func=cst.Attribute(getter.args[0].value, cst.Name(name)))
            planned = _layers.plan(synthetic, f"torch.nn.{name}", self.ctx)
            if planned is None or isinstance(planned, _layers.Manual):
                return None
            plans.append(planned)
        first = plans[0]
        if len(names) == 1:
            return first
        if not all(isinstance(p.new, cst.Call) for p in plans):
            return None
        calls = [p.new for p in plans]
        if any(_nnx.code(c.with_changes(func=cst.Name("_"))) != _nnx.code(calls[0].with_changes(func=cst.Name("_")))
               or p.rngs != first.rngs for c, p in zip(calls, plans)):
            return None  # the arguments translate differently: reported (JX901)
        table = cst.parse_expression("{" + ", ".join(f"{n!r}: {_nnx.code(c.func)}" for n, c in zip(names, calls)) + "}")
        new = calls[0].with_changes(func=cst.Subscript(table, [cst.SubscriptElement(cst.Index(which))]))
        imports = tuple(dict.fromkeys(i for p in plans for i in p.imports))
        return dataclasses.replace(first, new=new, imports=imports)


def _literal_names(which: cst.BaseExpression, ctx, node: cst.CSTNode) -> list[str]:
    """The names a `getattr(nn, which)` can take: a string literal, or the literals of an
    enclosing `if which in [...]:` whose body holds the call."""
    if isinstance(which, cst.SimpleString):
        return [which.evaluated_value] if isinstance(which.evaluated_value, str) else []
    text = _nnx.code(which)
    inner = node
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.If) and anc.body is inner \
                and isinstance(anc.test, cst.Comparison) and len(anc.test.comparisons) == 1 \
                and isinstance(anc.test.comparisons[0].operator, cst.In) and _nnx.code(anc.test.left) == text:
            options = anc.test.comparisons[0].comparator
            if isinstance(options, (cst.List, cst.Tuple, cst.Set)) and all(
                    isinstance(e.value, cst.SimpleString) for e in options.elements):
                return [e.value.evaluated_value for e in options.elements]
            return []
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
            return []
        inner = anc
    return []
