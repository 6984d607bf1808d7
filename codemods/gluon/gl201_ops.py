import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _model, _ops_table
from ._ops_table import Manual

_OPERATORS = (cst.BinaryOperation, cst.BooleanOperation, cst.Comparison, cst.UnaryOperation, cst.IfExp)


class GluonOps(Rule):
    """
    ## What it does
    Rewrites MXNet operators called through `F` in `hybrid_forward(self, F, ...)`, or through
    `mx.nd` / `nd` / `mx.sym`, to their torch counterparts, from the table in
    codemods/gluon/_ops_table.py: `F.relu(x)` -> `torch.relu(x)`, `F.Activation(x,
    act_type="relu")` -> `torch.relu(x)`, `F.concat(a, b, dim=1)` -> `torch.cat([a, b], dim=1)`,
    `F.sum(x, axis=1, keepdims=True)` -> `torch.sum(x, dim=1, keepdim=True)`, `nd.softmax(x)`
    -> `torch.softmax(x, dim=-1)`, `F.broadcast_add(a, b)` -> `a + b`...

    MXNet's own semantics are kept where they differ from torch's: a full reduction of the
    NDArray API has shape `(1,)` (`.reshape(1)`), `argmax` returns float indices, `concat`
    joins on axis 1 by default, `maximum(x, 0.0)` takes a scalar (`torch.clamp`). A call the
    table cannot write with the same semantics (reshape's special codes 0/-2/-3/-4, an
    `axis` that is not a literal, `F.<op>` not in the table) is reported and its line marked
    `# porter: manual`.

    Array creation (`nd.zeros`, `nd.array`, `nd.random.*`, with their `ctx=`) is left to the
    script rules (GL0xx).

    ## Why
    `F` is the NDArray or Symbol API Gluon passes to `hybrid_forward`; torch calls its
    functions directly.

    ## Fix safety
    Safe: every entry is checked numerically against mxnet 1.9.1 (tests/test_gluon_ops.py:
    values, shapes and dtypes).
    """

    code = "GL201"
    name = "gluon-ops"
    target = "torch"
    summary = "F.* / mx.nd.* operators -> torch (the op table)"
    severity = Severity.ERROR
    needs_text = ("mxnet", "hybrid_forward")
    examples = [
        Example(
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x, y):
                    z = F.concat(F.relu(x), y)
                    return F.sum(z, axis=1) + F.broadcast_mul(x, y)
            """,
            """
            from mxnet import gluon
            import torch

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x, y):
                    z = torch.cat([torch.relu(x), y], dim=1)
                    return torch.sum(z, dim=1) + (x * y)
            """,
        ),
        Example(
            """
            import mxnet as mx

            probs = mx.nd.softmax(logits)
            total = mx.nd.sum(probs)
            """,
            """
            import mxnet as mx
            import torch

            probs = torch.softmax(logits, dim=-1)
            total = torch.sum(probs).reshape(1)
            """,
            title="a full reduction keeps MXNet's shape (1,)",
        ),
        Example(
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x):
                    return F.reshape(x, shape=(0, -1))
            """,
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x):
                    return F.reshape(x, shape=(0, -1))  # porter: manual
            """,
            title="reshape's special codes are left for a person",
        ),
    ]
    valid = ["import torch\ny = torch.relu(x)\n", "import mxnet as mx\nx = mx.nd.zeros((2, 3))\n"]

    def visit_Call(self, node: cst.Call) -> None:
        f = node.func
        if not isinstance(f, cst.Attribute):
            return
        name = None
        via_f = False
        fname = _model.hybrid_f_name(self.ctx)
        if fname is not None and isinstance(f.value, cst.Name) and f.value.value == fname:
            name, via_f = f.attr.value, True
        else:
            q = self.ctx.qualname(f)
            if q:
                for ns in _ops_table.NAMESPACES:
                    if q.startswith(ns + ".") and "." not in q[len(ns) + 1:]:
                        name = q[len(ns) + 1:]
        if name is None:
            return
        op = _ops_table.OPS.get(name)
        if op is None:
            if via_f:
                _model.report_manual(self, node, f"F.{name} is not in porter's MXNet op table")
            return
        torch, imports = _model.torch_name(self.ctx)
        try:
            _ops_table.build(op, node, torch)
        except Manual as exc:
            _model.report_manual(self, node, f"{name}: {exc}")
            return
        parent = self.ctx.parent

        def rewrite(updated: cst.Call):
            new = cst.parse_expression(_ops_table.build(op, updated, torch))
            if isinstance(new, _OPERATORS) and not isinstance(parent, (cst.Arg, cst.Assign, cst.Return, cst.Expr,
                                                                        cst.Element, cst.AnnAssign)):
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return new

        self.report(node, f"MXNet {name}: torch", Fix((self.replace(node, rewrite),), imports=imports))
