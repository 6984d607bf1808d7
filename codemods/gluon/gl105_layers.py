from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model, _model_layers
from ._model_layers import Manual

# mx.init's registered names (a string initializer is the class of that name, default arguments)
_STRING_INITS = {"zeros": "init_zero()", "ones": "init_one()", "normal": "init_normal()", "uniform": "init_uniform()",
                 "xavier": "init_xavier()"}


class GluonLayers(Rule):
    """
    ## What it does
    Rewrites Gluon layers to torch layers with the same parameters under the same names:

    | Gluon | torch |
    | --- | --- |
    | `Dense(units)` after a Dense (2-D input), `flatten=False` | `nn.Linear(in, units)` |
    | `Dense(units, activation=..., flatten=True)` | `Dense(in, units, activation=...)`, an emitted module (`weight`, `bias` at its own level) that flattens all axes but the first and applies the activation: one layer, as in Gluon |
    | `Conv1D/2D/3D`, `Conv2DTranspose` | `nn.Conv2d(in, channels, kernel_size, stride=, padding=, ...)`, `nn.ConvTranspose2d` |
    | `Conv2D(..., activation="relu")` | `with_activation(nn.Conv2d(...), "relu")`: the layer with a forward hook applying the activation (emitted), one layer as in Gluon |
    | `BatchNorm(momentum=0.9, epsilon=1e-5)` | `nn.BatchNorm2d(C)` (torch's momentum is 1 - Gluon's: 0.1) |
    | `Dropout(rate)`, `Activation("relu")`, `LeakyReLU(a)`, `Flatten()` | `nn.Dropout(rate)`, `nn.ReLU()`, `nn.LeakyReLU(a)`, `nn.Flatten()` |
    | `MaxPool2D`, `AvgPool2D`, `GlobalAvgPool2D` | `nn.MaxPool2d`, `nn.AvgPool2d`, `nn.AdaptiveAvgPool2d(1)` |
    | `Embedding(n, d)` | `nn.Embedding(n, d)` |
    | `LayerNorm()` after a Dense, `PReLU(in_channels=c)`, `ELU(a)`, `SELU()`, `GELU()`, `Swish()` | `nn.LayerNorm(n)`, `nn.PReLU(num_parameters=c)`, `nn.ELU(a)`, `nn.SELU()`, `nn.GELU()`, `nn.SiLU()` |
    | `rnn.LSTM(h, layers, input_size=n)`, `rnn.GRU` | `nn.LSTM(n, h, layers)` (`layout="NTC"`: `batch_first=True`) |
    | `BatchNorm(scale=False, center=False)` | `frozen(nn.BatchNorm2d(C), "weight", "bias")`: gamma/beta kept under their names, not trained (Gluon's grad_req 'null'), and no running-statistics update when nothing the layer reads needs a gradient (MXNet updates them in the backward, which does not run then) |
    | `contrib.nn.Identity()` | `nn.Identity()` |
    | `Conv2D(use_bias=False, **kwargs)`, `Conv2D(channels, *args)` | `gluon_conv(2, use_bias=False, **kwargs)`: Gluon's signature bound when it runs (emitted) |

    Gluon infers a layer's input size at the first forward (`in_units=0`, `in_channels=0`).
    The rule writes the size where the code shows it: an explicit `in_units`/`in_channels`;
    the output of the layer before it in a Sequential (`Dense(64)` then `Dense(10)`: 64;
    `Conv2D(32)` then `BatchNorm()`: 32; through helper functions that return a layer); the
    data flow of the block's `forward` (`self.bn1(self.conv1(x))`). A BatchNorm's rank (torch's
    BatchNorm1d/2d/3d) comes from the layer before it, else from the convolutions of the
    enclosing functions and classes, innermost first, and in each first those added to the
    same container (`self.features.add(...)`). Otherwise the layer is
    torch's lazy one (`nn.LazyConv2d`, `nn.LazyBatchNorm2d`, `nn.LazyLinear`, or the emitted
    `LazyDense`), which takes the size from its first input as Gluon does; a size given as a
    variable that may be 0 (`in_channels=in_channels` with a default of 0) becomes
    `nn.Conv2d(in_channels, ...) if in_channels else nn.LazyConv2d(...)`.

    A layer's own `weight_initializer=` is kept with the layer (`with_init(layer,
    weight=init)`) for `initialize` (GL106); string initializers are mx.init's registered names
    (`"zeros"`, `"ones"`, `"normal"`: Normal(0.01), `"uniform"`: Uniform(0.07), `"xavier"`).
    Arguments torch has no counterpart for (channels-last layouts, `Dropout(axes=)`, BatchNorm
    with `use_global_stats`, shared `params=`, an LSTM without `input_size`) are reported and
    the line is marked `# porter: manual`.

    ## Why
    One torch module per Gluon block, with Gluon's attribute names and container indices,
    keeps the parameter names `porter verify` gives the Gluon model (`features.1.0.body.1.running_var`).

    ## Fix safety
    Safe. Measured against mxnet 1.9.1 (tests/test_gluon_model_rules.py): loaded with the
    Gluon weights, the ported models of the five fixtures give Gluon's outputs (training
    mode) within 1.4e-6 (cnn_bn_dropout), 1.7e-7 or less for the others. One difference
    remains in training mode: torch's BatchNorm updates the running variance with the
    unbiased batch variance (n/(n-1) times Gluon's biased one) in the forward, where Gluon
    updates it in the backward.

    Gradients: mxnet 1.9.1's SELU backward is wrong for negative inputs (measured: at x = -3
    it gives 0.0028 where the derivative is 0.0875, torch's value); the port's `nn.SELU` has
    the true gradient, so training through a SELU differs from MXNet's there.

    Lazy layers: under torch_xla 2.9 a lazy layer moved to the XLA device before its
    parameters exist loses its deferred shape (the uninitialized parameter becomes an empty
    one): run one forward, or `load_state_dict`, before `model.to(xla_device)`. The JAX
    target needs the input sizes: a lazy layer is left there for a person (JX090).
    """

    code = "GL105"
    name = "gluon-layers"
    target = "torch"
    summary = "Gluon layers (Dense, Conv2D, BatchNorm, pooling, Embedding, rnn.LSTM...) -> torch.nn layers"
    severity = Severity.ERROR
    needs_text = ("mxnet", "porter: manual")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            def get_net():
                net = gluon.nn.HybridSequential()
                net.add(gluon.nn.Conv2D(16, kernel_size=3, padding=1, in_channels=3))
                net.add(gluon.nn.BatchNorm())
                net.add(gluon.nn.Activation("relu"))
                net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
                return net
            """,
            """
            from mxnet import gluon
            import torch.nn

            def get_net():
                net = gluon.nn.HybridSequential()
                net.add(torch.nn.Conv2d(3, 16, 3, padding=1))
                net.add(torch.nn.BatchNorm2d(16))
                net.add(torch.nn.ReLU())
                net.add(torch.nn.MaxPool2d(2, stride=2))
                return net
            """,
            title="input sizes from the layer before",
        ),
        Example(
            """
            from mxnet import gluon

            net = gluon.nn.HybridSequential()
            net.add(gluon.nn.Dense(64, activation="relu"))
            net.add(gluon.nn.Dense(10))
            """,
            """
            from mxnet import gluon
            import torch
            import torch.nn


            def _gluon_activation(x, activation):
                \"\"\"Gluon's `activation=` of Dense: applied inside the layer (it is not a layer of its own).\"\"\"
                if activation is None:
                    return x
                if activation == "relu":
                    return torch.relu(x)
                if activation == "sigmoid":
                    return torch.sigmoid(x)
                if activation == "tanh":
                    return torch.tanh(x)
                if activation == "softrelu":
                    return torch.nn.functional.softplus(x)
                if activation == "softsign":
                    return torch.nn.functional.softsign(x)
                raise ValueError(f"unknown Gluon activation {activation!r}")


            class LazyDense(torch.nn.LazyLinear):
                \"\"\"Gluon's Dense with `in_units=0`: the input size is taken from the first input (of the
                flattened input with `flatten=True`), as Gluon does; then like Dense. The class stays
                LazyDense once the parameters exist.\"\"\"

                cls_to_become = None

                def __init__(self, out_features, bias=True, flatten=True, activation=None):
                    super().__init__(out_features, bias=bias)
                    self.flatten = flatten
                    self.activation = activation

                def initialize_parameters(self, x):
                    super().initialize_parameters(torch.flatten(x, 1) if self.flatten else x)

                def forward(self, x):
                    if self.flatten:
                        x = torch.flatten(x, 1)
                    return _gluon_activation(super().forward(x), self.activation)


            net = gluon.nn.HybridSequential()
            net.add(LazyDense(64, activation="relu"))
            net.add(torch.nn.Linear(64, 10))
