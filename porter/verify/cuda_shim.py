"""Run a script written for a CUDA GPU on the CPU, taking the branches it takes on a GPU.

This is for running the ORIGINAL side of a port (the user's GPU script) on a machine
without a GPU, so that its per-step losses can be compared with the ported torch_xla
program. It is not a mock of torch: every tensor really lives on, and is computed by,
the CPU. What the shim changes:

* ``torch.cuda`` queries answer as for one present device: ``is_available()`` is True,
  ``device_count()`` is 1, ``current_device()`` is 0, ``get_device_name()`` names the
  shim, ``get_device_capability()`` is (8, 0), ``is_bf16_supported()`` is True.
  ``set_device``/``synchronize``/``empty_cache``/``ipc_collect`` do nothing; the memory
  counters (``memory_allocated`` ...) are 0 because nothing lives on a CUDA device.
  ``torch.accelerator`` answers the same way (one 'cuda' accelerator).
* ``torch.cuda.manual_seed``/``manual_seed_all``/``seed``/``seed_all`` and
  ``set_rng_state(_all)`` do nothing; ``get_rng_state(_all)`` returns the CPU generator's
  state. Random numbers for tensors "on cuda" come from the CPU default generator, which
  the script seeds with ``torch.manual_seed`` as usual. (A GPU's Philox stream cannot be
  reproduced on the CPU anyway.)
* Placement on 'cuda' lands on the CPU: ``.cuda()``, ``.to('cuda')``, ``.to(0)``,
  ``.to(torch.device('cuda:0'))``, ``device='cuda'``/``device=0`` in any torch function
  (factories such as ``torch.randn/zeros/arange/tensor``, ``new_*``, ``*_like``),
  ``nn.Module.cuda()/.to('cuda')``, ``torch.load(map_location=...)`` (any map_location,
  also none, so GPU-saved checkpoints load), ``UntypedStorage.cuda()``,
  ``torch.set_default_device('cuda')``. ``non_blocking`` is accepted (and is a no-op on
  the CPU); ``Tensor.pin_memory()`` returns the tensor, ``is_pinned()`` is False,
  ``pin_memory=True`` in factories is dropped, ``record_stream`` is a no-op.
  Like ``.to('cpu')``, ``.cuda()`` returns the tensor itself, not a copy.
  Tensors still report ``device.type == 'cpu'`` and ``is_cuda`` False.
* ``torch.cuda.Event(enable_timing=True)`` measures host wall time; ``torch.cuda.Stream``,
  ``torch.cuda.stream(s)``, ``current_stream()``, ``torch.cuda.device(i)`` are inert.
* ``torch.backends.cudnn`` / ``torch.backends.cuda.matmul`` flags stay settable (they are
  plain torch flags and do not need a GPU).
* Autocast: ``torch.autocast('cuda', ...)`` / ``torch.cuda.amp.autocast(...)`` are entered
  normally (so ``torch.is_autocast_enabled()`` answers as on a GPU), but CUDA autocast
  only re-types ops on CUDA tensors, and there are none: the region runs in float32. With
  ``enabled=True`` a note is recorded (see ``notes()``); with ``enabled=False`` nothing
  changes at all.
* ``torch.amp.GradScaler('cuda')`` / ``torch.cuda.amp.GradScaler()`` with ``enabled=True``
  is built as a DISABLED scaler (and a note is recorded): ``scale(loss)`` returns the loss
  unchanged, ``step(opt)`` calls ``opt.step()``, ``update()`` does nothing. The run is in
  float32, so loss scaling is not needed; scaling by a power of two and unscaling is exact
  in float32 except for overflow-skipped steps, and keeping the loss unscaled lets the
  trace record the real loss. With ``enabled=False`` it is untouched.
* ``torch.distributed.init_process_group('nccl')`` uses 'gloo' (also for
  'cpu:gloo,cuda:nccl'); a CUDA ``device_id=`` is dropped. ``DistributedDataParallel``
  drops CUDA ``device_ids``/``output_device`` (a CPU module must not name devices).
  ``nn.DataParallel`` over CUDA devices (``device_ids`` None, or all CUDA) is built as
  DataParallel builds itself where no accelerator is present: the single-device module it
  is on one CPU (``forward`` calls the module; ``.module`` is the module).
* ``torch_xla`` cannot be imported while the shim is installed (``sys.modules['torch_xla']
  = None``: ``import torch_xla`` raises ModuleNotFoundError and
  ``importlib.util.find_spec('torch_xla')`` is None, so libraries that probe for it take
  their non-XLA path). The shim is for the original; the ported side never gets it.

``install()`` applies all of this to the current process; ``uninstall()`` restores it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["install", "uninstall", "installed", "is_installed", "notes", "DEVICE_NAME"]

DEVICE_NAME = "porter CUDA shim (CPU)"

_NOTES: list[str] = []
_STATE: dict[str, Any] | None = None


def notes() -> list[str]:
    """Notes recorded while the shim was active (autocast/GradScaler downgrades), in order."""
    return list(_NOTES)


def _note(text: str) -> None:
    if text not in _NOTES:
        _NOTES.append(text)


def _is_cuda(device: Any) -> bool:
    """True for anything torch reads as a CUDA device: 'cuda', 'cuda:1', torch.device('cuda'), 0."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    # In a device position torch reads a bare int as a CUDA ordinal.
    return isinstance(device, int) and not isinstance(device, bool)


