from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _nnx


class NnxLayer(Rule):
    """
    ## What it does
    Rewrites the construction of torch.nn layers into Flax NNX, with torch's semantics written
    out where Flax's defaults differ (the table is `codemods/jax/_layers.py`):

    - `nn.Linear(a, b, bias=False)` -> `nnx.Linear(a, b, use_bias=False, rngs=rngs)`;
      `nn.LayerNorm(d)` -> `nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)` (Flax's default is 1e-6);
      `nn.Embedding(n, d)` -> `nnx.Embed(n, d, rngs=rngs)`; `nn.Dropout(p)` ->
      `nnx.Dropout(p, rngs=rngs)` (`Dropout2d`: `broadcast_dims=(2, 3)`, whole channels).
    - Layers whose layout or semantics differ in NNX become small classes emitted into the
      port (rule JX011) that take torch's own arguments: `nn.Conv1d/2d/3d` ->
      `TorchConv2d(...)` (an `nnx.Conv` with torch's zero padding, stride, dilation, groups,
      applied to NCHW input through explicit transposes), `nn.ConvTranspose2d` ->
      `TorchConvTranspose2d`, `nn.BatchNorm1d/2d/3d` -> `TorchBatchNorm` (an `nnx.BatchNorm`
      over axis 1 with momentum `1 - 0.1`, eps 1e-5 and torch's unbiased running variance),
      `nn.GroupNorm` -> `TorchGroupNorm`, `nn.MaxPool2d` / `nn.AvgPool2d`
      (`count_include_pad`) / `nn.AdaptiveAvgPool2d` on NCHW, `nn.Embedding(padding_idx=i)` ->
      `TorchEmbedding` (no gradient into the padding row), `nn.LSTM` / `nn.GRU` /
      `nn.MultiheadAttention` with torch's parameter layout and gate order.
    - Stateless layers become functions: `nn.ReLU()` -> `nnx.relu`, `nn.GELU()` ->
      `functools.partial(nnx.gelu, approximate=False)` (jax's default is the tanh
      approximation), `nn.Softmax(dim=1)` -> `functools.partial(nnx.softmax, axis=1)`,
      `nn.Flatten()` -> `lambda x: x.reshape(x.shape[0], -1)`, `nn.Identity()` -> `lambda x: x`.

    Layers and arguments without a faithful translation (`ceil_mode=True`, a bidirectional
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
    valid = [
        "import flax.nnx as nnx\nfc = nnx.Linear(2, 3, rngs=nnx.Rngs(0))\n",
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        self.pool = nn.MaxPool2d(2, ceil_mode=True)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if not qual:
            return
        result = _layers.plan(node, qual, self.ctx)
        if result is None or isinstance(result, _layers.Manual):
            return
        if _layers.inside_manual_construct(self.ctx):
            return  # part of a construction left for a manual port (JX090)
        if result.rngs and not _nnx.in_rngs_scope(self.ctx):
            return  # built outside a module class or factory: JX090 reports it
        self.report(
            node,
            f"{_nnx.code(node.func)}(...) -> {_nnx.code(result.new.func) if isinstance(result.new, cst.Call) else _nnx.code(result.new)}: "
            "the Flax NNX layer with torch's semantics",
            Fix((self.replace(node, result.new),), imports=result.imports,
                remove_imports=(("torch.nn", None), ("torch", "nn"), ("torch", None))),
        )
