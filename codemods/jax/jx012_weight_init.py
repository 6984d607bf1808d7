from __future__ import annotations


import libcst as cst

from porter import astutil
from porter.astutil import code as _code
from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _loop, _nnx
from ._nnx import INITS, handled_tree_walk
from ._nnx import init_name as _init_name

class NnxWeightInit(Rule):
    """
    ## What it does
    Ports the weight initialisation code of module classes:

    - `nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")` ->
      `init_kaiming_normal_(m, "weight", mode="fan_out", nonlinearity="relu", key=rngs.params())`,
      and likewise `uniform_`, `normal_`, `trunc_normal_`, `constant_`, `ones_`, `zeros_`,
      `xavier_uniform_`, `xavier_normal_`, `kaiming_uniform_` (same arguments as torch's, the
      tensor split into its module and torch's parameter name; `.data` dropped). The
      `init_*` functions are emitted into the port: each draws in torch's layout (fan_in /
      fan_out and gains as torch computes them) from the module's `rngs` stream and stores the
      values in the NNX layout through the weight converter's layout table (a Linear's
      `weight` is its kernel, transposed; a BatchNorm's `weight` its scale).
    - A method that draws initial values (`self.init_weights()` called from `__init__`) takes
      the caller's `rngs` like the methods that build layers (JX001).
    - `for m in self.modules():` -> `for _, m in nnx.iter_modules(self):` and
      `isinstance(m, nn.Conv2d)` -> `isinstance(m, TorchConv2d)` (the class the layer becomes:
      `nn.Linear` -> `nnx.Linear`, `nn.BatchNorm2d` -> `TorchBatchNorm`...).
    - `for pn, p in self.named_parameters(): if pn.endswith("c_proj.weight"): nn.init.normal_(p, ...)`
      (GPT-style: `p` used only as the tensor of `nn.init` calls) ->
      `for pn, p in torch_named_parameters(self): ... init_normal_(*p, ..., key=rngs.params())`:
      `torch_named_parameters` (emitted by JX013) yields torch's parameter names (as in the
      original's `state_dict()`) with the (layer, torch parameter name) pair the init_*
      functions take.
    - `next(self.parameters())` (a parameter to read a dtype from) ->
      `jax.tree.leaves(nnx.state(self, nnx.Param))[0]`.

    Left for a manual port, marked `# porter: manual (JX012)`: other `nn.init` functions
    (`orthogonal_`, `eye_`, `dirac_`, `sparse_`), a tensor that is not an attribute of a
    module (`for p in self.parameters(): nn.init.normal_(p)`, a named_parameters() loop that
    uses the tensor otherwise: JX090), a random init where no `rngs`
    is in scope, `isinstance` against a layer that becomes a function (`nn.ReLU`), and
    `isinstance(m, nn.BatchNorm2d)` in a file that also builds BatchNorm layers of another
    dimension (all become `TorchBatchNorm`).

    ## Why
    torch initialises in place through the tensor (`m.weight`); an NNX layer keeps its
    parameters under other names and layouts (`kernel` is `weight.T`), and random numbers
    come from an explicit `nnx.Rngs` stream.

    ## Fix safety
    Safe: same distributions as torch's (drawn from JAX's generator, so not the same numbers;
    load the original's weights with `load_torch_state_dict` to start from the same values).
    """

    code = "JX012"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-weight-init"
    target = "jax"
    summary = "nn.init.*_ on layer parameters, self.modules() init loops, isinstance on layers -> NNX"
    severity = Severity.ERROR
    needs_text = ("init", "modules", "isinstance", "parameters")
    examples = [
        Example(
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.conv = TorchConv2d(3, 8, 3, rngs=rngs)
                    self.fc = nnx.Linear(8, 2, rngs=rngs)
                    for m in self.modules():
                        if isinstance(m, nn.Conv2d):
                            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    nn.init.zeros_(self.fc.bias)
            """,
            """
            import flax.nnx as nnx

            class Net(nnx.Module):
                def __init__(self, *, rngs: nnx.Rngs):
                    self.conv = TorchConv2d(3, 8, 3, rngs=rngs)
                    self.fc = nnx.Linear(8, 2, rngs=rngs)
                    for _, m in nnx.iter_modules(self):
                        if isinstance(m, TorchConv2d):
                            init_kaiming_normal_(m, "weight", mode="fan_out", nonlinearity="relu", key=rngs.params())
                    init_zeros_(self.fc, "bias")
            """,
            title="an init loop and an init call (JX013 defines the init_* functions in the port)",
        ),
        Example(
            """
            import math
            import torch.nn as nn
            import flax.nnx as nnx

            class GPT(nnx.Module):
                def __init__(self, n_layer, *, rngs: nnx.Rngs):
                    self.c_proj = nnx.Linear(8, 8, rngs=rngs)
                    for pn, p in self.named_parameters():
                        if pn.endswith("c_proj.weight"):
                            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
            """,
            """
            import math
            import flax.nnx as nnx

            class GPT(nnx.Module):
                def __init__(self, n_layer, *, rngs: nnx.Rngs):
                    self.c_proj = nnx.Linear(8, 8, rngs=rngs)
                    for pn, p in torch_named_parameters(self):
                        if pn.endswith("c_proj.weight"):
                            init_normal_(*p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer), key=rngs.params())
            """,
            title="a named_parameters() loop selecting parameters by their torch names (JX013 defines torch_named_parameters)",
        ),
    ]
    valid = [
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        self.fc = nn.Linear(2, 2)\n",
        "x = isinstance(1, int)\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._marked: set[int] = set()

    # ---------------------------------------------------------------------------------
    def _manual(self, node: cst.CSTNode, reason: str) -> None:
        stmt = _nnx.statement_of(self.ctx)
        if _nnx.has_manual_marker(stmt):
            return
        fix = None
        if stmt is not None and id(stmt) not in self._marked:
            self._marked.add(id(stmt))
            fix = Fix((self.replace(stmt, _nnx.manual_comment(self.code, reason)),), description="marked for a manual port")
        self.report(node, reason, fix)

    def _in_port_module(self) -> bool:
        return _nnx.enclosing_module_class(self.ctx) is not None

    def visit_Call(self, node: cst.Call) -> None:
        # a file with module classes, or one that builds its model from torch's layers alone
        # (`net = nn.Sequential(...)`, then `net.apply(weights_init)`)
        if not _nnx.module_classes(self.ctx) and not _loop.file_facts(self.ctx).modules:
            return
        name = _init_name(self.ctx.qualname(node.func))
        if name is not None:
            self._init(node, name)
            return
        if isinstance(node.func, cst.Name) and node.func.value == "isinstance" and len(node.args) == 2:
            self._isinstance(node)
            return
        if not self._in_port_module():
            return
        method = astutil.method_name(node)
        receiver = getattr(node.func, "value", None)
        if not (isinstance(receiver, cst.Name) and receiver.value == "self") or not handled_tree_walk(node, self.ctx) \
                or _nnx.parameter_count_call(node, self.ctx):
            return  # (a parameter count is JX022's)
        nnx = _nnx.nnx_name(self.ctx)
        if method == "modules":
            loop = self.ctx.ancestors[-2]
            self.report(node, f"self.modules() -> {nnx}.iter_modules(self) (path, module) pairs",
                        Fix((self.replace(node, cst.parse_expression(f"{nnx}.iter_modules(self)")),
                             self.replace(loop.target, cst.Tuple([cst.Element(cst.Name("_")), cst.Element(loop.target)],
                                                                 lpar=[], rpar=[]))),
                            imports=("flax.nnx",)))
        elif method == "named_parameters":
            self.report(node, "self.named_parameters() -> torch_named_parameters(self): (torch name, (module, "
                              "torch parameter name)) pairs for the init_* functions",
                        Fix((self.replace(node, cst.parse_expression("torch_named_parameters(self)")),)))
        else:
            outer = self.ctx.ancestors[-3]
            self.report(outer, "next(self.parameters()) -> the first nnx.Param array of the module",
                        Fix((self.replace(outer, cst.parse_expression(f"jax.tree.leaves({nnx}.state(self, {nnx}.Param))[0]")),),
                            imports=("jax", "flax.nnx")))

    # ---------------------------------------------------------------------------------
    def _init(self, node: cst.Call, name: str) -> None:
        if name not in INITS:
            if name in ("calculate_gain",):
                return
            self._manual(node, f"nn.init.{name} is not translated: set the NNX variable by hand "
                               "(or load the original's weights with load_torch_state_dict)")
            return
        args = list(node.args)
        at = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == "tensor"), None)
        if at is None:
            at = 0 if args and args[0].keyword is None and not args[0].star else None
        if at is None:
            return
        tensor = args[at].value
        if isinstance(tensor, cst.Attribute) and tensor.attr.value == "data":
            tensor = tensor.value
        if isinstance(tensor, cst.Name) and at == 0 and self._parameter_handle(tensor.value):
            self._init_handle(node, name, tensor.value)
            return
        if not isinstance(tensor, cst.Attribute) or tensor.attr.value in ("data",):
            self._manual(node, f"nn.init.{name} on {_nnx.code(tensor)}: porter ports it on a layer's parameter "
                               "(`m.weight`); set the NNX variable by hand")
            return
        random = INITS[name]
        if random and not _nnx.in_rngs_scope(self.ctx):
            self._manual(node, f"nn.init.{name} draws random numbers and no `rngs` is in scope here: pass an "
                               "nnx.Rngs and use init_{name}(module, \"{attr}\", ..., key=rngs.params())"
                         .replace("{name}", name).replace("{attr}", tensor.attr.value))
            return
        new_args = [cst.Arg(tensor.value), cst.Arg(cst.SimpleString(f'"{tensor.attr.value}"'))]
        rest = [a for i, a in enumerate(args) if i != at]
        new_args += [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in rest]
        if random:
            new_args.append(_nnx.kwarg("key", cst.parse_expression("rngs.params()")))
        new_args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) if i < len(new_args) - 1
                    else a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for i, a in enumerate(new_args)]
        new = cst.Call(cst.Name(f"init_{name}"), new_args)
        self.report(node, f"nn.init.{name}({_nnx.code(tensor)}) -> init_{name}({_nnx.code(tensor.value)}, "
                          f"\"{tensor.attr.value}\", ...) on the NNX layer's variable, in torch's layout",
                    Fix((self.replace(node, new),)))

    def _parameter_handle(self, name: str) -> bool:
        """``name`` is the parameter of a ``for pn, p in self.named_parameters():`` around the node
        that JX012 ports (``torch_named_parameters(self)``)."""
        for anc in reversed(self.ctx.ancestors[:-1]):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(anc, cst.For) and isinstance(anc.iter, cst.Call) and _code(anc.iter) in (
                    "self.named_parameters()", "torch_named_parameters(self)"):
                return _nnx.named_parameters_handle(anc, self.ctx) == name
        return False

    def _init_handle(self, node: cst.Call, name: str, handle: str) -> None:
        """nn.init.normal_(p, ...) on a parameter of self.named_parameters() -> init_normal_(*p, ...)."""
        random = INITS[name]
        if random and not _nnx.in_rngs_scope(self.ctx):
            self._manual(node, f"nn.init.{name} draws random numbers and no `rngs` is in scope here: pass an "
                               f"nnx.Rngs and use init_{name}(*{handle}, ..., key=rngs.params())")
            return
        args = [cst.Arg(cst.Name(handle), star="*"), *node.args[1:]]
        if random:
            args.append(_nnx.kwarg("key", cst.parse_expression("rngs.params()")))
        args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) if i < len(args) - 1
                else a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for i, a in enumerate(args)]
        self.report(node, f"nn.init.{name}({handle}) on a parameter of self.named_parameters() -> "
                          f"init_{name}(*{handle}, ...) on the NNX layer's variable, in torch's layout",
                    Fix((self.replace(node, cst.Call(cst.Name(f"init_{name}"), args)),)))

    def _isinstance(self, node: cst.Call) -> None:
        classes = node.args[1].value
        elements = [e.value for e in classes.elements] if isinstance(classes, cst.Tuple) else [classes]
        nnx = _nnx.nnx_name(self.ctx)
        edits = []
        for e in elements:
            qual = self.ctx.qualname(e) or ""
            if not qual.startswith("torch.nn."):
                continue
            short = qual[len("torch.nn."):]
            if qual in _nnx.TORCH_MODULE:
                edits.append(self.replace(e, cst.parse_expression(f"{nnx}.Module")))
                continue
            new = _layers.annotation_for(short, nnx)
            if new is None:
                if short in _layers.LAYERS:
                    self._manual(node, f"isinstance(..., nn.{short}): nn.{short} becomes a function in the port, "
                                       "not a module class")
                return
            if new == "TorchBatchNorm" and self._other_batchnorm_dims(short):
                self._manual(node, f"isinstance(..., nn.{short}): every BatchNorm1d/2d/3d of the file becomes "
                                   "TorchBatchNorm; tell them apart by hand")
                return
            edits.append(self.replace(e, cst.parse_expression(new)))
        if edits:
            self.report(node, "isinstance against a torch layer class -> the class the port builds",
                        Fix(tuple(edits), imports=("flax.nnx",)))

    def _other_batchnorm_dims(self, short: str) -> bool:
        for call in astutil.walk(self.ctx.module, into_functions=True):
            if isinstance(call, (cst.Call, cst.Attribute, cst.Name)):
                qual = self.ctx.qualname(call.func if isinstance(call, cst.Call) else call) or ""
                if qual.startswith("torch.nn.BatchNorm") and qual != f"torch.nn.{short}":
                    return True
        return False
