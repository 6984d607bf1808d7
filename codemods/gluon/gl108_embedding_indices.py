import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model


class GluonEmbeddingIndices(Rule):
    """
    ## What it does
    In a Gluon block, a call of an `Embedding` layer the block builds (`self.encoder =
    nn.Embedding(...)`) gets its indices as integers: `self.encoder(x)` ->
    `self.encoder(x.long())`.

    ## Why
    Gluon's Embedding takes float indices (MXNet data pipelines deliver token ids as float32
    arrays); torch's `nn.Embedding` raises on a float tensor.

    ## Fix safety
    Safe: `.long()` of integer-valued floats is the index Gluon uses, and a no-op on int64
    indices.
    """

    code = "GL108"
    name = "gluon-embedding-indices"
    target = "torch"
    summary = "self.embedding(x) in a Gluon block -> self.embedding(x.long())"
    severity = Severity.ERROR
    needs_text = ("Embedding",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon

            class LM(gluon.Block):
                def __init__(self, vocab, dim):
                    super(LM, self).__init__()
                    self.encoder = gluon.nn.Embedding(vocab, dim)

                def forward(self, tokens):
                    return self.encoder(tokens)
            """,
            """
            from mxnet import gluon

            class LM(gluon.Block):
                def __init__(self, vocab, dim):
                    super(LM, self).__init__()
                    self.encoder = gluon.nn.Embedding(vocab, dim)

                def forward(self, tokens):
                    return self.encoder(tokens.long())
            """,
        ),
    ]
    valid = ["import torch.nn as nn\n\nclass LM(nn.Module):\n    def forward(self, x):\n        return self.emb(x)\n"]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not _model.is_block_class(node, self.ctx):
            return
        embeddings = set()
        for n in astutil.walk(node.body, into_functions=True):
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call):
                t = n.targets[0].target
                if (_model.gluon_layer(n.value.func, self.ctx) == "Embedding" and isinstance(t, cst.Attribute)
                        and isinstance(t.value, cst.Name) and t.value.value == "self"):
                    embeddings.add(t.attr.value)
        if not embeddings:
            return
        for stmt in node.body.body:
            if not (isinstance(stmt, cst.FunctionDef) and stmt.name.value in ("forward", "hybrid_forward")):
                continue
            for call in astutil.walk(stmt.body, into_functions=True):
                if (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                        and isinstance(call.func.value, cst.Name) and call.func.value.value == "self"
                        and call.func.attr.value in embeddings and len(call.args) == 1 and call.args[0].keyword is None
                        and not call.args[0].star):
                    arg = call.args[0].value
                    if isinstance(arg, cst.Call) and astutil.method_name(arg) == "long":
                        continue
                    self.report(call, "Gluon's Embedding takes float indices; torch's takes integers", Fix((
                        self.replace(call, lambda c: c.with_changes(args=[c.args[0].with_changes(
                            value=cst.Call(cst.Attribute(_paren(c.args[0].value), cst.Name("long"))))])),)))


def _paren(expr):
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
