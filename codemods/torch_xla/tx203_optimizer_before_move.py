from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _training as tr

_SWAP = "set_swap_module_params_on_conversion"


class OptimizerBeforeMove(Rule):
    """
    ## What it does
    In a file that builds a `torch.optim` optimizer from `model.parameters()` and moves that
    module to its device (`model.to(device)`, `model.cuda()`) where porter cannot see that the
    move comes first (in another function, such as a trainer's `__init__` that receives the
    model and the optimizer already built, or after the optimizer in the same function), adds
    `torch.__future__.set_swap_module_params_on_conversion(True)` after the imports.

    ## Why
    On CUDA, `module.to(device)` moves each parameter in place: the optimizer built before
    the move still holds the model's parameters. On XLA it does not: measured in torch_xla
    2.9, after `m.to(torch_xla.device())` the module holds new `Parameter` objects and the
    optimizer keeps the old CPU ones, so `optimizer.step()` updates tensors the model no
    longer uses and the model never learns (the losses of a ported trainer diverge from the
    original's at the second step). With the swap flag, `Module.to` swaps the tensors into
    the existing parameters (`torch.utils.swap_tensors`), which keeps their identity as on
    CUDA (measured: the same object, updated by the optimizer built before the move).

    ## Fix safety
    Safe: only the way `Module.to`/`.cuda()` convert parameters changes: they keep the same
    `Parameter` objects with the new device's data, as the original relied on. Values are
    unchanged.
    """

    code = "TX203"
    name = "xla-optimizer-before-move"
    target = "torch-xla"
    summary = "optimizer built before the model moves to XLA keeps the CPU parameters: keep parameter identity on conversion"
    severity = Severity.ERROR
    needs_text = ("parameters(",)
    examples = [
        Example(
            """
            import torch

            class Trainer:
                def __init__(self, model, optimizer, device):
                    self.model = model.to(device)
                    self.optimizer = optimizer

            def main(device):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                Trainer(model, optimizer, device)
            """,
            """
            import torch
            torch.__future__.set_swap_module_params_on_conversion(True)

            class Trainer:
                def __init__(self, model, optimizer, device):
                    self.model = model.to(device)
                    self.optimizer = optimizer

            def main(device):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                Trainer(model, optimizer, device)
            """,
            title="a trainer that moves the model it is given",
        ),
        Example(
            """
            import torch
            from torch import nn, optim

            net = nn.Linear(4, 2)
            opt = optim.Adam(net.parameters())
            net.cuda()
            """,
            """
            import torch
            from torch import nn, optim
            torch.__future__.set_swap_module_params_on_conversion(True)

            net = nn.Linear(4, 2)
            opt = optim.Adam(net.parameters())
            net.cuda()
            """,
            title="moved after the optimizer in the same scope",
        ),
    ]
    valid = [
        # moved first, then the optimizer: nothing to keep
        "import torch\nmodel = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\ndef main(device):\n    model = Net()\n    model.to(device)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        # tensors moved, no module
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = x.to(device)\n",
        # the flag is already set
        "import torch\ntorch.__future__.set_swap_module_params_on_conversion(True)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(device)\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        opt_scopes: dict[str, list[tuple[Optional[cst.CSTNode], cst.Call]]] = {}
        moves: list[tuple[str, Optional[cst.CSTNode], cst.Call]] = []
        for scope, call in _calls_with_scope(node):
            q = self.ctx.qualname(call.func) or ""
            if q.endswith("." + _SWAP):
                return
            if tr.classify_value(call, self.ctx) == tr.OPTIMIZER:
                for module in _parameter_owners(call):
                    opt_scopes.setdefault(module, []).append((scope, call))
            elif astutil.method_name(call) in ("to", "cuda") and isinstance(call.func, cst.Attribute):
                key = dotted_name(call.func.value)
                if key is not None:
                    moves.append((key.rsplit(".", 1)[-1], scope, call))
        late = None
        for name, scope, call in moves:
            for opt_scope, opt_call in opt_scopes.get(name, ()):
                if opt_scope is not scope or _position(node, opt_call) < _position(node, call):
                    late = call
                    break
            if late is not None:
                break
        if late is None:
            return
        imports = [s for s in node.body if isinstance(s, cst.SimpleStatementLine)
                   and all(isinstance(b, (cst.Import, cst.ImportFrom)) for b in s.body)]
        if not imports or node.body.index(imports[-1]) != len(imports) - 1 + _docstring_lines(node):
            self.report(late, "this module moves to its device after (or apart from) the optimizer built on its "
                        "parameters: on XLA the optimizer keeps the old CPU parameters; build the optimizer "
                        "after the move, or call torch.__future__.set_swap_module_params_on_conversion(True) first")
            return
        torch = self.ctx.module_alias("torch")
        flag = cst.parse_statement(f"{torch}.__future__.{_SWAP}(True)\n")
        self.report(
            late,
            "this module moves to its device after (or apart from) the optimizer built on its parameters: on "
            "XLA `.to()` gives the module new Parameter objects and the optimizer would update the old CPU "
            "ones; torch.__future__.set_swap_module_params_on_conversion(True) keeps them (as on CUDA)",
            Fix((Edit(imports[-1], astutil.insert_after([flag])),), imports=("torch",)),
        )


def _docstring_lines(module: cst.Module) -> int:
    first = module.body[0] if module.body else None
    if (isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))):
        return 1
    return 0


def _parameter_owners(call: cst.Call) -> Iterator[str]:
    """Last names of the modules whose ``.parameters()`` (or ``named_parameters``) the
    optimizer's arguments read: ``model``, ``self.net`` -> ``net``."""
    for n in astutil.walk(call):
        if isinstance(n, cst.Call) and astutil.method_name(n) in ("parameters", "named_parameters"):
            key = dotted_name(n.func.value)  # type: ignore[attr-defined]
            if key is not None:
                yield key.rsplit(".", 1)[-1]


def _calls_with_scope(module: cst.Module) -> Iterator[tuple[Optional[cst.CSTNode], cst.Call]]:
    """Every call, with its innermost function (None: the module's code)."""
    stack: list[tuple[cst.CSTNode, Optional[cst.CSTNode]]] = [(module, None)]
    while stack:
        n, scope = stack.pop()
        if isinstance(n, cst.Call):
            yield scope, n
        inner = n if isinstance(n, (cst.FunctionDef, cst.Lambda)) else scope
        stack.extend((c, inner) for c in reversed(astutil.children(n)))


def _position(module: cst.Module, target: cst.CSTNode) -> int:
    for i, n in enumerate(astutil.walk(module, into_functions=True)):
        if n is target:
            return i
    return -1