""",
            title="a lazy first layer, a size from the layer before",
        ),
        Example(
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def __init__(self, **kwargs):
                    super(Net, self).__init__(**kwargs)
                    self.conv = gluon.nn.Conv2D(8, 3, layout="NHWC")
            """,
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def __init__(self, **kwargs):
                    super(Net, self).__init__(**kwargs)
                    self.conv = gluon.nn.Conv2D(8, 3, layout="NHWC")  # porter: manual
            """,
            title="channels-last layouts are left for a person",
        ),
    ]
    valid = ["import torch.nn as nn\nfc = nn.Linear(4, 2)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        q = self.ctx.qualname(node.func)
        if q and q.startswith("torch.nn.") and q[len("torch.nn."):] in _model.GLUON_ONLY:
            # a Gluon layer left for a person, once its module is torch's: still reported, and why
            kind = q[len("torch.nn."):]
            sig = _model.SIGNATURES.get(kind)
            reason = _model_layers.shared_reason(_model.bind(node, sig), kind) if sig else None
            _model.report_manual(self, node, reason or f"Gluon layer {kind} has no translation")
            return
        kind = _model.gluon_layer(node.func, self.ctx)
        if kind is None or kind in _model.SEQUENTIALS | _model.CONCURRENTS or kind in ("Block", "HybridBlock"):
            return
        if _model._conv_dims(kind) and "Transpose" not in kind and _runtime_kwargs(node):
            self._runtime_conv(node, kind)
            return
        sig = _model.SIGNATURES.get(kind)
        if sig is None:
            _model.report_manual(self, node, f"Gluon layer {kind} has no translation")
            return
        nn, imports = _model.torch_nn(self.ctx)
        size = _model.input_size(node, self.ctx)
        try:
            plan = _model_layers.plan(kind, _model.bind(node, sig), size, nn, self.ctx, node)
            text_in, mode = self._in_size(node, plan, size)
            init_helpers = self._init_helpers(_model.bind(node, sig))
        except Manual as exc:
            _model.report_manual(self, node, str(exc))
            return
        helpers = [h for h in plan.helpers if (h in ("Dense",) and mode != "lazy") or (h == "LazyDense" and mode != "known")
                   or h not in ("Dense", "LazyDense")]
        helpers += init_helpers
        parent = self.ctx.parent

        def rewrite(updated: cst.Call):
            try:
                p = _model_layers.plan(kind, _model.bind(updated, sig), size, nn, self.ctx, updated, rank=plan.rank)
            except Manual:  # an edit inside changed an argument: the next pass decides again
                return updated
            if mode == "known":
                text = p.known.replace("{in}", text_in)
            elif mode == "lazy":
                text = p.lazy
            elif mode == "either":
                text = f"{p.known.replace('{in}', text_in)} if {text_in} else {p.lazy}"
            else:
                text = p.known
            text = self._with_init(text, _model.bind(updated, sig))
            new = astutil.parse_expression(text)
            if mode == "either" and not isinstance(parent, (cst.Arg, cst.Assign, cst.Return)):
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return new

        edits = [self.replace(node, rewrite)]
        if helpers:
            edit, more = _model.helpers_edit(self.ctx, helpers)
            edits.append(edit)
            imports = (*imports, *more)
        note = {"lazy": f": its input size is not shown by the code; torch's lazy layer takes it from the first "
                        f"input, as Gluon does (the JAX target needs the size)",
                "either": ": lazy when the given input size is 0"}.get(mode, "")
        self.report(node, f"Gluon {kind}: torch layer{note}", Fix(tuple(edits), imports=tuple(dict.fromkeys(imports))))

    def _runtime_conv(self, node: cst.Call, kind: str) -> None:
        """``nn.Conv2D(use_bias=False, **kwargs)``: the arguments are known when it runs; the
        emitted ``gluon_conv`` binds Gluon's signature then."""
        edit, imports = _model.helpers_edit(self.ctx, ["gluon_conv"])

        def rewrite(updated: cst.Call):
            return updated.with_changes(func=cst.Name("gluon_conv"),
                                        args=[cst.Arg(cst.Integer(kind[4])), *updated.args])

        self.report(node, f"Gluon {kind} with **kwargs: gluon_conv binds Gluon's arguments when it runs",
                    Fix((self.replace(node, rewrite), edit), imports=imports))

    def _in_size(self, node: cst.Call, plan, size) -> tuple[Optional[str], str]:
        if plan.in_arg is None:
            return None, "plain"
        b = _model.bind(node, _model.SIGNATURES[_model.gluon_layer(node.func, self.ctx)])
        given = b.get(plan.in_arg)
        if given is not None:
            v = _model.literal(given)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return _model.code(given), "known"
            if v is _model.NOT_LITERAL:
                if plan.lazy is not None and self._may_be_zero(given):
                    return _model.code(given), "either"
                return _model.code(given), "known"
        if size.features is not None and size.kind in plan.accepts:
            return size.features, "known"
        if plan.lazy is None:
            raise Manual(f"the input size is not shown by the code and torch has no lazy {plan.known.split('(')[0]}")
        return None, "lazy"

    def _may_be_zero(self, given: cst.CSTNode) -> bool:
        """``in_channels=in_channels`` where the enclosing function's parameter defaults to 0,
        or has no default in a helper function that returns the layer."""
        if not isinstance(given, cst.Name):
            return False
        for anc in reversed(self.ctx.ancestors):
            if isinstance(anc, cst.FunctionDef):
                for p in anc.params.params:
                    if p.name.value == given.value:
                        return p.default is None or _model.literal(p.default) == 0
                return False
        return False

    def _init_helpers(self, b) -> list:
        names = ["frozen"] if _frozen_names(b) else []
        for arg in ("weight_initializer", "bias_initializer"):
            node = b.get(arg)
            if node is None or _model.literal(node) is None:
                continue
            v = _model.literal(node)
            if isinstance(v, str):
                if v not in _STRING_INITS:
                    raise Manual(f"{arg}={v!r}")
                names.append(_STRING_INITS[v].split("(")[0])
            names.append("with_init")
        return names

    def _with_init(self, text: str, b) -> str:
        inits = []
        for arg, pname in (("weight_initializer", "weight"), ("bias_initializer", "bias")):
            node = b.get(arg)
            if node is None or _model.literal(node) is None:
                continue
            v = _model.literal(node)
            inits.append(f"{pname}={_STRING_INITS[v] if isinstance(v, str) else _model.code(node)}")
        frozen = _frozen_names(b)
        if frozen:
            text = f"frozen({text}, {', '.join(repr(n) for n in frozen)})".replace("'", '"')
        if not inits:
            return text
        return f"with_init({text}, {', '.join(inits)})"


def _runtime_kwargs(node: cst.Call) -> bool:
    """Arguments known only when it runs: ``**kwargs`` or ``*args``."""
    return any(a.star for a in node.args)


def _frozen_names(b) -> list:
    """BatchNorm's parameters Gluon does not train: gamma with scale=False (fix_gamma), beta
    with center=False."""
    if "center" not in b.args and "scale" not in b.args:
        return []
    out = []
    if _model.literal(b.get("scale")) is False:
        out.append("weight")
    if _model.literal(b.get("center")) is False:
        out.append("bias")
    return out
