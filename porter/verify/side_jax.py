"""The JAX side of a model-level verification, run in its own interpreter:
``python -m porter.verify.side_jax REQUEST.json``.

It reads and writes the protocol of every side (``porter.verify.sidenpz``: an .npz of
arrays plus a JSON of metadata), for a port written in Flax NNX to the JAX target's contract:

- the model is built from ``--model`` with ``rngs=nnx.Rngs(0)`` added;
- the original's initial weights go in through the port's own
  ``load_torch_state_dict(model, state_dict)``, and parameters, batch statistics and gradients
  come back under the original's torch names, in torch layouts, through its
  ``torch_state_dict(model)``;
- the first forward pass records every submodule's output under the original's module name
  (NNX attribute names are the torch ones; ``nnx.Sequential``'s ``layers[i]`` is torch's
  ``seq.i``; outputs of channels-last layers (nnx.Conv, nnx.BatchNorm over the last axis, ...)
  are compared with the channels moved to axis 1, as torch has them);
- K optimizer steps (optax SGD with momentum 0.9, or Adam with torch's defaults) run in one
  ``nnx.jit`` train step; nothing is read back to the host until all steps ran.

Random numbers the port draws in its forward (a VAE's ``jax.random.normal(self.rngs.noise(),
...)``, JX014) are fed torch's: a first eager pass finds the port's ``jax.random.normal`` /
``jax.random.uniform`` draws (shapes, in order); this side then rebuilds torch's generator as
the original's side has it when its first forward starts (``torch.manual_seed(seed)``, the
original's file loaded and its model built, under the same HostRandomMode) and draws, per
step, ``torch.randn`` / ``torch.rand`` of those shapes, in that order — the numbers the
original's ``torch.randn_like`` / ``rand_like`` get. The port's draws return them: in the eager
recording pass directly, in the jitted step as an argument of the step (so it still compiles
once). The original's file is ``request["original"]``. When they cannot be
aligned the note says why and the port's own draws stay (the forward then differs: never
silently compared on other noise).

A torch module with no NNX counterpart (no module, no function attribute or Sequential entry
of that name) cannot be recorded: its layer keys are listed in the metadata's ``skipped`` and
in a note. Names or shapes of weights that do not fit give side_torch's ``mismatch`` record.

Compiled programs are kept in JAX's persistent compilation cache (``<porter cache>/jax``,
unless ``JAX_COMPILATION_CACHE_DIR`` names another), so building the model and the eager
first pass do not compile again on the next run.

Health, per step (``health.steps``, as side_torch on XLA): compilations (every XLA
compilation JAX reports through ``jax.monitoring``; it reports a program loaded from the
persistent cache as one too: the step needed it), device-to-host transfers (this side reads
nothing inside a step; each host-callback primitive in the compiled step —
``jax.debug.print``, ``jax.debug.callback``, ``pure_callback``, ``io_callback`` — is a
transfer to the host in every execution and is counted as one), executions (calls of the
compiled step: one), and no CPU fallbacks (JAX has none). Besides: ``jit_cache_size`` (1
when the step compiled once), ``host_callbacks``, and ``problems`` (both findings in words,
also given as notes).
"""
from __future__ import annotations

import ast
import os
import time

import numpy as np

from porter.verify import sidenpz, sideproto


# primitives that leave the compiled program for the host while it runs
HOST_CALLBACKS = {
    "debug_callback": "jax.debug.callback",
    "debug_print": "jax.debug.print",
    "pure_callback": "jax.pure_callback",
    "io_callback": "jax.experimental.io_callback",
    "callback": "a host callback",
    "outside_call": "a host callback (host_callback)",
    "host_callback_call": "a host callback (host_callback)",
}

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class PortError(RuntimeError):
    """The port does not follow the JAX target's contract."""


