import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._tables import DEPRECATED_XLA, TORCH_XLA, XLA_DEVICE, tidy_args

# Parents in which a Name is a binding or a label, not a use of an imported function.
_BINDING_PARENTS = (cst.FunctionDef, cst.ClassDef, cst.Param, cst.AssignTarget, cst.AsName, cst.Global, cst.Nonlocal)


class DeprecatedXlaApi(Rule):
    """
    ## What it does
    Rewrites torch_xla names that are removed or deprecated in torch_xla 2.9 to the current
    API, from one table: `xm.xla_device()` -> `torch_xla.device()`, `xm.mark_step()` ->
    `torch_xla.sync()`, `xm.xrt_world_size()` / `xm.world_size()` -> `xr.world_size()`,
    `xm.get_ordinal()` -> `xr.global_ordinal()`, `xm.get_local_ordinal()` ->
    `xr.local_ordinal()`, `torch_xla.experimental.compile` -> `torch_xla.compile`. Names with
    no mechanical replacement (`xm.parse_xla_device`, `xr.using_pjrt`) and names planned for
    deprecation (`xm.get_xla_supported_devices`, `xm.xla_real_devices`, `xm.xla_device_hw`)
    are reported. `from torch_xla.core.xla_model import <old name>` loses the old name once
    its uses are rewritten (the engine removes the import then, other names of the line stay);
    while a use is left for a human, the import is reported.

    ## Why
    Checked in the torch_xla 2.9.0 venv: `xm.xrt_world_size`, `xm.get_ordinal`,
    `xm.world_size`, `xm.parse_xla_device` and `xr.using_pjrt` no longer exist
    (AttributeError; a `from ... import` of them fails at import time);
    `xm.xla_device` and `xm.mark_step` warn `DeprecationWarning: Use torch_xla.device /
    torch_xla.sync instead`. The removals follow pytorch/xla#8915 (2.7 release).
    `xm.get_local_ordinal()` only calls `xr.local_ordinal()`. `xm.xla_device(n, devkind)`
    ignores `devkind` in 2.9 and returns `torch_xla.device(n)`.

    ## Fix safety
    Safe: each new name is what the old one calls (or called before removal) in 2.9.
    """

    code = "TX001"
    name = "deprecated-xla-api"
    target = "torch-xla"
    summary = "removed/deprecated torch_xla names (xla_device, mark_step, xrt_world_size, get_ordinal...) -> current API"
    severity = Severity.WARNING
    needs_text = ("torch_xla",)
    examples = [
        Example(
            """
            import torch_xla.core.xla_model as xm

            device = xm.xla_device()
            world = xm.xrt_world_size()
            rank = xm.get_ordinal()
            local = xm.get_local_ordinal()
            for batch in loader:
                step(batch)
                xm.mark_step()
            """,
            """
            import torch_xla
            import torch_xla.runtime as xr

            device = torch_xla.device()
            world = xr.world_size()
            rank = xr.global_ordinal()
            local = xr.local_ordinal()
            for batch in loader:
                step(batch)
                torch_xla.sync()
            """,
        ),
        Example(
            """
            import torch_xla
            from torch_xla.core.xla_model import get_ordinal, xla_device, optimizer_step

            dev = xla_device(n=1, devkind="TPU")

            def is_first():
                return get_ordinal() == 0
            """,
            """
            import torch_xla
            from torch_xla.core.xla_model import optimizer_step
            import torch_xla.runtime as xr

            dev = torch_xla.device(1)

            def is_first():
                return xr.global_ordinal() == 0
            """,
            title="imported names; devkind is ignored by torch_xla 2.9",
        ),
        Example(
            """
            from torch_xla.core.xla_model import get_ordinal, xrt_world_size

            world = xrt_world_size()
            rank = get_ordinal(group)
            """,
            """
            from torch_xla.core.xla_model import get_ordinal
            import torch_xla.runtime as xr

            world = xr.world_size()
            rank = get_ordinal(group)
            """,
            title="a name with a use left for a human stays imported (reported)",
        ),
        Example(
            """
            import torch_xla.runtime as xr

            if xr.using_pjrt():
                setup()
            """,
            None,
        ),
    ]
    valid = [
        "import torch_xla\nimport torch_xla.runtime as xr\nd = torch_xla.device()\nn = xr.world_size()\ntorch_xla.sync()\n",
        "import torch_xla.core.xla_model as xm\nxm.optimizer_step(opt)\n",
        "def get_ordinal():\n    return 0\nimport torch_xla\nget_ordinal()\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._imports: list[tuple[cst.ImportFrom, str, list[tuple[str, str]]]] = []
        self._unfixed: set[str] = set()  # local names with a use reported without a fix

    # References -----------------------------------------------------------------------
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        parent = self.ctx.parent
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return
        if isinstance(parent, _BINDING_PARENTS) or self.ctx.inside(cst.Import, cst.ImportFrom):
            return
        self._reference(node)

    def _reference(self, node: cst.CSTNode) -> None:
        name = self.ctx.qualname(node)
        if name is None or not name.startswith("torch_xla"):
            return
        parent = self.ctx.parent
        call = parent if isinstance(parent, cst.Call) and parent.func is node else None
        if name == XLA_DEVICE:
            self._xla_device(node, call)
            return
        spec = DEPRECATED_XLA.get(name)
        if spec is None:
            return
        target = call if call is not None else node
        if spec.module is None or (call is not None and call.args and not spec.keep_args):
            self.report(target, spec.message, severity=spec.severity)
            self._unfixed.add(_head(node))
            return
        new_func = cst.parse_expression(f"{self.ctx.module_alias(spec.module)}.{spec.attr}")
        self.report(target, spec.message, Fix((self.replace(node, new_func),), imports=(spec.module,)), severity=spec.severity)

    def _xla_device(self, node: cst.CSTNode, call) -> None:
        message = "xm.xla_device() is deprecated (DeprecationWarning in 2.9): use torch_xla.device()"
        new_func = cst.parse_expression(f"{self.ctx.module_alias(TORCH_XLA)}.device")
        if call is None:
            self.report(node, message, Fix((self.replace(node, new_func),), imports=(TORCH_XLA,)))
            return
        if any(a.star for a in call.args):
            self.report(call, message)
            self._unfixed.add(_head(node))
            return
        index = arg(call, "n", 0)
        args = [cst.Arg(index.value)] if index is not None else []
        new = call.with_changes(func=new_func, args=tidy_args(args))
        self.report(call, message, Fix((self.replace(call, new),), imports=(TORCH_XLA,)))

    # Imports of removed names -------------------------------------------------------------
    # Decided at the end of the file: the import of a name whose every use was rewritten is
    # removed by the engine (Fix.remove_imports, after the rewrites of the same pass); one
    # with a use left for a human stays, reported.
    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = cst.Module([]).code_for_node(node.module)
        dropped: list[tuple[str, str]] = []  # (name, local name)
        for alias in node.names:
            name = cst.Module([]).code_for_node(alias.name)
            spec = DEPRECATED_XLA.get(f"{module}.{name}")
            if f"{module}.{name}" == XLA_DEVICE or (spec is not None and spec.module is not None):
                local = cst.Module([]).code_for_node(alias.asname.name) if alias.asname else name
                dropped.append((name, local))
        if dropped:
            self._imports.append((node, module, dropped))

    def leave_Module(self, node: cst.Module) -> None:
        for stmt, module, dropped in self._imports:
            names = ", ".join(name for name, _ in dropped)
            left = [local for _, local in dropped if local in self._unfixed]
            pairs = tuple((module, name) for name, local in dropped if local not in self._unfixed)
            message = f"import of deprecated torch_xla names ({names}): "
            if left:
                message += (f"port the uses of {', '.join(left)} reported separately, then remove "
                            f"{'it' if len(left) == 1 else 'them'} from the import")
                if pairs:
                    message += "; the names whose uses are rewritten go"
            else:
                message += "their uses are rewritten; the names go"
            self.report(stmt, message, Fix((), remove_imports=pairs) if pairs else None)


def _head(node: cst.CSTNode) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""
