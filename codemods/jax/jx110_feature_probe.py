from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _ops_table as ops


class TorchFeatureProbe(Rule):
    """
    ## What it does
    `hasattr(torch.nn.functional, "scaled_dot_product_attention")`, `hasattr(F, 'gelu')`,
    `hasattr(torch, "cat")` -> `True`, where the probed name is a torch function of porter's
    op table (docs/jax-ops.md) or a functional loss: the port translates its calls (or
    reports each one it cannot), so the code takes the branch it takes on a torch that has
    the function. A probe of a name the table does not know is left (JX901 reports the torch
    code left), and so is a name given as a variable.

    ## Why
    Feature probes choose between a new torch function and a fallback written for older
    torch versions (nanoGPT's flash attention). In a JAX port the probe would still read
    torch; the question it asks ("can this code call the function?") has a fixed answer once
    the call is ported.

    ## Fix safety
    Safe: the port takes the branch that the original takes on the torch versions porter
    ports from (2.x, where every function of the table exists), and the calls in it are ported
    (or reported) like any other.
    """

    code = "JX110"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-torch-feature-probe"
    target = "jax"
    summary = "hasattr(torch.nn.functional, 'scaled_dot_product_attention') -> True (the port has the function)"
    severity = Severity.ERROR
    needs_text = ("hasattr",)
    examples = [
        Example(
            """
            import torch

            class Attention:
                def __init__(self):
                    self.flash = hasattr(torch.nn.functional, 'scaled_dot_product_attention')
            """,
            """
            class Attention:
                def __init__(self):
                    self.flash = True
            """,
        ),
        Example(
            """
            import torch
            import torch.nn.functional as F
            from torch.nn import functional

            if hasattr(F, "gelu") and hasattr(functional, "cross_entropy") and hasattr(torch, "cat"):
                act = "gelu"
            """,
            """
            if True and True and True:
                act = "gelu"
            """,
            title="F, a module alias, torch itself, a functional loss",
        ),
    ]
    valid = [
        "import torch\nok = hasattr(torch, 'compile')\n",  # not a function of the table: JX901 says so
        "import torch.nn.functional as F\nok = hasattr(F, name)\n",
        "import torch\nok = hasattr(model, 'scaled_dot_product_attention')\n",
        "def hasattr(a, b):\n    return False\nimport torch\nok = hasattr(torch, 'cat')\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = self._probed(node)
        if name is None:
            return
        self.report(node, f"hasattr(...) probes {name}: the port translates its calls, so the probe is True",
                    Fix((self.replace(node, cst.Name("True")),)))

    def _probed(self, node: cst.Call) -> Optional[str]:
        """The torch function a `hasattr(module, "name")` call probes, when the table knows it."""
        if self.ctx.qualname(node.func) != "builtins.hasattr" or len(node.args) != 2 \
                or any(a.star or a.keyword is not None for a in node.args):
            return None
        if any("hasattr" in astutil.binds(s) for s in self.ctx.module.body):
            return None  # the file's own hasattr
        module = self.ctx.qualname(node.args[0].value)
        attr = astutil.string_value(node.args[1].value)
        if not module or not attr or not (module == "torch" or module.startswith("torch.")):
            return None
        full = f"{module}.{attr}"
        return full if ops.known_function(full) else None