_CPU = torch.device("cpu")

# Tensor methods whose first argument after self may be a device.
_TO_METHODS = {torch.Tensor.to, torch._C.TensorBase.to}


class _CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of every torch function to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = _CPU
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if args and (func in _TO_METHODS or name == "_parse_to"):
            # Tensor.to(device, ...) / nn.Module.to(device, ...) (parsed by _parse_to).
            index = 1 if func in _TO_METHODS else 0
            if len(args) > index and _is_cuda(args[index]):
                args = args[:index] + (_CPU,) + tuple(args[index + 1 :])
        return func(*args, **kwargs)


# --- torch.cuda replacements -------------------------------------------------------


class _Event:
    """torch.cuda.Event on the host clock: record() stamps time, elapsed_time() is in ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: "_Event") -> float:
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._t - self._t) * 1000.0


class _Stream:
    """An inert torch.cuda.Stream: everything on the CPU is already ordered."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cuda", 0)
        self.priority = priority

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _Event:
        event = event if event is not None else _Event()
        event.record()
        return event

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


_DEFAULT_STREAM = _Stream()


class _DeviceContext:
    """torch.cuda.device(i): there is one device, so entering it changes nothing."""

    def __init__(self, device: Any):
        self.idx = 0

    def __enter__(self) -> "_DeviceContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def _properties(device: Any = None) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name=DEVICE_NAME,
        major=8,
        minor=0,
        total_memory=_total_memory(),
        multi_processor_count=os.cpu_count() or 1,
        is_integrated=False,
        is_multi_gpu_board=False,
    )


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _distinct(table: dict[str, Any], module: str) -> dict[str, Any]:
    """One function object per name: torch._dynamo maps torch.cuda functions by object and
    refuses one object that stands for two functions with different rules."""
    result = {}
    for name, value in table.items():
        if isinstance(value, types.FunctionType):
            value = types.FunctionType(value.__code__, value.__globals__, name, value.__defaults__, value.__closure__)
            value.__qualname__ = value.__name__ = name
            value.__module__ = module
        result[name] = value
    return result


def _cuda_replacements() -> dict[str, Any]:
    return _distinct({
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": _none,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": _none,
        "device": _DeviceContext,
        "device_of": _DeviceContext,
        "is_current_stream_capturing": lambda: False,
        "synchronize": _none,
        "empty_cache": _none,
        "ipc_collect": _none,
        "get_device_name": lambda device=None: DEVICE_NAME,
        "get_device_capability": lambda device=None: (8, 0),
        "get_device_properties": _properties,
        "get_arch_list": lambda: ["sm_80"],
        "is_bf16_supported": lambda including_emulation=True: True,
        "manual_seed": _none,
        "manual_seed_all": _none,
        "seed": _none,
        "seed_all": _none,
        "initial_seed": lambda: torch.initial_seed(),
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "get_rng_state_all": lambda: [torch.get_rng_state()],
        "set_rng_state": _none,
        "set_rng_state_all": _none,
        "memory_allocated": _zero,
        "max_memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_reserved": _zero,
        "memory_cached": _zero,
        "max_memory_cached": _zero,
        "reset_peak_memory_stats": _none,
        "reset_max_memory_allocated": _none,
        "reset_max_memory_cached": _none,
        "reset_accumulated_memory_stats": _none,
        "memory_stats": lambda device=None: {},
        "memory_summary": lambda device=None, abbreviated=False: "",
        "mem_get_info": lambda device=None: (_total_memory(), _total_memory()),
        "set_per_process_memory_fraction": _none,
        "Event": _Event,
        "Stream": _Stream,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
        "current_stream": lambda device=None: _DEFAULT_STREAM,
        "default_stream": lambda device=None: _DEFAULT_STREAM,
    }, "torch.cuda")


