from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Rule, Severity

# Gluon libraries: packages of MXNet/Gluon code that a script imports and porter does not port
# with the script itself (`porter migrate --with PACKAGE` ports the modules it uses)
LIBRARIES = ("gluoncv", "gluonnlp", "gluonts")


def _library(module: Optional[str]) -> Optional[str]:
    if module is None:
        return None
    top = module.split(".")[0]
    return top if top in LIBRARIES else None


_MXNET_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+mxnet\b|from[ \t]+mxnet\b)", re.M)


class GluonLibraries(Rule):
    """
    ## What it does
    Reports each import of a Gluon library, a package of MXNet/Gluon code such as gluoncv,
    gluonnlp or gluonts (`from gluoncv import model_zoo`, `import gluoncv as gcv`,
    `from gluoncv.utils import TrainingHistory`), at the import, saying what to do:

    - `porter migrate SCRIPT --to TARGET --out DIR --with gluoncv` ports the modules of the
      installed package the script imports (and what they import from it) into `DIR/gluoncv/`
      along with the script, so that the port imports the ported library from `DIR`
      (docs/cli.md); the findings left in the library's modules are listed with the script's;
    - or replace the library's models, transforms and utilities with torch code by hand.

    The message starts with the package's name (the CLI drops the findings of the packages
    named by `--with`). It reports only in files that import MXNet: the port of a script, which
    imports the library ported along, is not reported again.

    ## Why
    The port of a script is plain PyTorch; a Gluon library it imports is MXNet code, so the
    port would still import MXNet (and fail where MXNet is not installed, as on a TPU VM with
    only torch_xla or JAX).

    ## Fix safety
    No fix: what replaces a library's code is a decision (port it along, or use a torch
    library's counterpart).
    """

    code = "GL008"
    name = "gluon-libraries"
    target = "torch"
    summary = "imports of Gluon libraries (gluoncv, gluonnlp, gluonts) -> a finding: port them along with --with PACKAGE"
    severity = Severity.ERROR
    needs_text = LIBRARIES
    # Gluon documents only, as the other GL rules: a port (no mxnet left) that imports the
    # library ported along by --with is not reported again
    needs_document = ("mxnet",)
    examples = [
        Example(
            """
            import mxnet as mx
            from gluoncv import model_zoo

            net = model_zoo.get_model("resnet18_v1", classes=10)
            """,
            None,
            title="a module of the library",
        ),
        Example(
            """
            import mxnet as mx
            import gluoncv as gcv

            history = gcv.utils.TrainingHistory(["train-error"])
            """,
            None,
            title="the whole package under an alias",
        ),
    ]
    valid = [
        "import mxnet as mx\nfrom mxnet.gluon import model_zoo\n",
        "import gluoncv_helpers\nfrom torchvision import models\n",
        "import mxnet as mx\nfrom .gluoncv import local_module\n",
        "import torch\nfrom gluoncv import model_zoo\n",  # a port: the library was ported along (--with)
        "import torch\nfrom gluoncv import model_zoo\nMXNET_HOME = '~/.mxnet'  # mxnet named, not imported\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        # a file that imports MXNet itself: the script, not its port (whose text may still
        # name mxnet in a comment or a string, which the document gate lets through). Asked of
        # the text the run began with: once GL001 has dropped the script's MXNet imports, the
        # library's import is still the script's, and the port would fail on it
        if self.ctx.document is not None:
            self._uses_mxnet = _MXNET_IMPORT.search(self.ctx.document) is not None
            return
        self._uses_mxnet = any(
            (isinstance(n, cst.Import) and any((dotted_name(a.name) or "").split(".")[0] == "mxnet" for a in n.names))
            or (isinstance(n, cst.ImportFrom) and not n.relative and n.module is not None
                and (dotted_name(n.module) or "").split(".")[0] == "mxnet")
            for n in astutil.walk(node, into_functions=True))

    def visit_Import(self, node: cst.Import) -> None:
        if not self._uses_mxnet:
            return
        for alias in node.names:
            package = _library(dotted_name(alias.name))
            if package is not None:
                self._report(node, package, f"import {dotted_name(alias.name)}")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if not self._uses_mxnet or node.relative or node.module is None:
            return
        module = dotted_name(node.module)
        package = _library(module)
        if package is not None:
            self._report(node, package, f"from {module} import ...")

    def _report(self, node: cst.CSTNode, package: str, spelled: str) -> None:
        self.report(node, f"{package} is a Gluon library (MXNet code) that porter does not port with the script "
                    f"(`{spelled}`): port the modules this script uses along with it, "
                    f"`porter migrate SCRIPT --to TARGET --out DIR --with {package}` (an installed {package}; "
                    f"the port imports DIR/{package}), or replace them with torch code by hand")
