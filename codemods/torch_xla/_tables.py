"""Data and helpers shared by the device-placement (TX1xx), CUDA-only-call (TX8xx) and
deprecated-torch_xla-API (TX0xx) rules.

The API maps are data: one visitor per rule serves a table of qualified names. Every entry
records what torch_xla 2.9.0 really does (measured in the project's venv with
``PJRT_DEVICE=CPU``; see the rule docs for the facts each entry rests on).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import libcst as cst

from porter.astutil import string_value, walk
from porter.context import FileContext
from porter.device_options import default_truth
from porter.device_options import is_cuda_string  # noqa: F401 (for the TX rules)
from porter.rules import Edit, Severity

XM = "torch_xla.core.xla_model"
XR = "torch_xla.runtime"
PL = "torch_xla.distributed.parallel_loader"
TORCH_XLA = "torch_xla"


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replacement:
    """``old`` qualified name -> ``attr`` of ``module`` (None: report only)."""

    module: Optional[str]
    attr: Optional[str]
    message: str
    severity: Severity = Severity.WARNING
    keep_args: bool = True  # False: the fix only applies to a call without arguments


# TX001: torch_xla names that are gone or deprecated in 2.9.0 (checked with hasattr and
# warnings in the venv; removal versions from pytorch/xla#8915 and the 2.7 release notes).
DEPRECATED_XLA = {
    f"{XM}.xrt_world_size": Replacement(
        XR, "world_size", "xm.xrt_world_size() was removed in torch_xla 2.7 (AttributeError in 2.9): use xr.world_size()",
        Severity.ERROR, keep_args=False),
    f"{XM}.world_size": Replacement(
        XR, "world_size", "xm.world_size() was removed in torch_xla 2.7: use xr.world_size()",
        Severity.ERROR, keep_args=False),
    f"{XM}.get_ordinal": Replacement(
        XR, "global_ordinal", "xm.get_ordinal() was removed in torch_xla 2.7 (AttributeError in 2.9): use xr.global_ordinal()",
        Severity.ERROR, keep_args=False),
    f"{XM}.get_local_ordinal": Replacement(
        XR, "local_ordinal", "xm.get_local_ordinal() is superseded by xr.local_ordinal() (pytorch/xla#7656; it only calls it)",
        Severity.INFO, keep_args=False),
    f"{XM}.mark_step": Replacement(
        TORCH_XLA, "sync", "xm.mark_step() is deprecated (DeprecationWarning in 2.9): use torch_xla.sync()"),
    "torch_xla.experimental.compile": Replacement(
        TORCH_XLA, "compile", "torch_xla.experimental.compile was removed: use torch_xla.compile", Severity.ERROR),
    f"{XM}.parse_xla_device": Replacement(
        None, None, "xm.parse_xla_device was removed in torch_xla 2.7; use torch.device(d).type / .index",
        Severity.ERROR),
    f"{XR}.using_pjrt": Replacement(
        None, None, "xr.using_pjrt() no longer exists in torch_xla 2.9: PJRT is the only runtime (XRT was removed in 2.2); "
        "drop the check and keep the PJRT branch", Severity.ERROR),
    f"{XM}.get_xla_supported_devices": Replacement(
        None, None, "xm.get_xla_supported_devices() is planned for deprecation (pytorch/xla#7653): torch_xla.devices() "
        "returns the same devices as torch.device objects (not strings)", Severity.INFO),
    f"{XM}.xla_real_devices": Replacement(
        None, None, "xm.xla_real_devices() is planned for deprecation (pytorch/xla#7657): use torch_xla.real_devices()",
        Severity.INFO),
    f"{XM}.xla_device_hw": Replacement(
        None, None, "xm.xla_device_hw() is planned for deprecation (pytorch/xla#7658): xr.device_type() gives the "
        "PJRT device type ('TPU', 'CPU', ...) of this process", Severity.INFO),
}
# xm.xla_device(n, devkind) is handled apart (its arguments change), see tx001.
XLA_DEVICE = f"{XM}.xla_device"

# torch.accelerator (torch 2.6+), torch's device-generic API. On a CUDA build of torch it is
# CUDA whether or not a GPU is there (measured, torch 2.9.0+cu128 with torch_xla imported:
# current_accelerator() is device(type='cuda'), is_available() False), so each of its calls
# ports as its torch.cuda counterpart does. current_accelerator() itself is TX101's.
ACCELERATOR_AS_CUDA = {
    "torch.accelerator.is_available": "torch.cuda.is_available",
    "torch.accelerator.device_count": "torch.cuda.device_count",
    "torch.accelerator.current_device_index": "torch.cuda.current_device",
    "torch.accelerator.current_device_idx": "torch.cuda.current_device",
    "torch.accelerator.set_device_index": "torch.cuda.set_device",
    "torch.accelerator.set_device_idx": "torch.cuda.set_device",
    "torch.accelerator.synchronize": "torch.cuda.synchronize",
    "torch.accelerator.empty_cache": "torch.cuda.empty_cache",
    "torch.accelerator.reset_peak_memory_stats": "torch.cuda.reset_peak_memory_stats",
    "torch.accelerator.reset_accumulated_memory_stats": "torch.cuda.reset_accumulated_memory_stats",
    "torch.accelerator.memory_allocated": "torch.cuda.memory_allocated",
    "torch.accelerator.max_memory_allocated": "torch.cuda.max_memory_allocated",
    "torch.accelerator.memory_reserved": "torch.cuda.memory_reserved",
    "torch.accelerator.max_memory_reserved": "torch.cuda.max_memory_reserved",
    "torch.accelerator.memory_stats": "torch.cuda.memory_stats",
}
CURRENT_ACCELERATOR = "torch.accelerator.current_accelerator"


def cuda_qualname(node: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """``ctx.qualname(node)``, a torch.accelerator call read as its torch.cuda counterpart."""
    name = ctx.qualname(node)
    return ACCELERATOR_AS_CUDA.get(name, name) if name else name


def as_spelled(message: str, node: cst.CSTNode, ctx: FileContext) -> str:
    """A torch.cuda call's message, for the torch.accelerator call ``node`` stands for."""
    name = ctx.qualname(node) or ""
    cuda = ACCELERATOR_AS_CUDA.get(name)
    return message.replace(cuda, name) if cuda else message

