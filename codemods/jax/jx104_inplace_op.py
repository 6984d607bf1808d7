import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _ops_table as ops
from . import _params


class InplaceOp(Rule):
    """
    ## What it does
    Rewrites in-place tensor methods used as statements on a plain name to an assignment of
    the functional result: `x.add_(y)` -> `x = x + y`, `h.masked_fill_(m, 0)` ->
    `h = jnp.where(m, 0, h)`, `acc.zero_()` -> `acc = jnp.zeros_like(acc)`,
    `x.clamp_(0, 1)` -> `x = jnp.clip(x, min=0, max=1)`. The in-place methods torch has for the op table's
    methods are covered (docs/jax-ops.md counts them), plus `zero_`, `fill_` and `copy_`.

    A slice of a plain name (`x[a:b].zero_()`, `x[:, 0].add_(1)`: basic indexing, a view in
    torch) is updated through `.at`: `x = x.at[a:b].set(jnp.zeros_like(x[a:b]))`.

    A call whose result is used (`res.append(acc.mul_(100))`) becomes the functional value
    (`jnp.multiply(acc, 100)`) where the name is a local that each assignment binds to a value
    of its own (a computation, no view of another tensor) and that this call alone reads.

    An in-place call on anything else (`self.buf.mul_(0.9)`, `p.data.add_(g)`, `x[i].add_(1)`
    with an index that may be a tensor, a copy in torch) or whose result is used otherwise (`y = x.add_(1)` with `x` read again) is marked `# porter: manual`
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
        Example(
            """
            import torch

            def attention(qkv_bias, x, i, n):
                qkv_bias[n : 2 * n].zero_()
                x[:, 0].add_(1.0)
                x[..., -1].fill_(2.0)
                x[i].zero_()
                return qkv_bias, x
            """,
            """
            import torch
            import jax.numpy as jnp

            def attention(qkv_bias, x, i, n):
                qkv_bias = qkv_bias.at[n : 2 * n].set(jnp.zeros_like(qkv_bias[n : 2 * n]))
                x = x.at[:, 0].set(x[:, 0] + 1.0)
                x = x.at[..., -1].set(jnp.full_like(x[..., -1], 2.0))
                x[i].zero_()  # porter: manual
                return qkv_bias, x
            """,
            title="a slice of a plain name (a view in torch) through .at; an index that may be a tensor is left",
        ),
        Example(
            """
            import torch

            def percent(correct, topk, n):
                res = []
                for k in topk:
                    hits = correct[:k].sum(0, keepdim=True)
                    res.append(hits.mul_(100.0 / n))
                flat = correct.view(-1)
                return res, flat.add_(1)
            """,
            """
            import torch
            import jax.numpy as jnp

            def percent(correct, topk, n):
                res = []
                for k in topk:
                    hits = correct[:k].sum(0, keepdim=True)
                    res.append(jnp.multiply(hits, 100.0 / n))
                flat = correct.view(-1)
                return res, flat.add_(1)  # porter: manual
            """,
            title="a result used: the functional value where the name holds a value of its own that nothing else reads",
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
        if _params.in_average_loop(self.ctx):
            return  # JX205 rewrites the whole loop
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
        if _basic_slice_of_name(recv) and isinstance(parent, cst.Expr) and isinstance(stmt, cst.SimpleStatementLine):
            self._slice_update(node, parent, o, recv, what)
            return
        if isinstance(recv, cst.Name) and not isinstance(parent, cst.Expr) and self._fresh_and_dead(recv):
            # `res.append(acc.mul_(100))`, acc a value of its own read nowhere else: its new value is all that counts
            built = self._build(node, o, recv, what)
            if built is not None:
                text, used = built
                if func.attr.value in ops.INPLACE_CAST:
                    text = f"{ops.atom(astutil.parse_expression(text))}.astype({recv.value}.dtype)"
                self.report(node, f"{what}: JAX arrays are immutable, and {recv.value} is read nowhere else: {text}",
                            Fix((self.replace(node, astutil.parse_expression(ops.atom(astutil.parse_expression(text)))),),
                                imports=tuple(sorted(used))))
            return
        if not (isinstance(recv, cst.Name) and isinstance(parent, cst.Expr) and isinstance(stmt, cst.SimpleStatementLine)):
            ops.report_manual(
                self, node,
                f"{what} on {'an attribute' if isinstance(recv, cst.Attribute) else 'a subscript' if isinstance(recv, cst.Subscript) else 'a value that is used'}: "
                "JAX arrays are immutable; rebind the value (an nnx.Variable's .value, x.at[i].set/add for an element)",
            )
            return
        built = self._build(node, o, recv, what)
        if built is None:
            return
        text, used = built
        if func.attr.value in ops.INPLACE_CAST:  # torch stores the result in x's own dtype
            text = f"{ops.atom(astutil.parse_expression(text))}.astype({recv.value}.dtype)"
        new = cst.Assign([cst.AssignTarget(cst.Name(recv.value))], astutil.parse_expression(text))
        self.report(node, f"{what}: JAX arrays are immutable: {recv.value} = {text}", Fix((self.replace(parent, new),), imports=tuple(sorted(used))))

    def _fresh_and_dead(self, recv: cst.Name) -> bool:
        """``recv`` is a local of the enclosing function (no parameter, no global) that every
        assignment binds to a value of its own (a computation, not another name, attribute,
        subscript or view of one), and this in-place call is the only read of it: no other
        tensor shares its storage, and no later code sees the write."""
        fn = self.ctx.enclosing(cst.FunctionDef)
        if fn is None or recv.value in {p.name.value for p in astutil.walk(fn.params) if isinstance(p, cst.Param)}:
            return False
        values = []
        reads = 0
        for n in astutil.walk(fn.body, into_functions=True):
            if isinstance(n, (cst.Global, cst.Nonlocal)) and any(a.name.value == recv.value for a in n.names):
                return False
            if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.With, cst.NamedExpr)):
                targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [
                    getattr(n, "target", None)] if not isinstance(n, cst.With) else [i.asname.name for i in n.items if i.asname]
                for t in targets:
                    if isinstance(t, cst.Name) and t.value == recv.value:
                        if not isinstance(n, cst.Assign):
                            return False
                        values.append(n.value)
                    elif t is not None and any(isinstance(m, cst.Name) and m.value == recv.value for m in astutil.walk(t)):
                        return False  # unpacked into: porter cannot see the value
            if isinstance(n, cst.Name) and n.value == recv.value and n is not recv:
                reads += 1
        # each binding's own target Name is walked as a read too
        return bool(values) and reads == len(values) and all(_own_value(v) for v in values)

    def _build(self, node: cst.Call, o, recv, what: str):
        """The functional value of the in-place call (text, imports used), or None where it is
        not this rule's or is reported for a manual port."""
        try:
            text, used = ops.build(o, node, self.ctx, recv)
        except ops.NotMine:
            return None
        except ops.Manual as exc:
            ops.report_manual(self, node, f"{what}: {exc}")
            return None
        if isinstance(text, tuple):
            ops.report_manual(self, node, f"{what} returns values and indices")
            return None
        return text, used

    def _slice_update(self, node: cst.Call, parent: cst.Expr, o, recv: cst.Subscript, what: str) -> None:
        """`x[a:b].zero_()` on a plain name -> `x = x.at[a:b].set(jnp.zeros_like(x[a:b]))`."""
        built = self._build(node, o, recv, what)
        if built is None:
            return
        text, used = built
        name = recv.value.value
        index = astutil.code(recv)[len(astutil.code(recv.value)):]
        if node.func.attr.value in ops.INPLACE_CAST:
            text = f"{ops.atom(astutil.parse_expression(text))}.astype({name}.dtype)"
        value = f"{name}.at{index}.set({text})"
        new = cst.Assign([cst.AssignTarget(cst.Name(name))], astutil.parse_expression(value))
        self.report(node, f"{what} on a slice: JAX arrays are immutable: {name} = {value}",
                    Fix((self.replace(parent, new),), imports=tuple(sorted(used))))


