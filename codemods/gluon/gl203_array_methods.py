from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _arrays, _model, _ops_table
from . import _script as sc
from ._ops_table import Manual

# NDArray methods no torch tensor (nor NumPy array) has: translated on any receiver but a
# NumPy array
_NDARRAY_ONLY = frozenset({"expand_dims", "one_hot", "slice_axis", "pick", "broadcast_like", "softsign",
                           "zeros_like", "ones_like"})
# methods a torch tensor has with other semantics (flatten keeps the first axis, transpose
# takes the axes, split the number of parts, repeat repeats elements, softmax's axis is
# optional, take takes along axis 0, argmax gives float indices): translated on arrays
_DIFFERENT = frozenset({"flatten", "transpose", "split", "repeat", "softmax", "log_softmax", "take", "broadcast_to",
                        "argmax", "argmin"})
# with an axis torch's max/min give (values, indices), norm's arguments are p and dim
_WITH_ARGUMENTS = frozenset({"max", "min", "norm"})
# the same method in torch unless a keyword of MXNet's is used (axis, keepdims, a_min, ...)
_WITH_KEYWORDS = frozenset({"sum", "mean", "prod", "clip", "squeeze", "swapaxes", "tile", "exp", "log", "sqrt", "abs",
                            "sign", "square",
                            "relu", "sigmoid", "tanh", "floor", "ceil", "reciprocal", "log1p", "expm1"})

_METHODS = _NDARRAY_ONLY | _DIFFERENT | _WITH_ARGUMENTS | _WITH_KEYWORDS | {"astype"}