# TX004: environment variables torch_xla no longer honours, or will stop honouring.
DEPRECATED_ENV = {
    "XLA_USE_BF16": "XLA_USE_BF16 is deprecated (torch_xla 2.9 logs 'will be deprecated after the 2.6 release, please "
    "convert your model to bf16 directly'): use torch.autocast('xla', dtype=torch.bfloat16) or model.to(torch.bfloat16)",
    "XLA_DOWNCAST_BF16": "XLA_DOWNCAST_BF16 is deprecated like XLA_USE_BF16: use torch.autocast('xla', "
    "dtype=torch.bfloat16) or convert the model with model.to(torch.bfloat16)",
    "XLA_USE_FP16": "XLA_USE_FP16 was removed in torch_xla 2.7 (2.9 only warns that it is deprecated): "
    "use torch.autocast('xla', dtype=torch.bfloat16); TPUs compute in bfloat16, not float16",
    "XLA_DOWNCAST_FP16": "XLA_DOWNCAST_FP16 was removed in torch_xla 2.7: use torch.autocast('xla', dtype=torch.bfloat16)",
    "XLA_USE_SPMD": "XLA_USE_SPMD is being deprecated (torch_xla 2.9 warns): call xr.use_spmd() at the start of the "
    "program instead of setting the variable",
    "XRT_TPU_CONFIG": "XRT_TPU_CONFIG configured the XRT runtime, removed in torch_xla 2.2: set PJRT_DEVICE=TPU",
    "XRT_WORKERS": "XRT_WORKERS configured the XRT runtime, removed in torch_xla 2.2: PJRT needs no worker list",
    "XRT_DEVICE_MAP": "XRT_DEVICE_MAP configured the XRT runtime, removed in torch_xla 2.2: PJRT needs no device map",
    "GPU_NUM_DEVICES": "GPU_NUM_DEVICES configured XLA:CUDA, removed from torch_xla 2.9: target TPU (PJRT_DEVICE=TPU) or CPU",
}