def model_expression(expr: str, rngs: str) -> str:
    """``Net(10)`` -> ``Net(10, rngs=<rngs>)``; ``Net`` or ``mod.Net`` -> ``Net(rngs=<rngs>)``."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise PortError(f"--model {expr!r} is not a Python expression: {exc.msg}") from None
    body = tree.body
    rngs_node = ast.parse(rngs, mode="eval").body
    if isinstance(body, ast.Call):
        if not any(k.arg == "rngs" for k in body.keywords):
            body.keywords.append(ast.keyword(arg="rngs", value=rngs_node))
    elif isinstance(body, (ast.Name, ast.Attribute)):
        body = ast.Call(func=body, args=[], keywords=[ast.keyword(arg="rngs", value=rngs_node)])
    else:
        raise PortError(f"--model {expr!r}: give a class name or a call (Net, Net(10)) to build an NNX port")
    return ast.unparse(ast.fix_missing_locations(ast.Expression(body)))


def _flatten(obj, prefix: str, out: list):
    import jax

    out.extend(sideproto.flatten(obj, lambda a: isinstance(a, (jax.Array, np.ndarray)), prefix))


def _arrays(obj) -> list:
    flat: list = []
    _flatten(obj, "", flat)
    return [t for _, t in flat]


def _is_float(a) -> bool:
    import jax.numpy as jnp

    return bool(jnp.issubdtype(a.dtype, jnp.floating))


def _host(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    return np.array(a, copy=True)


def _switch_off_drop_path(module, name: str, drop_paths: dict) -> bool:
    """Set the probability of the port's module ``name`` to 0 where the original's side switched
    off a stochastic-depth layer of that name (torchvision's StochasticDepth ``p``, timm's DropPath
    ``drop_prob``) and the port's module keeps the attribute as a number."""
    attr = drop_paths.get(name)
    value = getattr(module, attr, None) if attr else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value:
        return False
    setattr(module, attr, 0.0)
    return True


def torch_names(model) -> dict[int, tuple[str, object]]:
    """id(module) -> (torch module name, module) for every callable submodule of an NNX model.
    Attribute names are kept by the port, so the NNX path is the torch name; the ``layers``
    list of an ``nnx.Sequential`` is torch's Sequential itself (``seq.layers.0`` -> ``seq.0``)."""
    from flax import nnx

    modules = {path: m for path, m in nnx.iter_modules(model)}
    names = {}
    for path, m in modules.items():
        if not path or isinstance(m, (nnx.List, nnx.Dict, nnx.Rngs, nnx.RngStream)) \
                or not callable(getattr(type(m), "__call__", None)):
            continue  # nnx.Rngs / RngStream (a module's random stream) are no torch module
        names.setdefault(id(m), (_torch_name(path, modules), m))
    return names


def _torch_name(path, modules) -> str:
    from flax import nnx

    parts = []
    for i, part in enumerate(path):
        if part == "layers" and isinstance(modules.get(tuple(path[:i])), nnx.Sequential):
            continue
        parts.append(str(part))
    return ".".join(parts)


def _channels_last_bases() -> tuple:
    from flax import nnx

    return (nnx.Conv, nnx.ConvTranspose, nnx.GroupNorm, nnx.BatchNorm)


def channel_axis(module, ndim: int) -> "int | None":
    """Where the computation of a channels-last NNX layer (nnx.Conv, nnx.ConvTranspose,
    nnx.GroupNorm: the last axis; nnx.BatchNorm: its ``axis``) puts the channels of an output
    of ``ndim`` dimensions, when that is not axis 1 (where torch has them); else None."""
    from flax import nnx

    if ndim < 3:
        return None
    if isinstance(module, nnx.BatchNorm):
        axis = module.axis if isinstance(module.axis, int) else None
    elif isinstance(module, _channels_last_bases()):
        axis = -1
    else:
        return None
    if axis is None or axis % ndim == 1:
        return None
    return axis % ndim


