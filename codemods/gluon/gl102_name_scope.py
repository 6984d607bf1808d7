import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _model


class GluonNameScope(Rule):
    """
    ## What it does
    Removes Gluon's `with self.name_scope():` (or `with net.name_scope():`) and keeps its body
    at the enclosing level.

    ## Why
    `name_scope` only prefixes Gluon's parameter names; torch names parameters by attribute
    path, which the port keeps.

    ## Fix safety
    Safe: the statements inside run in the same order.
    """

    code = "GL102"
    name = "gluon-name-scope"
    target = "torch"
    summary = "with self.name_scope(): body -> body"
    severity = Severity.WARNING
    needs_text = ("name_scope",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            def build(net, layers):
                with net.name_scope():
                    for layer in layers:
                        net.add(layer)
                return net
            """,
            """
            import mxnet as mx

            def build(net, layers):
                for layer in layers:
                    net.add(layer)
                return net
            """,
        ),
    ]
    valid = ["with torch.no_grad():\n    y = f(x)\n"]

    def visit_With(self, node: cst.With) -> None:
        if not _model.is_gluon_file(self.ctx):
            return
        if not _model._name_scope_with(node) or not isinstance(node.body, cst.IndentedBlock):
            return

        def flatten(updated: cst.With):
            body = list(updated.body.body)
            if not body:
                return cst.RemoveFromParent()
            body[0] = body[0].with_changes(leading_lines=[*updated.leading_lines, *body[0].leading_lines])
            return cst.FlattenSentinel(body)

        self.report(node, "Gluon's name_scope has no torch meaning", Fix((self.replace(node, flatten),)))