# TX104: torch.cuda device management.
CUDA_DEVICE_API = {
    "torch.cuda.device_count": Replacement(
        TORCH_XLA, "device_count",
        "torch.cuda.device_count() -> torch_xla.device_count() (XLA devices this process can address). Unsafe: it "
        "initializes the XLA runtime, so called in a parent process before torch_xla.launch it breaks the launch; "
        "to size a launch, let torch_xla.launch use every device instead", keep_args=False),
    "torch.cuda.current_device": Replacement(
        None, None,
        "torch.cuda.current_device() has no single XLA equivalent: torch_xla.device().index is the index of this "
        "process's XLA device, xr.local_ordinal() its ordinal on the host, xr.global_ordinal() its rank; "
        "an XLA process needs neither for placement (use torch_xla.device())", Severity.ERROR),
}
SET_DEVICE = "torch.cuda.set_device"

# TX803: calls that only manage the CUDA caching allocator / IPC: no effect to keep on XLA.
CUDA_NOOP_CALLS = (
    "torch.cuda.empty_cache",
    "torch.cuda.reset_peak_memory_stats",
    "torch.cuda.reset_max_memory_allocated",
    "torch.cuda.reset_max_memory_cached",
    "torch.cuda.reset_accumulated_memory_stats",
    "torch.cuda.ipc_collect",
)

# TX802: backend switches that only configure cuDNN / CUDA matmuls.
CUDA_BACKEND_FLAGS = (
    "torch.backends.cudnn.benchmark",
    "torch.backends.cudnn.deterministic",
    "torch.backends.cudnn.enabled",
    "torch.backends.cudnn.allow_tf32",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
)

# TX804
CUDA_SEEDS = ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all")

# TX805: CUDA memory and device queries.
_MEM = ("xm.get_memory_info(device) returns {'bytes_used', 'bytes_limit', 'peak_bytes_used'} on TPU "
        "(it raises UNIMPLEMENTED on the CPU PJRT backend)")
CUDA_QUERIES = {
    "torch.cuda.get_device_name": Replacement(
        XM, "xla_device_kind", "torch.cuda.get_device_name() -> xm.xla_device_kind() (the device kind string, "
        "e.g. 'TPU v4'; 'cpu' on the CPU backend)", keep_args=False),
    "torch.cuda.is_bf16_supported": Replacement(
        XR, "is_bf16_supported", "torch.cuda.is_bf16_supported() is False without CUDA: on XLA ask the XLA device "
        "(torch_xla.runtime.is_bf16_supported(); TPUs compute in bfloat16)", keep_args=False),
    "torch.cuda.memory_allocated": Replacement(None, None, f"torch.cuda.memory_allocated() is CUDA-only: {_MEM}; use 'bytes_used'"),
    "torch.cuda.max_memory_allocated": Replacement(None, None, f"torch.cuda.max_memory_allocated() is CUDA-only: {_MEM}; use 'peak_bytes_used'"),
    "torch.cuda.memory_reserved": Replacement(None, None, f"torch.cuda.memory_reserved() is CUDA-only (no caching allocator on XLA): {_MEM}"),
    "torch.cuda.max_memory_reserved": Replacement(None, None, f"torch.cuda.max_memory_reserved() is CUDA-only: {_MEM}"),
    "torch.cuda.memory_cached": Replacement(None, None, f"torch.cuda.memory_cached() is CUDA-only: {_MEM}"),
    "torch.cuda.max_memory_cached": Replacement(None, None, f"torch.cuda.max_memory_cached() is CUDA-only: {_MEM}"),
    "torch.cuda.memory_stats": Replacement(None, None, f"torch.cuda.memory_stats() is CUDA-only: {_MEM}"),
    "torch.cuda.memory_summary": Replacement(None, None, f"torch.cuda.memory_summary() is CUDA-only: {_MEM}"),
    "torch.cuda.mem_get_info": Replacement(None, None, f"torch.cuda.mem_get_info() is CUDA-only: {_MEM}; free = bytes_limit - bytes_used"),
    "torch.cuda.get_device_properties": Replacement(None, None, "torch.cuda.get_device_properties() is CUDA-only: xm.xla_device_kind() names the device, "
                                                    f"{_MEM} ('bytes_limit' ~ total_memory)"),
    "torch.cuda.get_device_capability": Replacement(None, None, "torch.cuda.get_device_capability() is CUDA-only (compute capability); "
                                                    "XLA code should not branch on it: xm.xla_device_kind() names the device"),
    "torch.cuda.utilization": Replacement(None, None, "torch.cuda.utilization() is CUDA-only; use the TPU profiler (torch_xla.debug.profiler)"),
}
# CUDA's own runtime objects: streams, events, graphs, NVTX ranges and the device context have no
# XLA counterpart (XLA orders and fuses the work itself; one device per process); each raises
# "Found no NVIDIA driver" without CUDA
_TIMING = ("time the step on the host instead: xm.wait_device_ops() (or torch_xla.sync(wait=True)) then "
           "time.perf_counter(); the TPU profiler (torch_xla.debug.profiler) shows the device's own times")
