from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _nnx


class TorchWeightConverter(Rule):
    """
    ## What it does
    Adds to a file that defines modules, after its last module class, the two functions of
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
    needs_text = ("Module",)
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
            """
            import torch.nn as nn
            import flax.nnx as nnx
            import jax.numpy as jnp
            import numpy as np

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.fc = nnx.Linear(4, 2, rngs=rngs)


            def _torch_layout(module):
                \"\"\"(torch name, NNX variable, to NNX layout, to torch layout) for each array of one module.\"\"\"
                same = (lambda w: w, lambda w: w)
                if isinstance(module, nnx.Linear):
                    pairs = [("weight", module.kernel, lambda w: w.T, lambda k: k.T), ("bias", module.bias, *same)]
                elif isinstance(module, nnx.ConvTranspose):
                    # torch (in, out, *k) <-> kernel (*k, in, out), spatially flipped (torch's is the conv gradient)
                    n = module.kernel[...].ndim - 2
                    to_nnx = lambda w: np.flip(w.transpose(*range(2, n + 2), 0, 1), tuple(range(n)))
                    to_torch = lambda k: np.flip(k, tuple(range(n))).transpose(n, n + 1, *range(n))
                    pairs = [("weight", module.kernel, to_nnx, to_torch), ("bias", module.bias, *same)]
                elif isinstance(module, nnx.Conv):
                    # torch (out, in / groups, *k) <-> kernel (*k, in / groups, out)
                    n = module.kernel[...].ndim - 2
                    to_nnx = lambda w: w.transpose(*range(2, n + 2), 1, 0)
                    to_torch = lambda k: k.transpose(n + 1, n, *range(n))
                    pairs = [("weight", module.kernel, to_nnx, to_torch), ("bias", module.bias, *same)]
                elif isinstance(module, nnx.BatchNorm):
                    pairs = [("weight", module.scale, *same), ("bias", module.bias, *same)]
                    if getattr(module, "track_running_stats", True):
                        pairs += [("running_mean", module.mean, *same), ("running_var", module.var, *same)]
                elif isinstance(module, (nnx.LayerNorm, nnx.GroupNorm)):
                    pairs = [("weight", module.scale, *same), ("bias", module.bias, *same)]
                elif isinstance(module, nnx.Embed):
                    pairs = [("weight", module.embedding, *same)]
                else:
                    # any other module (yours, the emitted Torch* layers, nnx.List / nnx.Dict): its own
                    # nnx.Param and nnx.Variable attributes, under their names, in torch's layout already
                    if isinstance(module, nnx.List):
                        items = enumerate(module)
                    elif isinstance(module, nnx.Dict):
                        items = module.items()
                    else:
                        items = vars(module).items()
                    pairs = [
                        (str(name), value, *same)
                        for name, value in items
                        if type(value) in (nnx.Param, nnx.BatchStat, nnx.Variable)
                        and value.get_metadata().get("persistent", True)
                    ]
                return [pair for pair in pairs if pair[1] is not None]


            def _torch_names(model):
                \"\"\"torch name (as in the original's state_dict()) -> (NNX variable, to NNX, to torch).\"\"\"
                modules = dict(nnx.iter_modules(model))
                names = {}
                for path, module in modules.items():
                    # nnx.Sequential keeps its layers in `.layers`; torch's Sequential names them 0, 1, ...
                    prefix = [
                        str(part) for i, part in enumerate(path)
                        if not (part == "layers" and isinstance(modules.get(path[:i]), nnx.Sequential))
                    ]
                    for name, variable, to_nnx, to_torch in _torch_layout(module):
                        names[".".join([*prefix, name])] = (variable, to_nnx, to_torch)
                return names


            def load_torch_state_dict(model, state_dict):
                \"\"\"Set the model's parameters and buffers from the original's torch state dict.

                state_dict: the original's `model.state_dict()` names -> arrays (numpy arrays, CPU torch
                tensors, anything np.asarray takes) in torch layouts; `num_batches_tracked` is ignored.
                Raises KeyError naming a missing or unexpected torch key, ValueError naming a key whose
                shape does not fit.\"\"\"
                names = _torch_names(model)
                given = {k: v for k, v in state_dict.items() if not k.endswith("num_batches_tracked")}
                for key in given:
                    if key not in names:
                        raise KeyError(f"unexpected key in the torch state dict: {key!r}")
                for key in names:
                    if key not in given:
                        raise KeyError(f"missing key in the torch state dict: {key!r}")
                for key, (variable, to_nnx, to_torch) in names.items():
                    value = np.asarray(given[key])
                    expected = to_torch(np.empty(variable[...].shape)).shape
                    if value.shape != expected:
                        raise ValueError(
                            f"shape mismatch for {key!r}: the torch state dict has {tuple(value.shape)}, "
                            f"the model expects {tuple(expected)}"
                        )
                    # a copy (jnp.array): never a view of the caller's array, which torch may update in place
                    variable[...] = jnp.array(to_nnx(value), dtype=variable[...].dtype)


            def torch_state_dict(model):
                \"\"\"The model's parameters and buffers under the original's torch names, in torch layouts
                (numpy arrays).\"\"\"
                return {
                    key: np.array(to_torch(np.asarray(variable[...])))
                    for key, (variable, _, to_torch) in _torch_names(model).items()
                }


            model = Net(rngs=nnx.Rngs(0))
            """,
        ),
    ]
    valid = ["import torch\nx = torch.zeros(2)\n"]

    def visit_Module(self, node: cst.Module) -> None:
        if not _nnx.module_classes(self.ctx):
            return
        if "load_torch_state_dict" in _nnx.top_level_defs(node):
            return
        statements = _nnx.spaced(_nnx.render("jax_weights.py.j2"))
        self.report(
            node,
            "the port's weight converter: load_torch_state_dict(model, state_dict) and torch_state_dict(model)",
            Fix((self.replace(node, _nnx.insert_statements(statements, "after_classes")),),
                imports=("numpy", "jax.numpy", "flax.nnx")),
        )
