"""The JAX side of a script-level verification: hooks ``porter.verify.trace`` installs in a
JAX port's process (``--jax``) before the script runs.

* **Steps.** Every function the script jits (``nnx.jit``, ``jax.jit``; decorator or call) is
  wrapped. A jitted function is a *step function* when tracing it updated parameters
  (``nnx.Optimizer.update`` or ``optax.apply_updates`` ran inside it); each call of a step
  function is one optimizer step, and so is an ``nnx.Optimizer.update`` / ``optax.apply_updates``
  called eagerly. The step's loss is the first floating-point scalar among the function's
  outputs (``loss``, ``(loss, logits)``, ``(params, opt_state, loss)``), kept on the device and
  read when the script ends. A jitted function that takes gradients of a model
  (``nnx.value_and_grad`` / ``nnx.grad`` of an NNX module ran inside it) without updating is
  a *gradient step* (a micro-step of gradient accumulation): its loss is pending, and belongs
  to the next optimizer step, as the original's backward passes before a step are.
* **Initial weights.** The i-th ``nnx.Optimizer(model, ...)`` the script builds gets, just
  before its constructor runs, the state dict of the original's i-th torch.optim optimizer's
  model (``porter.verify.weights``), through the port's own ``load_torch_state_dict``.
* **float64.** With ``x64`` (a float64 verification: the original ran with torch's default
  dtype float64), ``jax_enable_x64`` is on before the script runs, and each optimizer's model
  has its floating-point variables widened to float64 before the original's weights are
  loaded (Flax creates parameters as float32 whatever the default): the step then computes in
  float64 (inputs and parameters promote), as the original does. The summary lists the
  parameters still narrower than float64 after the run (a port that casts its own), so that
  the comparison can fall back to float32's tolerances.
* **Random numbers.** With ``host_random`` (the verifier's ``--host-random``: the original
  draws on torch's CPU generator), once the first optimizer is built the port's
  ``jax.random.normal`` / ``uniform`` / ``bernoulli`` draw the same numbers from torch's CPU
  generator, in the order the program runs them (an ordered ``io_callback``, inside jitted
  steps too; a step that draws is waited for, so that the data loader's draws on the host
  keep their order): ``normal`` is ``torch.randn``, ``uniform`` ``lo + (hi - lo) *
  torch.rand``, and ``bernoulli(p)`` ``torch.rand < p`` or, for a dropout (``nnx.Dropout``,
  the port's ``torch_dropout``), ``torch.rand >= 1 - p``, as the original's dropout keeps
  ``rand >= p`` (``porter.verify.trace.HostRandomMode``). The reparameterisation noise of a
  VAE, a noise draw in the step and a dropout mask are then the original's.
* **Health.** Compilations (every backend compilation ``jax.monitoring`` reports),
  device-to-host transfers (a ``jax.Array`` whose value is fetched to the host for the first
  time: ``float()``, ``.item()``, ``np.asarray``, printing), calls of the step functions; at the
  end, each step function's jit cache size (one entry per compilation) and the host callbacks
  traced into it (``jax.debug.print``, ``jax.debug.callback``, ``jax.pure_callback``,
  ``io_callback``: each is a transfer to the host in every execution).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_CALLBACKS = (("jax.debug", "print"), ("jax.debug", "callback"), ("jax", "pure_callback"),
              ("jax.experimental", "io_callback"))


class JaxHooks:
    def __init__(self, recorder: Any, weights: Optional[str], reseed: Optional[int], reseed_fn: Callable,
                 x64: bool = False, host_random: bool = False) -> None:
        self.recorder = recorder
        self.x64 = x64
        self.host_random = host_random
        self.drawing = False  # host draws stand in for jax.random's (from the first optimizer on)
        self.draws = 0  # host draws made or traced
        self.models: list[Any] = []  # each optimizer's model
        self.weights = weights
        self.reseed = reseed
        self.reseed_fn = reseed_fn
        self.compiles = 0
        self.transfers = 0
        self.calls = 0
        self.depth = 0  # > 0 inside a call of a jitted function
        self.updates = 0  # parameter updates seen (traced or eager)
        self.updating = 0  # > 0 inside an update (optax.apply_updates inside nnx.Optimizer.update)
        self.step_functions: dict[str, Any] = {}  # name -> the jitted object
        self.callbacks: dict[str, dict[str, int]] = {}  # step function -> {callback: count}
        self.tracing: list[str] = []  # names of the jitted functions being called, innermost last
        self.grads = 0  # gradient functions called (traced or eager)
        self.optimizers = 0
        self.loaded: list[str] = []

    # -- metrics --
    def snapshot(self) -> dict[str, int]:
        return {"compiles": self.compiles, "transfers": self.transfers, "executions": self.calls, "fallback_ops": 0,
                "off_tpu_fallbacks": 0}

    def summary(self) -> dict[str, Any]:
        sizes = {}
        for name, fn in self.step_functions.items():
            try:
                sizes[name] = int(_cache_size(fn))
            except Exception:  # noqa: BLE001 - an object without a jit cache to ask
                sizes[name] = None
        summary = {"jit_cache_sizes": sizes, "host_callbacks": self.callbacks, "weights_loaded": self.loaded}
        if self.x64:
            summary["narrow_parameters"] = _narrow_parameters(self.models)
        return summary

    # -- installing --
    def install(self) -> None:
        import importlib

        import jax
        import optax
        from flax import nnx
        from jax._src import array as jarray

        if self.x64:
            jax.config.update("jax_enable_x64", True)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        hooks = self

        fetch = jarray.ArrayImpl._value

        def _value(array):
            if getattr(array, "_npy_value", None) is None and hooks.depth == 0:
                hooks.transfers += 1
            return fetch.fget(array)

        jarray.ArrayImpl._value = property(_value)

        init = nnx.Optimizer.__init__

        def optimizer_init(self, model, *args, **kwargs):
            hooks.on_optimizer(model)
            init(self, model, *args, **kwargs)

        nnx.Optimizer.__init__ = optimizer_init

        update = nnx.Optimizer.update

        def optimizer_update(self, *args, **kwargs):
            return hooks.on_update(lambda: update(self, *args, **kwargs))

        nnx.Optimizer.update = optimizer_update
        apply = optax.apply_updates

        def apply_updates(*args, **kwargs):
            return hooks.on_update(lambda: apply(*args, **kwargs))

        optax.apply_updates = apply_updates

        if self.host_random:
            _HostDraws(self).install()
        nnx.jit = self._jit_wrapper(nnx.jit)
        for name in ("value_and_grad", "grad"):
            setattr(nnx, name, self._grad_wrapper(getattr(nnx, name), nnx.Module))
        jax.jit = self._jit_wrapper(jax.jit)
        for module_name, attr in _CALLBACKS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if callable(getattr(module, attr, None)):
                setattr(module, attr, self._callback_wrapper(f"{module_name}.{attr}", getattr(module, attr)))

    def _on_duration(self, event: str, duration: float, **_kw: Any) -> None:
        if event == COMPILE_EVENT:
            self.compiles += 1

    # -- the script's model meets its optimizer --
    def on_optimizer(self, model: Any) -> None:
        index = self.optimizers
        self.optimizers += 1
        self.models.append(model)
        if self.x64:
            _widen(model)
        if self.weights is not None:
            from porter.verify import weights

            found = weights.load(self.weights, index)
            if found is None:
                self.loaded.append(f"optimizer {index}: the original has no weights for it")
            else:
                state, cls = found
                loader = _loader(model)
                if loader is None:
                    self.loaded.append(f"optimizer {index}: the port defines no load_torch_state_dict(model, "
                                       "state_dict): its own initial weights stay")
                else:
                    try:
                        loader(model, state)
                        self.loaded.append(f"optimizer {index}: the original's {cls} weights loaded into the "
                                           f"port's {type(model).__name__}")
                    except Exception as exc:  # noqa: BLE001 - said in the report; the run goes on
                        self.loaded.append(f"optimizer {index}: the original's {cls} weights could not be loaded "
                                           f"into {type(model).__name__}: {type(exc).__name__}: {exc}")
        if self.reseed is not None:
            self.reseed_fn(self.reseed)
        self.drawing = self.host_random

    # -- updates and steps --
    def on_update(self, run: Callable) -> Any:
        top = self.updating == 0
        self.updating += 1
        try:
            result = run()
        finally:
            self.updating -= 1
        if top:
            self.updates += 1
            if self.depth == 0:  # an eager update: a step by itself
                self.recorder.on_step("eager update", (), {})
        return result

    def _jit_wrapper(self, real: Callable) -> Callable:
        hooks = self

        def wrap(*args: Any, **kwargs: Any) -> Any:
            if not args:  # @nnx.jit(static_argnames=...)
                return lambda fn: wrap(fn, **kwargs)
            return _Jitted(hooks, real(*args, **kwargs), getattr(args[0], "__name__", "jitted"))

        def jit(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.split(".")[0] in ("jax", "flax", "optax", "jaxlib"):
                return real(*args, **kwargs)  # the frameworks' own use of jit
            return wrap(*args, **kwargs)

        return jit

    def _grad_wrapper(self, real: Callable, module_type: type) -> Callable:
        """``nnx.value_and_grad`` / ``nnx.grad`` whose functions count their calls in
        ``self.grads`` when they differentiate a model (an NNX module first: gradients of plain
        arrays, an autograd demonstration, are no micro-step)."""
        hooks = self

        def make(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.split(".")[0] in ("jax", "flax", "optax", "jaxlib"):
                return real(*args, **kwargs)
            if not args:  # nnx.value_and_grad(has_aux=True)(fn)
                return lambda fn: make(fn, **kwargs)
            taken = real(*args, **kwargs)

            def call(*a: Any, **k: Any) -> Any:
                if a and isinstance(a[0], module_type):
                    hooks.grads += 1
                return taken(*a, **k)

            return call

        return make

    def _callback_wrapper(self, name: str, real: Callable) -> Callable:
        hooks = self

        def callback(*args: Any, **kwargs: Any) -> Any:
            if hooks.tracing:
                counts = hooks.callbacks.setdefault(hooks.tracing[0], {})
                counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)

        return callback

    def on_call(self, fn: "_Jitted", args: tuple, kwargs: dict) -> Any:
        before, grads_before, draws_before = self.updates, self.grads, self.draws
        self.depth += 1
        self.tracing.append(fn.name)
        try:
            result = fn.compiled(*args, **kwargs)
        finally:
            self.depth -= 1
            self.tracing.pop()
        if self.draws > draws_before:
            fn.draws = True
        if fn.draws and self.depth == 0:
            # its host draws run when it executes: done before the script's next draw on the host
            import jax

            jax.block_until_ready(result)
        if self.updates > before:  # its trace updated parameters: a step function
            fn.is_step = True
            self.step_functions.setdefault(fn.name, fn.compiled)
            if fn.name not in self.callbacks:
                self.callbacks[fn.name] = {}
        elif self.grads > grads_before:  # it took gradients and updated nothing: a micro-step
            fn.is_grad = True
        if fn.is_step and self.depth == 0:
            self.calls += 1
            loss = _loss_of(result)
            self.recorder.on_step(fn.name, (), {}, [loss] if loss is not None else [])
        elif fn.is_grad and self.depth == 0:
            self.calls += 1
            loss = _loss_of(result)
            if loss is not None:  # the next step's, as a backward pass before step() is
                self.recorder.pending.append(loss)
                self.recorder.pending_leaves.append({})
        return result


class _Jitted:
    """A jitted function of the script, as the script sees it (attributes are the jitted object's)."""

    def __init__(self, hooks: JaxHooks, compiled: Any, name: str) -> None:
        self.hooks = hooks
        self.compiled = compiled
        self.name = name
        self.is_step = False
        self.is_grad = False
        self.draws = False  # its trace drew random numbers on the host (_HostDraws)
        self.__name__ = name
        self.__wrapped__ = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hooks.on_call(self, args, kwargs)

    def __get__(self, obj: Any, owner: Any = None) -> Any:  # a jitted method
        if obj is None:
            return self
        import functools

        return functools.partial(self.__call__, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


class _HostDraws:
    """``jax.random.normal`` / ``uniform`` / ``bernoulli`` drawn from torch's CPU generator while
    ``hooks.drawing`` (see the module docstring); jax.random's own before that."""

    _DROPOUT_CALLERS = ("torch_dropout",)

    def __init__(self, hooks: JaxHooks) -> None:
        from jax.experimental import io_callback

        self.hooks = hooks
        self.io_callback = io_callback  # the real one: the verifier's draws are no host callback of the port

    def install(self) -> None:
        import jax

        for kind in ("normal", "uniform", "bernoulli"):
            real = getattr(jax.random, kind)
            setattr(jax.random, kind, getattr(self, f"_{kind}")(real))

    def _draw(self, sampler: str, shape: tuple, dtype: Any) -> Any:
        """``torch.<sampler>(shape)`` in DTYPE's precision, on the host when the program runs there."""
        import jax
        import numpy as np
        import torch

        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        wide = torch.float64 if dtype == np.float64 else torch.float32
        self.hooks.draws += 1

        def draw() -> Any:
            return getattr(torch, sampler)(shape, dtype=wide).numpy().astype(dtype)

        value = self.io_callback(draw, jax.ShapeDtypeStruct(shape, dtype), ordered=True)
        if self.hooks.depth == 0:
            jax.block_until_ready(value)
        return value

    @staticmethod
    def _float(dtype: Any) -> Any:
        import jax.numpy as jnp

        return jnp.dtype(dtype) if dtype is not None else jnp.dtype(jnp.zeros(()).dtype)

    def _normal(self, real: Callable) -> Callable:
        def normal(key: Any, shape: Any = (), dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not self.hooks.drawing or args or not _placement_only(kwargs):
                return real(key, shape, *((dtype,) if dtype is not None else ()), *args, **kwargs)
            return self._draw("randn", shape, self._float(dtype))

        return normal

    def _uniform(self, real: Callable) -> Callable:
        def uniform(key: Any, shape: Any = (), dtype: Any = None, minval: Any = 0.0, maxval: Any = 1.0,
                    **kwargs: Any) -> Any:
            if not self.hooks.drawing or not _placement_only(kwargs):
                return real(key, shape, *((dtype,) if dtype is not None else ()), minval=minval, maxval=maxval,
                            **kwargs)
            dtype = self._float(dtype)
            return minval + (maxval - minval) * self._draw("rand", shape, dtype)

        return uniform

    def _bernoulli(self, real: Callable) -> Callable:
        def bernoulli(key: Any, p: Any = 0.5, shape: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not self.hooks.drawing or args or not _placement_only(kwargs):
                return real(key, p, shape, *args, **kwargs)
            import jax.numpy as jnp

            p = jnp.asarray(p)
            noise = self._draw("rand", shape if shape is not None else p.shape, self._float(None))
            if _dropout_caller():
                return noise >= 1.0 - p  # the original's dropout keeps rand >= rate
            return noise < p

        return bernoulli


def _placement_only(kwargs: dict) -> bool:
    """KWARGS only place the result (``out_sharding=None`` or a sharding, which a host draw on
    one device has no use for); else the draw is left to jax.random."""
    return set(kwargs) <= {"out_sharding"}


def _dropout_caller() -> bool:
    """The bernoulli draw is a dropout's keep mask: called by nnx.Dropout or the port's
    torch_dropout helper."""
    frame = sys._getframe(2)
    code = frame.f_code
    return code.co_name in _HostDraws._DROPOUT_CALLERS or (
        code.co_name == "__call__" and code.co_filename.replace("\\", "/").endswith("nnx/nn/stochastic.py"))


def _cache_size(fn: Any) -> int:
    inner = getattr(fn, "jitted_fn", fn)  # nnx.jit keeps the jax.jit function here
    return inner._cache_size()


def _loss_of(result: Any) -> Any:
    """The first floating-point scalar among a step function's outputs."""
    import jax
    import jax.numpy as jnp

    leaves = jax.tree_util.tree_leaves(result)
    for size in (0, 1):
        for leaf in leaves:
            shape = getattr(leaf, "shape", None)
            if shape is None or not hasattr(leaf, "dtype") or not jnp.issubdtype(leaf.dtype, jnp.floating):
                continue
            if (size == 0 and shape == ()) or (size == 1 and int(getattr(leaf, "size", 0)) == 1):
                return leaf
    return None


def _widen(model: Any) -> None:
    """The model's floating-point variables (parameters, buffers) as float64, in place."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def wide(x: Any) -> Any:
        dtype = getattr(x, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.floating) or dtype == jnp.float64:
            return x
        return jnp.asarray(x, dtype=jnp.float64)

    if isinstance(model, nnx.Module):  # else a torch module given to nnx.Optimizer, which fails there (JX901)
        # its Variables only: a tuple of arrays kept as plain data (nnx.data: a recurrent state)
        # cannot be updated in place, and the forward rebinds it from the widened parameters
        nnx.update(model, jax.tree.map(wide, nnx.state(model, nnx.Variable)))


def _narrow_parameters(models: list) -> list[str]:
    """The parameters of MODELS whose floating dtype is narrower than float64 (by path)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    narrow = []
    for i, model in enumerate(models):
        if not isinstance(model, nnx.Module):
            continue  # a torch module given to nnx.Optimizer (JX901): no NNX parameters to read
        for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
            if not isinstance(leaf, (jax.Array, np.ndarray)):
                continue  # a torch tensor left in an nnx.Param (a draw left for a person, JX101): not JAX's to read
            dtype = leaf.dtype
            if jnp.issubdtype(dtype, jnp.floating) and dtype != jnp.float64:
                narrow.append(f"{i}:{jax.tree_util.keystr(path)} {dtype}")
    return narrow


def _loader(model: Any) -> Optional[Callable]:
    """The port's load_torch_state_dict: in the module that defines the model's class, else in
    the script."""
    for name in (type(model).__module__, "__main__"):
        fn = getattr(sys.modules.get(name), "load_torch_state_dict", None)
        if callable(fn):
            return fn
    return None
