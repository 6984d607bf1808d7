import libcst as cst

from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _model

_STORE = "mxnet.gluon.model_zoo.model_store"


class GluonModelStore(Rule):
    """
    ## What it does
    `from mxnet.gluon.model_zoo.model_store import get_model_file` (at the top of the file or
    inside the `if pretrained:` branch of a model constructor) -> the emitted
    `get_model_file(name, root=None)`, which needs no MXNet: it returns the MXNet `.params` file
    of the pretrained model already in `root` (`name-<sha1 prefix>.params`, as MXNet's model
    store names it, or `name.params`; `root` defaults to `gluon_data_dir()/models`) and raises
    `FileNotFoundError` naming the file and the folder when it is not there. The port does not
    download. With `load_gluon_parameters` (GL403), which reads MXNet's file format with numpy,
    `pretrained=True` works from a file fetched once.

    ## Why
    The model store downloads through `mxnet.gluon.utils`: the port must import and build its
    models without MXNet.

    ## Fix safety
    Safe for the models, reported (a warning): `pretrained=True` no longer downloads; it
    loads a file that is in `root`, or says where to put it.
    """

    code = "GL405"
    name = "gluon-model-store"
    target = "torch"
    summary = "model_store.get_model_file -> an emitted loader of a local .params file (no download, no MXNet)"
    severity = Severity.WARNING
    needs_text = ("model_store",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet.gluon import nn

            def tiny(pretrained=False, root="~/.mxnet/models"):
                net = nn.Dense(2, in_units=4)
                if pretrained:
                    from mxnet.gluon.model_zoo.model_store import get_model_file
                    net.load_parameters(get_model_file("tiny", root=root))
                return net
            """,
            """
            from mxnet.gluon import nn


            def gluon_data_dir():
                \"\"\"MXNet's base.data_dir(): $MXNET_HOME, else ~/.mxnet (%APPDATA%\\\\mxnet on Windows), without MXNet.\"\"\"
                import os
                import platform

                default = os.path.join(os.environ.get("APPDATA", ""), "mxnet") if platform.system() == "Windows" \\
                    else os.path.join(os.path.expanduser("~"), ".mxnet")
                return os.environ.get("MXNET_HOME", default)


            def get_model_file(name, root=None):
                \"\"\"The Gluon model store's get_model_file without MXNet: the path of an MXNet `.params` file
                of the pretrained model `name` already in `root` (`name-<sha1 prefix>.params`, as MXNet's
                model store names it, or `name.params`). The port does not download: a file that is not there
                is a FileNotFoundError that says where to put it.\"\"\"
                import glob
                import os

                root = os.path.expanduser(root if root is not None else os.path.join(gluon_data_dir(), "models"))
                found = sorted(glob.glob(os.path.join(glob.escape(root), glob.escape(name) + "-*.params")))
                exact = os.path.join(root, name + ".params")
                if os.path.exists(exact):
                    found.append(exact)
                if not found:
                    raise FileNotFoundError(
                        f"pretrained weights are not downloaded by the port: put MXNet's {name}-<hash>.params file "
                        f"(from MXNet's model store, or the original's get_model_file({name!r})) in {root}")
                return found[0]


            def tiny(pretrained=False, root="~/.mxnet/models"):
                net = nn.Dense(2, in_units=4)
                if pretrained:
                    net.load_parameters(get_model_file("tiny", root=root))
                return net
            """,
            title="pretrained weights from a local file",
        ),
    ]
    valid = ["from mymodels.store import get_model_file\n"]

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or dotted_name(node.module) != _STORE \
                or isinstance(node.names, cst.ImportStar):
            return
        ours = [a for a in node.names if dotted_name(a.name) == "get_model_file"]
        if not ours:
            return
        alias = ours[0]
        if alias.asname is not None:
            return  # `get_model_file as g`: left as it is (rare), MXNet's import stays visible
        stmt = self.ctx.ancestors[-2] if len(self.ctx.ancestors) >= 2 else None
        if not isinstance(stmt, cst.SimpleStatementLine):
            return
        keep = [a for a in node.names if a is not alias]
        if keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            edit = self.replace(node, node.with_changes(names=keep))
        elif len(stmt.body) == 1:
            edit = self.remove(stmt)
        else:
            edit = self.remove(node)
        helpers, _ = _model.helpers_edit(self.ctx, ["gluon_data_dir", "get_model_file"])  # plain Python
        self.report(node, "MXNet's model store: the emitted get_model_file loads a local .params file "
                          "(pretrained weights are not downloaded by the port)", Fix((edit, helpers)))
