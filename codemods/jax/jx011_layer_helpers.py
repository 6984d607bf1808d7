from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx

# helper -> the helpers it needs
HELPERS = {
    "TorchConv1d": ("_ntuple",), "TorchConv2d": ("_ntuple",), "TorchConv3d": ("_ntuple",),
    "TorchConvTranspose1d": ("_ntuple",), "TorchConvTranspose2d": ("_ntuple",), "TorchConvTranspose3d": ("_ntuple",),
    "TorchBatchNorm": (), "TorchGroupNorm": (),
    # pooling: the classes call the functions, which the op rules also use for F.max_pool2d ...
    "pool_nd": ("_ntuple",), "adaptive_pool_nd": ("_ntuple",), "layer_norm_nd": (), "interpolate_nd": (), "torch_split": (), "TorchLayerNormBase": ("layer_norm_nd",),
    **{f"Torch{kind}Pool{n}d": ("pool_nd", "_ntuple") for kind in ("Max", "Avg") for n in (1, 2, 3)},
    **{f"TorchAdaptive{kind}Pool{n}d": ("adaptive_pool_nd", "_ntuple") for kind in ("Max", "Avg") for n in (1, 2, 3)},
    "TorchEmbedding": (), "TorchTiedLinear": (), "TorchSequential": (), "TorchModuleDict": (), "TorchModuleList": (), "torch_dropout": (), "torch_sdpa": ("torch_dropout",), "TorchDropoutNd": ("torch_dropout",), "TorchStochasticDepth": (),
    # torch layer classes used as values (JX017): factories with torch's arguments
    "TorchLinear": (), "TorchLayerNorm": ("_ntuple",), "TorchDropout": (),
    **{f"Torch{name}": () for name in ("ReLU", "ReLU6", "SiLU", "Hardswish", "Hardsigmoid", "Tanh", "Sigmoid", "GELU",
                                        "LeakyReLU", "ELU", "Identity")},
    "TorchLSTM": (), "TorchGRU": (), "TorchMultiheadAttention": (),
    "TorchTransformerEncoderLayer": ("TorchMultiheadAttention",), "TorchTransformerEncoder": (),
    # torch's lazy layers (input size from the first input); `_TorchLazy` is their base
    "_TorchLazy": (), "TorchLazyLinear": ("_TorchLazy",), "TorchLazyBatchNorm": ("_TorchLazy", "TorchBatchNorm"),
    # Gluon's BatchNorm (MXNet's biased running variance) in a port of Gluon code (JX015)
    "_gluon_batch_norm": (), "GluonBatchNorm": ("TorchBatchNorm", "_gluon_batch_norm"),
    "GluonLazyBatchNorm": ("TorchLazyBatchNorm", "_TorchLazy", "TorchBatchNorm", "_gluon_batch_norm"),
    **{f"TorchLazyConv{n}d": ("_TorchLazy", f"TorchConv{n}d", "_ntuple") for n in (1, 2, 3)},
    **{f"TorchLazyConvTranspose{n}d": ("_TorchLazy", f"TorchConvTranspose{n}d", "_ntuple") for n in (1, 2, 3)},
}


# helpers other helpers derive from
_BASES = frozenset({"_TorchLazy", "TorchBatchNorm", "TorchLazyBatchNorm", *(f"TorchConv{n}d" for n in (1, 2, 3)), *(f"TorchConvTranspose{n}d" for n in (1, 2, 3))})


def _moved(names: set, insert):
    """The module edit `insert`, after removing the top-level definitions of `names` (emitted
    again by it)."""

    def apply(module: cst.Module) -> cst.Module:
        if names:
            body = [s for s in module.body
                    if not (isinstance(s, (cst.ClassDef, cst.FunctionDef)) and s.name.value in names)]
            module = module.with_changes(body=body)
        return insert(module)

    return apply


