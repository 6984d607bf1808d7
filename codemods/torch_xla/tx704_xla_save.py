from __future__ import annotations

import libcst as cst

from porter.astutil import arg, walk
from porter.rules import Example, Fix, Rule, Severity

from ._amp_dist import keyword, with_args

_PER_PROCESS_WORDS = ("rank", "ordinal")


class XlaSave(Rule):
    """
    ## What it does
    Rewrites `torch.save(obj, path)` to `xm.save(obj, path)`. When the destination
    expression mentions a rank or an ordinal (`f"ckpt_{rank}.pt"`), every process writes its
    own file, so the fix passes `master_only=False`. Calls with extra arguments
    (`pickle_protocol=`...) are reported.

    ## Why
    `torch.save` of XLA tensors pickles device tensors (a later `torch.load` needs an XLA
    runtime, and may load them on the wrong device); with several processes every one of
    them writes the same file at once. `xm.save` syncs pending device work, moves the
    tensors to the CPU and writes from the master process only.

    ## Fix safety
    Safe. On one process `xm.save` writes the same objects, with tensors on the CPU (a
    checkpoint the original's `torch.load(..., map_location='cpu')` reads the same). With
    several processes only the master of each host writes; `xm.save` is no collective, so a
    call already under `if rank == 0:` still works. Per-process files (a rank in the path)
    keep one file per process with `master_only=False`.
    """

    code = "TX704"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-save"
    target = "torch-xla"
    summary = "torch.save(obj, path) -> xm.save(obj, path) (CPU tensors, master process writes)"
    severity = Severity.WARNING
    needs_text = ("save",)
    examples = [
        Example(
            """
            import torch

            if epoch % 10 == 0:
                torch.save(model.state_dict(), "model.pt")
            """,
            """
            import torch_xla.core.xla_model as xm

            if epoch % 10 == 0:
                xm.save(model.state_dict(), "model.pt")
            """,
        ),
        Example(
            """
            from torch import save

            save(obj=state, f=f"ckpt_rank{args.rank}.pt")
            """,
            """
            from torch import save
            import torch_xla.core.xla_model as xm

            xm.save(state, f"ckpt_rank{args.rank}.pt", master_only=False)
            """,
            title="a file per process",
        ),
        Example(
            """
            import torch

            torch.save(state, path, pickle_protocol=4)
            """,
            None,
            title="extra arguments are reported",
        ),
    ]
    valid = [
        "import torch_xla.core.xla_model as xm\nxm.save(m.state_dict(), 'm.pt')\n",
        "import numpy as np\nnp.save('a.npy', a)\n",
        "model.save('x')\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in ("torch.save", "torch.serialization.save"):
            return
        obj = arg(node, "obj", 0)
        dest = arg(node, "f", 1)
        if obj is None or dest is None or len(node.args) != 2 or any(a.star for a in node.args):
            self.report(
                node,
                "torch.save on XLA: use xm.save(obj, path) (moves XLA tensors to the CPU, master process "
                "writes); xm.save takes no pickle options",
            )
            return
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        args = [a.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) for a in (obj, dest)]
        per_process = _mentions_rank(dest.value)
        if per_process:
            args.append(keyword("master_only", cst.Name("False")))
        new = node.with_changes(func=cst.parse_expression(f"{xm}.save"), args=with_args(node, args).args)
        self.report(
            node,
            "torch.save on XLA: use xm.save, which moves XLA tensors to the CPU and writes from the master process"
            + (" (master_only=False: the path is per process)" if per_process else ""),
            Fix((self.replace(node, new),), imports=("torch_xla.core.xla_model",)),
        )


def _mentions_rank(expr: cst.CSTNode) -> bool:
    for n in walk(expr, into_functions=True):
        if isinstance(n, cst.Name) and any(w in n.value.lower() for w in _PER_PROCESS_WORDS):
            return True
    return False