for _name, _message in {
    "torch.cuda.Event": f"torch.cuda.Event() is CUDA-only (a CUDA event for timing or ordering): {_TIMING}",
    "torch.cuda.Stream": "torch.cuda.Stream() is CUDA-only: XLA has no user streams (it schedules the compiled graph "
                         "itself); run the work in order, and overlap host-to-device copies with "
                         "torch_xla.distributed.parallel_loader.MpDeviceLoader",
    "torch.cuda.stream": "torch.cuda.stream(...) is CUDA-only (no user streams on XLA): run the block as it is",
    "torch.cuda.current_stream": "torch.cuda.current_stream() is CUDA-only (no user streams on XLA): "
                                 "xm.wait_device_ops() waits for the device's work",
    "torch.cuda.default_stream": "torch.cuda.default_stream() is CUDA-only (no user streams on XLA): "
                                 "xm.wait_device_ops() waits for the device's work",
    "torch.cuda.CUDAGraph": "torch.cuda.CUDAGraph() is CUDA-only: XLA compiles the step into one graph already",
    "torch.cuda.graph": "torch.cuda.graph(...) is CUDA-only: XLA compiles the step into one graph already",
    "torch.cuda.nvtx.range_push": "torch.cuda.nvtx ranges are CUDA-only: torch_xla.debug.profiler.Trace(name) marks "
                                  "a region in the TPU profile",
    "torch.cuda.nvtx.range_pop": "torch.cuda.nvtx ranges are CUDA-only: torch_xla.debug.profiler.Trace(name) marks a "
                                 "region in the TPU profile",
    "torch.cuda.nvtx.range": "torch.cuda.nvtx.range is CUDA-only: torch_xla.debug.profiler.Trace(name) marks a region "
                             "in the TPU profile",
    "torch.cuda.nvtx.mark": "torch.cuda.nvtx.mark is CUDA-only: torch_xla.debug.profiler.Trace(name) marks a region "
                            "in the TPU profile",
    "torch.cuda.device": "torch.cuda.device(...) (a CUDA device context) is CUDA-only: an XLA process has one device, "
                         "torch_xla.device(); run the block as it is",
    "torch.cuda.device_of": "torch.cuda.device_of(...) is CUDA-only: an XLA process has one device, "
                            "torch_xla.device(); run the block as it is",
}.items():
    CUDA_QUERIES[_name] = Replacement(None, None, _message, Severity.ERROR)
CUDA_RUNTIME_OBJECTS = frozenset(n for n in CUDA_QUERIES if n.startswith(("torch.cuda.Event", "torch.cuda.Stream",
                                                                           "torch.cuda.stream", "torch.cuda.current_",
                                                                           "torch.cuda.default_", "torch.cuda.CUDAGraph",
                                                                           "torch.cuda.graph", "torch.cuda.nvtx",
                                                                           "torch.cuda.device")))


# --------------------------------------------------------------------------------------
# Strings naming devices
# --------------------------------------------------------------------------------------
def is_string(node: cst.CSTNode, *values: str) -> bool:
    value = string_value(node)
    return value is not None and (not values or value in values)