class GluonArrayMethods(Rule):
    """
    ## What it does
    Translates the methods of MXNet arrays that a torch tensor does not have, or has with
    other semantics, where the code shows that the receiver is an MXNet array: an operator's
    result, a block's output, a DataLoader's batch, an input of `forward`/`hybrid_forward`, the
    image a function given to a dataset's `transform(fn)` receives, arithmetic with those
    (see codemods/gluon/_arrays.py):

    | MXNet | PyTorch |
    | --- | --- |
    | `x.astype('float32')`, `x.astype(np.uint8)` | `x.to(torch.float32)`, `x.to(torch.uint8)` |
    | `x.flatten()` (keeps the first axis) | `torch.flatten(x, 1)` |
    | `x.transpose((0, 3, 1, 2))`, `x.transpose()` | `torch.permute(x, (0, 3, 1, 2))`, every axis reversed |
    | `x.expand_dims(axis=1)`, `x.one_hot(10)`, `x.softmax()` | `torch.unsqueeze(x, 1)`, `torch.nn.functional.one_hot(...)`, `torch.softmax(x, dim=-1)` |
    | `x.sum(axis=1, keepdims=True)`, `x.max(axis=1)` | `torch.sum(x, dim=1, keepdim=True)`, `torch.amax(x, dim=1)` (`x.sum(1)` stays) |
    | `x.clip(a_min=0, a_max=1)`, `x.argmax(axis=1)` | `torch.clamp(x, 0, 1)`, float indices as MXNet's |
    | `x.size` (the number of elements) | `x.numel()` |
    | `(pred == label).mean()` (MXNet compares into 1.0 / 0.0) | `(pred == label).float().mean()` |

    The torch side of each method is the operator table's (GL201) for the operator of the
    same name with the receiver as its data, checked numerically against mxnet 1.9.1. A call
    the table cannot write (an axis that is not a literal, a dtype in a variable) is
    reported and marked `# porter: manual`. Methods torch has with the same meaning
    (`x.exp()`, `x.sum()`, `x.reshape(2, 3)`) stay as they are; `reshape` with MXNet's codes is
    GL201's, `asnumpy`/`asscalar` GL004's, `as_in_context` GL003's. A receiver the code does
    not show to be an MXNet array (a function's parameter, a NumPy array) is left alone, but
    for the methods only MXNet arrays have (`expand_dims`, `one_hot`, ...).

    ## Why
    Left as they are, these calls fail on a torch tensor (`astype`, `expand_dims`), or give
    other values (`flatten` flattens every axis, `x.max(axis=1)` gives a tuple, `x.size` is a
    method).

    ## Fix safety
    Safe: the operator table's semantics, which are MXNet's.
    """

    code = "GL203"
    name = "gluon-array-methods"
    target = "torch"
    summary = "NDArray methods torch lacks or reads otherwise (astype, flatten, transpose(axes), sum(axis=))"
    severity = Severity.ERROR
    needs_text = ("mxnet", "torch")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import numpy as np
            from mxnet import nd

            x = nd.ones((4, 28, 28, 1))
            images = x.transpose((0, 3, 1, 2)).astype('float32') / 255
            flat = images.flatten()
            best = flat.max(axis=1, keepdims=True)
            print(x.size)
            """,
            """
            import numpy as np
            from mxnet import nd
            import torch

            x = nd.ones((4, 28, 28, 1))
            images = torch.permute(x, (0, 3, 1, 2)).to(torch.float32) / 255
            flat = torch.flatten(images, 1)
            best = torch.amax(flat, dim=1, keepdim=True)
            print(x.numel())
            """,
            title="arrays an operator made",
        ),
        Example(
            """
            import numpy as np
            import mxnet as mx
            from mxnet import gluon

            def transformer(data, label):
                data = data.transpose((2, 0, 1)).astype(np.float32) / 255
                return data, label.astype(np.float32)

            train = gluon.data.vision.MNIST(train=True).transform(transformer)
            """,
            """
            import numpy as np
            import mxnet as mx
            from mxnet import gluon
            import torch

            def transformer(data, label):
                data = torch.permute(data, (2, 0, 1)).to(torch.float32) / 255
                return data, label.astype(np.float32)

            train = gluon.data.vision.MNIST(train=True).transform(transformer)
            """,
            title="the image a dataset's transform receives (its label is a NumPy scalar)",
        ),
        Example(
            """
            from mxnet import gluon

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x):
                    return self.out(x).softmax().expand_dims(axis=1)

            def probabilities(scores):
                return scores.softmax(), scores.astype('float16')
            """,
            """
            from mxnet import gluon
            import torch

            class Net(gluon.HybridBlock):
                def hybrid_forward(self, F, x):
                    return torch.unsqueeze(torch.softmax(self.out(x), dim=-1), 1)

            def probabilities(scores):
                return scores.softmax(), scores.astype('float16')
            """,
            title="a block's inputs are arrays; a plain function's parameters are not known",
        ),
    ]
    valid = ["import torch\ny = torch.ones(3).to(torch.float32).flatten()\n",
             "import numpy as np\nimport mxnet as mx\nx = np.ones(3).astype('float32').flatten()\n"]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or sc.qualname(self.ctx, func) is not None or _arrays.jax_stage(self.ctx):
            return
        method = func.attr.value
        if method not in _METHODS:
            return
        receiver_kind = _arrays.kind(self.ctx, func.value)
        if receiver_kind == _arrays.NAMESPACE:
            return  # F.sum(x): GL201's
        if method in _NDARRAY_ONLY:
            wanted = receiver_kind != _arrays.NUMPY
        elif receiver_kind != _arrays.ARRAY:
            wanted = False
        elif method in _WITH_ARGUMENTS:
            wanted = bool(node.args)
        elif method in _WITH_KEYWORDS:
            wanted = any(a.keyword is not None for a in node.args)
        else:
            wanted = True
        if not wanted:
            return
        if method == "astype":
            self._astype(node)
            return
        op = _ops_table.OPS.get(method)
        if op is None or any(a.keyword is not None and a.keyword.value not in (*op.params, "name") for a in node.args):
            return  # a keyword MXNet's operator does not take (dim=): torch code already
        if not op.variadic and any(u.startswith("argument") for u in _model.bind(_as_operator(node), op.params).unknown):
            return  # more positional arguments than MXNet's operator takes (x.transpose(0, 1)): torch code
        torch, imports = _model.torch_name(self.ctx)
        try:
            _ops_table.build(op, _as_operator(node), torch)
        except Manual as exc:
            astutil.report_manual(self, node, f"the array method {method}: {exc}")
            return
        parent = self.ctx.parent

        def rewrite(updated: cst.Call) -> cst.BaseExpression:
            new = astutil.parse_expression(_ops_table.build(op, _as_operator(updated), torch))
            if astutil.needs_parens(new) and isinstance(parent, (cst.Attribute, cst.Subscript, cst.BinaryOperation,
                                                                 cst.UnaryOperation, cst.Call)):
                new = astutil.parenthesized(new)
            return new

        self.report(node, f"the array method {method}: torch", Fix((self.replace(node, rewrite),), imports=imports))

    def _astype(self, node: cst.Call) -> None:
        if any(a.keyword is not None and a.keyword.value not in ("dtype", "copy") for a in node.args):
            return
        args = [a for a in node.args if not (a.keyword is not None and a.keyword.value == "copy")]
        dtype = None
        if len(args) == 1 and (args[0].keyword is None or args[0].keyword.value == "dtype"):
            dtype = args[0].value
        torch = sc.torch_name(self.ctx)
        new = sc.dtype_expr(dtype, torch) if dtype is not None else None
        if new is None or new is dtype:
            astutil.report_manual(self, node, "astype: the dtype is not a literal; write x.to(<torch dtype>)")
            return
        self.report(node, "astype(dtype) -> to(torch dtype)", Fix((self.replace(
            node, lambda u: cst.Call(cst.Attribute(u.func.value, cst.Name("to")), [cst.Arg(new)])),), imports=("torch",)))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        """``(a == b).mean()``: MXNet compares into an array of 1.0 and 0.0, torch into booleans
        (whose mean fails): a comparison of arrays read by a method gets ``.float()``."""
        parent = self.ctx.parent
        if len(node.comparisons) != 1 or not isinstance(parent, cst.Attribute) or parent.value is not node \
                or _arrays.jax_stage(self.ctx):
            return
        if not isinstance(node.comparisons[0].operator, (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual,
                                                          cst.GreaterThan, cst.GreaterThanEqual)):
            return
        if _arrays.ARRAY not in (_arrays.kind(self.ctx, node.left), _arrays.kind(self.ctx, node.comparisons[0].comparator)):
            return
        if parent.attr.value in ("float", "to", "astype", "type", "all", "any", "nonzero"):
            return
        self.report(node, "a comparison of arrays (1.0/0.0 in MXNet, booleans in torch) read by a method: .float()",
                    Fix((self.replace(parent, lambda u: u.with_changes(
                        value=cst.Call(cst.Attribute(astutil.parenthesized(u.value), cst.Name("float"))))),)))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "size" or _arrays.jax_stage(self.ctx):
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        if isinstance(parent, (cst.AssignTarget, cst.Attribute)) and getattr(parent, "target", None) is node:
            return
        if _arrays.kind(self.ctx, node.value) != _arrays.ARRAY:
            return
        self.report(node, "x.size (the number of elements) -> x.numel()", Fix((self.replace(
            node, lambda u: cst.Call(cst.Attribute(u.value, cst.Name("numel")))),)))


def _as_operator(call: cst.Call) -> cst.Call:
    """``x.op(a, k=v)`` as the operator call ``op(x, a, k=v)``."""
    assert isinstance(call.func, cst.Attribute)
    receiver = cst.Arg(call.func.value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args = list(call.args)
    if not args:
        receiver = cst.Arg(call.func.value)
    return call.with_changes(func=call.func.attr, args=[receiver, *args])
