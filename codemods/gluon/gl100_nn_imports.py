import libcst as cst

from porter import astutil

from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _model, _model_layers

_MODULES = {"mxnet.gluon.nn": "nn", "mxnet.gluon.rnn": "rnn"}
# the layers of Gluon's rnn module that GL105 writes as torch.nn's
_TRANSLATED_RNN = frozenset({"LSTM", "GRU"})


class GluonNnImports(Rule):
    """
    ## What it does
    Rewrites the imports of Gluon's layer modules to torch's: `from mxnet.gluon import nn`
    -> `from torch import nn`; `from mxnet.gluon import nn, rnn` -> `from torch import nn`
    (the recurrent layers are in torch.nn: GL104 writes `rnn.LSTM` as `nn.LSTM`);
    `from mxnet.gluon import rnn` alone -> `from torch import nn as rnn`; `import
    mxnet.gluon.nn as nn` -> `from torch import nn`. Other names of the same import (`from
    mxnet.gluon import nn, loss`) stay in an MXNet import for the other rules.

    ## Why
    The layer rules (GL104) write torch layers with the module's own name (`nn.Linear`):
    the name must then be torch's.

    ## Fix safety
    Safe together with GL104, which rewrites every Gluon layer the file builds; a layer it
    cannot translate is marked `# porter: manual`, and its `nn.<GluonName>` then fails with
    an AttributeError at once, never computes something else.
    """

    code = "GL100"
    name = "gluon-nn-imports"
    target = "torch"
    summary = "from mxnet.gluon import nn / rnn -> from torch import nn"
    severity = Severity.ERROR
    needs_text = ("mxnet",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet.gluon import nn, rnn
            """,
            """
            from torch import nn
            """,
            title="layers and recurrent layers",
        ),
        Example(
            """
            from mxnet.gluon import rnn
            """,
            """
            from torch import nn as rnn
            """,
            title="recurrent layers alone",
        ),
    ]
    valid = ["from torch import nn\n", "from mxnet import gluon\n"]

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        mod = dotted_name(node.module)
        if mod not in ("mxnet.gluon", "mxnet"):
            return
        ours, others = [], []
        for alias in node.names:
            full = f"{mod}.{dotted_name(alias.name)}"
            if full in _MODULES or (mod == "mxnet" and full == "mxnet.gluon.nn"):
                ours.append((_MODULES[full], alias))
            else:
                others.append(alias)
        if not ours:
            return
        new: list[cst.ImportAlias] = []
        kinds = {k for k, _ in ours}
        for kind, alias in ours:
            local = alias.asname.name.value if alias.asname else kind
            if kind == "rnn" and self._untranslated(local):
                # rnn.RNN, rnn.LSTMCell...: MXNet's until a person ports them (reported at their
                # lines by GL105, the import by GL901); as torch.nn's they would take Gluon's
                # arguments with no finding
                others.append(alias)
                continue
            if kind == "rnn" and "nn" in kinds and local == "rnn":
                continue  # rnn.X is written nn.X
            asname = None if local == "nn" else cst.AsName(cst.Name(local))
            new.append(cst.ImportAlias(cst.Name("nn"), asname=asname))
        if not new:
            return
        torch_import = cst.ImportFrom(module=cst.Name("torch"), names=new)
        if others:
            others[-1] = others[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            rest = node.with_changes(names=others)
            stmt = self.ctx.enclosing(cst.SimpleStatementLine)
            if stmt is None or len(stmt.body) != 1:
                return
            fix = Fix((self.replace(stmt, cst.FlattenSentinel([
                stmt.with_changes(body=[rest]), cst.SimpleStatementLine([torch_import])])),))
        else:
            fix = Fix((self.replace(node, torch_import),))
        self.report(node, "Gluon's layer modules: torch.nn", fix)

    def _untranslated(self, local: str) -> bool:
        """The file uses a member of ``local`` (Gluon's rnn module) that the layer rules do not
        write as torch.nn's: one they have no translation for (RNN, the cells), or an LSTM/GRU
        whose arguments they leave for a person."""
        for n in astutil.walk(self.ctx.module, into_functions=True):
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == local \
                    and n.attr.value not in _TRANSLATED_RNN:
                return True
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and isinstance(n.func.value, cst.Name) \
                    and n.func.value.value == local and n.func.attr.value in _TRANSLATED_RNN:
                kind = n.func.attr.value
                try:
                    _model_layers.plan(kind, _model.bind(n, _model.SIGNATURES[kind]), _model.input_size(n, self.ctx),
                                       "nn", self.ctx, n)
                except _model_layers.Manual:
                    return True
        return False

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name)
            if full in _MODULES and alias.asname is not None and len(node.names) == 1:
                local = alias.asname.name.value
                asname = None if local == "nn" else cst.AsName(cst.Name(local))
                stmt = self.ctx.enclosing(cst.SimpleStatementLine)
                if stmt is None:
                    return
                self.report(node, "Gluon's layer modules: torch.nn", Fix((self.replace(
                    node, cst.ImportFrom(module=cst.Name("torch"), names=[cst.ImportAlias(cst.Name("nn"), asname=asname)])),)))
