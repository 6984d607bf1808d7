import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model


def sequential_owners(ctx) -> frozenset:
    """Code of every expression a Gluon Sequential/HybridSequential is assigned to
    (`net`, `self.features`, `layer`), anywhere in the file."""
    memo = ctx.cache.get(("gluon-seq-owners", None))
    if memo is None:
        owners = set()
        for node in astutil.walk(ctx.module, into_functions=True):
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                if _model.gluon_layer(node.value.func, ctx) in _model.SEQUENTIALS:
                    owners.update(_model.code(t.target) for t in node.targets)
        memo = frozenset(owners)
        ctx.cache[("gluon-seq-owners", None)] = memo
    return memo


class GluonSequential(Rule):
    """
    ## What it does
    `nn.HybridSequential(prefix=...)` / `nn.Sequential()` -> `nn.Sequential()`, and `net.add(a)`
    on it -> `net.append(a)` (`net.add(a, b)` -> `net.extend([a, b])`), so the children keep
    Gluon's indices (`features.0`, `features.1.0.body.2`...).

    ## Why
    torch's `nn.Sequential` is the same container: children called in order, named by index.

    ## Fix safety
    Safe.
    """

    code = "GL104"
    name = "gluon-sequential"
    target = "torch"
    summary = "nn.HybridSequential() + net.add(layer) -> nn.Sequential() + net.append(layer)"
    severity = Severity.ERROR
    needs_text = ("Sequential",)
    examples = [
        Example(
            """
            from mxnet import gluon

            def body(channels):
                seq = gluon.nn.HybridSequential(prefix="")
                seq.add(gluon.nn.Dropout(0.5))
                seq.add(gluon.nn.Activation("relu"), gluon.nn.Flatten())
                return seq
            """,
            """
            from mxnet import gluon
            import torch.nn

            def body(channels):
                seq = torch.nn.Sequential()
                seq.append(gluon.nn.Dropout(0.5))
                seq.extend([gluon.nn.Activation("relu"), gluon.nn.Flatten()])
                return seq
            """,
        ),
    ]
    valid = ["import torch.nn as nn\nseq = nn.Sequential()\nseq.append(nn.ReLU())\n"]

    def visit_Call(self, node: cst.Call) -> None:
        kind = _model.gluon_layer(node.func, self.ctx)
        if kind in _model.SEQUENTIALS:
            nn, imports = _model.torch_nn(self.ctx)
            self.report(node, f"Gluon {kind}: torch nn.Sequential",
                        Fix((self.replace(node, cst.parse_expression(f"{nn}.Sequential()")),), imports=imports))
            return
        if astutil.method_name(node) == "add" and isinstance(node.func, cst.Attribute):
            owner = _model.code(node.func.value)
            if owner not in sequential_owners(self.ctx):
                return
            if any(a.keyword is not None or a.star for a in node.args) or not node.args:
                return
            if len(node.args) == 1:
                fix = Fix((self.replace(node, lambda n: n.with_changes(
                    func=n.func.with_changes(attr=cst.Name("append")))),))
            else:
                fix = Fix((self.replace(node, lambda n: n.with_changes(
                    func=n.func.with_changes(attr=cst.Name("extend")),
                    args=[cst.Arg(cst.List([cst.Element(a.value) for a in n.args]))])),))
            self.report(node, "Sequential.add: append", fix)
