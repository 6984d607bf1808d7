import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _ops_table as ops


class InplaceOp(Rule):
    """
    ## What it does
    Rewrites in-place tensor methods used as statements on a plain name to an assignment of
    the functional result: `x.add_(y)` -> `x = x + y`, `h.masked_fill_(m, 0)` ->
    `h = jnp.where(m, 0, h)`, `acc.zero_()` -> `acc = jnp.zeros_like(acc)`,
    `x.clamp_(0, 1)` -> `x = jnp.clip(x, min=0, max=1)`. The in-place methods torch has for the op table's
    methods are covered (docs/jax-ops.md counts them), plus `zero_`, `fill_` and `copy_`.

    An in-place call on anything but a plain name (`self.buf.mul_(0.9)`, `p.data.add_(g)`,
    `x[i].add_(1)`) or whose result is used (`y = x.add_(1)`) is marked `# porter: manual`
    and reported: it mutates storage that other names share, which JAX arrays never do; the
    port needs an `nnx.Variable` update (`self.buf.value = ...`) or `x.at[i].add(1)`.

    ## Why
    JAX arrays are immutable: there is no in-place method to call.

    ## Fix safety
    Safe for a plain local name: the name is rebound to the value torch would have written.
    The difference (other references to the same tensor no longer see the change) only
    matters for aliased storage, which is why anything but a plain name is reported instead.
    """

    code = "JX104"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "inplace-op-to-assignment"
    target = "jax"
    summary = "x.add_(y) -> x = x + y (in-place methods on plain names)"
    severity = Severity.ERROR
    needs_text = ("_(",)
    examples = [
        Example(
            """
            import torch

            def step(x: torch.Tensor, y, mask):
                x.add_(y, alpha=0.5)
                x.masked_fill_(mask, 0.0)
                x.clamp_(min=0)
                return x
            """,
            """
            import torch
            import jax.numpy as jnp

            def step(x: torch.Tensor, y, mask):
                x = x + 0.5 * y
                x = jnp.where(mask, 0.0, x)
                x = jnp.clip(x, min=0)
                return x
            """,
            title="rebinding a plain name",
        ),
        Example(
            """
            import torch

            class EMA:
                def update(self, value):
                    self.avg.mul_(0.9).add_(value, alpha=0.1)
            """,
            """
            import torch

            class EMA:
                def update(self, value):
                    self.avg.mul_(0.9).add_(value, alpha=0.1)  # porter: manual
            """,
            title="in-place update of an attribute: marked for a manual port",
        ),
    ]
    valid = [
        "import torch\nimport torch.nn as nn\nnn.init.xavier_uniform_(w)\n",
        "import torch\ndef f(optimizer):\n    optimizer.zero_grad()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        o = ops.INPLACE.get(func.attr.value)
        if o is None or self.ctx.qualname(func) is not None or ops.in_data_pipeline(self.ctx):
            return
        recv = func.value
        if isinstance(recv, (cst.SimpleString, cst.List, cst.Dict, cst.Tuple)):
            return
        if isinstance(recv, cst.Name) and recv.value in ("self", "cls"):
            return
        parent = self.ctx.parent
        stmt = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if isinstance(recv, cst.Call) and isinstance(recv.func, cst.Attribute) and recv.func.attr.value in ops.INPLACE:
            return  # the inner in-place call of a chain reports the line
        what = f"x.{func.attr.value}(...)"
        if not (isinstance(recv, cst.Name) and isinstance(parent, cst.Expr) and isinstance(stmt, cst.SimpleStatementLine)):
            ops.report_manual(
                self, node,
                f"{what} on {'an attribute' if isinstance(recv, cst.Attribute) else 'a subscript' if isinstance(recv, cst.Subscript) else 'a value that is used'}: "
                "JAX arrays are immutable; rebind the value (an nnx.Variable's .value, x.at[i].set/add for an element)",
            )
            return
        try:
            text, used = ops.build(o, node, self.ctx, recv)
        except ops.NotMine:
            return
        except ops.Manual as exc:
            ops.report_manual(self, node, f"{what}: {exc}")
            return
        if isinstance(text, tuple):
            ops.report_manual(self, node, f"{what} returns values and indices")
            return
        if func.attr.value in ops.INPLACE_CAST:  # torch stores the result in x's own dtype
            text = f"{ops.atom(astutil.parse_expression(text))}.astype({recv.value}.dtype)"
        new = cst.Assign([cst.AssignTarget(cst.Name(recv.value))], astutil.parse_expression(text))
        self.report(node, f"{what}: JAX arrays are immutable: {recv.value} = {text}", Fix((self.replace(parent, new),), imports=tuple(sorted(used))))