class LayerRecorder:
    """Records every submodule's output of one eager forward pass of ``model`` (a throwaway
    clone: its batch statistics move) under the original's torch module names.

    Module classes get their ``__call__`` wrapped for the duration (by identity of the
    instance, outermost call only, so a subclass calling ``super().__call__`` records once);
    plain functions that stand for torch modules (``nnx.relu`` in an ``nnx.Sequential``,
    ``self.act = nnx.relu``) are wrapped in place on the clone.

    Layouts: the output of a channels-last layer (nnx.Conv, nnx.BatchNorm over the last
    axis, ...) has its channels moved to axis 1 for the comparison. A subclass that calls the
    layer's own ``__call__`` is channels-last only where it returns the very array that call
    gave (``TorchConv2d``, which moves the channels back to axis 1 around ``nnx.Conv``, is not);
    one that never calls it is judged by the layer's attributes. So is every output that is
    that very array (an ``nnx.Sequential`` returning its last layer's output) or that a plain
    function made of it (``nnx.relu``, pooling in a channels-last ``nnx.Sequential``)."""

    def __init__(self, model, torch_layers: dict[str, tuple]):
        from flax import nnx

        self.model = model
        self.torch_layers = torch_layers  # layer key -> the original's shape
        self.torch_modules = {k.partition("/")[2] for k in torch_layers}
        self.names = torch_names(model)
        self.records: list[tuple[str, object, dict]] = []  # (name, output, {id(array): channel axis})
        self.channels_last: dict[int, tuple[int, object]] = {}  # id(array) -> (channel axis, array)
        self.active: set[int] = set()
        self.base_out: dict[int, list] = {}  # id(module) -> what the channels-last layer's own __call__ gave
        self._patched: list[tuple[type, object, bool]] = []
        modules = {path: m for path, m in nnx.iter_modules(model)}
        self._functions = []
        for path, m in modules.items():
            if isinstance(m, nnx.Sequential):
                layers = m.layers
                for i in range(len(layers)):
                    f = layers[i]
                    if callable(f) and not isinstance(f, nnx.Module):
                        self._functions.append((layers, i, _torch_name(path + ("layers", i), modules), f))
            elif not isinstance(m, (nnx.List, nnx.Dict)):
                for attr, f in list(vars(m).items()):
                    if attr.startswith("_") or isinstance(f, (nnx.Module, nnx.Variable, type)) or not callable(f):
                        continue
                    name = _torch_name(path + (attr,), modules)
                    if self._is_torch_module(name):
                        self._functions.append((m, attr, name, f))

    def _is_torch_module(self, name: str) -> bool:
        return any(t == name or t.startswith(name + ".") for t in self.torch_modules)

    def __enter__(self):
        classes = {type(m) for _, m in self.names.values()} | set(_channels_last_bases())
        for cls in sorted(classes, key=lambda c: len(c.__mro__)):  # base classes first
            self._wrap_class(cls)
        for holder, key, name, f in self._functions:
            wrapped = self._wrap_function(name, f)
            if isinstance(key, int):
                holder[key] = wrapped
            else:
                setattr(holder, key, wrapped)
        return self

    def __exit__(self, *exc):
        for cls, original, own in reversed(self._patched):
            if own:
                cls.__call__ = original
            else:
                del cls.__call__
        self._patched.clear()
        for holder, key, _name, f in self._functions:
            if isinstance(key, int):
                holder[key] = f
            else:
                setattr(holder, key, f)
        return False

    def _wrap_class(self, cls):
        original = cls.__call__
        own = "__call__" in cls.__dict__
        base = cls in _channels_last_bases()
        recorder = self

        def __call__(module, *args, **kwargs):
            key = id(module)
            if key not in recorder.names:
                return original(module, *args, **kwargs)
            if key in recorder.active:  # a subclass's __call__ calling super().__call__
                out = original(module, *args, **kwargs)
                if base:
                    recorder.base_out[key] = _arrays(out)
                return out
            recorder.active.add(key)
            try:
                out = original(module, *args, **kwargs)
            finally:
                recorder.active.discard(key)
            if base:
                recorder.base_out[key] = _arrays(out)
            name, _ = recorder.names[key]
            recorder.record(name, out, module=module, base_out=recorder.base_out.pop(key, None))
            return out

        __call__.__wrapped__ = original
        cls.__call__ = __call__
        self._patched.append((cls, original, own))

    def _wrap_function(self, name, f):
        recorder = self

        def recorded(*args, **kwargs):
            out = f(*args, **kwargs)
            recorder.record(name, out, source=args[0] if args else None)
            return out

        return recorded

    def record(self, name, out, module=None, source=None, base_out=None):
        layout = {}
        flat: list = []
        _flatten(out, "", flat)
        for _, t in flat:
            axis = None
            if module is not None and (base_out is None or any(t is b for b in base_out)):
                axis = channel_axis(module, getattr(t, "ndim", 0))
            if axis is None and id(t) in self.channels_last:
                axis = self.channels_last[id(t)][0]  # the very array a channels-last layer gave
            if axis is None and source is not None and id(source) in self.channels_last \
                    and getattr(source, "ndim", None) == getattr(t, "ndim", -1):
                axis = self.channels_last[id(source)][0]  # a function of a channels-last array
            if axis is not None:
                layout[id(t)] = axis
                self.channels_last[id(t)] = (axis, t)  # the reference keeps the id unique
        self.records.append((name, out, layout))

    def arrays(self, notes: list) -> list[tuple[str, np.ndarray]]:
        """The recorded outputs as (layer key, numpy array), in execution order."""
        out = []
        moved = []
        for name, value, layout in self.records:
            sub: list = []
            _flatten(value, "", sub)
            for suffix, t in sub:
                key = sidenpz.layer_key(name, suffix)
                a = _host(t)
                want = self.torch_layers.get(key)
                if id(t) in layout:
                    a = np.moveaxis(a, layout[id(t)], 1)
                    moved.append(name)
                elif want is not None and tuple(a.shape) != tuple(want) and a.ndim >= 3 \
                        and tuple(np.moveaxis(a, -1, 1).shape) == tuple(want):
                    a = np.moveaxis(a, -1, 1)  # a channels-last output where torch has NCHW
                    moved.append(name)
                out.append((key, a))
        if moved:
            notes.append("outputs of channels-last NNX layers compared with the channels moved to axis 1: "
                         + ", ".join(dict.fromkeys(moved)))
        return out


