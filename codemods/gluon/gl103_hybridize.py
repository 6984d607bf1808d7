import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model


class GluonHybridize(Rule):
    """
    ## What it does
    Removes `net.hybridize(...)` statements.

    ## Why
    Hybridizing compiles the block's operators into one graph; the torch port runs them
    eagerly, and on the torch_xla and JAX targets the training step is compiled anyway
    (XLA traces it).

    ## Fix safety
    Safe: a hybridized block computes what the imperative one computes.
    """

    code = "GL103"
    name = "gluon-hybridize"
    target = "torch"
    summary = "net.hybridize() -> removed (XLA compiles the step)"
    severity = Severity.INFO
    needs_text = ("hybridize",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            net = get_mlp()
            net.hybridize(static_alloc=True)
            out = net(x)
            """,
            """
            import mxnet as mx

            net = get_mlp()
            out = net(x)
            """,
        ),
    ]
    valid = ["net.hybridize = True\n"]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if not _model.is_gluon_file(self.ctx):
            return
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if isinstance(call, cst.Call) and astutil.method_name(call) == "hybridize":
            parent = self.ctx.parent
            # the only statement of a block stays, as `pass`
            body = getattr(parent, "body", None)
            if isinstance(body, (list, tuple)) and len(body) == 1:
                fix = Fix((self.replace(node, node.with_changes(body=[cst.Pass()])),))
            else:
                fix = Fix((self.remove(node),))
            self.report(node, "hybridize(): nothing to do in torch (XLA compiles the step)", fix)
