"""The initial weights of a training script's models, as its optimizers see them.

At script level a JAX port builds its model from ``nnx.Rngs`` and cannot draw torch's initial
weights; the original's side therefore writes, as each torch.optim optimizer is created, the
state dict of the model that optimizer trains (``weights_<i>.npz``, i in creation order), and
the port's side loads it into the model of its i-th ``nnx.Optimizer`` through the port's own
``load_torch_state_dict`` (``porter.verify.trace_jax``).

The model of an optimizer is the live ``nn.Module`` whose parameters are the most of the
optimizer's parameters, all of them the optimizer's; of several such modules with the same
parameters the outermost that is not a wrapper (a ``DataParallel``/``DistributedDataParallel``
or ``torch.compile`` wrapper gives way to its module; a model whose layers are one
``nn.Sequential`` is the model, not its Sequential).
"""
from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def _live_modules() -> list:
    import torch.nn as nn

    with warnings.catch_warnings():  # isinstance on every live object touches deprecated modules
        warnings.simplefilter("ignore")
        modules = []
        for obj in gc.get_objects():
            try:
                if isinstance(obj, nn.Module):
                    modules.append(obj)
            except Exception:  # noqa: BLE001 - objects whose __class__ misbehaves
                continue
    return modules


def model_of(optimizer: Any) -> Any:
    """The module OPTIMIZER trains (None when no live module's parameters are all its)."""
    import torch.nn as nn

    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    modules = _live_modules()
    best: dict[frozenset, list] = {}
    for m in modules:
        ids = frozenset(id(p) for p in m.parameters())
        if ids and ids <= owned:
            best.setdefault(ids, []).append(m)
    if not best:
        return None
    group = best[max(best, key=len)]
    # a wrapper's state dict prefixes its module's names (`module.`, `_orig_mod.`): its module
    unwrapped = [m for m in group if not _is_wrapper(m, nn)] or group
    # of the rest, the outermost: the model the script built (a net whose layers are one
    # nn.Sequential has that Sequential's parameters too)
    outer = [m for m in unwrapped if not any(o is not m and any(s is m for s in o.modules()) for o in unwrapped)]
    return (outer or unwrapped)[0]


def _is_wrapper(module: Any, nn: Any) -> bool:
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    return isinstance(module, wrappers) or type(module).__name__ == "OptimizedModule"  # torch.compile's


def model_with(parameters: Any) -> Any:
    """The smallest live module (not a DataParallel-style wrapper) that holds every one of
    PARAMETERS (a loss's parameter leaves, for a script that updates them by hand); None when
    no module holds them all."""
    import torch.nn as nn

    wanted = {id(p) for p in parameters if isinstance(p, nn.Parameter)}
    if not wanted:
        return None
    holders = []
    for m in _live_modules():
        ids = {id(p) for p in m.parameters()}
        if wanted <= ids and not _is_wrapper(m, nn):
            holders.append((len(ids), m))
    if not holders:
        return None
    fewest = min(n for n, _ in holders)
    tight = [m for n, m in holders if n == fewest]
    # of modules with the same parameters, the outermost (the model the script built)
    return next((m for m in tight if not any(o is not m and any(s is m for s in o.modules()) for o in tight)),
                tight[0])


def export(optimizer: Any, folder: str, index: int) -> str:
    """Write the state dict of OPTIMIZER's model to FOLDER/weights_<index>.npz; a line for the
    record (which model, or why none)."""
    model = model_of(optimizer)
    if model is None:
        return f"optimizer {index}: no model of its own (its parameters are not one module's)"
    return export_model(model, folder, index, f"optimizer {index}")


def export_model(model: Any, folder: str, index: int, label: str) -> str:
    """Write MODEL's state dict to FOLDER/weights_<index>.npz; a line for the record."""
    import torch

    state = {}
    for key, value in model.state_dict().items():
        t = value.detach()
        if t.is_floating_point() and t.dtype != torch.float64:
            t = t.float()  # half / bfloat16 as float32; a float64 run's weights stay float64
        state[key] = t.cpu().numpy().copy()
    write(folder, index, state, type(model).__name__)
    return f"{label}: the initial weights of its {type(model).__name__} ({len(state)} tensors)"


def write(folder: str, index: int, state: "dict[str, np.ndarray]", cls: str) -> None:
    """FOLDER/weights_<index>.npz (the arrays by state-dict name) and its .json (the model's class).
    numpy only: the MXNet side (``porter.verify.trace_mxnet``) writes them too."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    np.savez(target / f"weights_{index}.npz", **state)
    (target / f"weights_{index}.json").write_text(json.dumps({"class": cls, "keys": len(state)}), encoding="utf-8")


def load_into(optimizer: Any, folder: str, index: int) -> str:
    """Load FOLDER/weights_<index>.npz into the model of OPTIMIZER (a torch port's i-th
    torch.optim optimizer) with ``load_state_dict`` (strict); a line for the record."""
    import torch

    found = load(folder, index)
    if found is None:
        return f"optimizer {index}: the original has no weights for it"
    state, cls = found
    model = model_of(optimizer)
    if model is None:
        return f"optimizer {index}: no model of its own (its parameters are not one module's): its own initial weights stay"
    own = model.state_dict()
    state = _aligned(state, set(own))
    tensors = {}
    for key, value in state.items():
        t = torch.from_numpy(np.ascontiguousarray(value))
        target = own.get(key)
        lazy = isinstance(target, torch.nn.parameter.UninitializedTensorMixin)
        if target is not None and not lazy and target.is_floating_point() and t.is_floating_point():
            t = t.to(target.dtype)
        tensors[key] = t
    try:
        model.load_state_dict(tensors)
    except Exception as exc:  # noqa: BLE001 - the record says why the port kept its own weights
        first = str(exc).strip().splitlines()
        return (f"optimizer {index}: the original's {cls} weights could not be loaded into the port's "
                f"{type(model).__name__}: {type(exc).__name__}: {' '.join(first)[:400]}")
    return f"optimizer {index}: the original's {cls} weights loaded into the port's {type(model).__name__} ({len(tensors)} tensors)"


def _aligned(state: dict, own: set) -> dict:
    """STATE under the port model's names where the two name the same tensors one block apart:
    the original's model is the only child of the port's (a Sequential holding one layer: the
    MXNet side names the innermost block that owns a trainer's parameters), or the other way
    round; one common prefix added or dropped. Otherwise STATE as it is."""
    if set(state) == own or not state or len(state) != len(own):
        return state
    first = min(own)
    for name in state:  # the port's names are the original's under one prefix
        if first.endswith("." + name) and {first[: -len(name)] + k for k in state} == own:
            prefix = first[: -len(name)]
            return {prefix + k: v for k, v in state.items()}
    first = min(state)
    for key in own:  # the original's names are the port's under one prefix
        if first.endswith("." + key):
            prefix = first[: -len(key)]
            if all(k.startswith(prefix) for k in state) and {k[len(prefix):] for k in state} == own:
                return {k[len(prefix):]: v for k, v in state.items()}
    return state


def load(folder: str, index: int) -> "tuple[dict[str, np.ndarray], str] | None":
    path = Path(folder) / f"weights_{index}.npz"
    if not path.exists():
        return None
    meta = json.loads((Path(folder) / f"weights_{index}.json").read_text(encoding="utf-8"))
    with np.load(path) as data:
        return {k: data[k] for k in data.files}, meta["class"]