def host_callbacks(jaxpr) -> dict[str, int]:
    """Host-callback primitives in a (closed) jaxpr and every jaxpr nested in it."""
    from jax.extend import core as jcore

    found: dict[str, int] = {}

    def walk(j):
        j = getattr(j, "jaxpr", j)
        for eqn in j.eqns:
            name = eqn.primitive.name
            if name in HOST_CALLBACKS:
                found[name] = found.get(name, 0) + 1
            for v in eqn.params.values():
                for s in (v if isinstance(v, (list, tuple)) else (v,)):
                    if isinstance(s, (jcore.Jaxpr, jcore.ClosedJaxpr)):
                        walk(s)

    walk(jaxpr)
    return found


def _mismatch(own: dict, state: dict):
    """side_torch's mismatch record, or None when the names and shapes fit."""
    # a lazy layer's parameter has no shape yet (None): loading the state dict gives it one
    return sidenpz.mismatch(
        {k: None if v is None else np.shape(v) for k, v in own.items() if not k.endswith("num_batches_tracked")},
        {k: np.shape(v) for k, v in state.items() if not k.endswith("num_batches_tracked")})


def _mismatch_from_error(exc: Exception, own: dict, state: dict) -> dict:
    text = str(exc.args[0]) if exc.args else str(exc)
    named = sorted((k for k in set(state) | set(own) if k in text), key=len, reverse=True)
    key = named[0] if named else text
    if isinstance(exc, ValueError) and key in state:
        return {"shape": {key: [list(np.shape(state[key])), list(np.shape(own.get(key, ())))]},
                "error": f"{type(exc).__name__}: {text}"}
    if key in state:
        return {"missing": [], "unexpected": [key], "error": f"{type(exc).__name__}: {text}"}
    return {"missing": [key], "unexpected": [], "error": f"{type(exc).__name__}: {text}"}


