import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _model

_DATA_DIR = frozenset({"mxnet.base.data_dir", "mxnet.util.data_dir"})


class GluonDataDir(Rule):
    """
    ## What it does
    `mxnet.base.data_dir()` (`from mxnet import base; base.data_dir()`, `mx.base.data_dir()`),
    MXNet's folder for downloaded models and data sets, -> `gluon_data_dir()`, an emitted
    function with MXNet's rule: `$MXNET_HOME`, else `~/.mxnet` (`%APPDATA%\\mxnet` on Windows).

    ## Why
    Model zoos use it as the default `root=` of their pretrained weights; the port must import
    without MXNet.

    ## Fix safety
    Safe: the same path, computed as MXNet 1.9.1 computes it.
    """

    code = "GL007"
    name = "gluon-data-dir"
    target = "torch"
    summary = "base.data_dir() -> gluon_data_dir() (MXNET_HOME or ~/.mxnet, no MXNet)"
    severity = Severity.ERROR
    needs_text = ("data_dir",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import os
            from mxnet import base

            def get_net(root=os.path.join(base.data_dir(), "models")):
                return root
            """,
            """
            import os


            def gluon_data_dir():
                \"\"\"MXNet's base.data_dir(): $MXNET_HOME, else ~/.mxnet (%APPDATA%\\\\mxnet on Windows), without MXNet.\"\"\"
                import os
                import platform

                default = os.path.join(os.environ.get("APPDATA", ""), "mxnet") if platform.system() == "Windows" \\
                    else os.path.join(os.path.expanduser("~"), ".mxnet")
                return os.environ.get("MXNET_HOME", default)


            def get_net(root=os.path.join(gluon_data_dir(), "models")):
                return root
            """,
        ),
    ]
    valid = ["import os\nroot = os.path.expanduser('~/.mxnet')\n"]

    def visit_Call(self, node: cst.Call) -> None:
        if node.args or self.ctx.qualname(node.func) not in _DATA_DIR:
            return
        edit, _ = _model.helpers_edit(self.ctx, ["gluon_data_dir"])  # plain Python: no torch import
        self.report(node, "MXNet's data_dir(): the emitted gluon_data_dir()",
                    Fix((self.replace(node, cst.parse_expression("gluon_data_dir()")), edit)))
