from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import context_renames as renamed


def _converter() -> list[cst.BaseStatement]:
    return sc.render("gluon_weights.py.j2")


_CONVERTER_TEXT = cst.Module(_converter()).code


class GluonParametersIO(Rule):
    """
    ## What it does
    Translates Gluon's parameter files and emits, in the port, a converter for the ones the
    original wrote:

    | Gluon | PyTorch |
    | --- | --- |
    | `net.save_parameters(path)` | `torch.save(net.state_dict(), path)` |
    | `net.load_parameters(path, ctx=device)` | `load_gluon_parameters(net, path)`, then `net.to(device)` |

    `load_gluon_parameters(model, path)` and `read_gluon_parameters(path)` are plain code
    added to the port (templates/gluon_weights.py.j2): they read MXNet's NDArray list format
    (what `save_parameters` writes) with `struct` and numpy alone, no MXNet, and name each
    array as the port's `state_dict()` does: `gamma` -> `weight`, `beta` -> `bias`, an rnn
    layer's `_unfused.<n>.i2h_weight` (MXNet 1.9's file names) or `l<n>_i2h_weight` ->
    `weight_ih_l<n>` (`r_cell`/`r<n>` -> `_reverse`), a cell's `i2h_weight` -> `weight_ih`,
    PReLU's `alpha` -> `weight`; layouts are the same. Loading is strict: a Gluon model
    whose port does not keep the original's attribute names and container indices fails
    with the names that do not fit. The port's own checkpoints are torch's (`torch.save`).

    Reported: `load_parameters` with `allow_missing=True`, `ignore_extra=True` or `cast_dtype`.

    ## Why
    Users port a Gluon script together with the weights it trained; the port must load them
    without MXNet (which needs numpy < 1.24).

    ## Fix safety
    Safe: the same arrays under the port's names.
    """

    code = "GL403"
    name = "gluon-parameters-io"
    target = "torch"
    summary = "save_parameters -> torch.save(state_dict); load_parameters -> the emitted Gluon weight converter"
    severity = Severity.ERROR
    needs_text = ("save_parameters", "load_parameters")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            "# an mxnet script after the front end's first pass (Rule.needs_document)\n"
            "import numpy as np\n"
            "import torch\n"
            "\n"
            'net.load_parameters("pretrained.params", ctx=device)\n'
            'net.save_parameters("net.params")\n',
            "# an mxnet script after the front end's first pass (Rule.needs_document)\n"
            "import numpy as np\n"
            "import torch\n"
            "import re\n"
            "import struct\n"
            "\n\n"
            + _CONVERTER_TEXT
            + "\n\n"
            'load_gluon_parameters(net, "pretrained.params")\n'
            "net.to(device)\n"
            'torch.save(net.state_dict(), "net.params")\n',
        ),
        Example("# an mxnet script after the front end's first pass (Rule.needs_document)\n"
                'net.load_parameters("p.params", allow_missing=True)\n', None, title="partial loads: reported"),
    ]
    valid = ["import torch\ntorch.save(net.state_dict(), 'p.pt')\n"]

    def visit_Module(self, node: cst.Module) -> None:
        if self._any_call(node) and not sc.defined_at_top(self.ctx, "load_gluon_parameters"):
            self.report(node, "the port gets the Gluon weight converter (read_gluon_parameters, load_gluon_parameters)",
                        Fix((self.replace(node, sc.insert_before_defs(_converter())),),
                            imports=("re", "struct", "numpy", "torch")), severity=Severity.INFO)

    def _any_call(self, node: cst.Module) -> bool:
        return any(astutil.method_name(c) in ("save_parameters", "load_parameters") and self._problem(c) is None
                   for c in (n for n in astutil.walk(node, into_functions=True) if isinstance(n, cst.Call)))

    def _problem(self, node: cst.Call):
        if sc.qualname(self.ctx, node.func) is not None or astutil.arg(node, "filename", 0) is None:
            return "not a parameter file call"
        if astutil.method_name(node) == "save_parameters":
            return "save_parameters with deduplicate=: translate by hand" if len(node.args) != 1 else None
        for a in node.args:
            if a.keyword is not None and a.keyword.value not in ("filename", "ctx"):
                return (f"load_parameters({a.keyword.value}=...): load the arrays with read_gluon_parameters "
                        "and pick them by hand")
        if len([a for a in node.args if a.keyword is None]) > 2:
            return "load_parameters with positional options: translate by hand"
        return None

    def visit_Call(self, node: cst.Call) -> None:
        method = astutil.method_name(node)
        if method not in ("save_parameters", "load_parameters") or sc.qualname(self.ctx, node.func) is not None:
            return
        path = astutil.arg(node, "filename", 0)
        if path is None:
            return
        problem = self._problem(node)
        if problem is not None:
            self.report(node, problem)
            return
        if method == "save_parameters":
            torch = sc.torch_name(self.ctx)

            def build(u: cst.Call) -> cst.Call:
                net = u.func.value
                state = cst.Call(cst.Attribute(net, cst.Name("state_dict")))
                return cst.Call(sc.expr(f"{torch}.save"), [cst.Arg(state), cst.Arg(u.args[0].value)])

            self.report(node, "net.save_parameters(p) -> torch.save(net.state_dict(), p)", Fix((self.replace(node, build),), imports=("torch",)))
            return
        def build2(u: cst.Call) -> cst.Call:
            return cst.Call(cst.Name("load_gluon_parameters"), [cst.Arg(u.func.value), cst.Arg(astutil.arg(u, "filename", 0).value)])

        edits = [self.replace(node, build2)]
        device = astutil.arg(node, "ctx", 1)
        stmt = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if device is not None:
            if not (isinstance(self.ctx.parent, cst.Expr) and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
                self.report(node, "load_parameters(..., ctx=) inside an expression: load with load_gluon_parameters(net, "
                            "path), then net.to(device)")
                return
            one = sc.one_device(self.ctx, device.value)  # a context list: its one device (GL002)
            if one is None:
                self.report(node, "load_parameters(..., ctx=) on this context list: load with load_gluon_parameters(net, "
                            "path), then net.to(device)")
                return
            where = sc.code(one)
            where = renamed(self.ctx).get(where, where)  # the context variable is `device` now (GL002)
            move = cst.parse_statement(f"{sc.code(node.func.value)}.to({where})\n")
            edits.append(self.replace(stmt, lambda u: cst.FlattenSentinel([u, move])))
        self.report(node, "net.load_parameters(p, ctx=d) -> load_gluon_parameters(net, p) (the emitted converter), "
                    "net.to(d)", Fix(tuple(edits)))
