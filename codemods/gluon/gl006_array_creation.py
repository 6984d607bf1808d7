from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import dtype_expr as _dtype

# mx.nd factory -> (torch factory, the MXNet parameters in order after the first)
_FACTORIES = {
    "mxnet.nd.ones": "ones",
    "mxnet.nd.zeros": "zeros",
    "mxnet.nd.full": "full",
    "mxnet.nd.empty": "empty",
}


class MxnetArrayCreation(Rule):
    """
    ## What it does
    Translates the NDArray factories a training script uses to build labels, masks and
    states:

    | MXNet | PyTorch |
    | --- | --- |
    | `mx.nd.ones(shape, ctx=d, dtype=t)` (`zeros`, `empty`) | `torch.ones(shape, device=d, dtype=torch.t)` |
    | `mx.nd.full(shape, v, ctx=d)` | `torch.full(shape, v, device=d)` |
    | `mx.nd.array([...], ctx=d)` (a list or tuple literal) | `torch.tensor([...], dtype=torch.float32, device=d)` |
    | `mx.nd.arange(start, stop, step, ctx=d)` | `torch.arange(start, stop, step, dtype=torch.float32, device=d)` |
    | `mx.nd.array(x, dtype=t, ctx=d)` (any value, its dtype given) | `torch.tensor(x, dtype=torch.t, device=d)` |

    MXNet's default dtype is float32 for all of them (torch's `tensor`/`arange` of integers
    would be int64, hence the explicit dtype). `mx.nd.array(x, dtype=t)` of any other value is
    `torch.tensor(x, dtype=torch.t)` (a copy, as MXNet's); without the dtype (a numpy array
    keeps its dtype in MXNet) it is reported.

    ## Why
    The PyTorch factories are what the torch-xla and JAX rules know how to place.

    ## Fix safety
    Safe: same shape, value, dtype and device.
    """

    code = "GL006"
    name = "gluon-array-creation"
    target = "torch"
    summary = "mx.nd.ones/zeros/full/empty/array/arange(..., ctx=) -> torch factories with device="
    severity = Severity.ERROR
    needs_text = sc.NEEDS_MXNET
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            real_label = mx.nd.ones((batch_size,), ctx=device)
            mask = mx.nd.zeros((4, 4), dtype="int32")
            w = mx.nd.array([0.5, 2], ctx=device)
            rows = mx.nd.array(np.ones((2, 3)), dtype="float32")
            """,
            """
            import torch

            real_label = torch.ones((batch_size,), device=device)
            mask = torch.zeros((4, 4), dtype=torch.int32)
            w = torch.tensor([0.5, 2], dtype=torch.float32, device=device)
            rows = torch.tensor(np.ones((2, 3)), dtype=torch.float32)
            """,
        ),
        Example("import mxnet as mx\nx = mx.nd.array(numpy_batch)\n", None, title="mx.nd.array of a non-literal: reported"),
    ]
    valid = ["import torch\nx = torch.ones(2)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        torch = sc.torch_name(self.ctx)
        if name in _FACTORIES:
            factory = _FACTORIES[name]
            npos = 2 if factory == "full" else 1

            def build(u: cst.Call, factory=factory, npos=npos) -> cst.BaseExpression:
                positional = [a for a in u.args if a.keyword is None][:npos]
                args = [cst.Arg(a.value) for a in positional]
                for a in u.args:
                    if a.keyword is None:
                        continue
                    k = a.keyword.value
                    if k == "ctx":
                        args.append(sc.kwarg("device", a.value))
                    elif k == "dtype":
                        args.append(sc.kwarg("dtype", _dtype(a.value, torch)))
                    elif k in ("shape", "val"):
                        args.append(sc.kwarg("size" if k == "shape" else "fill_value", a.value))
                return cst.Call(sc.expr(f"{torch}.{factory}"), args)

            if any(a.keyword is not None and a.keyword.value not in ("ctx", "dtype", "shape", "val") for a in node.args):
                self.report(node, f"{sc.code(node.func)} with arguments porter does not translate")
                return
            self.report(node, f"{sc.code(node.func)} -> torch.{factory}", Fix((self.replace(node, build),), imports=("torch",)))
        elif name in ("mxnet.nd.array", "mxnet.nd.arange"):
            first = node.args[0] if node.args and node.args[0].keyword is None else None
            if name == "mxnet.nd.array" and (first is None or not isinstance(first.value, (cst.List, cst.Tuple))):
                if first is None or astutil.arg(node, "dtype") is None or len([a for a in node.args if a.keyword is None]) > 1 \
                        or any(a.keyword is not None and a.keyword.value not in ("ctx", "dtype") for a in node.args):
                    self.report(node, "mx.nd.array of a value porter cannot see: MXNet keeps a numpy array's dtype and "
                                "makes float32 of anything else; write torch.tensor(x, dtype=...) by hand")
                    return
                # the dtype is given: whatever the value is, a copy of it in that dtype
            factory = "tensor" if name == "mxnet.nd.array" else "arange"

            def build2(u: cst.Call, factory=factory) -> cst.BaseExpression:
                args = [cst.Arg(a.value) for a in u.args if a.keyword is None]
                dtype = astutil.arg(u, "dtype")
                device = astutil.arg(u, "ctx")
                args.append(sc.kwarg("dtype", _dtype(dtype.value, torch) if dtype else sc.expr(f"{torch}.float32")))
                if device is not None:
                    args.append(sc.kwarg("device", device.value))
                return cst.Call(sc.expr(f"{torch}.{factory}"), args)

            self.report(node, f"{sc.code(node.func)} -> torch.{factory}", Fix((self.replace(node, build2),), imports=("torch",)))