# tensor methods whose result may share the receiver's storage (a view) or be the receiver
_VIEWS = frozenset({"view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "expand", "expand_as",
                    "narrow", "squeeze", "unsqueeze", "flatten", "unflatten", "detach", "as_strided", "select",
                    "split", "chunk", "unbind", "movedim", "swapaxes", "diagonal", "contiguous", "to", "type",
                    "float", "double", "half", "long", "int", "bool", "cpu", "cuda", "data", "T", "mT", "real", "imag"})


def _own_value(value: cst.BaseExpression) -> bool:
    """A value computed afresh (an operator's or a call's result that is no view): not a name,
    attribute or subscript of another value, nor a view method's result."""
    if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript)):
        return False
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _VIEWS:
        return False
    return isinstance(value, (cst.Call, cst.BinaryOperation, cst.UnaryOperation))


def _basic_slice_of_name(recv: cst.BaseExpression) -> bool:
    """`x[a:b]`, `x[0]`, `x[:, 1:]`, `x[..., 0]` of a plain name other than self: a view in torch
    (basic indexing), so the in-place call writes into x. An index that may be a tensor
    (`x[mask]`, `x[idx]`) is a copy in torch, whose in-place update x never sees: not this."""
    if not (isinstance(recv, cst.Subscript) and isinstance(recv.value, cst.Name)) or recv.value.value in ("self", "cls"):
        return False
    for element in recv.slice:
        sl = element.slice
        if isinstance(sl, cst.Slice):
            continue
        if isinstance(sl, cst.Index) and (isinstance(sl.value, (cst.Integer, cst.Ellipsis)) or (
                isinstance(sl.value, cst.UnaryOperation) and isinstance(sl.value.expression, cst.Integer))):
            continue
        return False
    return True
