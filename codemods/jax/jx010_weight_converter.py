from __future__ import annotations

import re

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _loop, _nnx

# NNX layers and containers a file builds models from (a factory function with no module class)
_NNX_BUILDERS = frozenset({
    "Sequential", "List", "Dict", "Linear", "Conv", "ConvTranspose", "BatchNorm", "LayerNorm",
    "GroupNorm", "Embed", "Dropout",
})
# a lazy layer (torch's Lazy*, its port TorchLazy*, Gluon's LazyDense): the converter
# materializes those from the state dict's shapes
_LAZY = re.compile(r"\b(?:Torch)?Lazy\w*\(")


def builds_layers(ctx) -> bool:
    """The file defines module classes or builds NNX / torch layers (a factory function)."""
    if _nnx.module_classes(ctx):
        return True
    for node in astutil.walk(ctx.module, into_functions=True):
        if not isinstance(node, cst.Call):
            continue
        qual = ctx.qualname(node.func) or ""
        if qual.startswith("flax.nnx.") and qual[len("flax.nnx."):] in _NNX_BUILDERS:
            return True
        if qual.startswith("torch.nn.") and qual[len("torch.nn."):] in _layers.LAYERS:
            return True
    return False


def _converter_text() -> str:
    statements = _nnx.spaced(_nnx.render("jax_weights.py.j2"))
    return cst.Module(statements).code


# the converter as the rule emits it (from templates/jax_weights.py.j2)
_AFTER = (
    "import torch.nn as nn\n"
    "import flax.nnx as nnx\n"
    "import jax.numpy as jnp\n"
    "import numpy as np\n"
    "\n"
    "class Net(nnx.Module):\n"
    "    def __init__(self, *, rngs: nnx.Rngs):\n"
    "        self.fc = nnx.Linear(4, 2, rngs=rngs)\n"
    "\n\n"
    + _converter_text()
    + "\n\n"
    "model = Net(rngs=nnx.Rngs(0))\n"
)


_SCRIPT_AFTER = (
    "import torch\n"
    "import flax.nnx as nnx\n"
    "import jax.numpy as jnp\n"
    "import numpy as np\n"
    "\n\n"
    + _converter_text()
    + "\n\n"
    "# settings\n"
    "lr = 0.1\n"
    "model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=lr)\n"
    "for epoch in range(3):\n"
    "    train(model, optimizer)\n"
)


class TorchWeightConverter(Rule):
    """
    ## What it does
    Adds to a file that defines modules or builds layers (a factory function returning an
    `nnx.Sequential` counts), after its last class (after its imports where the script
    builds an optimizer at module level before that point: the functions must exist when it
    runs; the comments above the next statement stay with it), the two functions of
    the JAX contract, as plain code (rendered from templates/jax_weights.py.j2; the port
    imports nothing from porter):

    - `load_torch_state_dict(model, state_dict)`: sets the NNX model's parameters and buffers
      from the original's `state_dict()` (numpy arrays or CPU tensors): Linear `kernel = W.T`,
      Conv `OIHW -> HWIO` (any number of spatial dims), ConvTranspose `(in, out, *k)` flipped
      to `(*k, in, out)`, BatchNorm `weight/bias/running_mean/running_var ->
      scale/bias/mean/var`, LayerNorm/GroupNorm `weight -> scale`, Embedding `weight ->
      embedding`; the parameters of your own modules (`nnx.Param`, `nnx.Variable` from
      `nn.Parameter` / `register_buffer`) and of the emitted LSTM/GRU/attention classes under
      their torch names as they are. Names follow the module tree: attributes, `nnx.List`
      and `nnx.Dict` entries, and `nnx.Sequential` layers (`features.layers.3` is torch's
      `features.3`). `num_batches_tracked` is ignored. A missing or unexpected torch key
      raises `KeyError` naming it; a shape that does not fit raises `ValueError` naming the
      key and both shapes.
    - `torch_state_dict(model)`: the inverse, numpy arrays under torch's names and layouts
      (for a gradient tree: `g = nnx.clone(model); nnx.update(g, grads); torch_state_dict(g)`).

    In a file with lazy layers (`TorchLazy*`, Gluon's `LazyDense`), `load_torch_state_dict`
    first materializes the ones not called yet from the shapes of their torch weights (as
    torch's `load_state_dict` does), and `torch_state_dict` gives None for a parameter that
    has no shape yet.

    ## Why
    The port starts from the original's weights only through a converter that knows both
    layouts; comparing the two (verification, gradients) needs the way back.

    ## Fix safety
    Safe: adds two functions. Round trip and layouts are tested on an MLP, a CNN, a ResNet,
    an LSTM language model, a Transformer classifier and a VAE against torch
    (tests/test_jax_modules_run.py).
    """

    code = "JX010"
    name = "torch-weight-converter"
    target = "jax"
    summary = "emit load_torch_state_dict / torch_state_dict (the weight converter) into the port"
    severity = Severity.ERROR
    needs_text = ("Module", "Sequential", "nnx.")
    examples = [
        Example(
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.fc = nnx.Linear(4, 2, rngs=rngs)

            model = Net(rngs=nnx.Rngs(0))
            """,
            _AFTER,
        ),
        Example(
            """
            import torch
            import flax.nnx as nnx

            # settings
            lr = 0.1
            model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for epoch in range(3):
                train(model, optimizer)
            """,
            _SCRIPT_AFTER,
            title="a script that builds its optimizer at module level: the converter goes after the imports, "
                  "defined before the optimizer is built",
        ),
    ]
    valid = ["import torch\nx = torch.zeros(2)\n"]

    def visit_Module(self, node: cst.Module) -> None:
        if "load_torch_state_dict" in astutil.top_level_names(node):
            return
        if not builds_layers(self.ctx):
            return
        lazy = bool(_LAZY.search(self.ctx.text))
        statements = _nnx.spaced(_nnx.render("jax_weights.py.j2", lazy=lazy))
        self.report(
            node,
            "the port's weight converter: load_torch_state_dict(model, state_dict) and torch_state_dict(model)",
            Fix((self.replace(node, _nnx.insert_statements(statements, "after_classes", self._optimizer_callees(node))),),
                imports=("numpy", "jax.numpy", "flax.nnx")),
        )

    def _optimizer_callees(self, node: cst.Module) -> frozenset:
        """The texts of the optimizer constructors and ``.backward`` calls of the file outside
        functions (a script that trains at module level): the converter must be defined before
        they run (the verifier loads the original's weights when the optimizer is built; a
        loop that updates by hand gets its nnx.Optimizer from JX301 in a later pass, just
        before the loop)."""
        found = {f"{_loop.nnx_name(self.ctx)}.Optimizer"}
        for stmt in node.body:
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            for n in astutil.walk(stmt):
                if isinstance(n, cst.Call) and (_loop.is_optimizer_ctor(self.ctx.qualname(n.func))
                                                or astutil.method_name(n) == "backward"):
                    found.add(_loop.code(n.func))
        return frozenset(found)

