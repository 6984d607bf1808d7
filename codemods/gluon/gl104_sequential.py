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
    Gluon's indices (`features.0`, `features.1.0.body.2`...). The layers added right after
    the container is made, one statement after another (also inside `with
    net.name_scope():`), become the constructor's arguments: `nn.Sequential(a, b, c)`, one
    layer a line, with the lines' comments; adds in loops or branches stay `append`.

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
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
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
                seq = torch.nn.Sequential(
                    gluon.nn.Dropout(0.5),
                    gluon.nn.Activation("relu"),
                    gluon.nn.Flatten(),
                )
                return seq
            """,
        ),
        Example(
            """
            from mxnet import gluon

            def stage(blocks):
                layer = gluon.nn.HybridSequential(prefix="stage1_")
                for block in blocks:
                    layer.add(block)
                return layer
            """,
            """
            from mxnet import gluon
            import torch.nn

            def stage(blocks):
                layer = torch.nn.Sequential()
                for block in blocks:
                    layer.append(block)
                return layer
            """,
            title="layers added in a loop",
        ),
    ]
    valid = ["import torch.nn as nn\nseq = nn.Sequential()\nseq.append(nn.ReLU())\n"]

    def visit_Module(self, node: cst.Module) -> None:
        self._block(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._block(node)

    def _block(self, block) -> None:
        owners = []
        body = list(block.body)
        for i, stmt in enumerate(body):
            if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
                    and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].value, cst.Call)
                    and _model.gluon_layer(stmt.body[0].value.func, self.ctx) in _model.SEQUENTIALS
                    and i + 1 < len(body) and _adds_next(body[i + 1], _model.code(stmt.body[0].targets[0].target))):
                owners.append(_model.code(stmt.body[0].targets[0].target))
        if not owners:
            return
        self.report(block, "layers added right after the Sequential is made: its constructor's arguments",
                    Fix((self.replace(block, lambda b: _collapse(b, owners)),)))

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


def _adds_next(stmt, owner: str) -> bool:
    """``owner.add(...)`` as the next statement, or first in a ``with owner.name_scope():``."""
    if isinstance(stmt, cst.With) and _model._name_scope_with(stmt) and isinstance(stmt.body, cst.IndentedBlock):
        stmt = stmt.body.body[0] if stmt.body.body else None
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    return (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "add"
            and _model.code(call.func.value) == owner)


def _added(stmt, owner: str):
    """The layers a ``owner.append(x)`` / ``owner.extend([x, y])`` line adds, else None."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return None
    call = stmt.body[0].value
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
            and _model.code(call.func.value) == owner and call.args and not any(a.keyword or a.star for a in call.args)):
        return None
    if call.func.attr.value == "append" and len(call.args) == 1:
        return [call.args[0].value]
    if call.func.attr.value == "extend" and len(call.args) == 1 and isinstance(call.args[0].value, cst.List):
        return [e.value for e in call.args[0].value.elements]
    return None


def _collapse(block, owners):
    """``X = nn.Sequential()`` followed by lines appending to X -> ``X = nn.Sequential(a, b, ...)``
    (one layer a line, the lines' comments kept)."""
    body = list(block.body)
    out = []
    i = 0
    while i < len(body):
        stmt = body[i]
        owner = None
        if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
                and len(stmt.body[0].targets) == 1 and isinstance(stmt.body[0].value, cst.Call)
                and not stmt.body[0].value.args and isinstance(stmt.body[0].value.func, cst.Attribute)
                and stmt.body[0].value.func.attr.value == "Sequential"):
            owner = _model.code(stmt.body[0].targets[0].target)
        if owner not in owners:
            out.append(stmt)
            i += 1
            continue
        items = []  # (layer code, comment)
        j = i + 1
        while j < len(body):
            added = _added(body[j], owner)
            if added is None or any(l.comment for l in body[j].leading_lines) \
                    or any("\n" in _model.code(layer) for layer in added):
                break
            comment = body[j].trailing_whitespace.comment
            for k, layer in enumerate(added):
                items.append((_model.code(layer), comment.value if comment is not None and k == len(added) - 1 else None))
            j += 1
        if not items:
            out.append(stmt)
            i += 1
            continue
        ctor = _model.code(stmt.body[0].value.func)
        lines = [f"{owner} = {ctor}("]
        for text, comment in items:
            lines.append(f"    {text}," + (f"  {comment}" if comment else ""))
        lines.append(")")
        new = cst.parse_statement("\n".join(lines) + "\n")
        new = new.with_changes(leading_lines=stmt.leading_lines)
        if stmt.trailing_whitespace.comment is not None:
            new = new.with_changes(trailing_whitespace=stmt.trailing_whitespace)
        out.append(new)
        i = j
    return block.with_changes(body=out)
