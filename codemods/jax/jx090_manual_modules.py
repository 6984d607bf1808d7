from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _layers, _nnx, _optax
from ._nnx import handled_tree_walk


_TREE_METHODS = ("modules", "named_modules", "children", "named_children", "parameters", "named_parameters",
                 "buffers", "named_buffers", "apply")


class ManualModule(Rule):
    """
    ## What it does
    Reports the module constructs the JAX port cannot translate with the same semantics and
    leaves them in place, marked `# porter: manual (JX090): <reason>` on their line:

    - torch.nn layers without a translation (`nn.Transformer`, `nn.TransformerDecoderLayer`, `nn.RNN`,
      `nn.Upsample`, `nn.EmbeddingBag`...) and arguments the translation does not cover
      (`return_indices=True`, a bidirectional LSTM, `nn.ConvTranspose2d(groups=2)`,
      `nn.Softmax()` without `dim`, LayerNorm over several dimensions, `dtype=`...);
    - a layer with parameters built in `forward` or another method that is not `__init__`,
      or in a class body (it has no `rngs` to draw its parameters from; torch would create
      new parameters on every call);
    - `register_buffer` with a computed name or a `None` tensor, forward/backward hooks;
    - `self.named_parameters()`, `self.apply(fn)` and the other tree walks inside a module
      class (`for m in self.modules():` loops and `next(self.parameters())` are JX012's,
      `self.apply(init_fn)` of a def or method porter sees JX016's): NNX
      has `nnx.iter_modules` / `nnx.state`, but what the loop does needs a person;
    - classes deriving from a torch.nn layer other than `nn.Module` and `nn.Sequential`
      (`class MyConv(nn.Conv2d)`).

    ## Why
    A port that runs but computes something else is worse than no port: these need a person.

    ## Fix safety
    The marker comment is the only change: the code stays as it was.
    """

    code = "JX090"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-manual-module"
    target = "jax"
    summary = "module constructs without a faithful NNX translation: reported, marked # porter: manual"
    severity = Severity.ERROR
    needs_text = ("nn", "Module", "register_")
    examples = [
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.pool = nn.MaxPool2d(2, return_indices=True)
                    self.enc = nn.Transformer(64, 4)
            """,
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.pool = nn.MaxPool2d(2, return_indices=True)  # porter: manual (JX090): nn.MaxPool2d(return_indices=True): the indices output is not translated
                    self.enc = nn.Transformer(64, 4)  # porter: manual (JX090): nn.Transformer: not translated: build it from MultiheadAttention, Linear and LayerNorm
            """,
            title="a layer argument and a layer without translation",
        ),
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    return nn.Linear(10, 2)(x)
            """,
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    return nn.Linear(10, 2)(x)  # porter: manual (JX090): a layer built in a class body or a method other than __init__ has no rngs: build it in __init__ (torch would create new parameters on every call)
            """,
            title="a layer built in forward",
        ),
    ]
    valid = [
        "import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self):\n        self.fc = nn.Linear(2, 2)\n",
        "import torch.nn as nn\ncriterion = nn.CrossEntropyLoss()\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._marked: set[int] = set()

    def _manual(self, node: cst.CSTNode, reason: str) -> None:
        stmt = _nnx.statement_of(self.ctx)
        if _nnx.has_manual_marker(stmt):
            self.report(node, reason, severity=Severity.WARNING)
            return
        fix = None
        if stmt is not None and id(stmt) not in self._marked:
            self._marked.add(id(stmt))
            fix = Fix((self.replace(stmt, _nnx.manual_comment(self.code, reason)),), description="marked for a manual port")
        self.report(node, reason, fix)

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func) or ""
        if qual.startswith("torch.nn."):
            if _layers.inside_manual_construct(self.ctx):
                return  # the enclosing construction is reported
            result = _layers.plan(node, qual, self.ctx)
            if isinstance(result, _layers.Manual):
                self._manual(node, str(result))
            elif result is not None and result.rngs and not _nnx.in_rngs_scope(self.ctx) and _nnx.scope_statement(self.ctx) is None:
                self._manual(node, "a layer built in a class body or a method other than __init__ has no rngs: build it in __init__ (torch would create new parameters on every call)")
            return
        method = astutil.method_name(node)
        if method in ("register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook", "register_backward_hook"):
            self._manual(node, f"{method}: NNX modules have no hooks; call the code explicitly in __call__")
        elif (
            method in _TREE_METHODS and isinstance(node.func.value, cst.Name) and node.func.value.value == "self"  # type: ignore[attr-defined]
            and _nnx.enclosing_module_class(self.ctx) is not None and not handled_tree_walk(node, self.ctx)
            and id(node) not in _optax.decay_group_parts(self.ctx)  # an optimizer's decay groups: JX201's
            and not (method == "apply" and len(node.args) == 1 and _nnx.apply_init_target(self.ctx, node.args[0].value))
        ):
            self._manual(node, f"self.{method}(): nn.Module's tree walks have no NNX method of that name "
                               "(nnx.iter_modules(self) / nnx.state(self, nnx.Param)); a weight-init loop over torch "
                               "layer types needs a hand port (or load the original's weights with load_torch_state_dict)")
        elif method == "register_buffer" and _nnx.enclosing_module_class(self.ctx) is not None:
            name = astutil.arg(node, "name", 0)
            tensor = astutil.arg(node, "tensor", 1)
            key = astutil.string_value(name.value) if name else None
            if key is None or not key.isidentifier():
                self._manual(node, "register_buffer with a computed name: assign an nnx.Variable attribute by hand")
            elif tensor is None or _nnx.literal(tensor.value) is None:
                self._manual(node, "register_buffer(name, None): an optional buffer has no NNX counterpart")

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            qual = self.ctx.qualname(base.value) or ""
            if qual.startswith("torch.nn.") and qual not in _nnx.TORCH_MODULE and qual not in _nnx.TORCH_CONTAINER_BASES \
                    and qual.split(".")[-1][:1].isupper():
                self.report(node, f"class {node.name.value} derives from {qual}: subclasses of torch layers are not translated; derive from nn.Module and hold the layer as an attribute")
