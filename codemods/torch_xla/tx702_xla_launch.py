from __future__ import annotations

import libcst as cst

from porter.astutil import arg
from porter.rules import Example, Fix, Rule, Severity

from ._amp_dist import has_star, is_literal, is_string, keyword, source_of, with_args

_SPAWN = ("torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn")
# mp.spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method='spawn')
_POSITIONS = ("fn", "args", "nprocs", "join", "daemon", "start_method")


class XlaLaunch(Rule):
    """
    ## What it does
    Rewrites `torch.multiprocessing.spawn(fn, args=(...), nprocs=N, join=True)` to
    `torch_xla.launch(fn, args=(...))`. `nprocs` is dropped (launch starts one process per
    XLA device); `join=True` and `daemon=False` are dropped (launch always joins);
    `start_method=` is kept. `mp.spawn` without `nprocs` (or with `nprocs=1`) starts one
    process, and becomes `torch_xla.launch(fn, args=..., debug_single_process=True)`.
    `join=False` or `daemon=True` are reported: launch has no such modes.

    ## Why
    `mp.spawn` knows nothing of TPU devices; `torch_xla.launch` starts the PJRT processes,
    one per device, each with its runtime set up (rank, world size, device), as the `xla://`
    process group (TX701) expects.

    ## Fix safety
    Safe on one host. Like `mp.spawn`, `torch_xla.launch` calls `fn(index, *args)`: the
    index is the process's global ordinal (`xr.global_ordinal()`), which on a single host
    equals the local index `mp.spawn` passes (0..N-1). On a multi-host TPU pod the index is
    the global rank: code that computes `rank = node_rank * nprocs + index` must use the
    index as the rank directly (or `xr.global_ordinal()`). Under torchrun, launch passes
    `LOCAL_RANK` instead.
    """

    code = "TX702"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-launch"
    target = "torch-xla"
    summary = "mp.spawn(fn, args, nprocs=N) -> torch_xla.launch(fn, args=...)"
    severity = Severity.ERROR
    needs_text = ("spawn",)
    examples = [
        Example(
            """
            import torch
            import torch.multiprocessing as mp

            if __name__ == "__main__":
                world_size = torch.cuda.device_count()
                mp.spawn(main_worker, args=(world_size, args), nprocs=world_size, join=True)
            """,
            """
            import torch
            import torch_xla

            if __name__ == "__main__":
                world_size = torch.cuda.device_count()
                torch_xla.launch(main_worker, args=(world_size, args))
            """,
        ),
        Example(
            """
            from torch.multiprocessing import spawn

            spawn(train, (cfg,), 4, True, False, "forkserver")
            """,
            """
            import torch_xla

            torch_xla.launch(train, args=(cfg,), start_method="forkserver")
            """,
            title="positional arguments",
        ),
        Example(
            """
            import torch.multiprocessing as mp

            mp.spawn(run, args=(cfg,))
            """,
            """
            import torch_xla

            torch_xla.launch(run, args=(cfg,), debug_single_process=True)
            """,
            title="mp.spawn's default nprocs=1 stays one process",
        ),
        Example(
            """
            import torch.multiprocessing as mp

            ctx = mp.spawn(run, nprocs=8, join=False)
            """,
            None,
            title="join=False is reported",
        ),
    ]
    valid = [
        "import torch_xla\ntorch_xla.launch(fn, args=(1,))\n",
        "import multiprocessing as mp\nmp.Process(target=f)\n",
        "import subprocess\nspawn(fn)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _SPAWN:
            return
        if has_star(node):
            self.report(node, "mp.spawn on TPU: use torch_xla.launch(fn, args=(...))")
            return
        given: dict[str, cst.Arg] = {}
        for i, a in enumerate(node.args):
            name = a.keyword.value if a.keyword is not None else (_POSITIONS[i] if i < len(_POSITIONS) else "?")
            given[name] = a
        join, daemon = given.get("join"), given.get("daemon")
        if (join is not None and not is_literal(join.value, True)) or (daemon is not None and not is_literal(daemon.value, False)):
            bad = join if join is not None and not is_literal(join.value, True) else daemon
            self.report(
                node,
                f"mp.spawn with `{source_of(bad)}`: torch_xla.launch always joins its processes; "
                "restructure to call torch_xla.launch(fn, args=(...)) and wait for it",
            )
            return
        if "fn" not in given or "?" in given:
            return
        nprocs = given.get("nprocs")
        single = nprocs is None or is_literal(nprocs.value, 1)
        args = [cst.Arg(given["fn"].value)]
        if "args" in given:
            args.append(keyword("args", given["args"].value))
        start = given.get("start_method")
        if start is not None and not is_string(start.value, "spawn"):
            args.append(keyword("start_method", start.value))
        if single:
            args.append(keyword("debug_single_process", cst.Name("True")))
        launch = cst.parse_expression(f"{self.ctx.module_alias('torch_xla')}.launch")
        new = with_args(node.with_changes(func=launch), args)
        detail = (
            "mp.spawn starts one process here; debug_single_process=True keeps that (drop it to use every device)"
            if single else "nprocs is dropped: launch starts one process per XLA device"
        )
        self.report(
            node,
            f"mp.spawn on TPU: use torch_xla.launch(fn, args=(...)), which passes the process index first like mp.spawn; {detail}",
            Fix((self.replace(node, new),), imports=("torch_xla",)),
        )
