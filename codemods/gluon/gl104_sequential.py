import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model


def sequential_owners(ctx) -> frozenset:
    """Code of every expression a Gluon Sequential/HybridSequential (or contrib Concurrent) is
    assigned to (`net`, `self.features`, `layer`), anywhere in the file; and, followed through
    the file's own functions, the parameter a container is passed to (`_add_conv(out, ...)`
    called with one) and the target of a call of a function that returns one
    (`self.features = self._make_features(...)`)."""
    memo = ctx.cache.get(("gluon-seq-owners", None))
    if memo is None:
        owners = set()
        functions: dict[str, list[cst.FunctionDef]] = {}
        assigns, calls = [], []
        for node in astutil.walk(ctx.module, into_functions=True):
            if isinstance(node, cst.FunctionDef):
                functions.setdefault(node.name.value, []).append(node)
            elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                if _model.gluon_layer(node.value.func, ctx) in _model.SEQUENTIALS | _model.CONCURRENTS:
                    owners.update(_model.code(t.target) for t in node.targets)
                else:
                    assigns.append(node)
            if isinstance(node, cst.Call):
                calls.append(node)
        changed = True
        while changed:
            changed = False
            for node in assigns:
                fns = functions.get(_callee(node.value))
                if fns and any(_returns_owner(fn, owners) for fn in fns):
                    for t in node.targets:
                        changed |= _model.code(t.target) not in owners
                        owners.add(_model.code(t.target))
            for call in calls:
                for fn in functions.get(_callee(call), ()):
                    for name in _owner_params(fn, call, owners):
                        changed |= name not in owners
                        owners.add(name)
        memo = frozenset(owners)
        ctx.cache[("gluon-seq-owners", None)] = memo
    return memo


def _callee(call: cst.Call):
    """``f`` of ``f(...)`` and ``self.f(...)``."""
    f = call.func
    if isinstance(f, cst.Name):
        return f.value
    if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self":
        return f.attr.value
    return None


def _returns_owner(fn: cst.FunctionDef, owners) -> bool:
    return any(isinstance(n, cst.Return) and n.value is not None and _model.code(n.value) in owners
               for n in astutil.walk(fn.body, into_functions=False))


def _owner_params(fn: cst.FunctionDef, call: cst.Call, owners) -> list:
    """The parameters of ``fn`` that ``call`` passes a container to."""
    params = [p.name.value for p in fn.params.params]
    if params and params[0] == "self" and isinstance(call.func, cst.Attribute):
        params = params[1:]
    out = []
    for i, a in enumerate(call.args):
        if a.star or _model.code(a.value) not in owners:
            continue
        if a.keyword is None and i < len(params):
            out.append(params[i])
        elif a.keyword is not None and a.keyword.value in params + [p.name.value for p in fn.params.kwonly_params]:
            out.append(a.keyword.value)
    return out


class GluonSequential(Rule):
    """
    ## What it does
    `nn.HybridSequential(prefix=...)` / `nn.Sequential()` -> `nn.Sequential()`, and `net.add(a)`
    on it -> `net.append(a)` (`net.add(a, b)` -> `net.extend([a, b])`), so the children keep
    Gluon's indices (`features.0`, `features.1.0.body.2`...). The layers added right after
    the container is made, one statement after another (also inside `with
    net.name_scope():`), become the constructor's arguments: `nn.Sequential(a, b, c)`, one
    layer a line, with the lines' comments; adds in loops or branches stay `append`.

    `HybridConcurrent(axis=1)` / `Concurrent` of `mxnet.gluon.contrib.nn` (every child gets the
    same input, the outputs are concatenated on `axis`, Gluon's default -1) -> the emitted
    `Concurrent(axis)`, an `nn.Sequential` whose forward is `torch.cat([child(x) ...], dim=axis)`;
    its `add` becomes `append` too.

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
    needs_text = ("Sequential", "Concurrent")
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
            import torch.nn

            def stage(blocks):
                layer = torch.nn.Sequential()
                for block in blocks:
                    layer.append(block)
                return layer
            """,
            title="layers added in a loop",
        ),
        Example(
            """
            from mxnet.gluon import nn
            from mxnet.gluon.contrib.nn import HybridConcurrent, Identity

            def branches(channels):
                out = HybridConcurrent(axis=1, prefix="")
                with out.name_scope():
                    out.add(Identity())
                    out.add(nn.Conv2D(channels, 3, padding=1, in_channels=channels))
                return out
            """,
            """
            from mxnet.gluon import nn
            from mxnet.gluon.contrib.nn import Identity
            import torch


            class Concurrent(nn.Sequential):
                \"\"\"Gluon's HybridConcurrent / Concurrent (mxnet.gluon.contrib.nn): every child gets the same
                input and their outputs are concatenated on `axis` (Gluon's default -1). Children are added
                with append, so they keep Gluon's indices.\"\"\"

                def __init__(self, axis=-1):
                    super().__init__()
                    self.axis = axis

                def forward(self, x):
                    return torch.cat([layer(x) for layer in self], dim=self.axis)


            def branches(channels):
                out = Concurrent(axis=1)
                with out.name_scope():
                    out.append(Identity())
                    out.append(nn.Conv2D(channels, 3, padding=1, in_channels=channels))
                return out
            """,
            title="contrib's HybridConcurrent: the children's outputs concatenated",
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
        if kind in _model.CONCURRENTS:
            self._concurrent(node, kind)
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


    def _concurrent(self, node: cst.Call, kind: str) -> None:
        b = _model.bind(node, _model.SIGNATURES[kind])
        if b.unknown or b.get("params") is not None:
            _model.report_manual(self, node, f"{kind} with arguments porter does not know or shared params=")
            return
        axis = b.get("axis")
        text = f"Concurrent({'axis=' + _model.code(axis) if axis is not None else ''})"
        edit, imports = _model.helpers_edit(self.ctx, ["Concurrent"])
        self.report(node, f"Gluon {kind}: the emitted Concurrent (torch.cat of the children's outputs)",
                    Fix((self.replace(node, astutil.parse_expression(text)), edit), imports=imports))


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
