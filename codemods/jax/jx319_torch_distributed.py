from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp

_GONE = ("torch.distributed.init_process_group", "torch.distributed.destroy_process_group")
_CALLS = {
    "torch.distributed.get_rank": "jax.process_index()",
    "torch.distributed.get_world_size": "jax.process_count()",
    "torch.distributed.barrier": 'multihost_utils.sync_global_devices("barrier")',
}
_DDP = ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel")
_SAMPLERS = ("torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler")
# torchrun's variables: the global ones are the JAX process's; the host-local ones keep a
# torchrun launch working and read as the host's only process under `python script.py`
_ENV = {"RANK": "jax.process_index()", "WORLD_SIZE": "jax.process_count()",
        "LOCAL_RANK": 'int(os.environ.get("LOCAL_RANK", 0))', "LOCAL_WORLD_SIZE": 'int(os.environ.get("LOCAL_WORLD_SIZE", 1))'}


class TorchDistributed(Rule):
    """
    ## What it does
    Ports a script written for torchrun's one process per GPU (DistributedDataParallel) to
    JAX's one process per host:

    - `init_process_group(...)` and `destroy_process_group()` go;
    - `model = DDP(model, device_ids=[...])` goes (`self.model = DDP(self.model, ...)` too),
      another target keeps the model itself, and `model.module` reads the model (also
      `nn.DataParallel`'s, once JX303 has unwrapped it, where the file gives nothing an
      attribute `module` of its own);
    - `DistributedSampler(dataset)` shards over the hosts: `num_replicas=jax.process_count(),
      rank=jax.process_index()` (its defaults ask the process group);
    - `dist.get_rank()` -> `jax.process_index()`, `dist.get_world_size()` ->
      `jax.process_count()`, `dist.barrier()` ->
      `jax.experimental.multihost_utils.sync_global_devices("barrier")`;
    - the launcher's variables read as integers with no default: `int(os.environ["RANK"])`
      -> `jax.process_index()`, `WORLD_SIZE` -> `jax.process_count()`, `LOCAL_RANK` ->
      `int(os.environ.get("LOCAL_RANK", 0))` (`LOCAL_WORLD_SIZE`, 1): one JAX process per
      host is the host's only process, and a torchrun launch still gives its own;
    - an `if flag:` left empty goes (`if distributed: dist.destroy_process_group()`; the
      engine's settle, `edits.without_emptied_ifs`).

    ## Why
    A JAX port runs as `python script.py`, one process per host driving all of the host's
    devices; multi-host runs call `jax.distributed.initialize()` first (on a TPU VM pod it
    finds the other hosts itself). Left as it was, the port stops where torchrun's world
    is missing: "ProcessGroupNCCL is only supported with GPUs", `KeyError: 'LOCAL_RANK'`, a
    DistributedSampler with no process group, a DDP wrapper around an NNX module.

    ## Fix safety
    Safe where every use of torch.distributed in the file is one of these (the script then
    trains as torchrun's single process did, and shards its data over hosts as it sharded
    over processes); otherwise unsafe, with the first other use named (an `all_reduce` of a
    metric, `dist.is_initialized()`): removing the process group breaks it. Data
    parallelism over a host's devices is not added: the port trains on one device per host.
    """

    code = "JX319"
    local = False  # whether the fixes are safe depends on every use in the file
    name = "jax-torch-distributed"
    target = "jax"
    summary = "torchrun's DDP set-up -> one JAX process per host (process group and DDP go, ranks from jax)"
    severity = Severity.ERROR
    needs_text = ("distributed", "DistributedDataParallel", "DDP", "RANK", "WORLD_SIZE")
    examples = [
        Example(
            """
            import os
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler

            def main(model, dataset):
                dist.init_process_group(backend="nccl")
                local_rank = int(os.environ["LOCAL_RANK"])
                model = DDP(model, device_ids=[local_rank])
                loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
                if dist.get_rank() == 0:
                    print(f"{dist.get_world_size()} processes")
                train(model, loader)
                dist.barrier()
                if local_rank == 0:
                    torch.save(model.module.state_dict(), "model.pt")
                dist.destroy_process_group()
            """,
            """
            import os
            import torch
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            import jax
            import jax.experimental.multihost_utils

            def main(model, dataset):
                local_rank = int(os.environ.get("LOCAL_RANK", 0))
                loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset, num_replicas=jax.process_count(), rank=jax.process_index()))
                if jax.process_index() == 0:
                    print(f"{jax.process_count()} processes")
                train(model, loader)
                jax.experimental.multihost_utils.sync_global_devices("barrier")
                if local_rank == 0:
                    torch.save(model.state_dict(), "model.pt")
            """,
        ),
        Example(
            """
            import torch.distributed as dist

            def average(t):
                dist.init_process_group("gloo")
                dist.all_reduce(t)
                return t / dist.get_world_size()
            """,
            """
            import torch.distributed as dist
            import jax

            def average(t):
                dist.all_reduce(t)
                return t / jax.process_count()
            """,
            title="another use of the process group (all_reduce): the fixes are unsafe",
            unsafe=True,
        ),
    ]
    valid = ["import torch\nfrom torch.utils.data import DistributedSampler\nDistributedSampler(ds, num_replicas=2, rank=0)\n"]

    def visit_Module(self, node: cst.Module) -> None:
        self._other: Optional[str] = None  # the first use of torch.distributed the rule does not port
        self._wrapped: set[str] = set()  # targets given a DDP(...) of themselves or another model
        if not lp.imports_torch(self.ctx):
            self._active = False
            return
        self._active = True
        own_module = False  # the file's code has an attribute `module` of its own
        for n in astutil.walk(node, into_functions=True):
            if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and self.ctx.qualname(n.value.func) in _DDP:
                self._wrapped.update(astutil.code(t.target) for t in n.targets)
            if isinstance(n, cst.AssignTarget) and isinstance(n.target, cst.Attribute) and n.target.attr.value == "module":
                own_module = True
            if isinstance(n, (cst.Attribute, cst.Name)) and self._other is None:
                qual = self.ctx.qualname(n) or ""
                if qual.startswith("torch.distributed.") and qual not in (*_GONE, *_CALLS):
                    self._other = qual
        if not own_module:  # `model.module` of a model the wrapper is gone from (an earlier pass, JX303's DataParallel)
            self._wrapped |= lp.file_facts(self.ctx).modules

    def _fix(self, *edits, imports=()) -> Fix:
        safety = Safety.SAFE if self._other is None else Safety.UNSAFE
        return Fix(tuple(edits), safety, imports=imports)

    def _why(self, text: str) -> str:
        if self._other is not None:
            text += f"; unsafe: the file also uses {self._other}, which needs the process group"
        return text

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if not self._active or len(node.body) != 1:
            return
        small = node.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) \
                and self.ctx.qualname(small.value.func) in _GONE:
            name = (self.ctx.qualname(small.value.func) or "").rsplit(".", 1)[-1]
            self.report(node, self._why(f"{name}: a JAX port runs one process per host, with no torch process group "
                                        "(jax.distributed.initialize() joins the hosts of a multi-host run)"),
                        self._fix(self.remove_statement(node)))
        elif isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) \
                and self.ctx.qualname(small.value.func) in _DDP and small.value.args:
            inner = small.value.args[0].value
            same = all(astutil.code(t.target) == astutil.code(inner) for t in small.targets)
            fix = self._fix(self.remove_statement(node) if same else self.replace(small.value, inner))
            self.report(node, self._why("DistributedDataParallel: the JAX port's model is the model itself "
                                        "(one process per host; its gradients need no all-reduce)"), fix)

    def visit_Call(self, node: cst.Call) -> None:
        if not self._active:
            return
        qual = self.ctx.qualname(node.func) or ""
        if qual in _CALLS and not node.args:
            new = _CALLS[qual]
            imports: tuple = ("jax",)
            if new.startswith("multihost_utils."):
                imports = ("jax.experimental.multihost_utils",)
                new = self.ctx.module_alias(imports[0]) + new[len("multihost_utils"):]
            self.report(node, self._why(f"{qual.rsplit('.', 1)[-1]}(): {new} (one JAX process per host)"),
                        self._fix(self.replace(node, astutil.parse_expression(new)), imports=imports))
        elif qual in _SAMPLERS and node.args and not any(
                a.keyword is not None and a.keyword.value in ("num_replicas", "rank") for a in node.args) \
                and not any(a.star for a in node.args) and len([a for a in node.args if a.keyword is None]) == 1:
            added = [astutil.kwarg("num_replicas", astutil.parse_expression("jax.process_count()")),
                     astutil.kwarg("rank", astutil.parse_expression("jax.process_index()"))]
            args = list(node.args)
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            self.report(node, self._why("DistributedSampler: shards over the JAX processes (hosts); its defaults ask "
                                        "the torch process group"),
                        self._fix(self.replace(node, node.with_changes(args=[*args, *added])), imports=("jax",)))
        elif isinstance(node.func, cst.Name) and node.func.value == "int":
            variable = _env_variable(node, self.ctx)
            if variable is not None:
                self.report(node, self._why(f"{variable} is set by torchrun; a JAX port runs one process per host: "
                                            f"{_ENV[variable]}"),
                            self._fix(self.replace(node, astutil.parse_expression(_ENV[variable])),
                                      imports=("jax",) if "jax" in _ENV[variable] else ()))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if not self._active or node.attr.value != "module" or astutil.code(node.value) not in self._wrapped:
            return
        if isinstance(self.ctx.parent, cst.AssignTarget):
            return
        self.report(node, self._why(f"{astutil.code(node)}: DDP's wrapped model is the model itself in the port"),
                    self._fix(self.replace(node, node.value)))


def _env_variable(call: cst.Call, ctx) -> Optional[str]:
    """`int(os.environ["RANK"])`, `int(os.environ.get("RANK"))`, `int(os.getenv("RANK"))` (no
    default: under `python script.py` it fails): the launcher variable read, or None."""
    if len(call.args) != 1:
        return None
    value = call.args[0].value
    name = None
    if isinstance(value, cst.Subscript) and ctx.qualname(value.value) == "os.environ" and len(value.slice) == 1 \
            and isinstance(value.slice[0].slice, cst.Index):
        name = astutil.string_value(value.slice[0].slice.value)
    elif isinstance(value, cst.Call) and len(value.args) == 1 and (ctx.qualname(value.func) or "") in ("os.environ.get", "os.getenv"):
        name = astutil.string_value(value.args[0].value)  # no default: a read a plain run would fail
    return name if name in _ENV else None
