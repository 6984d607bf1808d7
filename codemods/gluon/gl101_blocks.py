import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model, _ops_table


class GluonBlock(Rule):
    """
    ## What it does
    Rewrites a Gluon block class to a torch module:

    - the base `gluon.Block` / `gluon.HybridBlock` (also `nn.Block`, `nn.HybridBlock`) ->
      `nn.Module`;
    - `super(X, self).__init__(**kwargs)` -> `super(X, self).__init__()` (Gluon's `prefix=` and
      `params=` have no torch meaning; the class keeps accepting them);
    - `def hybrid_forward(self, F, x, ...)` -> `def forward(self, x, ...)`: the `F.*` calls in
      it are the ops GL201 translates (when one of them has no translation, `hybrid_forward`
      and its `F` stay, with the call marked `# porter: manual`: torch then raises at the
      first call, never computes something else); `F` used otherwise than in a call
      (`act = F.Activation`, see GL202) also keeps it, and once GL202 has rewritten it the
      `hybrid_forward` of the class, a torch module by then, becomes `forward` in a later pass;
    - `self.register_child(block, name)` -> `self.add_module(name, block)` (without a name
      Gluon numbers the children: `str(len(self._modules))`).

    A block that declares its own parameters (`self.params.get(...)`, which Gluon passes to
    `hybrid_forward` as keyword arguments) is reported for a person.

    ## Why
    Attribute names stay as they are, so the torch module's `state_dict` names are the ones
    `porter verify` gives the Gluon parameters (`conv1.weight`, `bn1.running_var`...).

    ## Fix safety
    Safe: `hybridize()` compiles the same operators the imperative forward runs.
    """

    code = "GL101"
    name = "gluon-block"
    target = "torch"
    summary = "gluon.HybridBlock with hybrid_forward(self, F, x) -> nn.Module with forward(self, x)"
    severity = Severity.ERROR
    needs_text = ("Block",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon
            from mxnet.gluon import nn

            class Net(gluon.HybridBlock):
                def __init__(self, **kwargs):
                    super(Net, self).__init__(**kwargs)
                    self.act = nn.Activation("relu")

                def hybrid_forward(self, F, x):
                    return self.act(x)
            """,
            """
            from mxnet.gluon import nn

            class Net(nn.Module):
                def __init__(self, **kwargs):
                    super(Net, self).__init__()
                    self.act = nn.Activation("relu")

                def forward(self, x):
                    return self.act(x)
            """,
            title="a HybridBlock",
        ),
    ]
    valid = ["import torch.nn as nn\n\nclass Net(nn.Module):\n    def forward(self, x):\n        return x\n"]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = [b for b in node.bases if self.ctx.qualname(b.value) in _model.BLOCK_BASES]
        if not bases:
            self._later_forward(node)
            return
        nn, imports = _model.torch_nn(self.ctx)
        new_base = cst.parse_expression(f"{nn}.Module")
        edits = [self.replace(b.value, new_base) for b in bases]
        for stmt in node.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "hybrid_forward":
                params = stmt.params.params
                if len(params) >= 2 and _ops_table.all_f_calls_translate(stmt):
                    edits.append(self.replace(stmt, lambda fn: fn.with_changes(
                        name=cst.Name("forward"),
                        params=fn.params.with_changes(params=[fn.params.params[0], *fn.params.params[2:]]))))
        for n in astutil.walk(node.body, into_functions=True):
            if isinstance(n, cst.Call):
                self._call(n, node, edits)
        self.report(node, f"Gluon block {node.name.value}: a torch nn.Module", Fix(tuple(edits), imports=imports))

    def _later_forward(self, node: cst.ClassDef) -> None:
        """A block made a torch module in an earlier pass while ``F`` was still used otherwise
        (``act = F.Activation``, rewritten since): its ``hybrid_forward`` becomes ``forward`` now."""
        if not any(self.ctx.qualname(b.value) == "torch.nn.Module" for b in node.bases):
            return
        for stmt in node.body.body:
            if (isinstance(stmt, cst.FunctionDef) and stmt.name.value == "hybrid_forward" and len(stmt.params.params) >= 2
                    and _ops_table.all_f_calls_translate(stmt)):
                self.report(stmt, f"hybrid_forward of {node.name.value}: forward", Fix((self.replace(
                    stmt, lambda fn: fn.with_changes(name=cst.Name("forward"), params=fn.params.with_changes(
                        params=[fn.params.params[0], *fn.params.params[2:]]))),)))

    def _call(self, call: cst.Call, cls: cst.ClassDef, edits: list) -> None:
        f = call.func
        # super(X, self).__init__(**kwargs) / super().__init__(prefix=...)
        if (isinstance(f, cst.Attribute) and f.attr.value == "__init__" and isinstance(f.value, cst.Call)
                and isinstance(f.value.func, cst.Name) and f.value.func.value == "super" and call.args):
            edits.append(self.replace(call, call.with_changes(args=[])))
        elif (isinstance(f, cst.Attribute) and f.attr.value == "register_child" and isinstance(f.value, cst.Name)
              and f.value.value == "self"):
            block = astutil.arg(call, "block", 0)
            name = astutil.arg(call, "name", 1)
            if block is None:
                return
            name_code = _model.code(name.value) if name is not None else "str(len(self._modules))"
            edits.append(self.replace(call, cst.parse_expression(
                f"self.add_module({name_code}, {_model.code(block.value)})")))
        elif (isinstance(f, cst.Attribute) and f.attr.value == "get" and isinstance(f.value, cst.Attribute)
              and f.value.attr.value == "params" and isinstance(f.value.value, cst.Name) and f.value.value.value == "self"):
            self.report(call, "manual port needed: a Gluon block's own parameter (self.params.get): make it an "
                        "nn.Parameter attribute and pass it to the forward explicitly", severity=Severity.ERROR)