class TorchLayerHelpers(Rule):
    """
    ## What it does
    Defines, once per file, the small classes the translated layers use
    (`TorchConv2d`, `TorchBatchNorm`, `TorchMaxPool2d`, `TorchLSTM`, `TorchMultiheadAttention`...,
    see JX002), right before the file's first class or function. Only the classes the file
    uses are emitted; each is a few lines on top of an NNX layer or `jax.lax`, with a
    docstring saying what it keeps of torch:

    - `TorchConvNd` / `TorchConvTransposeNd`: `nnx.Conv` / `nnx.ConvTranspose` taking torch's
      arguments (padding on both sides in any of torch's padding modes, `groups`,
      `output_padding`), applied to channels-first input: `jnp.moveaxis` to channels-last,
      the NNX layer, and back. This is
      where the port's layout transposes live: tensors between layers stay NCHW, so
      `x.view(x.size(0), -1)` before a Linear flattens in torch's order.
    - `TorchBatchNorm`: `nnx.BatchNorm` over axis 1, torch's momentum and eps, running
      variance updated with the unbiased batch variance as torch does.
    - `TorchGroupNorm` on NCHW; `TorchMaxPoolNd`, `TorchAvgPoolNd`, `TorchAdaptiveAvgPoolNd`,
      `TorchAdaptiveMaxPoolNd` (1-3 spatial dims) on channels-first input, through two
      functions the op rules also call for `F.max_pool2d` and the like: `pool_nd` (torch's
      output size, `ceil_mode` with its "the last window starts inside the input or its left
      padding" clause, -inf / zero padding, `count_include_pad`, `divisor_override`, dilation)
      and `adaptive_pool_nd` (torch's windows floor(i * L / out) .. ceil((i + 1) * L / out),
      overlapping where the output size does not divide the input's).
    - `TorchEmbedding`: `nnx.Embed` whose `padding_idx` row gets no gradient.
    - `TorchDropoutNd`: `nn.Dropout1d/2d/3d` through `torch_dropout(..., spatial=n)`, whole channels
      zeroed on inputs of every rank torch takes (nnx.Dropout's fixed `broadcast_dims` fit one rank).
    - `torch_split`: torch.split's chunk sizes (an int, or a list of sizes), known only when the
      code runs, as jnp.split's cut indices.
    - `TorchTiedLinear`: a Linear whose weight is an embedding's array (weight tying, JX019).
    - `TorchLSTM`, `TorchGRU`: torch's parameters (`weight_ih_l0`, `bias_hh_l0`, gate order
      i, f, g, o / r, z, n) and return values, `batch_first`, `num_layers`, inter-layer
      dropout; a `jax.lax.scan` over time.
    - `TorchMultiheadAttention`: `in_proj_weight` / `in_proj_bias` / `out_proj` as in torch,
      `key_padding_mask`, `attn_mask`, `batch_first`, head-averaged weights.
    - `TorchTransformerEncoderLayer` / `TorchTransformerEncoder`: torch's blocks with their
      submodule names (`layers.0.self_attn.in_proj_weight`, `linear1`, `norm2`...), post- or
      pre-norm, relu or exact gelu; the encoder clones its layer as torch deep-copies it.
    - `TorchLazyLinear`, `TorchLazyConvNd`, `TorchLazyConvTransposeNd`, `TorchLazyBatchNorm` (torch's lazy layers,
      on the `_TorchLazy` base): the layer's own constructor runs at its first eager call with
      the input's size (last axis / axis 1), or from the torch weight's shape when
      `load_torch_state_dict` comes first; until then each parameter holds a placeholder
      that makes `nnx.Optimizer` / `nnx.jit` raise naming the layer, and `torch_state_dict`
      gives None for it (torch's UninitializedParameter). A deferred initializer
      (`lazy_init`, Gluon's `initialize()`) runs on the parameters an eager call made.
    - `GluonBatchNorm` / `GluonLazyBatchNorm` (a port of MXNet/Gluon code, JX015): the
      running variance updated with the biased batch variance, as MXNet's BatchNorm does.

    ## Why
    Flax's LSTM cells keep one kernel per gate with a single bias, nnx.MultiHeadAttention
    keeps separate (E, heads, head_dim) kernels, and convolutions and pooling are
    channels-last: written as explicit classes that keep torch's layouts, the port computes
    exactly what the original computes and its parameters keep torch's names.

    ## Fix safety
    Safe: adds definitions only. Each class is tested against torch (forward, gradients,
    running statistics) in tests/test_jax_modules.py.
    """

    code = "JX011"
    name = "torch-layer-helpers"
    target = "jax"
    summary = "define the Torch* layer classes the port uses (torch semantics on Flax NNX)"
    severity = Severity.ERROR
    needs_text = ("torch", "Torch")
    examples = [
        Example(
            """
            import flax.nnx as nnx

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.pool = TorchAdaptiveAvgPool2d((7, 7))
            """,
            """
            import flax.nnx as nnx
            import jax
            import jax.numpy as jnp


            def _ntuple(value, n):
                \"\"\"torch's int-or-tuple arguments: 3 -> (3, 3).\"\"\"
                return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


            def adaptive_pool_nd(x, kind, n, output_size):
                \"\"\"torch's adaptive average ("avg") or max ("max") pooling over the last n axes of x: output
                cell i of an axis of size L pools input cells floor(i * L / out) to ceil((i + 1) * L / out) - 1,
                as torch does (windows overlap where out does not divide L); None keeps the axis' size. Both
                reductions are separable over the axes of a rectangular window.\"\"\"
                reduce = jnp.mean if kind == "avg" else jnp.max
                lead = x.ndim - n
                for axis, out in zip(range(lead, x.ndim), _ntuple(output_size, n)):
                    size = x.shape[axis]
                    out = size if out is None else out
                    if size % out == 0:
                        x = reduce(jnp.reshape(x, x.shape[:axis] + (out, size // out) + x.shape[axis + 1:]), axis=axis + 1)
                    else:
                        x = jnp.concatenate([
                            reduce(jax.lax.slice_in_dim(x, i * size // out, -(-(i + 1) * size // out), axis=axis), axis=axis, keepdims=True)
                            for i in range(out)
                        ], axis=axis)
                return x


            class TorchAdaptiveAvgPool2d(nnx.Module):
                \"\"\"torch.nn.AdaptiveAvgPool2d on channels-first input, torch's windows (overlapping where
                the output size does not divide the input's): adaptive_pool_nd.\"\"\"

                def __init__(self, output_size, *, rngs=None):
                    self.output_size = output_size

                def __call__(self, x):
                    return adaptive_pool_nd(x, "avg", 2, self.output_size)


            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.pool = TorchAdaptiveAvgPool2d((7, 7))
            """,
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
        names = set(wanted)
        for helper in wanted:
            names.update(HELPERS[helper])
        # a base class emitted by an earlier pass moves down with the new classes deriving from it
        # (they are inserted before the file's first definition, so above the earlier helpers)
        redo = names & defined & _BASES
        names -= defined - redo
        if "_TorchLazy" in redo:
            redo.add("_TorchUnmaterialized")  # rendered with _TorchLazy
        conv = sorted(int(h[len("TorchConv"):-1]) for h in names if h.startswith("TorchConv") and h[len("TorchConv"):-1].isdigit())
        convt = sorted(int(h[len("TorchConvTranspose"):-1]) for h in names if h.startswith("TorchConvTranspose"))
        lazy = sorted(int(h[len("TorchLazyConv"):-1]) for h in names if h.startswith("TorchLazyConv") and h[len("TorchLazyConv"):-1].isdigit())
        lazyt = sorted(int(h[len("TorchLazyConvTranspose"):-1]) for h in names if h.startswith("TorchLazyConvTranspose"))
        statements = _nnx.render("jax_layers.py.j2", names=names, conv_dims=conv, conv_transpose_dims=convt,
                                 lazy_conv_dims=lazy, lazy_conv_transpose_dims=lazyt)
        statements = _nnx.spaced(statements)
        self.report(
            node,
            f"the port uses {', '.join(sorted(wanted))}: defined in the file (torch semantics on Flax NNX)",
            Fix((self.replace(node, _moved(redo, _nnx.insert_statements(statements, "before_defs"))),),
                imports=("jax", "jax.numpy", "flax.nnx",
                         *(("functools",) if names & {"TorchTransformerEncoderLayer", "TorchGELU", "TorchLeakyReLU", "TorchELU"} else ()))),
        )
