import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._tables import XM, XR, needs_parens, parenthesize


class IsMasterOrdinal(Rule):
    """
    ## What it does
    Rewrites `xm.is_master_ordinal()` to `xr.local_ordinal() == 0` and
    `xm.is_master_ordinal(local=False)` to `xr.global_ordinal() == 0`.

    ## Why
    The process-identity API of torch_xla is `torch_xla.runtime` (`xr.world_size()`,
    `xr.global_ordinal()`, `xr.local_ordinal()`); `xm.get_ordinal` and `xm.xrt_world_size`
    are already gone (2.7). `is_master_ordinal` is not deprecated in 2.9, but its default is
    easy to misread: `local=True`, i.e. the first process of EACH HOST, not the first process
    of the job (torch_xla 2.9 source: `ordinal = get_local_ordinal() if local else
    runtime.global_ordinal(); return ordinal == 0`). Spelling the test out makes clear whether
    a log line or a checkpoint save happens once per host or once per job.

    ## Fix safety
    Safe: the replacement is the function's own body. A `local=` argument that is not a
    literal True/False is reported.
    """

    code = "TX002"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-is-master-ordinal"
    target = "torch-xla"
    summary = "xm.is_master_ordinal(local=...) -> xr.local_ordinal() == 0 / xr.global_ordinal() == 0"
    severity = Severity.INFO
    needs_text = ("is_master_ordinal",)
    examples = [
        Example(
            """
            import torch_xla.core.xla_model as xm

            if xm.is_master_ordinal():
                print("per host")
            if xm.is_master_ordinal(local=False):
                save(model)
            flags = [not xm.is_master_ordinal(), xm.is_master_ordinal() is True]
            """,
            """
            import torch_xla.runtime as xr

            if xr.local_ordinal() == 0:
                print("per host")
            if xr.global_ordinal() == 0:
                save(model)
            flags = [not xr.local_ordinal() == 0, (xr.local_ordinal() == 0) is True]
            """,
        ),
        Example(
            """
            import torch_xla.core.xla_model as xm

            first = xm.is_master_ordinal(local=args.per_host)
            """,
            None,
        ),
    ]
    valid = ["import torch_xla.runtime as xr\nfirst = xr.global_ordinal() == 0\n"]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != f"{XM}.is_master_ordinal":
            return
        local = arg(node, "local", 0)
        if any(a.star for a in node.args) or len(node.args) > 1:
            local_value = None
        elif local is None:
            local_value = True
        elif isinstance(local.value, cst.Name) and local.value.value in ("True", "False"):
            local_value = local.value.value == "True"
        else:
            local_value = None
        if local_value is None:
            self.report(node, "xm.is_master_ordinal(local=...): write xr.local_ordinal() == 0 (first process of each host) "
                              "or xr.global_ordinal() == 0 (first process of the job)")
            return
        xr = self.ctx.module_alias(XR)
        which = "local_ordinal" if local_value else "global_ordinal"
        new = cst.parse_expression(f"{xr}.{which}() == 0")
        if needs_parens(self.ctx):
            new = parenthesize(new)
        scope = "each host (local=True is the default)" if local_value else "the job"
        self.report(node, f"xm.is_master_ordinal() tests for the first process of {scope}: xr.{which}() == 0 says so",
                    Fix((self.replace(node, new),), imports=(XR,)))
