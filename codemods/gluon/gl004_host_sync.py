from __future__ import annotations

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

_WAITALL = ("mxnet.nd.waitall",)


class MxnetHostSync(Rule):
    """
    ## What it does
    Translates MXNet's reads of device values and its synchronisations:

    | MXNet | PyTorch |
    | --- | --- |
    | `x.asscalar()` | `x.item()` |
    | `x.asnumpy()` | `x.detach().cpu().numpy()` |
    | `mx.nd.waitall()`, `x.wait_to_read()` (a statement) | `torch.cuda.synchronize()` |

    The torch-xla rules then treat these as the host syncs they are: a value read on a
    logging step goes into `xm.add_step_closure`, `torch.cuda.synchronize()` becomes
    `xm.wait_device_ops()`; the JAX rules read the array on the host.

    ## Why
    MXNet's engine is asynchronous like CUDA: `asscalar`/`asnumpy` wait for the value and
    copy it to the host, exactly what `.item()` and `.cpu().numpy()` do.

    ## Fix safety
    Safe: the same values, the same synchronisation points.
    """

    code = "GL004"
    name = "gluon-host-sync"
    target = "torch"
    summary = "asscalar() -> item(); asnumpy() -> detach().cpu().numpy(); nd.waitall() -> torch.cuda.synchronize()"
    severity = Severity.ERROR
    needs_text = ("asscalar", "asnumpy", "waitall", "wait_to_read")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            print(loss.mean().asscalar())
            probs = output.softmax().asnumpy()
            mx.nd.waitall()
            """,
            """
            import torch

            print(loss.mean().item())
            probs = output.softmax().detach().cpu().numpy()
            torch.cuda.synchronize()
            """,
        ),
    ]
    valid = ["import torch\nv = loss.item()\n"]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if sc.call_name(self.ctx, node) in _WAITALL:
            torch = sc.torch_name(self.ctx)
            self.report(node, "mx.nd.waitall() -> torch.cuda.synchronize()",
                        Fix((self.replace(node, sc.expr(f"{torch}.cuda.synchronize()")),), imports=("torch",)))
            return
        if not isinstance(func, cst.Attribute) or node.args or sc.qualname(self.ctx, func.value) is not None:
            return
        method = func.attr.value
        if method == "asscalar":
            self.report(node, ".asscalar() -> .item()",
                        Fix((self.replace(node, lambda u: u.with_changes(func=u.func.with_changes(attr=cst.Name("item")))),)))
        elif method == "asnumpy":

            def build(u: cst.Call) -> cst.BaseExpression:
                inner = u.func.value
                chain = cst.Call(cst.Attribute(cst.Call(cst.Attribute(inner, cst.Name("detach"))), cst.Name("cpu")))
                return cst.Call(cst.Attribute(chain, cst.Name("numpy")))

            self.report(node, ".asnumpy() -> .detach().cpu().numpy()", Fix((self.replace(node, build),)))
        elif method == "wait_to_read" and isinstance(self.ctx.parent, cst.Expr):
            torch = sc.torch_name(self.ctx)
            self.report(node, "x.wait_to_read() -> torch.cuda.synchronize()",
                        Fix((self.replace(node, sc.expr(f"{torch}.cuda.synchronize()")),), imports=("torch",)))
