import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import XR

_OLD = "torch_xla.experimental.pjrt"
# Public functions of torch_xla.runtime in 2.9.0 (dir() in the venv).
RUNTIME_NAMES = frozenset((
    "addressable_device_count", "addressable_runtime_device_count", "device_type", "get_master_ip",
    "get_num_cached_compilation_graph", "global_device_count", "global_ordinal", "global_runtime_device_attributes",
    "host_index", "initialize_cache", "is_bf16_supported", "is_spmd", "local_device_count", "local_ordinal",
    "local_process_count", "process_count", "process_index", "runtime_device_attributes", "set_device_type",
    "use_spmd", "world_size",
))


class ExperimentalPjrt(Rule):
    """
    ## What it does
    Rewrites imports of `torch_xla.experimental.pjrt` to `torch_xla.runtime` when every name
    the file uses from it exists in `torch_xla.runtime`:
    `import torch_xla.experimental.pjrt as pjrt` -> `import torch_xla.runtime as pjrt`,
    `from torch_xla.experimental import pjrt` -> `from torch_xla import runtime as pjrt`,
    `from torch_xla.experimental.pjrt import world_size` -> `from torch_xla.runtime import world_size`.
    Otherwise it reports the names that have no counterpart.

    ## Why
    The PJRT runtime API moved from `torch_xla.experimental.pjrt` to `torch_xla.runtime` in
    r2.1 (PJRT docs); in torch_xla 2.9.0 the old module is gone
    (`ModuleNotFoundError: No module named 'torch_xla.experimental.pjrt'`, checked), so the
    import fails before anything runs. Names such as `using_pjrt` or `run_multiprocess` have no
    counterpart (`torch_xla.launch` replaced the latter).

    ## Fix safety
    Safe: only applied when all used names exist in `torch_xla.runtime` 2.9.
    """

    code = "TX005"
    name = "xla-experimental-pjrt"
    target = "torch-xla"
    summary = "import torch_xla.experimental.pjrt (removed) -> torch_xla.runtime"
    severity = Severity.ERROR
    needs_text = ("pjrt",)
    examples = [
        Example(
            """
            import torch_xla.experimental.pjrt as pjrt
            from torch_xla.experimental.pjrt import global_ordinal

            n = pjrt.world_size()
            r = global_ordinal()
            """,
            """
            import torch_xla.runtime as pjrt
            from torch_xla.runtime import global_ordinal

            n = pjrt.world_size()
            r = global_ordinal()
            """,
        ),
        Example(
            """
            from torch_xla.experimental import pjrt

            if pjrt.using_pjrt():
                pjrt.run_multiprocess(main)
            """,
            None,
        ),
    ]
    valid = [
        "import torch_xla.runtime as xr\nn = xr.world_size()\n",
        "import torch_xla.experimental.pjrt_backend\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._pending: list[tuple[cst.CSTNode, str, Fix]] = []
        self._used: dict[str, list[str]] = {}

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            if cst.Module([]).code_for_node(alias.name) != _OLD:
                continue
            if alias.asname is None:
                self.report(node, "torch_xla.experimental.pjrt no longer exists (2.9): import torch_xla.runtime as xr and use xr.<name>")
                return
            local = cst.Module([]).code_for_node(alias.asname.name)
            new_alias = alias.with_changes(name=cst.parse_expression(XR))
            self._pending.append((node, local, Fix((self.replace(alias, new_alias),))))
            return

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = cst.Module([]).code_for_node(node.module)
        if module == _OLD:
            names = [cst.Module([]).code_for_node(a.name) for a in node.names]
            missing = [n for n in names if n not in RUNTIME_NAMES]
            if missing:
                self._report_missing(node, missing)
                return
            self.report(node, "torch_xla.experimental.pjrt no longer exists (2.9): import from torch_xla.runtime",
                        Fix((self.replace(node, node.with_changes(module=cst.parse_expression(XR))),)))
        elif module == "torch_xla.experimental":
            for alias in node.names:
                if cst.Module([]).code_for_node(alias.name) != "pjrt":
                    continue
                if len(node.names) > 1:
                    self.report(node, "torch_xla.experimental.pjrt no longer exists (2.9): import torch_xla.runtime instead")
                    return
                local = cst.Module([]).code_for_node(alias.asname.name) if alias.asname else "pjrt"
                new = node.with_changes(
                    module=cst.Name("torch_xla"),
                    names=[alias.with_changes(name=cst.Name("runtime"), asname=cst.AsName(name=cst.Name(local)))],
                )
                self._pending.append((node, local, Fix((self.replace(node, new),))))

    # The module-alias forms are decided at the end of the file, once every `alias.name`
    # the file uses is known.
    def visit_Attribute(self, node: cst.Attribute) -> None:
        if isinstance(node.value, cst.Name):
            used = self._used.setdefault(node.value.value, [])
            if node.attr.value not in used:
                used.append(node.attr.value)

    def leave_Module(self, node: cst.Module) -> None:
        for stmt, local, fix in self._pending:
            missing = [a for a in self._used.get(local, ()) if a not in RUNTIME_NAMES]
            if missing:
                self._report_missing(stmt, missing)
            else:
                self.report(stmt, "torch_xla.experimental.pjrt no longer exists (2.9): it is torch_xla.runtime", fix)

    def _report_missing(self, node: cst.CSTNode, missing: list[str]) -> None:
        self.report(node, "torch_xla.experimental.pjrt no longer exists (2.9); torch_xla.runtime has no "
                          f"{', '.join(missing)} (PJRT is the only runtime; torch_xla.launch starts processes): port these by hand")

