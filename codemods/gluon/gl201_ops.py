import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model, _ops_table
from ._ops_table import Manual

_OPERATORS = (cst.BinaryOperation, cst.BooleanOperation, cst.Comparison, cst.UnaryOperation, cst.IfExp)


class GluonOps(Rule):
    """
    ## What it does
    Rewrites MXNet operators called through `F` in `hybrid_forward(self, F, ...)`, or through
    `mx.nd` / `nd` / `mx.sym`, `mx.np` (NumPy semantics: `mx.np.sum(x)` is 0-d, `argmax` gives
    int64) and `mx.npx`, to their torch counterparts, from the tables in
    codemods/gluon/_ops_table.py: `F.relu(x)` -> `torch.relu(x)`, `F.Activation(x,
    act_type="relu")` -> `torch.relu(x)`, `F.concat(a, b, dim=1)` -> `torch.cat([a, b], dim=1)`,
    `F.sum(x, axis=1, keepdims=True)` -> `torch.sum(x, dim=1, keepdim=True)`, `nd.softmax(x)`
    -> `torch.softmax(x, dim=-1)`, `F.broadcast_add(a, b)` -> `a + b`...

    `x.reshape((-3, -1))` (an array's reshape with MXNet's special codes 0, -2, -3, -4) and
    `F.reshape` with them -> `gluon_reshape(x, (-3, -1))`, an emitted function that computes
    the shape from the input's as MXNet does.

    Every operator's `name=` (the symbol's name in a graph, `F.clip(x, 0, 6, name="relu6")`)
    is dropped: it changes no value. MXNet's own semantics are kept where they differ from torch's: a full reduction of the
    NDArray API has shape `(1,)` (`.reshape(1)`), `argmax` returns float indices, `concat`
    joins on axis 1 by default, `maximum(x, 0.0)` takes a scalar (`torch.clamp`). A call the
    table cannot write with the same semantics (a reshape `shape` that is not a literal, an
    `axis` that is not a literal, `F.<op>` or `mx.nd.<op>` / `mx.np.<op>` not in the table, an
    operator of a submodule such as `mx.nd.contrib` or `mx.nd.linalg`) is
    reported and its line marked `# porter: manual`, so a port never keeps an MXNet call
    silently. `mx.nd.SoftmaxActivation(x)` (the legacy softmax: over the last axis, or axis 1
    with `mode="channel"`) is in the table.

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
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
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
                def hybrid_forward(self, F, x, shape):
                    return F.reshape(x, shape=shape)
            """,
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x, shape):
                    return F.reshape(x, shape=shape)  # porter: manual
            """,
            title="a shape that is not a literal is left for a person (MXNet's special codes)",
        ),
        Example(
            """
            from mxnet import nd

            probs = [nd.SoftmaxActivation(out) for out in outputs]
            boxes = nd.contrib.box_nms(dets)
            best = nd.topk(probs[0], k=5)
            """,
            """
            from mxnet import nd
            import torch

            probs = [torch.softmax(out, dim=-1) for out in outputs]
            boxes = nd.contrib.box_nms(dets)  # porter: manual
            best = nd.topk(probs[0], k=5)  # porter: manual
            """,
            title="an mx.nd operator outside the table is reported at its line",
        ),
        Example(
            """
            import mxnet as mx
            from mxnet import nd

            mirrored = nd.flip(img, axis=1)
            upside = mx.nd.reverse(img, axis=(0, 1))
            every = mx.np.flip(arr)
            last = nd.flip(img, axis=-1)
            """,
            """
            from mxnet import nd
            import torch

            mirrored = torch.flip(img, dims=(1,))
            upside = torch.flip(img, dims=(0, 1))
            every = torch.flip(arr, dims=tuple(range(arr.dim())))
            last = nd.flip(img, axis=-1)  # porter: manual
            """,
            title="flip / reverse: an axis or a tuple of them; MXNet 1.9.1 rejects a negative axis",
        ),
    ]
    valid = ["import torch\ny = torch.relu(x)\n", "import mxnet as mx\nx = mx.nd.zeros((2, 3))\n"]

    def visit_Call(self, node: cst.Call) -> None:
        f = node.func
        if not isinstance(f, cst.Attribute):
            return
        fname = _model.hybrid_f_name(self.ctx)
        if (f.attr.value == "reshape" and _model.is_gluon_file(self.ctx) and not (self.ctx.qualname(f) or "").startswith("mxnet")
                and not (isinstance(f.value, cst.Name) and f.value.value == fname)):
            self._reshape_method(node)
            return
        name = None
        via_f = False
        namespace = ""
        if fname is not None and isinstance(f.value, cst.Name) and f.value.value == fname:
            name, via_f = f.attr.value, True
        else:
            q = self.ctx.qualname(f)
            if q:
                for ns, table in _ops_table.TABLES.items():
                    if q.startswith(ns + ".") and "." not in q[len(ns) + 1:]:
                        name, namespace = q[len(ns) + 1:], ns
                        break
                else:
                    sub = _ops_table.submodule_op(q)
                    if sub is not None:  # mx.nd.contrib.box_nms, mx.nd.linalg.gemm2: no table
                        _model.report_manual(self, node, f"{_model.code(f)} ({sub}) is not in porter's MXNet op table: "
                                             "write its torch counterpart by hand")
                        return
        if name is None:
            return
        op = (_ops_table.OPS if via_f else table).get(name)
        if op is None:
            if via_f:
                _model.report_manual(self, node, f"F.{name} is not in porter's MXNet op table")
            elif not (namespace in _ops_table.NAMESPACES and name in _ops_table.NOT_OPS):
                # mx.nd.<op> / mx.np.<op> outside the table: the port would still call MXNet
                _model.report_manual(self, node, f"{_model.code(f)} ({namespace}.{name}) is not in porter's MXNet op table: "
                                     "write its torch counterpart by hand")
            return
        torch, imports = _model.torch_name(self.ctx)
        try:
            _ops_table.build(op, node, torch)
        except Manual as exc:
            _model.report_manual(self, node, f"{name}: {exc}")
            return
        parent = self.ctx.parent

        def rewrite(updated: cst.Call):
            new = astutil.parse_expression(_ops_table.build(op, updated, torch))
            if isinstance(new, _OPERATORS) and not isinstance(parent, (cst.Arg, cst.Assign, cst.Return, cst.Expr,
                                                                        cst.Element, cst.AnnAssign)):
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return new

        edits = [self.replace(node, rewrite)]
        if "gluon_reshape(" in _ops_table.build(op, node, torch):
            edit, more = _model.helpers_edit(self.ctx, ["gluon_reshape"])
            edits.append(edit)
            imports = (*imports, *more)
        self.report(node, f"MXNet {name}: torch", Fix(tuple(edits), imports=tuple(dict.fromkeys(imports))))

    def _reshape_method(self, node: cst.Call) -> None:
        """``x.reshape((-3, -1))``: MXNet's special codes in an array's reshape."""
        args = [a for a in node.args if a.keyword is None and not a.star]
        if len(args) != len(node.args) or not args:
            return
        if len(args) == 1:
            shape_node = args[0].value
            shape = _model.literal(shape_node)
            shape_code = _model.code(shape_node)
        else:
            shape = tuple(_model.literal(a.value) for a in args)
            shape_code = "(" + ", ".join(_model.code(a.value) for a in args) + ")"
        if not isinstance(shape, tuple) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
            return
        if not any(s in (0, -2, -3, -4) for s in shape):
            return
        edit, imports = _model.helpers_edit(self.ctx, ["gluon_reshape"])
        self.report(node, "reshape with MXNet's special codes: gluon_reshape", Fix((
            self.replace(node, lambda n: astutil.parse_expression(
                f"gluon_reshape({_model.code(n.func.value)}, {shape_code})")), edit), imports=imports))


GluonOps.__doc__ = (GluonOps.__doc__ or "").rstrip() + "\n\n    ## The table\n\n" + "\n".join(
    "    " + line if line else "" for line in _ops_table.render_markdown().splitlines()) + "\n"