def is_cpu_string(node: cst.CSTNode) -> bool:
    return is_string(node, "cpu")


def string_node(value: str, like: Optional[cst.CSTNode] = None) -> cst.SimpleString:
    quote = like.quote if isinstance(like, cst.SimpleString) and like.quote in ('"', "'") else '"'
    return cst.SimpleString(f"{quote}{value}{quote}")


# --------------------------------------------------------------------------------------
# `cuda if <cond> else cpu` device selection
# --------------------------------------------------------------------------------------
AVAILABILITY = ("torch.cuda.is_available", "torch.cuda.device_count")


def only_availability(test: cst.BaseExpression, ctx: FileContext) -> bool:
    """The condition asks only whether CUDA is there (no user flag): made of
    torch.cuda.is_available() / torch.cuda.device_count() calls, constants, not/and/or/compare."""
    found = False
    for n in walk(test, into_functions=True):
        if isinstance(n, cst.Call):
            if cuda_qualname(n.func, ctx) not in AVAILABILITY or n.args:
                return False
            found = True
        elif isinstance(n, cst.Name):
            # Names are only allowed as parts of the torch.cuda.* chains.
            if not _inside_availability_chain(n, test, ctx):
                return False
        elif isinstance(n, (cst.Subscript, cst.Await, cst.Lambda, cst.IfExp)):
            return False
    return found


def _inside_availability_chain(name: cst.Name, test: cst.BaseExpression, ctx: FileContext) -> bool:
    for n in walk(test, into_functions=True):
        if isinstance(n, cst.Call) and cuda_qualname(n.func, ctx) in AVAILABILITY:
            if any(m is name for m in walk(n.func, into_functions=True)):
                return True
    return False


@dataclass(frozen=True)
class DeviceChoice:
    """``'cuda' if test else 'cpu'`` (or the mirror ``'cpu' if test else 'cuda'``)."""

    node: cst.IfExp
    cuda_first: bool
    availability_only: bool


def device_choice(node: cst.CSTNode, ctx: FileContext) -> Optional[DeviceChoice]:
    if not isinstance(node, cst.IfExp):
        return None
    if is_cuda_string(node.body) and is_cpu_string(node.orelse):
        cuda_first = True
    elif is_cpu_string(node.body) and is_cuda_string(node.orelse):
        cuda_first = False
    else:
        return None
    return DeviceChoice(node, cuda_first, only_availability(node.test, ctx))


def xla_device_expr(ctx: FileContext) -> cst.BaseExpression:
    return cst.parse_expression(f"{ctx.module_alias(TORCH_XLA)}.device()")


def choice_replacement(choice: DeviceChoice, ctx: FileContext, cpu: cst.BaseExpression,
                       folded: object = None, xla: Optional[cst.BaseExpression] = None) -> cst.BaseExpression:
    """torch_xla.device() (or ``xla``) for an availability test; else keep the user's choice,
    with ``cpu``. ``folded``: the test with the port's availability answers put in
    (True/False, the remaining user's choice, or None when it holds no availability test)."""
    xla = xla if xla is not None else xla_device_expr(ctx)
    if choice.availability_only:
        return xla
    if isinstance(folded, bool):
        return xla if folded is choice.cuda_first else cpu
    test = folded if isinstance(folded, cst.BaseExpression) else choice.node.test
    if defaults_choose_cpu(choice, ctx, folded):
        return xla
    if choice.cuda_first:
        return choice.node.with_changes(test=test, body=xla, orelse=cpu, lpar=(), rpar=())
    return choice.node.with_changes(test=test, body=cpu, orelse=xla, lpar=(), rpar=())


def defaults_choose_cpu(choice: DeviceChoice, ctx: FileContext, folded: object = None) -> bool:
    """The choice is an opt-in accelerator flag: with the script's default flags (`store_true`
    options False, `store_false` ones True; its test reads nothing else) it takes the CPU arm
    (`'cuda' if args.cuda else 'cpu'`). On a TPU host the port trains on XLA by default, as the
    GPU user who passes `--cuda` did: both arms are the XLA device. (A force-CPU flag, `'cpu'
    if args.no_cuda else 'cuda'`, defaults to the accelerator and stays the user's choice.)"""
    if choice.availability_only or isinstance(folded, bool):
        return False
    test = folded if isinstance(folded, cst.BaseExpression) else choice.node.test
    truth = default_truth(test, ctx)
    return truth is not None and truth is not choice.cuda_first