def _accelerator_replacements() -> dict[str, Any]:
    return _distinct({
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": lambda: 1,
        "current_device_index": lambda: 0,
        "set_device_index": _none,
        "synchronize": _none,
    }, "torch.accelerator")


# --- wrapped torch entry points ----------------------------------------------------


def _map_location(original: Any) -> Any:
    if original is None:
        return "cpu"  # a GPU-saved checkpoint would otherwise restore onto 'cuda'
    if isinstance(original, (str, torch.device, int)):
        return "cpu" if _is_cuda(original) else original
    if isinstance(original, dict):
        return {k: ("cpu" if _is_cuda(v) else v) for k, v in original.items()}
    if callable(original):
        user = original

        def map_location(storage: Any, location: str) -> Any:
            # The callable runs with the shim active (storage.cuda() returns the storage);
            # None means "torch's default", which for a 'cuda' location is the CPU here.
            result = user(storage, location)
            return storage if result is None and location.startswith("cuda") else result

        return map_location
    return original


def _wrap_load(load: Callable) -> Callable:
    @functools.wraps(load)
    def load_on_cpu(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        return load(f, _map_location(map_location), *args, **kwargs)

    return load_on_cpu


# Tensor methods, patched on the class so that they also hold in other threads (the
# DataLoader's pin-memory thread): the tensor stays where it is, like .to('cpu').
def _tensor_cuda(
    self: torch.Tensor, device: Any = None, non_blocking: bool = False, memory_format: Any = torch.preserve_format
) -> torch.Tensor:
    return self.to(_CPU, memory_format=memory_format)


def _tensor_pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    return self


def _tensor_is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return False


def _tensor_record_stream(self: torch.Tensor, stream: Any) -> None:
    return None


def _wrap_thread_bootstrap(bootstrap: Callable) -> Callable:
    # Torch function modes are per thread: enter the device mode in every new thread too.
    @functools.wraps(bootstrap)
    def _bootstrap_inner(self: Any) -> None:
        with _CudaToCpuMode():
            bootstrap(self)

    return _bootstrap_inner


def _storage_cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
    return self


def _wrap_set_default_device(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def set_default_device(device: Any) -> None:
        return fn("cpu" if _is_cuda(device) else device)

    return set_default_device


def _wrap_autocast_init(init: Callable) -> Callable:
    @functools.wraps(init)
    def __init__(self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None) -> None:
        if device_type == "cuda" and enabled:
            shown = dtype if dtype is not None else torch.get_autocast_dtype("cuda")
            _note(
                f"torch.autocast('cuda', dtype={shown}) was entered: CUDA autocast does not "
                "change CPU ops, so that region ran in float32"
            )
        init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return __init__


def _wrap_scaler_init(init: Callable) -> Callable:
    @functools.wraps(init)
    def __init__(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
        names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
        kwargs.update(zip(names, args))
        if device == "cuda" and kwargs.get("enabled", True):
            _note(
                "GradScaler('cuda', enabled=True) was built disabled: the CPU run is float32, "
                "scale(loss) returns the loss unchanged and step() calls optimizer.step()"
            )
            kwargs["enabled"] = False
        init(self, device, **kwargs)

    return __init__


def _wrap_init_process_group(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(backend, str) and "nccl" in backend.lower():
            _note(f"init_process_group(backend={backend!r}) used 'gloo'")
            backend = "gloo"
        if _is_cuda(kwargs.get("device_id")):
            kwargs.pop("device_id")
        return fn(backend, *args, **kwargs)

    return init_process_group


def _wrap_ddp_init(init: Callable) -> Callable:
    @functools.wraps(init)
    def __init__(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_ids is not None and all(_is_cuda(d) for d in device_ids):
            device_ids = None
        if output_device is not None and _is_cuda(output_device):
            output_device = None
        init(self, module, device_ids, output_device, *args, **kwargs)

    return __init__


def _wrap_data_parallel_init(init: Callable) -> Callable:
    @functools.wraps(init)
    def __init__(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, dim: int = 0) -> None:
        if device_ids is not None and not all(_is_cuda(d) for d in device_ids):
            init(self, module, device_ids, output_device, dim)
            return
        # DataParallel's own branch for a machine without an accelerator
        torch.nn.Module.__init__(self)
        self.module = module
        self.device_ids = []
        self.dim = dim

    return __init__


# --- install / uninstall -----------------------------------------------------------


def _patch(saved: list, owner: Any, name: str, value: Any) -> None:
    # For a class, remember only what it defines itself: uninstall then deletes our attribute
    # and the inherited one shows through again.
    before = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
    saved.append((owner, name, before))
    setattr(owner, name, value)


_MISSING = object()


def is_installed() -> bool:
    return _STATE is not None


def install() -> None:
    """Make CUDA code run on the CPU in this process (see the module docstring)."""
    global _STATE
    if _STATE is not None:
        return
    if sys.modules.get("torch_xla") is not None:
        raise RuntimeError(
            "torch_xla is already imported: the CUDA shim is only for running the original "
            "GPU script, never the ported torch_xla one"
        )
    saved: list = []
    for name, value in _cuda_replacements().items():
        _patch(saved, torch.cuda, name, value)
    if hasattr(torch, "accelerator"):
        for name, value in _accelerator_replacements().items():
            _patch(saved, torch.accelerator, name, value)
    _patch(saved, torch, "load", _wrap_load(torch.load))
    _patch(saved, torch, "set_default_device", _wrap_set_default_device(torch.set_default_device))
    _patch(saved, torch.Tensor, "cuda", _tensor_cuda)
    _patch(saved, torch.Tensor, "pin_memory", _tensor_pin_memory)
    _patch(saved, torch.Tensor, "is_pinned", _tensor_is_pinned)
    _patch(saved, torch.Tensor, "record_stream", _tensor_record_stream)
    import threading

    _patch(saved, threading.Thread, "_bootstrap_inner", _wrap_thread_bootstrap(threading.Thread._bootstrap_inner))
    for storage in (torch.UntypedStorage, torch.TypedStorage):
        _patch(saved, storage, "cuda", _storage_cuda)
    autocast = torch.amp.autocast_mode.autocast
    _patch(saved, autocast, "__init__", _wrap_autocast_init(autocast.__init__))
    scaler = torch.amp.grad_scaler.GradScaler
    _patch(saved, scaler, "__init__", _wrap_scaler_init(scaler.__init__))
    _patch(saved, torch.nn.DataParallel, "__init__", _wrap_data_parallel_init(torch.nn.DataParallel.__init__))
    import torch.distributed as dist

    if dist.is_available():
        _patch(saved, dist, "init_process_group", _wrap_init_process_group(dist.init_process_group))
        import torch.distributed.distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel

        _patch(saved, c10d, "init_process_group", dist.init_process_group)
        _patch(saved, DistributedDataParallel, "__init__", _wrap_ddp_init(DistributedDataParallel.__init__))
    previous_xla = sys.modules.get("torch_xla", _MISSING)
    sys.modules["torch_xla"] = None  # type: ignore[assignment]
    mode = _CudaToCpuMode()
    mode.__enter__()
    _STATE = {"saved": saved, "mode": mode, "torch_xla": previous_xla}


def uninstall() -> None:
    """Undo install(). The device mode must be the innermost torch function mode."""
    global _STATE
    if _STATE is None:
        return
    state, _STATE = _STATE, None
    state["mode"].__exit__(None, None, None)
    for owner, name, value in reversed(state["saved"]):
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    if state["torch_xla"] is _MISSING:
        sys.modules.pop("torch_xla", None)
    else:
        sys.modules["torch_xla"] = state["torch_xla"]


@contextlib.contextmanager
def installed():
    install()
    try:
        yield
    finally:
        uninstall()
