import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model

_IS_NP = frozenset({"mxnet.util.is_np_array", "mxnet.is_np_array"})


class GluonOpAlias(Rule):
    """
    ## What it does
    In `hybrid_forward(self, F, ...)`, a local name bound once to an operator of `F` and only
    called (`act = F.Activation`, `act = F.npx.activation if is_np_array() else F.Activation`)
    is replaced by the operator at each call (`act(x, act_type="relu")` ->
    `F.Activation(x, act_type="relu")`) and the assignment is removed, so that the op table
    (GL201) translates each call. Of MXNet's NumPy-mode switch `is_np_array()`, the NDArray
    branch is kept: the mode of MXNet unless `npx.set_np()` was called (the port's arrays are
    torch tensors, and GL201 gives each `F.<op>` the NDArray API's semantics).

    ## Why
    `F` is gone from the port's `forward`: a name bound to one of its operators would be a
    `NameError`, and the operator is translated only where it is called.

    ## Fix safety
    Safe: the same operator is called with the same arguments; the name is bound once, at the
    top level of the method, and used only as the called function.
    """

    code = "GL202"
    name = "gluon-op-alias"
    target = "torch"
    summary = "act = F.Activation; act(x, ...) -> F.Activation(x, ...) (then the op table)"
    severity = Severity.ERROR
    needs_text = ("hybrid_forward",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon
            from mxnet.util import is_np_array

            class Block(gluon.HybridBlock):
                def hybrid_forward(self, F, x, y):
                    act = F.npx.activation if is_np_array() else F.Activation
                    join = F.elemwise_add
                    return act(join(x, y), act_type="relu")
            """,
            """
            from mxnet import gluon

            class Block(gluon.HybridBlock):
                def hybrid_forward(self, F, x, y):
                    return F.Activation(F.elemwise_add(x, y), act_type="relu")
            """,
            title="an operator bound to a name, with MXNet's NumPy-mode switch",
        ),
    ]
    valid = [
        "from mxnet import gluon\nclass B(gluon.HybridBlock):\n    def hybrid_forward(self, F, x):\n"
        "        op = F.relu\n        ops = [op]\n        return op(x)\n",
    ]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params.params
        if node.name.value != "hybrid_forward" or len(params) < 2 or not isinstance(node.body, cst.IndentedBlock):
            return
        f = params[1].name.value
        for stmt in node.body.body:
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
                    and isinstance(stmt.body[0].targets[0].target, cst.Name)):
                continue
            op = self._op(stmt.body[0].value, f)
            if op is None:
                continue
            target = stmt.body[0].targets[0].target
            calls = self._calls(node, target)
            if not calls:
                continue
            edits = [self.remove(stmt), *(self.replace(c.func, op.deep_clone()) for c in calls)]
            self.report(stmt, f"{target.value} = F.{_model.code(op)[len(f) + 1:]}: the operator called directly",
                        Fix(tuple(edits)))

    def _op(self, value: cst.BaseExpression, f: str):
        """The ``F.<op>`` that ``value`` names (the NDArray branch of an ``is_np_array()`` choice)."""
        if isinstance(value, cst.IfExp):
            test, neg = value.test, False
            if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                test, neg = test.expression, True
            if not (isinstance(test, cst.Call) and not test.args and self.ctx.qualname(test.func) in _IS_NP):
                return None
            value = value.body if neg else value.orelse
        if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == f:
            return value
        return None

    @staticmethod
    def _calls(fn: cst.FunctionDef, target: cst.Name) -> list:
        """The calls of ``target``'s name in ``fn``, when the name is bound once and only called."""
        calls, names = [], []
        for n in astutil.walk(fn.body, into_functions=True):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == target.value:
                calls.append(n)
            if isinstance(n, cst.Name) and n.value == target.value:
                names.append(n)
            if isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
                t = getattr(n, "target", None)
                if isinstance(t, cst.Name) and t.value == target.value and t is not target:
                    return []  # bound again
        funcs = {id(c.func) for c in calls}
        if any(id(n) not in funcs and n is not target for n in names):
            return []
        return calls
