from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.branches import take_branch
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp


class CudaTensorTest(Rule):
    """
    ## What it does
    Folds a test of whether an array is a CUDA tensor, `x.is_cuda`, to its value in a JAX
    port, False, with the condition that holds it: `if x.is_cuda and self.ngpu > 1:
    <nn.parallel.data_parallel(...)> else: y = self.main(x)` -> `y = self.main(x)`;
    `if not x.is_cuda: A` -> `A`; `a if x.is_cuda else b` -> `b`; a stored or passed value
    (`pin = x.is_cuda`) -> `False`. The rest of an `and` goes with it only where it has no
    call (nothing that would have run is lost); `x.is_cuda` on an argparse namespace or an
    object whose `is_cuda` the file assigns (a setting, not a tensor) is left alone.

    ## Why
    A JAX array has no `is_cuda`: the ported module fails at its first call with
    "AttributeError: ... has no attribute is_cuda". In the port it could only be False: JAX
    arrays are not torch's CUDA tensors, and the torch code that stays (the input pipeline)
    runs on the host. The multi-GPU branch these tests guard (torch's data_parallel over
    `ngpu` GPUs) has no place in a JAX port, where several devices are used by sharding.

    ## Fix safety
    Safe: the branch kept is the one the original takes for a tensor that is not on a CUDA
    GPU, and the test is False for every array of the port.
    """

    code = "JX317"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-cuda-tensor-test"
    target = "jax"
    summary = "x.is_cuda -> False in a JAX port, with the branch of the `if` it decides"
    severity = Severity.ERROR
    needs_text = ("is_cuda",)
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn

            class Generator(nn.Module):
                def __init__(self, ngpu):
                    super().__init__()
                    self.ngpu = ngpu
                    self.main = nn.Linear(4, 4)

                def forward(self, input):
                    # several GPUs: split the batch
                    if input.is_cuda and self.ngpu > 1:
                        output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
                    else:
                        output = self.main(input)
                    return output
            """,
            """
            import torch
            import torch.nn as nn

            class Generator(nn.Module):
                def __init__(self, ngpu):
                    super().__init__()
                    self.ngpu = ngpu
                    self.main = nn.Linear(4, 4)

                def forward(self, input):
                    # several GPUs: split the batch
                    output = self.main(input)
                    return output
            """,
            title="the multi-GPU branch of a module's forward pass",
        ),
        Example(
            """
            import torch

            def prepare(x, log):
                if not x.is_cuda:
                    x = x * 2
                scale = 0.5 if x.is_cuda else 1.0
                log(on_gpu=x.is_cuda)
                return x * scale
            """,
            """
            import torch

            def prepare(x, log):
                x = x * 2
                scale = 1.0
                log(on_gpu=False)
                return x * scale
            """,
            title="a negated test, a conditional expression, a passed value",
        ),
        Example(
            """
            import torch

            if load(batch) and batch.is_cuda:
                batch = batch.half()
            """,
            None,
            title="a call before the test in its condition: reported, not folded (the call would be lost)",
        ),
    ]
    valid = [
        "import torch\nargs = parser.parse_args()\nif args.is_cuda:\n    pass\n",
        "import torch\nclass Cfg:\n    pass\ncfg = Cfg()\ncfg.is_cuda = True\nif cfg.is_cuda:\n    pass\n",
        "if x.is_cuda:\n    pass\n",  # not a torch file
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "is_cuda" or not lp.imports_torch(self.ctx):
            return
        anc = self.ctx.ancestors
        if isinstance(self.ctx.parent, cst.Call) and self.ctx.parent.func is node:
            return
        if isinstance(self.ctx.parent, (cst.AssignTarget, cst.AugAssign)) or self._a_setting(node):
            return
        # climb the condition: `not`, and an `and` whose other operands have no call
        top, at, value = node, len(anc) - 1, False
        while at >= 1:
            parent = anc[at - 1]
            if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
                value = not value
            elif isinstance(parent, cst.BooleanOperation) and isinstance(
                    parent.operator, cst.And if not value else cst.Or):
                other = parent.right if parent.left is top else parent.left
                if any(isinstance(n, cst.Call) for n in astutil.walk(other)) and parent.left is not top:
                    return self.report(node, "x.is_cuda is False in a JAX port, but the condition calls code "
                                             "before it: decide what this branch does")
            else:
                break
            top, at = parent, at - 1
        holder = anc[at - 1] if at >= 1 else None
        fix: Optional[Fix] = None
        if isinstance(holder, cst.If) and holder.test is top:
            fix = take_branch(self, holder, value, at - 1)
        elif isinstance(holder, cst.IfExp) and holder.test is top:
            fix = Fix((self.replace(holder, holder.body if value else holder.orelse),))
        elif isinstance(holder, cst.BooleanOperation):  # `not x.is_cuda and flag` -> `flag`
            fix = Fix((self.replace(holder, holder.right if holder.left is top else holder.left),))
        elif not isinstance(holder, (cst.While, cst.Assert)):
            fix = Fix((self.replace(top, cst.Name("True" if value else "False")),))
        if fix is not None:
            fix = Fix(fix.edits, Safety.SAFE)
        self.report(node, "x.is_cuda: a JAX array is not a CUDA tensor (False in the port); "
                          + ("the branch it decides is kept" if fix is not None else "decide what this code does"), fix)

    def _a_setting(self, node: cst.Attribute) -> bool:
        """`args.is_cuda`, `cfg.is_cuda` where the file assigns it: a flag, not a tensor's."""
        root = astutil.root_name(node)
        if root in lp.file_facts(self.ctx).namespaces:
            return True
        key = ("jx317.assigned",)
        if key not in self.ctx.cache:  # the `x.is_cuda = ...` targets of the file
            self.ctx.cache[key] = {
                astutil.code(t.target) for n in astutil.walk(self.ctx.module, into_functions=True)
                if isinstance(n, cst.Assign) for t in n.targets
                if isinstance(t.target, cst.Attribute) and t.target.attr.value == "is_cuda"}
        return astutil.code(node) in self.ctx.cache[key]
