from __future__ import annotations

import libcst as cst

from porter.astutil import arg, function_locals, name_values, rebinds_globals
from porter.rules import Example, Fix, Rule, Safety, Severity

from ._amp_dist import has_star, is_string, keyword, quote_like, source_of, with_args

_INIT = ("torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group")
_BACKEND_MODULE = "torch_xla.distributed.xla_backend"
# init_process_group(backend, init_method, timeout, world_size, rank, store, group_name, pg_options, device_id)
_POSITIONS = ("backend", "init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options", "device_id")
_DROPPED = {"init_method", "world_size", "rank", "pg_options", "device_id"}


class XlaProcessGroup(Rule):
    """
    ## What it does
    Rewrites `dist.init_process_group('nccl' | 'gloo', ...)` (or `backend='nccl'`, or no
    backend) to `dist.init_process_group('xla', init_method='xla://')` and adds
    `import torch_xla.distributed.xla_backend`, which registers the `'xla'` backend.
    `world_size=`, `rank=`, `init_method=`, `device_id=` and `pg_options=` are dropped: the
    `xla://` init method takes rank and world size from the PJRT runtime. `timeout=` and
    `group_name=` are kept. An `'xla'` process group without `init_method='xla://'`, or
    without the backend import in the file, is completed.

    ## Why
    NCCL does not exist on a TPU and gloo cannot reduce XLA tensors; the `'xla'` backend
    runs collectives (DDP's gradient all-reduce) as XLA collectives. The rank and world
    size computed for GPUs (`node_rank * gpus + gpu`, `--world-size`) do not describe the
    TPU processes that `torch_xla.launch` starts.

    ## Fix safety
    Safe for a backend the code names itself (`'nccl'`, `'gloo'`, `'mpi'`, none; a choice
    between such names, `'nccl' if torch.cuda.is_available() else 'gloo'`; a variable that
    only ever holds them, not rebound by `exec`): on a TPU host the only working process group for XLA tensors is
    `'xla'`, and `xla://` gives every process its true rank. Unsafe when the backend comes
    from outside the code (`args.dist_backend`, an environment variable): the user may
    choose between back ends on purpose. A `store=` argument is reported (it cannot
    be combined with an init method).
    """

    code = "TX701"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-process-group"
    target = "torch-xla"
    summary = "init_process_group('nccl') -> init_process_group('xla', init_method='xla://') + xla_backend import"
    severity = Severity.ERROR
    needs_text = ("init_process_group",)
    examples = [
        Example(
            """
            import torch.distributed as dist

            def setup(rank, world_size):
                dist.init_process_group("nccl", rank=rank, world_size=world_size)
            """,
            """
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            def setup(rank, world_size):
                dist.init_process_group("xla", init_method='xla://')
            """,
        ),
        Example(
            """
            import datetime
            import torch

            torch.distributed.init_process_group(
                backend='gloo',
                init_method='env://',
                world_size=args.world_size,
                rank=args.rank,
                timeout=datetime.timedelta(minutes=30),
            )
            """,
            """
            import datetime
            import torch
            import torch_xla.distributed.xla_backend

            torch.distributed.init_process_group(
                backend='xla',
                init_method='xla://',
                timeout=datetime.timedelta(minutes=30),
            )
            """,
            title="keywords; timeout kept",
        ),
        Example(
            """
            import torch.distributed as dist

            dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url)
            """,
            """
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            dist.init_process_group(backend='xla', init_method='xla://')
            """,
            unsafe=True,
            title="backend computed at run time: unsafe",
        ),
        Example(
            """
            import torch
            import torch.distributed as dist

            def setup(rank, world_size):
                backend = "nccl" if torch.cuda.is_available() else "gloo"
                dist.init_process_group(backend, rank=rank, world_size=world_size)
            """,
            """
            import torch
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            def setup(rank, world_size):
                backend = "nccl" if torch.cuda.is_available() else "gloo"
                dist.init_process_group('xla', init_method='xla://')
            """,
            title="a variable that only holds backend names",
        ),
        Example(
            """
            import torch.distributed as dist

            BACKEND = "gloo"

            def setup():
                dist.init_process_group(backend=BACKEND)
            """,
            """
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            BACKEND = "gloo"

            def setup():
                dist.init_process_group(backend='xla', init_method='xla://')
            """,
            title="a module constant",
        ),
        Example(
            """
            from torch.distributed import init_process_group

            backend = 'nccl'
            exec(open('configurator.py').read())  # may set any global: --backend=gloo
            init_process_group(backend=backend)
            """,
            """
            from torch.distributed import init_process_group
            import torch_xla.distributed.xla_backend

            backend = 'nccl'
            exec(open('configurator.py').read())  # may set any global: --backend=gloo
            init_process_group(backend='xla', init_method='xla://')
            """,
            unsafe=True,
            title="a module constant that exec() may rebind: unsafe",
        ),
        Example(
            """
            import os
            import torch.distributed as dist

            backend = os.environ.get("BACKEND", "nccl")
            dist.init_process_group(backend)
            """,
            """
            import os
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            backend = os.environ.get("BACKEND", "nccl")
            dist.init_process_group('xla', init_method='xla://')
            """,
            unsafe=True,
            title="a backend from the environment: unsafe",
        ),
        Example(
            """
            import torch.distributed as dist

            dist.init_process_group('xla')
            """,
            """
            import torch.distributed as dist
            import torch_xla.distributed.xla_backend

            dist.init_process_group('xla', init_method='xla://')
            """,
            title="'xla' backend completed",
        ),
        Example(
            """
            import torch.distributed as dist

            dist.init_process_group("nccl", store=store, rank=r, world_size=n)
            """,
            None,
            title="an explicit store is reported",
        ),
    ]
    valid = [
        "import torch.distributed as dist\nimport torch_xla.distributed.xla_backend\n"
        "dist.init_process_group('xla', init_method='xla://')\n",
        "import torch.distributed as dist\nfrom torch_xla.distributed import xla_backend\n"
        "dist.init_process_group(backend='xla', init_method='xla://')\n",
        "init_process_group('nccl')\n",
    ]

    def _fixed_backend(self, value: cst.BaseExpression) -> bool:
        """A backend the code names itself: a literal, a choice between literals (``'nccl' if
        torch.cuda.is_available() else 'gloo'``: the GPU-or-CPU choice that the TPU's 'xla'
        replaces), or a variable that only ever holds such values."""
        if isinstance(value, cst.IfExp):
            return self._fixed_backend(value.body) and self._fixed_backend(value.orelse)
        if isinstance(value, cst.Name):
            fn = self.ctx.enclosing(cst.FunctionDef)
            local = isinstance(fn, cst.FunctionDef) and value.value in function_locals(fn)
            if not local and rebinds_globals(self.ctx):
                return False  # a configurator may set it (nanoGPT's `--backend=gloo`)
            values = name_values(self.ctx, value.value)
            return values is not None and all(
                not isinstance(v, cst.Name) and self._fixed_backend(v) for v in values)
        return is_string(value)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _INIT:
            return
        if has_star(node):
            self.report(node, "init_process_group on TPU: use init_process_group('xla', init_method='xla://') "
                              "after `import torch_xla.distributed.xla_backend`")
            return
        backend = arg(node, "backend", 0)
        init = arg(node, "init_method", 1)
        store = arg(node, "store", 5)
        imported = _BACKEND_MODULE in self.ctx.module_names
        if backend is not None and is_string(backend.value, "xla") and init is not None and is_string(init.value, "xla://"):
            if not imported:
                self.report(
                    node,
                    "the 'xla' process group needs `import torch_xla.distributed.xla_backend` (it registers the backend)",
                    Fix((), imports=(_BACKEND_MODULE,)),
                )
            return
        if store is not None:
            self.report(
                node,
                "init_process_group with a store: on TPU use init_process_group('xla', init_method='xla://') "
                "(rank and world size come from the runtime) after `import torch_xla.distributed.xla_backend`",
            )
            return
        dynamic = backend is not None and not self._fixed_backend(backend.value)
        args: list[cst.Arg] = []
        positional_index = 0
        for a in node.args:
            name = a.keyword.value if a.keyword is not None else _POSITIONS[positional_index]
            if a.keyword is None:
                positional_index += 1
            if name == "backend":
                args.append(a.with_changes(value=quote_like(a.value, "xla")))
                args.append(keyword("init_method", quote_like(None, "xla://")).with_changes(comma=a.comma))
            elif name in _DROPPED:
                continue
            else:
                args.append(keyword(name, a.value) if a.keyword is None else a)
        if backend is None:
            args.insert(0, cst.Arg(quote_like(None, "xla")))
            args.insert(1, keyword("init_method", quote_like(None, "xla://")))
        new = with_args(node, args)
        was = f"backend {source_of(backend.value)}" if backend is not None else "the default backend"
        message = (
            f"init_process_group with {was}: on TPU use init_process_group('xla', init_method='xla://') "
            "(rank and world size come from the PJRT runtime)"
        )
        if dynamic:
            message += "; the backend is computed at run time, check nothing else relies on it"
        self.report(
            node,
            message,
            Fix((self.replace(node, new),), Safety.UNSAFE if dynamic else Safety.SAFE, imports=(_BACKEND_MODULE,)),
        )