def in_availability_choice(ctx: FileContext) -> bool:
    """The current node sits in the test of a ``'cuda' if <test> else 'cpu'`` that TX101 (or,
    as a ``map_location``, TX105) replaces as a whole, availability tests folded in."""
    anc = ctx.ancestors
    for i in range(len(anc) - 2, -1, -1):
        node = anc[i]
        if isinstance(node, cst.IfExp) and anc[i + 1] is node.test:
            return device_choice(node, ctx) is not None
    return False


# --------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------
def tidy_args(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """Arguments with ', ' between them and no trailing comma."""
    out = []
    for i, a in enumerate(args):
        if i < len(args) - 1:
            out.append(a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            out.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return out


def needs_parens(ctx: FileContext, index: int = -2) -> bool:
    """Whether an expression replacing the current node binds less tightly than its parent needs."""
    parent = ctx.ancestors[index] if len(ctx.ancestors) >= -index else None
    if isinstance(parent, cst.UnaryOperation):
        return not isinstance(parent.operator, cst.Not)
    return isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation, cst.Attribute, cst.Subscript, cst.Await))


def parenthesize(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


# --------------------------------------------------------------------------------------
# Removing statements without leaving an empty block
# --------------------------------------------------------------------------------------
_PURE_CALLS = ("builtins.int", "builtins.str", "builtins.float", "builtins.bool", "os.environ.get", "os.getenv")


def side_effect_free(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """No call in ``expr`` other than int()/str()/os.environ.get()... (dropping it loses nothing)."""
    for n in walk(expr, into_functions=True):
        if isinstance(n, cst.Call) and ctx.qualname(n.func) not in _PURE_CALLS:
            return False
        if isinstance(n, (cst.Yield, cst.Await, cst.NamedExpr)):
            return False
    return True


def removable_small(small: cst.CSTNode, ctx: FileContext) -> bool:
    """A small statement one of the TX1xx/TX8xx rules deletes (the shared predicate keeps the
    'last statement of a block becomes pass' decision consistent across rules)."""
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        call = small.value
        name = cuda_qualname(call.func, ctx)
        if name in CUDA_NOOP_CALLS or name == SET_DEVICE:
            return all(side_effect_free(a.value, ctx) for a in call.args)
        return False
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return ctx.qualname(small.targets[0].target) in CUDA_BACKEND_FLAGS and side_effect_free(small.value, ctx)
    return False


def _removable_line(stmt: cst.CSTNode, ctx: FileContext) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(removable_small(s, ctx) for s in stmt.body)


def _pass_line(line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    return line.with_changes(body=[cst.Pass()], trailing_whitespace=cst.TrailingWhitespace())


def removal_edits(ctx: FileContext, small: cst.CSTNode) -> Optional[tuple[Edit, ...]]:
    """The edits deleting ``small`` (on the ancestor stack): a block it would leave empty gets
    ``pass``; blank lines above a removed line move to the next statement, so the layout
    stays. None when ``small`` is not a removable statement."""
    edit = removal_edit(ctx, small)
    if edit is None:
        return None
    if edit.target is small and isinstance(edit.replacement, cst.RemovalSentinel):
        # `x = 1; torch.cuda.empty_cache()`: drop the small statement, then the `;` it leaves.
        holder = next((a for a in reversed(ctx.ancestors) if isinstance(a, (cst.SimpleStatementLine, cst.SimpleStatementSuite))), None)
        return (edit, Edit(holder, _strip_trailing_semicolon)) if holder is not None else (edit,)
    line = edit.target
    if not (isinstance(line, cst.SimpleStatementLine) and isinstance(edit.replacement, cst.RemovalSentinel)):
        return (edit,)
    blank = [e for e in line.leading_lines if e.comment is None]
    anc = ctx.ancestors
    idx = next((i for i in range(len(anc) - 1, -1, -1) if anc[i] is line), None)
    siblings = list(getattr(anc[idx - 1], "body", ())) if idx else []
    pos = next((i for i, s in enumerate(siblings) if s is line), None)
    if not blank or pos is None or (pos > 0 and _removable_line(siblings[pos - 1], ctx)):
        return (edit,)  # in a run of removed lines only the first one's blank lines move
    nxt = next((s for s in siblings[pos + 1:] if not _removable_line(s, ctx)), None)
    if nxt is None:
        return (edit,)

    def carry(updated: cst.CSTNode) -> cst.CSTNode:
        if not hasattr(updated, "leading_lines"):
            return updated
        return updated.with_changes(leading_lines=[*blank, *updated.leading_lines])  # type: ignore[attr-defined]

    return (edit, Edit(nxt, carry))


def _strip_trailing_semicolon(updated: cst.CSTNode) -> cst.CSTNode:
    body = list(getattr(updated, "body", ()))
    if not body or not hasattr(body[-1], "semicolon"):
        return updated
    return updated.with_changes(body=[*body[:-1], body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])


def removal_edit(ctx: FileContext, small: cst.CSTNode) -> Optional[Edit]:
    """The edit deleting ``small`` (on the ancestor stack); a block it would leave empty gets
    ``pass``. None when ``small`` is not a removable statement."""
    if not removable_small(small, ctx):
        return None
    anc = ctx.ancestors
    idx = next((i for i in range(len(anc) - 1, -1, -1) if anc[i] is small), None)
    if idx is None or idx < 2:
        return None
    line = anc[idx - 1]
    if isinstance(line, cst.SimpleStatementSuite):  # `if x: torch.cuda.empty_cache()`
        if all(removable_small(s, ctx) for s in line.body) and small is line.body[0]:
            return _emptied_if_edit(anc, idx - 1, ctx) or Edit(small, cst.Pass())
        return Edit(small, cst.RemoveFromParent())
    if not isinstance(line, cst.SimpleStatementLine):
        return None
    if not all(removable_small(s, ctx) for s in line.body):
        return Edit(small, cst.RemoveFromParent())  # `x = 1; torch.cuda.empty_cache()`
    block = anc[idx - 2]
    siblings = getattr(block, "body", ())
    if not isinstance(block, cst.Module) and all(_removable_line(s, ctx) for s in siblings) and siblings and siblings[0] is line:
        return _emptied_if_edit(anc, idx - 2, ctx) or Edit(line, _pass_line(line))
    return Edit(line, cst.RemoveFromParent())


def emptied_if(anc: Sequence[cst.CSTNode], block: int, ctx: FileContext) -> Optional[tuple[cst.If, bool]]:
    """The outermost plain `if flag:` (no else, a test without side effects) that removing the
    only statement of ``anc[block]`` leaves empty, and whether it is the only statement of its
    own block (then it becomes `pass`); None when there is none."""
    found = None
    while block >= 2:
        owner, holder = anc[block - 1], anc[block - 2]
        if not (isinstance(owner, cst.If) and owner.body is anc[block] and owner.orelse is None):
            break
        if isinstance(holder, cst.If) or not side_effect_free(owner.test, ctx):
            break  # an `elif`, or a test that must still run
        found = (owner, isinstance(holder, cst.IndentedBlock) and len(holder.body) == 1)
        if not found[1]:
            break
        block -= 2
    return found


def _emptied_if_edit(anc: Sequence[cst.CSTNode], block: int, ctx: FileContext) -> Optional[Edit]:
    """The edit removing the `if flag:` a removal empties (see :func:`emptied_if`), if any."""
    found = emptied_if(anc, block, ctx)
    if found is None:
        return None
    stmt, alone = found
    if alone:
        return Edit(stmt, cst.SimpleStatementLine([cst.Pass()], leading_lines=stmt.leading_lines))
    return Edit(stmt, cst.RemoveFromParent())


def imports_torch(ctx: FileContext) -> bool:
    return any(full == "torch" or full.startswith("torch.") for full in ctx.aliases.values())
