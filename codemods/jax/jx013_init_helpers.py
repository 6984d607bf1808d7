from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx
from ._nnx import INITS

# the emitted helpers each init_* function needs
_NEEDS = {
    "init_xavier_uniform_": ("_torch_fans",), "init_xavier_normal_": ("_torch_fans",),
    "init_kaiming_uniform_": ("_torch_fans", "_torch_gain"), "init_kaiming_normal_": ("_torch_fans", "_torch_gain"),
}
HELPERS = ("init_torch_param_", "torch_named_parameters", *(f"init_{n}" for n in INITS))


class NnxInitHelpers(Rule):
    """
    ## What it does
    Defines, once per file, the `init_*` functions the port's weight initialisation uses
    (JX012: `init_kaiming_normal_(m, "weight", mode="fan_out", key=rngs.params())`...), after
    the file's last class. Only the functions the file uses are emitted. Each has torch's
    signature with the tensor split into its module and torch's parameter name, draws in
    torch's layout (fan_in / fan_out as `torch.nn.init` computes them, `calculate_gain`'s
    gains) and stores the values in the NNX layout with `init_torch_param_`, which finds the
    NNX variable holding torch's parameter through the weight converter's `_torch_layout`
    (JX010). `torch_named_parameters(model)` (JX012's port of a `self.named_parameters()`
    init loop) yields torch's parameter names with the (layer, torch parameter name) pairs.

    ## Why
    The same distributions as torch's, written once in the port instead of at every call.

    ## Fix safety
    Safe: adds definitions only. Tested against torch's fans and gains in
    tests/test_jax_init.py.
    """

    code = "JX013"
    name = "nnx-init-helpers"
    target = "jax"
    summary = "emit the init_* functions (torch.nn.init on NNX layers) the port uses"
    severity = Severity.ERROR
    needs_text = ("init_",)
    examples = [
        Example(
            '''
            import flax.nnx as nnx

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.fc = nnx.Linear(8, 2, rngs=rngs)
                    init_zeros_(self.fc, "bias")
            ''',
            '''
            import flax.nnx as nnx
            import jax
            import math
            import jax.numpy as jnp
            import numpy as np

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.fc = nnx.Linear(8, 2, rngs=rngs)
                    init_zeros_(self.fc, "bias")


            def init_torch_param_(module, name, sample):
                """torch.nn.init on an NNX layer of this port: set torch's parameter `name` of `module`
                (a Linear's `weight` is its kernel, transposed; a BatchNorm's `weight` its scale) to
                `sample(shape, dtype)`, drawn in torch's layout (so fan_in / fan_out are torch's) and
                stored in the NNX layout. Runs eagerly (in __init__), not under jit."""
                for torch_name, variable, to_nnx, to_torch in _torch_layout(module):
                    if torch_name == name:
                        shape = to_torch(np.empty(variable[...].shape)).shape
                        variable[...] = jnp.asarray(to_nnx(np.asarray(sample(shape, variable[...].dtype))))
                        return
                raise AttributeError(f"{type(module).__name__} has no torch parameter {name!r}")


            def init_zeros_(module, name):
                """torch.nn.init.zeros_."""
                init_torch_param_(module, name, lambda shape, dtype: jnp.zeros(shape, dtype))
            ''',
        ),
    ]
    valid = ["import torch\nx = 1\n"]

    def visit_Module(self, node: cst.Module) -> None:
        used = _nnx.module_names_used(self.ctx, HELPERS)  # (node is the context's module)
        if not used:
            return
        defined = astutil.top_level_names(node)
        wanted = used - defined
        if not wanted:
            return
        names = set(wanted) | {"init_torch_param_"}
        for n in wanted:
            names.update(_NEEDS.get(n, ()))
        names -= defined
        statements = _nnx.render("jax_init.py.j2", names=names)
        if "init_torch_param_" in defined:
            statements = [s for s in statements if not (isinstance(s, cst.FunctionDef) and s.name.value == "init_torch_param_")]
        statements = _nnx.spaced(statements)
        self.report(
            node,
            f"the port uses {', '.join(sorted(wanted))}: torch.nn.init on NNX layers, defined in the file",
            Fix((self.replace(node, _nnx.insert_statements(statements, "after_classes")),),
                imports=("math", "jax", "jax.numpy", "numpy", *(("flax.nnx",) if "torch_named_parameters" in names else ()))),
        )
