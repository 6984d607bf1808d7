from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from porter.astutil import string_value

from ._amp_dist import is_string, positional, source_of

_VARS = {"LOCAL_RANK": "local_ordinal", "RANK": "global_ordinal", "WORLD_SIZE": "world_size"}


class EnvRank(Rule):
    """
    ## What it does
    Reports ranks read from the launcher's environment (`os.environ['LOCAL_RANK']`,
    `os.environ.get('RANK')`, `os.getenv('WORLD_SIZE')`). When the value is converted with
    `int(...)`, the unsafe fix replaces the whole expression with the runtime's answer:
    `LOCAL_RANK` -> `xr.local_ordinal()`, `RANK` -> `xr.global_ordinal()`, `WORLD_SIZE` ->
    `xr.world_size()`.

    ## Why
    `torchrun` sets these variables; `torch_xla.launch` (TX702) does not, so
    `int(os.environ['LOCAL_RANK'])` raises `KeyError` in a launched TPU process and
    `.get('LOCAL_RANK', -1)` silently says "not distributed". The PJRT runtime knows each
    process's ordinals.

    ## Fix safety
    Unsafe. The runtime's values equal the variables only with one XLA device per process
    (the `torch_xla.launch` layout, or torchrun with one device each); a default such as
    `.get('LOCAL_RANK', -1)` that the code tests to choose a non-distributed path is lost
    (the runtime always answers, 0 in a single process). The `xr` functions start the XLA
    runtime, after which `torch_xla.launch` fails ("Runtime is already initialized"): they
    belong in the launched function, so a read at module level (run by the parent process)
    is only reported. A bare string read (not under `int(...)`) is only reported too: the
    runtime returns an int.
    """

    code = "TX707"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "env-rank"
    target = "torch-xla"
    summary = "int(os.environ['LOCAL_RANK']) -> xr.local_ordinal() (unsafe)"
    severity = Severity.WARNING
    needs_text = ("RANK", "WORLD_SIZE")
    examples = [
        Example(
            """
            import os

            def main_worker(index, args):
                local_rank = int(os.environ["LOCAL_RANK"])
                rank = int(os.environ.get("RANK", 0))
                world = int(os.getenv("WORLD_SIZE", "1"))
            """,
            """
            import torch_xla.runtime as xr

            def main_worker(index, args):
                local_rank = xr.local_ordinal()
                rank = xr.global_ordinal()
                world = xr.world_size()
            """,
            unsafe=True,
        ),
        Example(
            """
            import os

            if __name__ == "__main__":
                local_rank = int(os.environ["LOCAL_RANK"])
            """,
            None,
            title="at module level (the parent process) it is only reported",
        ),
        Example(
            """
            import os

            os.environ["MASTER_PORT"] = "29500"
            print("rank", os.environ["RANK"])
            """,
            None,
            title="a string read is reported",
        ),
    ]
    valid = [
        "import os\nif 'LOCAL_RANK' in os.environ:\n    pass\n",
        "import os\nos.environ['RANK'] = '0'\n",
        "import os\nx = int(os.environ['OMP_NUM_THREADS'])\n",
        "env = {}\nr = int(env['RANK'])\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != "builtins.int" or len(node.args) != 1 or node.args[0].keyword:
            return
        var = self._read(node.args[0].value)
        if var is None:
            return
        func = _VARS[var]
        if not self.ctx.inside(cst.FunctionDef):
            self.report(
                node,
                f"{var} comes from torchrun's environment, which torch_xla.launch does not set: inside the "
                f"launched function use xr.{func}() (not at module level: it starts the XLA runtime, and "
                "torch_xla.launch then fails)",
            )
            return
        xr = self.ctx.module_alias("torch_xla.runtime")
        new = cst.parse_expression(f"{xr}.{func}()")
        self.report(
            node,
            f"{var} comes from torchrun's environment, which torch_xla.launch does not set: use xr.{func}() "
            f"(equal with one XLA device per process; a default meaning 'not distributed' is lost)",
            Fix((self.replace(node, new),), Safety.UNSAFE, imports=("torch_xla.runtime",)),
        )

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if self._wrapped_in_int(node) or self._is_store(node):
            return
        var = self._read(node)
        if var is not None:
            self._report_bare(node, var)

    def leave_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) in ("os.environ.get", "os.getenv") and not self._wrapped_in_int(node):
            var = self._read(node)
            if var is not None:
                self._report_bare(node, var)

    def _report_bare(self, node: cst.CSTNode, var: str) -> None:
        self.report(
            node,
            f"`{source_of(node)}`: torch_xla.launch does not set {var}; on XLA use xr.{_VARS[var]}() "
            "(an int, from torch_xla.runtime)",
        )

    def _wrapped_in_int(self, node: cst.CSTNode) -> bool:
        parent = self.ctx.parent
        if isinstance(parent, cst.Arg):
            stack = self.ctx.ancestors
            call = stack[-3] if len(stack) >= 3 else None
            return (
                isinstance(call, cst.Call)
                and self.ctx.qualname(call.func) == "builtins.int"
                and len(call.args) == 1
                and call.args[0].value is node
            )
        return False

    def _is_store(self, node: cst.Subscript) -> bool:
        parent = self.ctx.parent
        return isinstance(parent, (cst.AssignTarget, cst.Del)) or (
            isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node
        )

    def _read(self, expr: cst.CSTNode) -> Optional[str]:
        """The variable name when ``expr`` reads LOCAL_RANK / RANK / WORLD_SIZE from the environment."""
        key: Optional[cst.CSTNode] = None
        if isinstance(expr, cst.Subscript) and self.ctx.qualname(expr.value) == "os.environ":
            if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
                key = expr.slice[0].slice.value
        elif isinstance(expr, cst.Call) and self.ctx.qualname(expr.func) in ("os.environ.get", "os.getenv"):
            args = positional(expr)
            key = args[0].value if args else None
        if key is None or not is_string(key):
            return None
        name = string_value(key)
        return name if name in _VARS else None