class NoiseFeed:
    """Stands in for ``jax.random.normal`` / ``jax.random.uniform`` while active: records each
    draw's (kind, shape, dtype, minval, maxval), and returns the next array of ``queue`` when
    one is given (zeros when only discovering)."""

    KINDS = ("normal", "uniform")

    def __init__(self):
        import jax

        self.real = {k: getattr(jax.random, k) for k in self.KINDS}
        self.queue: "list | None" = None
        self.seen: list[tuple] = []
        self.active = False

    def __enter__(self):
        import jax

        for kind in self.KINDS:
            setattr(jax.random, kind, self._fake(kind))
        return self

    def __exit__(self, *exc):
        import jax

        for kind, f in self.real.items():
            setattr(jax.random, kind, f)
        return False

    def _fake(self, kind):
        import jax.numpy as jnp

        real = self.real[kind]

        def draw(key, shape=(), dtype=jnp.float32, *args, **kwargs):
            if not self.active:
                return real(key, shape, dtype, *args, **kwargs)
            lo = kwargs.get("minval", args[0] if args else 0.0)
            hi = kwargs.get("maxval", args[1] if len(args) > 1 else 1.0)
            shape = tuple(int(d) for d in shape)
            self.seen.append((kind, shape, jnp.dtype(dtype).name, lo, hi))
            if self.queue is None:
                return jnp.zeros(shape, dtype)
            if not self.queue:
                raise PortError("the port drew more random numbers than in the discovery pass")
            value = self.queue.pop(0)
            if tuple(value.shape) != shape:
                raise PortError(f"the port drew random numbers of shape {shape} where {tuple(value.shape)} was expected")
            if kind == "uniform":
                value = lo + (hi - lo) * value
            return jnp.asarray(value).astype(dtype)

        return draw


def original_file(request: dict) -> "str | None":
    """The original's file, which the verifier passes to the port's side as ``original``."""
    return request.get("original")


def torch_draws(request: dict, draws: list, steps: int) -> list:
    """Per step, the numbers the original's forward draws from torch's generator for the
    port's ``draws`` (kind, shape, ...), rebuilt as the torch side has its generator at the
    first forward: seeded, the original's file loaded, its model built (side_torch's order,
    under HostRandomMode). Uniform draws are U(0, 1) here (scaled by NoiseFeed)."""
    import torch

    from porter.verify.trace import HostRandomMode

    path = original_file(request)
    if path is None:
        raise PortError("the original's file is not known to this side")
    if request.get("cuda_shim", True):
        try:
            from porter.verify import cuda_shim

            cuda_shim.install()
        except ImportError:
            pass
    with HostRandomMode():
        torch.manual_seed(request["seed"])
        ns = sideproto.load_namespace(path)
        eval(request["model"], ns)  # the original's model: its initialisation draws from the generator
        per_step = []
        for _ in range(steps):
            arrays = []
            for kind, shape, _dtype, _lo, _hi in draws:
                t = torch.randn(shape, dtype=torch.float32) if kind == "normal" else torch.rand(shape, dtype=torch.float32)
                arrays.append(t.numpy().copy())
            per_step.append(arrays)
    return per_step


def configure():
    """JAX as the comparison needs it: 32-bit types, full-precision matmuls, the persistent
    compilation cache."""
    import jax

    from porter.verify.mxnet_env import cache_dir

    jax.config.update("jax_enable_x64", False)
    jax.config.update("jax_default_matmul_precision", "highest")
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def warm_up(request: dict) -> None:
    """What the side does first and that needs nothing from the original."""
    configure()
    import jax
    import optax  # noqa: F401
    from flax import nnx  # noqa: F401

    jax.devices()


