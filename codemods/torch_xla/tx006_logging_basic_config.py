import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity, module_fact

from . import _training as tr
from ._tables import imports_torch

_BASIC_CONFIG = "logging.basicConfig"


class LoggingBasicConfig(Rule):
    """
    ## What it does
    Adds `force=True` to the script's `logging.basicConfig(...)` calls (however `logging` or
    `basicConfig` is imported): `logging.basicConfig(level=logging.INFO, format=...)` ->
    `logging.basicConfig(level=logging.INFO, format=..., force=True)`. A call that already
    passes `force=`, or passes `**kwargs`, is left as it is; in a file that adds handlers to
    the root logger itself (`logging.getLogger().addHandler(...)`, `logging.root.addHandler`)
    the call is reported instead.

    ## Why
    `import torch_xla` calls `logging.basicConfig()` itself (torch_xla/__init__.py in 2.9: a
    stderr handler on the root logger, level WARNING). `basicConfig` does nothing when the root
    logger already has a handler, so in the port the script's own call is ignored: its level,
    format, file and handlers never apply, and every `logging.info(...)` line, the loss logs
    of the step closures included, is dropped (measured: a port that logs its loss with
    `logging.info` printed nothing, and a verification counted its logging steps as quiet
    steps with transfers). `force=True` (Python 3.8+) removes the root logger's handlers first.

    ## Fix safety
    Safe: in the original the call configures a root logger that has no handler yet (nothing
    in the file added one; a file that does is reported, not fixed), so removing the handlers
    present removes only the one torch_xla's import added, and the call configures logging as
    it did on the GPU.
    """

    code = "TX006"
    name = "logging-basic-config"
    target = "torch-xla"
    summary = "logging.basicConfig(...) -> basicConfig(..., force=True) (torch_xla's import configured logging first)"
    severity = Severity.ERROR
    needs_text = ("basicConfig",)
    examples = [
        Example(
            """
            import logging

            import torch

            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
            logger = logging.getLogger(__name__)
            """,
            """
            import logging

            import torch

            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", force=True)
            logger = logging.getLogger(__name__)
            """,
        ),
        Example(
            """
            import logging as log
            from logging import basicConfig
            import torch

            def setup(path):
                basicConfig(
                    filename=path,
                    level=log.DEBUG,
                )
            """,
            """
            import logging as log
            from logging import basicConfig
            import torch

            def setup(path):
                basicConfig(
                    filename=path,
                    level=log.DEBUG,
                    force=True,
                )
            """,
            title="an imported basicConfig, a call over several lines",
        ),
        Example(
            """
            import logging
            import torch

            root = logging.getLogger()
            root.addHandler(logging.FileHandler("train.log"))
            logging.basicConfig(level=logging.INFO)
            """,
            None,
            title="a file that adds root handlers itself is reported",
        ),
    ]
    valid = [
        "import logging\nimport torch\nlogging.basicConfig(level=logging.INFO, force=True)\n",
        "import logging\nimport torch\nlogging.basicConfig(**config)\n",
        "import logging\nlogging.basicConfig(level=logging.INFO)\n",  # not a torch file
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != _BASIC_CONFIG or not imports_torch(self.ctx):
            return
        if astutil.has_kwarg(node, "force") or any(a.star == "**" for a in node.args):
            return
        why = ("torch_xla's import configures the root logger first (logging.basicConfig() in torch_xla/__init__.py), "
               "so this call does nothing in the port: its level, format and handlers never apply and logging.info "
               "lines are dropped")
        if module_fact(self.ctx, _adds_root_handlers):
            self.report(node, f"{why}; the file also adds root handlers itself: pass force=True where the root "
                        "logger is first configured")
            return
        self.report(node, f"{why}; force=True configures it as in the original",
                    Fix((Edit(node, tr.append_kwarg("force", "True")),)))


def _adds_root_handlers(ctx) -> bool:
    """The file calls ``addHandler`` on the root logger, or on a name it assigns the root logger
    to (``root = logging.getLogger()``) anywhere. (A module fact.)"""
    nodes = list(astutil.walk(ctx.module, into_functions=True))
    roots = {t.target.value for n in nodes if isinstance(n, cst.Assign) and _is_root_logger(n.value, ctx)
             for t in n.targets if isinstance(t.target, cst.Name)}
    return any(isinstance(n, cst.Call) and astutil.method_name(n) == "addHandler" and isinstance(n.func, cst.Attribute)
               and (_is_root_logger(n.func.value, ctx)
                    or isinstance(n.func.value, cst.Name) and n.func.value.value in roots)
               for n in nodes)


def _is_root_logger(node: cst.BaseExpression, ctx) -> bool:
    if ctx.qualname(node) == "logging.root":
        return True
    return (isinstance(node, cst.Call) and ctx.qualname(node.func) == "logging.getLogger"
            and (not node.args or isinstance(node.args[0].value, cst.Name) and node.args[0].value.value == "None"))
