from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp


def _parameter_list(value: cst.BaseExpression) -> bool:
    """``[p for p in model.parameters() ...]`` or ``list(model.parameters())``."""
    if isinstance(value, cst.ListComp) and value.for_in.inner_for_in is None:
        it = value.for_in.iter
    elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "list" \
            and len(value.args) == 1:
        it = value.args[0].value
    else:
        return False
    return isinstance(it, cst.Call) and astutil.method_name(it) == "parameters" and not it.args


class UnusedParameterList(Rule):
    """
    ## What it does
    Removes a statement that only lists a model's parameters
    (`params = [p for p in model.parameters() if p.requires_grad]`, `list(model.parameters())`)
    when nothing in the file reads the list: what used it (gradient clipping over
    `p.grad`, an optimizer) is ported to whole-model transformations.

    ## Why
    An NNX model has no `parameters()`: the statement would fail in the port, and it
    computes nothing the port uses.

    ## Fix safety
    Safe: the list is read nowhere.
    """

    code = "JX311"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-unused-parameter-list"
    target = "jax"
    summary = "params = [p for p in model.parameters() ...] read by nothing -> removed"
    severity = Severity.ERROR
    needs_text = ("parameters()",)
    examples = [
        Example(
            """
            import torch

            def main(model, loader):
                params = [p for p in model.parameters() if p.requires_grad]
                for x in loader:
                    model(x)
            """,
            """
            import torch

            def main(model, loader):
                for x in loader:
                    model(x)
            """,
        ),
    ]
    valid = [
        "import torch\nparams = list(model.parameters())\nprint(len(params))\n",
        "import torch\nparams = [p for p in model.parameters()]\nopt = torch.optim.SGD(params, lr=0.1)\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign) or not lp.imports_torch(self.ctx):
            return
        assign = node.body[0]
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or not _parameter_list(assign.value):
            return
        name = assign.targets[0].target.value
        # a function's local: read in that function (and the closures in it); a module-level
        # name: anywhere in the file
        scope = self.ctx.enclosing(cst.FunctionDef) or self.ctx.module
        uses = sum(1 for n in astutil.walk(scope, into_functions=True) if isinstance(n, cst.Name) and n.value == name)
        if uses != 1:
            return
        self.report(node, f"`{name}` lists the model's parameters and nothing reads it (an NNX model has no parameters())",
                    Fix((self.remove(node),), Safety.SAFE))