def run(request: dict) -> dict:
    configure()
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    meta: dict = {"notes": [], "health": None}
    compiles = [0]

    def on_duration(event, duration, **_kw):
        if event == COMPILE_EVENT:
            compiles[0] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)

    ns = sideproto.load_namespace(request["file"])
    for fn in ("load_torch_state_dict", "torch_state_dict"):
        if not callable(ns.get(fn)):
            raise PortError(f"{request['file']} defines no {fn}(): a JAX port converts the original's weights "
                            f"with load_torch_state_dict(model, state_dict) and torch_state_dict(model)")
    load_torch_state_dict, torch_state_dict = ns["load_torch_state_dict"], ns["torch_state_dict"]
    expr = model_expression(request["model"], "__porter_nnx__.Rngs(0)")
    try:
        model = eval(expr, dict(ns, __porter_nnx__=nnx))  # the user's expression, in the user's namespace
    except Exception as exc:
        shown = model_expression(request["model"], "nnx.Rngs(0)")
        raise RuntimeError(f"--model {request['model']!r} (as {shown}) failed in {request['file']}: {exc}") from exc
    if not isinstance(model, nnx.Module):
        raise PortError(f"--model {request['model']!r} gave a {type(model).__name__}, not an nnx.Module")

    shared = request.get("shared")
    if not shared:
        raise PortError("the JAX side runs ports only: it needs the original's weights and inputs (shared)")
    data = sidenpz.Shared(shared)
    state = data.state()
    # None: a parameter of a lazy layer with no shape yet (load_torch_state_dict materializes it)
    own = {k: None if v is None else np.asarray(v) for k, v in torch_state_dict(model).items()}
    mm = _mismatch(own, state)
    if mm:
        meta["mismatch"] = mm
        return meta
    try:
        load_torch_state_dict(model, state)
    except (KeyError, ValueError) as exc:
        meta["mismatch"] = _mismatch_from_error(exc, own, state)
        return meta
    back = {k: np.asarray(v) for k, v in torch_state_dict(model).items()}
    off = [k for k in state if k in back and not np.array_equal(np.asarray(back[k], np.float64),
                                                                 np.asarray(state[k], np.float64))]
    if off:
        meta["notes"].append("torch_state_dict(model) does not give back the weights load_torch_state_dict(model, ...) "
                             f"was given, for: {', '.join(off[:5])}{' ...' if len(off) > 5 else ''}")

    # inputs: JAX runs with 32-bit types here (jax_enable_x64 off)
    inputs = []
    narrowed = []
    for i, x in enumerate(data.inputs()):
        if x.dtype == np.int64:
            x, _ = x.astype(np.int32), narrowed.append(f"input {i} int64 -> int32")
        elif x.dtype == np.float64:
            x, _ = x.astype(np.float32), narrowed.append(f"input {i} float64 -> float32")
        inputs.append(jnp.asarray(x))
    if narrowed:
        meta["notes"].append("jax_enable_x64 is off: " + ", ".join(narrowed))
    projection = [jnp.asarray(p) for p in data.projection()]
    torch_layers = {k: tuple(data[k].shape) for k in data.files if k.startswith("layer/")}

    model.train()
    names = torch_names(model)
    # the stochastic-depth layers the original's side switched off, by torch name (their port
    # is the package's own module, ported with it: same name, same probability attribute)
    drop_paths = dict(str(e).split("\t", 1) for e in data["drop_paths"]) if "drop_paths" in data.files else {}
    dropouts = []
    for _, m in nnx.iter_modules(model):
        if isinstance(m, nnx.Dropout) and m.rate > 0:
            m.rate = 0.0
        elif isinstance(m, nnx.MultiHeadAttention) and m.dropout_rate > 0:
            m.dropout_rate = 0.0
        elif id(m) in names and _switch_off_drop_path(m, names[id(m)][0], drop_paths):
            pass
        else:
            continue
        dropouts.append(names[id(m)][0] if id(m) in names else type(m).__name__)
    if dropouts:
        meta["notes"].append(f"dropout switched off for the comparison in: {', '.join(dropouts)}")

    arrays = sidenpz.Arrays()

    def keep(key, value):
        arrays.keep(key, value if isinstance(value, np.ndarray) else _host(value))

    # random numbers drawn in the forward: found by an eager pass on a clone, then fed torch's
    feed = NoiseFeed()
    noise: list = [[] for _ in range(request["steps"])]
    with feed:
        feed.active = True
        try:  # abstractly: the shapes are all it needs
            nnx.eval_shape(lambda m, *xs: m(*xs), nnx.clone(model), *inputs)
        except Exception:  # noqa: BLE001 - a model eval_shape cannot trace: one eager pass
            feed.seen.clear()
            nnx.clone(model)(*inputs)
        feed.active = False
    draws = list(feed.seen)
    if draws:
        what = ", ".join(f"jax.random.{k}{list(shape)}" for k, shape, *_ in draws)
        try:
            noise = [[jnp.asarray(a) for a in arrays] for arrays in torch_draws(request, draws, request["steps"])]
            meta["notes"].append(f"random numbers of the port's forward ({what}) fed torch's: drawn from torch's "
                                 f"generator as the original's side draws them (seed {request['seed']}, after building "
                                 "the original's model), in the same order")
        except Exception as exc:  # the port's own draws stay: the forward is compared as it is
            draws = []
            meta["notes"].append(f"the port's forward draws random numbers ({what}) that could not be aligned with "
                                 f"torch's ({type(exc).__name__}: {exc}): compared with the port's own draws")

    # every submodule's output of the first forward pass, eagerly, on a clone (its batch
    # statistics move; step 1 below runs the same forward on the model itself)
    recording = nnx.clone(model)
    with LayerRecorder(recording, torch_layers) as recorder, feed:
        feed.active, feed.queue = bool(draws), list(noise[0])
        first_out = recording(*inputs)
        feed.active, feed.queue = False, None
    layer_arrays = recorder.arrays(meta["notes"])
    del recording
    recorded = {k for k, _ in layer_arrays}
    skipped = [k for k in torch_layers if k not in recorded]
    if skipped:
        meta["skipped"] = skipped
        meta["notes"].append("no NNX module or function of the port corresponds to the original's "
                             f"{', '.join(k.partition('/')[2] for k in skipped[:8])}{' ...' if len(skipped) > 8 else ''}: "
                             "their outputs are not compared")

    # outputs that do not fit the original's: the loss (the original's projection of them) does
    # not exist, so no step runs; the layers and outputs show where the port went wrong
    flat_first: list = []
    _flatten(first_out, "", flat_first)
    shapes = [list(t.shape) for _, t in flat_first]
    if shapes != [list(p.shape) for p in projection]:
        for key, a in layer_arrays:
            keep(key, a)
        for suffix, t in flat_first:
            keep(sidenpz.output_key(suffix), t)
        meta["notes"].append(f"the port's model returned arrays of shapes {shapes}, the original's "
                             f"{[list(p.shape) for p in projection]}: no training step was run")
        arrays.save(request["out"], meta)
        return meta

    if request["optimizer"] == "adam":
        tx = optax.adam(request["lr"])  # torch's defaults: betas (0.9, 0.999), eps 1e-8 outside the sqrt
    else:
        tx = optax.sgd(request["lr"], momentum=0.9)  # torch's SGD: buf = 0.9 buf + g; p -= lr buf
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    def loss_of(out):
        flat: list = []
        _flatten(out, "", flat)
        if not any(_is_float(t) for _, t in flat):
            raise PortError("the model returned no floating-point array")
        # the original's fixed random projection of every output (side_torch)
        return sum(jnp.sum(t.astype(jnp.float32) * w) / max(t.size, 1)
                   for (_, t), w in zip(flat, projection) if _is_float(t)), flat

    @nnx.jit
    def train_step(model, optimizer, inputs, noise):
        def loss_fn(model):
            feed.active, feed.queue = bool(draws), list(noise)
            try:
                out = model(*inputs)
            finally:
                feed.active, feed.queue = False, None
            loss, _ = loss_of(out)
            return loss, out

        (loss, out), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, out, grads

    snapshots = []
    health_steps = []
    first = None
    t0 = time.perf_counter()
    for step in range(1, request["steps"] + 1):
        before = compiles[0]
        try:
            with feed:
                loss, out, grads = train_step(model, optimizer, inputs, noise[step - 1])
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError) as exc:
            raise PortError("the model reads a value on the host inside the jitted train step (float(), "
                            ".item(), np.asarray(), or Python control flow on an array), which a compiled "
                            f"step cannot do: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        if step == 1:
            first = (out, grads)
        snapshots.append((loss, nnx.clone(model)))
        health_steps.append({"compiles": compiles[0] - before,
                             "transfers": 0,  # this side reads nothing back inside a step
                             "executions": 1, "fallbacks": []})
    jax.block_until_ready([s[0] for s in snapshots])
    elapsed = time.perf_counter() - t0
    cache_size = train_step.jitted_fn._cache_size()

    # the compiled step: does it call back to the host?
    problems = []
    traced_model, traced_optimizer = nnx.clone((model, optimizer))  # tracing leaves the model as it is
    with feed:
        callbacks = host_callbacks(train_step.trace(traced_model, traced_optimizer, inputs, noise[0]).traced.jaxpr)
    if callbacks:
        n = sum(callbacks.values())
        what = ", ".join(f"{HOST_CALLBACKS[p]} ({p}) x{c}" for p, c in callbacks.items())
        for h in health_steps:
            h["transfers"] += n
        problems.append(f"the compiled step calls back to the host: {what}; each is a device-to-host "
                        "transfer in every step")
        meta["notes"].append(problems[-1])
    if cache_size != 1:
        problems.append(f"the train step was compiled {cache_size} times (for {request['steps']} steps)")
        meta["notes"].append(problems[-1])

    # everything read back now, converted to the original's names and layouts
    for key, a in layer_arrays:
        keep(key, a)
    out, grads = first
    flat: list = []
    _flatten(out, "", flat)
    for suffix, t in flat:
        keep(sidenpz.output_key(suffix), t)
    final = {k: np.asarray(v) for k, v in torch_state_dict(model).items()}
    bumped = nnx.clone(model)
    nnx.update(bumped, jax.tree.map(lambda v: v + 1, nnx.state(bumped, nnx.Param)))
    moved = {k: np.asarray(v) for k, v in torch_state_dict(bumped).items()}
    param_names = [k for k in final if k in moved and not np.array_equal(final[k], moved[k])]
    buffer_names = [k for k in final if k not in param_names and _is_float(final[k])]
    g = nnx.clone(model)
    nnx.update(g, grads)
    g_torch = torch_state_dict(g)
    for n in param_names:
        keep(f"grad/{n}", np.asarray(g_torch[n]))
    for step, (loss, snap) in enumerate(snapshots, start=1):
        keep(f"step{step}/loss", loss)
        sd = torch_state_dict(snap)
        for n in param_names:
            keep(f"step{step}/param/{n}", np.asarray(sd[n]))
        for n in buffer_names:
            keep(f"step{step}/buffer/{n}", np.asarray(sd[n]))
    meta["seconds"] = elapsed
    meta["health"] = {"steps": health_steps, "jit_cache_size": cache_size,
                      "host_callbacks": callbacks, "problems": problems}
    arrays.save(request["out"], meta)
    return meta


def main() -> None:
    sideproto.main(run)


if __name__ == "__main__":
    main()
