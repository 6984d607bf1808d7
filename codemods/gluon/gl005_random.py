from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import dtype_expr as _dtype

_SEED = ("mxnet.random.seed",)
_NORMAL = ("mxnet.nd.random.normal", "mxnet.nd.random_normal", "mxnet.random.normal")
_UNIFORM = ("mxnet.nd.random.uniform", "mxnet.nd.random_uniform", "mxnet.random.uniform")


def _number(node, value: float) -> bool:
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return float(node.value) == value
        except ValueError:
            return False
    return False


class MxnetRandom(Rule):
    """
    ## What it does
    Translates MXNet's seeding and its random arrays:

    | MXNet | PyTorch |
    | --- | --- |
    | `mx.random.seed(s)` | `torch.manual_seed(s)` |
    | `mx.nd.random.normal(0, 1, shape=s, ctx=d)` | `torch.randn(s, device=d)` |
    | `mx.nd.random.normal(loc, scale, shape=s, ctx=d)` | `torch.randn(s, device=d) * scale + loc` |
    | `mx.nd.random.uniform(low, high, shape=s, ctx=d)` | `torch.rand(s, device=d) * (high - low) + low` |

    A call without `shape` (one number) or with `out=` is reported.

    ## Why
    Torch's generators are seeded with `torch.manual_seed`; `randn`/`rand` are the
    factories the torch-xla and JAX rules know (JAX draws from its own keys).

    ## Fix safety
    Safe as to distributions: the same distribution on the same device. The numbers drawn
    differ from MXNet's (another generator), as in any port.
    """

    code = "GL005"
    name = "gluon-random"
    target = "torch"
    summary = "mx.random.seed -> torch.manual_seed; mx.nd.random.normal/uniform -> torch.randn/rand"
    severity = Severity.ERROR
    needs_text = ("random",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            mx.random.seed(args.seed)
            noise = mx.nd.random.normal(0, 1, shape=(batch_size, nz, 1, 1), ctx=device)
            jitter = mx.nd.random.uniform(-0.1, 0.1, shape=(4,))
            """,
            """
            import torch

            torch.manual_seed(args.seed)
            noise = torch.randn((batch_size, nz, 1, 1), device=device)
            jitter = torch.rand((4,)) * (0.1 - -0.1) + -0.1
            """,
        ),
    ]
    valid = ["import numpy as np\nnp.random.seed(1)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        torch = sc.torch_name(self.ctx)
        if name in _SEED:
            self.report(node, "mx.random.seed -> torch.manual_seed",
                        Fix((self.replace(node, lambda u: u.with_changes(func=sc.expr(f"{torch}.manual_seed"), args=u.args[:1])),),
                            imports=("torch",)))
            return
        if name not in (*_NORMAL, *_UNIFORM):
            return
        if astutil.arg(node, "shape", 2) is None or astutil.arg(node, "out") is not None:
            self.report(node, f"{sc.code(node.func)} without shape= (or with out=): translate by hand")
            return
        normal = name in _NORMAL
        a_kw, b_kw = ("loc", "scale") if normal else ("low", "high")
        a_default, b_default = (0.0, 1.0)

        def build(u: cst.Call) -> cst.BaseExpression:
            a = astutil.arg(u, a_kw, 0)
            b = astutil.arg(u, b_kw, 1)
            shape = astutil.arg(u, "shape", 2)
            device = astutil.arg(u, "ctx", 4)
            dtype = astutil.arg(u, "dtype", 3)
            args = [cst.Arg(shape.value)]
            if dtype is not None:
                args.append(sc.kwarg("dtype", _dtype(dtype.value, torch)))
            if device is not None:
                args.append(sc.kwarg("device", device.value))
            draw = cst.Call(sc.expr(f"{torch}.{'randn' if normal else 'rand'}"), args)
            a_val = a.value if a is not None else None
            b_val = b.value if b is not None else None
            is_a0 = a_val is None or _number(a_val, a_default)
            is_b1 = b_val is None or _number(b_val, b_default)
            if is_a0 and is_b1:
                return draw
            a_text = sc.code(a_val) if a_val is not None else "0.0"
            b_text = sc.code(b_val) if b_val is not None else "1.0"
            if normal:
                text = f"_ * {b_text} + {a_text}" if not is_a0 else f"_ * {b_text}"
            else:
                text = f"_ * ({b_text} - {a_text}) + {a_text}"
            return _substitute(sc.expr(text), draw)

        self.report(node, f"{sc.code(node.func)} -> torch.{'randn' if normal else 'rand'}", Fix((self.replace(node, build),), imports=("torch",)))


def _substitute(template: cst.BaseExpression, value: cst.BaseExpression) -> cst.BaseExpression:
    class Sub(cst.CSTTransformer):
        def leave_Name(self, original, updated):
            return value if original.value == "_" else updated

    return template.visit(Sub())


