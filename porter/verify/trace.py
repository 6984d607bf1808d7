"""Run a training script unmodified and record what it did, step by step.

    python -m porter.verify.trace --out RESULT.json [--cuda-shim] [--host-random] \\
        [--seed N] SCRIPT.py -- [script args...]

SCRIPT runs as ``__main__`` (``runpy.run_path``; ``sys.argv = [SCRIPT, *args]``; the
script's folder first on ``sys.path``; the working directory unchanged). The harness:

* keeps a ``.detach()`` reference to every tensor ``backward`` is called on
  (``torch.autograd.backward``, which ``Tensor.backward`` calls). Values are NOT read
  during the run: reading an XLA tensor is a device-to-host transfer and would distort
  the measurement. Everything is converted to floats at exit, after the last metrics
  snapshot. A non-scalar backward tensor is recorded as the sum of its elements.
* counts an optimizer step at every ``optimizer.step()``, through
  ``torch.optim.optimizer.register_optimizer_step_post_hook`` (``xm.optimizer_step`` calls
  ``optimizer.step()`` too). Each step gets the losses of the backward calls since the
  previous step (of a torch.optim step, those whose graph reaches the optimizer's
  parameters: a backward of plain tensors before it is no part of it) and the index
  (creation order) of the optimizer that stepped.
* counts a manual optimizer step (``UpdateWatch``, a TorchFunctionMode) at the first in-place
  change, after a backward pass, of a parameter no torch.optim optimizer owns (``p.data.add_``,
  ``p -= lr * p.grad``, ``p.copy_``; the parameters are the leaves of the first backward passes'
  graphs, ``p.data`` stands for ``p``); its optimizer index is -1. Gradient accumulation and an
  optimizer's own parameters changed outside its step (a weight clamp) are no steps.
* with ``--jax`` (a JAX port), counts the calls of the jitted functions that update parameters
  and measures JAX's compilations, host transfers, jit caches and host callbacks
  (``porter.verify.trace_jax``); ``--jax-weights DIR`` loads the original's initial weights,
  which ``--export-weights DIR`` writes on the original's side (``porter.verify.weights``);
  ``--reseed-at-optimizer`` seeds torch/random/numpy again as each optimizer is created.
* ``--torch-weights DIR`` (a torch port of an MXNet original, whose side
  ``porter.verify.trace_mxnet`` writes them) loads ``DIR/weights_<i>.npz`` into the model of
  the i-th torch.optim optimizer with ``load_state_dict`` as it is created; ``--no-shuffle``
  makes every DataLoader read its dataset in order (the other framework shuffles with
  another generator).
* when the script imports torch_xla, takes host-side snapshots of the cumulative
  torch_xla metrics: compilations (``CompileTime`` count), device-to-host transfers
  (``TransferFromDeviceTime`` count), graph executions launched (counters
  ``CachedCompile + UncachedCompile``) and executed CPU-fallback ops
  (``met.executed_fallback_ops()``; note that ``.item()`` shows up there as
  ``aten::_local_scalar_dense``). Reading these counters causes no transfer. A step's graph is compiled
  and run at the sync that FOLLOWS ``optimizer.step()`` (``torch_xla.sync()``,
  ``xm.mark_step()``, or the next batch of ``pl.MpDeviceLoader``), and step closures run
  there too, so the snapshot that closes step k is taken right after the first sync that
  follows step k's ``optimizer.step()`` (after its step closures); when no sync comes
  before the next ``optimizer.step()``, at that next step; for the last step, at exit.
  Per-step deltas are differences of consecutive closing snapshots (the first step's
  delta counts from zero, so it includes work done before training).

Datasets of torchvision that read or download files (MNIST, CIFAR10, ImageFolder, ...) are
replaced by deterministic synthetic data of the same form (``porter.verify.datasets``), seeded
by ``--seed`` (0 without it), so both sides of a verification see the same samples offline:
``--synthetic-size N`` samples per dataset (default 256 per ``--max-steps`` step, else 2048);
``--synthetic-image-size HxW`` sets the size of ImageFolder/ImageNet images (default 224x224);
``--real-datasets`` keeps the real classes. The record's ``notes`` name each substitution.

``--host-random`` aligns random numbers between a run on the CPU (the original under
``--cuda-shim``) and a run on an XLA device (the port): random tensors are drawn on the
CPU default generator and then moved to the requested device, so both runs consume the
same numbers in the same order (see ``HostRandomMode``). ``--seed N`` seeds
``torch``/``random``/``numpy`` before the script runs.

Python API: ``trace_script(...)`` runs this in a fresh subprocess with a timeout and
returns the record; ``compare_losses(a, b, rtol, atol)`` finds the first differing step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import runpy
import sys
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.overrides import TorchFunctionMode

from porter.verify import tpu_lowerings
from porter.verify.process import run_side, side_environment, traced_record
from porter.verify.warm import JAX_STACK, TORCH, preload_for_script

__all__ = ["trace_script", "compare_losses", "HostRandomMode", "main"]

_METRIC_KEYS = ("compiles", "transfers", "executions", "fallback_ops", "off_tpu_fallbacks")


# --- host random ---------------------------------------------------------------------


def _off_host(device: Any) -> bool:
    if device is None:
        return False
    return torch.device(device).type != "cpu"


class HostRandomMode(TorchFunctionMode):
    """Draw random numbers on the CPU default generator, then move them to the device.

    Two kinds of rewrites, so that a CPU run and an XLA run draw identical numbers:

    * Sampling with scalar parameters (``torch.randn/rand/randint/randperm``,
      ``torch.normal(float, float, size)``, ``randn_like/rand_like/randint_like``, and the
      in-place ``normal_/uniform_/random_/exponential_/bernoulli_(float p)``) is done by the
      same CPU kernel as on a CPU run and the result moved (or copied in place) to the
      tensor's device. On the CPU these calls are left alone, so the CPU run is unchanged.
    * Sampling whose parameters are tensors (``torch.bernoulli(p)``, ``Tensor.bernoulli()``,
      ``bernoulli_(p_tensor)``, ``torch.normal(mean_tensor, std)``) and dropout
      (``F.dropout`` with ``training=True``, used by ``nn.Dropout`` and
      ``nn.MultiheadAttention``) cannot read their parameters on the host without a
      transfer, so they are rewritten on EVERY device, the CPU included, in terms of
      standard noise drawn on the host: ``bernoulli(p) = (rand(shape) < p)``,
      ``normal(m, s) = m + s * randn(shape)``, ``dropout(x) = x * (rand(shape) >= p) / (1 - p)``;
      the channel dropouts (``F.dropout1d/2d/3d``: ``nn.Dropout1d/2d/3d``) the same with one
      draw per channel, ``rand(N, C, 1, ...)`` (``rand(C, 1, ...)`` for an unbatched input).
      The CPU run's random stream therefore differs from a plain CPU run, but it is the
      same in both traced runs.

    The dropout between the layers of ``nn.LSTM/GRU/RNN(dropout>0)``, drawn inside torch's
    kernel, is moved out of it: the kernel runs one layer at a time, with ``F.dropout``'s host
    draws between the layers (``_layered_rnn``).

    ``F.scaled_dot_product_attention(dropout_p>0)`` (``nn.MultiheadAttention`` with
    ``need_weights=False``, which ``nn.TransformerEncoderLayer/DecoderLayer`` pass) is computed
    as its math with the attention weights' dropout drawn as ``F.dropout``'s (``_attention``).

    ``torch.multinomial`` (``Categorical.sample``) is computed from host uniforms too
    (``_multinomial``: inverse CDF with replacement, Gumbel top-k without).

    Not covered (they keep the device's own generator): ``alpha_dropout`` and calls with an
    explicit non-CPU ``generator``. An XLA program under this mode uploads
    its random tensors each step (host-to-device) instead of generating them in the graph.

    ``float64_reference`` (a run in float64): every floating sample of a wider dtype is drawn in
    float32 and widened (the CPU kernels draw float64 from other bits of the generator than
    float32), and every float32 tensor a function returns is widened to float64 (a script's own
    ``.float()``, ``dtype=torch.float32`` or float32 NumPy data). The run computes what a float32
    run computes, from the same random numbers, without the float32 rounding: the reference
    that tells float32 noise from a real difference.
    """

    _FACTORIES = {torch.randn, torch.rand, torch.randint, torch.randperm}
    _LIKE = {torch.randn_like: torch.randn, torch.rand_like: torch.rand}
    _INPLACE = {"normal_", "uniform_", "random_", "exponential_", "bernoulli_"}
    # channel dropouts: the number of spatial dimensions of a batched input
    _CHANNEL_DROPOUT = {torch.nn.functional.dropout1d: 1, torch.nn.functional.dropout2d: 2,
                        torch.nn.functional.dropout3d: 3}

    # the kernels of nn.LSTM/GRU/RNN (torch._VF): their dropout between layers is drawn inside
    _RNN_KERNELS = {"lstm", "gru", "rnn_tanh", "rnn_relu"}

    def __init__(self, float64_reference: bool = False, init_seed: int | None = None) -> None:
        super().__init__()
        self.float64_reference = float64_reference
        # ``init_seed``: torch.nn.init's draws, and in-place samplers on a parameter's storage,
        # come from a generator of their own seeded with it, and leave the global one as it
        # was (init_apart)
        self.init_generator = None
        self.parameter_storages: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        if init_seed is not None:
            self.init_generator = torch.Generator()
            self.init_generator.manual_seed(init_seed)
            _watch_parameters(self.parameter_storages)

    def _of_a_parameter(self, tensor: torch.Tensor) -> bool:
        """``tensor`` is a parameter or its ``.data`` (the same storage): an initialisation
        written in place (`self.encoder.weight.data.uniform_(-r, r)`)."""
        if self.init_generator is None or tensor.device.type != "cpu":
            return False
        try:
            return tensor.untyped_storage().data_ptr() in self.parameter_storages
        except RuntimeError:
            return False

    def _narrowed(self, dtype: Any) -> Any:
        """The dtype to draw a sample of ``dtype`` (None: the default) in."""
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if self.float64_reference and dtype.is_floating_point and dtype.itemsize > 4:
            return torch.float32
        return dtype

    def _noise(self, sampler, shape, dtype, device, generator) -> torch.Tensor:
        drawn = self._narrowed(dtype)
        return _host_noise(sampler, shape, drawn, device, generator).to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = self._dispatch(func, args, dict(kwargs or {}))
        if self.float64_reference and not getattr(func, "__name__", "").endswith("_"):
            return _widened(out)
        return out

    def _dispatch(self, func, args, kwargs):
        name = getattr(func, "__name__", "")
        if "out" in kwargs:
            return func(*args, **kwargs)
        if getattr(func, "__module__", "") == "torch.nn.init":
            return self._init(func, args, kwargs)
        if func in self._FACTORIES or (func is torch.normal and not _has_tensor(args, kwargs)):
            device = kwargs.get("device")
            floating = func not in (torch.randint, torch.randperm)
            dtype = kwargs.get("dtype")
            if floating and self._narrowed(dtype) != (dtype or torch.get_default_dtype()):
                drawn = func(*args, **{**kwargs, "dtype": self._narrowed(dtype), "device": "cpu",
                                       "requires_grad": False})
                return _to_device(drawn.to(dtype or torch.get_default_dtype()), device or "cpu", kwargs)
            if _off_host(device):
                return _to_device(func(*args, **{**kwargs, "device": "cpu", "requires_grad": False}), device, kwargs)
            return func(*args, **kwargs)
        if func in self._LIKE or func is torch.randint_like:
            return self._like(func, args, kwargs)
        if func is torch.normal:
            return self._normal(*args, **kwargs)
        if name == "bernoulli" and args and isinstance(args[0], torch.Tensor):
            return self._bernoulli(*args, **kwargs)
        if name == "multinomial" and args and isinstance(args[0], torch.Tensor):
            return self._multinomial(*args, **kwargs)
        if name in self._INPLACE and args and isinstance(args[0], torch.Tensor):
            return self._inplace(func, name, args, kwargs)
        if func is torch.nn.functional.dropout:
            return self._dropout(*args, **kwargs)
        if func is torch.nn.functional.scaled_dot_product_attention:
            return self._attention(func, *args, **kwargs)
        if func is torch.nn.functional.multi_head_attention_forward:
            return self._multi_head_attention(func, args, kwargs)
        if name in self._RNN_KERNELS and len(args) >= 9 and not kwargs:
            return self._layered_rnn(func, args)
        if func in self._CHANNEL_DROPOUT:
            return self._channel_dropout(self._CHANNEL_DROPOUT[func], *args, **kwargs)
        return func(*args, **kwargs)

    def _init(self, func, args, kwargs):
        """``torch.nn.init.*_(tensor, ...)`` reach the mode as a whole (with ``tensor=`` as a
        keyword) and then run with the mode off: on a device tensor, initialise a CPU tensor
        of the same shape with the same function (same kernel, same draws) and copy it over."""
        kwargs = dict(kwargs)
        target = kwargs.pop("tensor") if "tensor" in kwargs else args[0]
        rest = args[1:] if args and args[0] is target else args
        if self.init_generator is not None and kwargs.get("generator") is None and _takes_generator(func):
            kwargs["generator"] = self.init_generator
        if not isinstance(target, torch.Tensor) or (
                not _off_host(target.device) and self._narrowed(target.dtype) == target.dtype):
            return func(target, *rest, **kwargs)
        sample = func(torch.empty(target.shape, dtype=self._narrowed(target.dtype)), *rest, **kwargs)
        with torch.no_grad():
            return target.copy_(sample)

    def _like(self, func, args, kwargs):
        source, bounds = args[0], tuple(args[1:])
        device = kwargs.get("device")
        device = source.device if device is None else device
        dtype = kwargs.get("dtype") or source.dtype
        narrow = func is not torch.randint_like and self._narrowed(dtype) != dtype
        if not _off_host(device) and not narrow:
            return func(*args, **kwargs)
        layout = {"dtype": self._narrowed(dtype) if narrow else dtype, "device": "cpu",
                  "generator": kwargs.get("generator")}
        if func is torch.randint_like:
            if "high" in kwargs:
                bounds = (bounds[0] if bounds else kwargs.get("low", 0), kwargs["high"])
            value = torch.randint(*bounds, tuple(source.shape), **layout)
        else:
            value = HostRandomMode._LIKE[func](tuple(source.shape), **layout)
        return _to_device(value.to(dtype), device, kwargs)

    def _inplace(self, func, name, args, kwargs):
        target = args[0]
        if name == "bernoulli_" and (
            (len(args) > 1 and isinstance(args[1], torch.Tensor)) or isinstance(kwargs.get("p"), torch.Tensor)
        ):
            p = args[1] if len(args) > 1 else kwargs["p"]
            dtype = torch.promote_types(p.dtype, torch.float32)
            noise = self._noise(torch.rand, target.shape, dtype, target.device, kwargs.get("generator"))
            with torch.no_grad():
                return target.copy_((noise < p).to(target.dtype))
        if kwargs.get("generator") is None and self._of_a_parameter(target):
            kwargs = {**kwargs, "generator": self.init_generator}
        if not _off_host(target.device) and self._narrowed(target.dtype) == target.dtype:
            return func(*args, **kwargs)
        sample = func(torch.empty(target.shape, dtype=self._narrowed(target.dtype)), *args[1:], **kwargs)
        with torch.no_grad():
            return target.copy_(sample)

    def _bernoulli(self, source, p=None, *, generator=None, **kwargs):
        probs = source if p is None else p
        if not isinstance(probs, torch.Tensor):
            probs = torch.tensor(probs, dtype=source.dtype, device=source.device)
        noise = self._noise(torch.rand, source.shape, probs.dtype, source.device, generator)
        return (noise < probs).to(source.dtype)

    def _multinomial(self, input, num_samples, replacement=False, *, generator=None):
        """``torch.multinomial`` (``Categorical.sample``, a sampler's draws) from host uniforms:
        with replacement (or one sample), each draw is the first category whose cumulative
        probability exceeds its uniform; without, the ``num_samples`` largest of log-probability
        plus Gumbel noise (distinct categories, drawn as torch's sequential draws are)."""
        probs = input / input.sum(-1, keepdim=True)
        batch = tuple(input.shape[:-1])
        if replacement or num_samples == 1:
            u = self._noise(torch.rand, (*batch, num_samples), probs.dtype, input.device, generator)
            below = (probs.cumsum(-1).unsqueeze(-2) <= u.unsqueeze(-1)).sum(-1)
            return below.clamp(max=input.size(-1) - 1).to(torch.long)
        u = self._noise(torch.rand, tuple(input.shape), probs.dtype, input.device, generator)
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-20)))
        return torch.topk(torch.log(probs) + gumbel, num_samples, dim=-1).indices

    def _normal(self, mean, std=1.0, *args, generator=None, **kwargs):
        like = mean if isinstance(mean, torch.Tensor) else std
        shape = torch.broadcast_shapes(
            tuple(mean.shape) if isinstance(mean, torch.Tensor) else (),
            tuple(std.shape) if isinstance(std, torch.Tensor) else (),
        )
        noise = self._noise(torch.randn, shape, like.dtype, like.device, generator)
        return mean + std * noise

    def _layered_rnn(self, func, args):
        """A multi-layer RNN kernel call that drops out between its layers in training, run one
        layer at a time with the dropout drawn on the host in between (torch drops out each
        layer's output but the last's). The noise is drawn time-major, (T, N, features), as
        the JAX port's TorchLSTM/TorchGRU draw theirs, whatever ``batch_first``."""
        packed = isinstance(args[1], torch.Tensor) and not args[1].is_floating_point()  # batch_sizes
        if packed:
            data, batch_sizes, hx, params, bias, layers, p, train, bidirectional = args[:9]
            batch_first = False
        else:
            data, hx, params, bias, layers, p, train, bidirectional, batch_first = args[:9]
        if not train or not p or layers < 2:
            return func(*args)
        directions = 2 if bidirectional else 1
        per_layer = len(params) // layers
        states = list(hx) if isinstance(hx, (tuple, list)) else [hx]
        outputs: list[list[torch.Tensor]] = [[] for _ in states]
        x = data
        for k in range(layers):
            weights = params[k * per_layer:(k + 1) * per_layer]
            h = [t[k * directions:(k + 1) * directions] for t in states]
            h_k = tuple(h) if isinstance(hx, (tuple, list)) else h[0]
            if packed:
                out = func(x, batch_sizes, h_k, weights, bias, 1, 0.0, train, bidirectional)
            else:
                out = func(x, h_k, weights, bias, 1, 0.0, train, bidirectional, batch_first)
            x = out[0]
            for kept, t in zip(outputs, out[1:]):
                kept.append(t)
            if k < layers - 1:
                x = (self._dropout(x.transpose(0, 1), p).transpose(0, 1) if batch_first and x.dim() == 3
                     else self._dropout(x, p))
        return (x, *[torch.cat(kept, 0) for kept in outputs])

    def _channel_dropout(self, spatial, input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        if p == 1.0:
            return input.mul_(0.0) if inplace else input * 0.0
        shape = _channel_dropout_shape(input.shape, spatial)
        noise = self._noise(torch.rand, shape, input.dtype, input.device, None)
        keep = (noise >= p).to(input.dtype)
        if inplace:
            return input.mul_(keep).div_(1.0 - p)
        return input * keep / (1.0 - p)

    def _dropout(self, input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        if p == 1.0:
            return input.mul_(0.0) if inplace else input * 0.0
        noise = self._noise(torch.rand, input.shape, input.dtype, input.device, None)
        keep = (noise >= p).to(input.dtype)
        if inplace:
            return input.mul_(keep).div_(1.0 - p)
        return input * keep / (1.0 - p)


    def _multi_head_attention(self, func, args, kwargs):
        """``F.multi_head_attention_forward`` (``nn.MultiheadAttention``) reaches the mode as a
        whole, and what it calls then runs with the mode off: its attention dropout
        (``F.dropout`` of the weights with ``need_weights=True``, ``scaled_dot_product_attention``
        with ``need_weights=False``) would keep the device's generator. It runs here with the mode
        on again for what it calls; its own torch-function check (the one plain
        ``has_torch_function`` call of torch.nn.functional, torch 2.9) is skipped for that call."""
        functional = torch.nn.functional
        check = functional.has_torch_function
        functional.has_torch_function = lambda ops: False
        try:
            with self:
                return func(*args, **kwargs)
        finally:
            functional.has_torch_function = check

    def _attention(self, func, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        """``F.scaled_dot_product_attention`` with ``dropout_p > 0`` (``nn.MultiheadAttention`` with
        ``need_weights=False``, as ``nn.TransformerEncoderLayer`` calls it, and attention written
        with it) draws its mask inside the kernel: computed here as its documented math, the
        attention weights' dropout by ``_dropout``'s host draws. Without dropout the kernel runs."""
        if not dropout_p:
            return func(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        if enable_gqa:
            key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
            value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
        weights = query @ key.transpose(-2, -1) * (query.size(-1) ** -0.5 if scale is None else scale)
        if is_causal:
            causal = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
            weights = weights.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            weights = (weights.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                       else weights + attn_mask)
        return self._dropout(torch.softmax(weights, dim=-1), dropout_p) @ value


def _channel_dropout_shape(shape: Sequence[int], spatial: int) -> tuple:
    """The noise shape of a channel dropout: one draw per (sample, channel), or per channel for
    an unbatched input (one dimension fewer than a batched one)."""
    shape = tuple(shape)
    batched = len(shape) >= spatial + 2
    kept = 2 if batched else 1
    return shape[:kept] + (1,) * (len(shape) - kept)


def _watch_parameters(storages: "weakref.WeakValueDictionary[int, torch.Tensor]") -> None:
    """Remember the storage of every nn.Parameter made from now on (by its data pointer)."""
    original_new = torch.nn.Parameter.__new__

    def new(cls, data=None, requires_grad=True):
        param = original_new(cls, data, requires_grad)
        try:
            storages[param.untyped_storage().data_ptr()] = param
        except RuntimeError:  # a storage-less tensor (meta, XLA)
            pass
        return param

    torch.nn.Parameter.__new__ = staticmethod(new)


def _takes_generator(func: Any) -> bool:
    import inspect

    try:
        return "generator" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def _widened(value: Any) -> Any:
    """``value`` with its float32 tensors (not parameters; in tuples and lists too) as float64;
    a leaf that requires grad stays a leaf."""
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        widened = [_widened(v) for v in value]
        return type(value)(widened) if type(value) in (tuple, list) else value
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or isinstance(value, torch.nn.Parameter):
        return value
    if value.is_leaf and value.requires_grad:
        return value.detach().to(torch.float64).requires_grad_(True)
    return value.to(torch.float64)


def _has_tensor(args: Sequence[Any], kwargs: dict) -> bool:
    return any(isinstance(a, torch.Tensor) for a in list(args) + list(kwargs.values()))


def _host_noise(sampler, shape, dtype, device, generator) -> torch.Tensor:
    noise = sampler(tuple(shape), dtype=dtype, device="cpu", generator=generator)
    return noise if not _off_host(device) else noise.to(device)


def _to_device(value: torch.Tensor, device: Any, kwargs: dict) -> torch.Tensor:
    value = value.to(device)
    if kwargs.get("requires_grad"):
        value.requires_grad_(True)
    return value


# --- recording ---------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.pending: list[torch.Tensor] = []
        self.pending_leaves: list[dict[int, weakref.ref]] = []  # the leaves of each pending tensor's graph
        self.steps: list[dict[str, Any]] = []
        self.optimizers: list[weakref.ref] = []
        self.met: Any = None
        self.xla_seen = False
        self.max_steps: int | None = None
        self.printed: set[int] = set()  # steps during which the script wrote output (logging steps)
        # manual optimizer steps: in-place updates of parameters no torch.optim optimizer owns
        self.params: dict[int, weakref.ref] = {}  # id -> parameter (leaves of the backward graphs)
        self.aliases: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
        self.owned: set[int] = set()  # ids of the parameters of the script's torch.optim optimizers
        self.in_step = 0  # > 0 while a torch.optim optimizer's step() runs
        self.backwards = 0
        self.jax: Any = None  # porter.verify.trace_jax.JaxHooks when the port runs on JAX
        self.on_optimizer_hooks: list = []  # callables(optimizer) run when an optimizer is created
        # callables(leaves) -> whether they found a model: run at each backward of a script that
        # has created no torch.optim optimizer (its updates are manual), with the parameters and
        # tensors its loss reaches, until one finds the model
        self.on_manual_hooks: list = []
        self.manual_model_seen = False

    # -- torch_xla metrics (host-side counters only) --
    def xla(self) -> Any:
        """The torch_xla metrics module once the script has imported torch_xla, else None."""
        if self.met is None and sys.modules.get("torch_xla.core.xla_model") is not None:
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met

            original = xm._run_step_closures

            def _run_step_closures(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                self.on_sync()
                return result

            xm._run_step_closures = _run_step_closures
            self.met = met
        return self.met

    def snapshot(self) -> dict[str, int] | None:
        if self.jax is not None:
            return self.jax.snapshot()
        met = self.xla()
        if met is None:
            return None
        compile_time = met.metric_data("CompileTime")
        transfers = met.metric_data("TransferFromDeviceTime")
        return {
            "compiles": compile_time[0] if compile_time else 0,
            "transfers": transfers[0] if transfers else 0,
            # Graphs launched: every launch first looks its graph up in the compile cache.
            # (The ExecuteTime metric is recorded when an asynchronous execution ends, so
            # it can land after the sync that launched it.)
            "executions": (met.counter_value("CachedCompile") or 0) + (met.counter_value("UncachedCompile") or 0),
            "fallback_ops": len(met.executed_fallback_ops()),
            # calls of fallbacks a TPU would not take: one transfer each (porter.verify.tpu_lowerings)
            "off_tpu_fallbacks": tpu_lowerings.off_tpu_calls(met),
        }

    def close_open_step(self) -> None:
        if self.steps and self.steps[-1]["xla"] is None:
            self.steps[-1]["xla"] = self.snapshot()

    def on_sync(self) -> None:
        self.close_open_step()
        if self.max_steps is not None and len(self.steps) >= self.max_steps:
            raise StopTrace(f"stopped after {self.max_steps} optimizer steps (--max-steps)")

    def on_output(self) -> None:
        """Output belongs to the open step (step closures print at the sync closing it), or
        to the step about to start."""
        open_step = bool(self.steps) and self.steps[-1]["xla"] is None
        self.printed.add(len(self.steps) - 1 if open_step else len(self.steps))

    # -- hooks --
    def on_backward(self, tensors: Any) -> None:
        self.xla()
        if isinstance(tensors, torch.Tensor):
            tensors = (tensors,)
        self.backwards += 1
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                self.pending.append(tensor.detach())
                # the parameters a manual update may change: the first backward passes' leaves
                self.pending_leaves.append(self._track_leaves(tensor, register=self.backwards <= 3))
                if not self.optimizers and not self.manual_model_seen and self.on_manual_hooks:
                    leaves = [ref() for ref in self.pending_leaves[-1].values()]
                    self.manual_model_seen = any([hook(leaves) for hook in self.on_manual_hooks])

    def _track_leaves(self, tensor: torch.Tensor, register: bool = True) -> dict[int, weakref.ref]:
        """The leaves of the tensor's graph (id -> weak reference: a freed leaf's id is reused);
        ``register``: also remembered as the parameters a manual update may change."""
        leaves: dict[int, weakref.ref] = {}
        seen: dict[int, Any] = {}  # the nodes kept alive: a freed wrapper's id is reused
        todo = [tensor.grad_fn] if tensor.grad_fn is not None else []
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            leaf = getattr(node, "variable", None)
            if isinstance(leaf, torch.Tensor):
                leaves[id(leaf)] = weakref.ref(leaf)
                if register:
                    self.params.setdefault(id(leaf), weakref.ref(leaf))
            todo.extend(n for n, _ in node.next_functions)
        return leaves

    def tracked(self, tensor: Any) -> bool:
        """Whether TENSOR is a parameter (or its ``.data``) that no torch.optim optimizer owns."""
        key = id(tensor)
        if key in self.aliases and self.aliases[key] is tensor:
            return True
        ref = self.params.get(key)
        return ref is not None and ref() is tensor and key not in self.owned

    def on_data(self, param: Any, alias: Any) -> None:
        if isinstance(alias, torch.Tensor) and self.tracked(param):
            self.aliases[id(alias)] = alias

    def on_parameter_update(self) -> None:
        """An in-place change of a parameter outside any optimizer's step(): the first one after
        a backward pass is a manual optimizer step (``p.data.add_(p.grad, alpha=-lr)``,
        ``p -= lr * p.grad`` under no_grad); gradient accumulation (several backward passes, no
        update) is not."""
        if self.in_step or not self.pending:
            return
        self.on_step(None, (), {})

    def on_optimizer_created(self, optimizer: Any) -> None:
        self.optimizers.append(weakref.ref(optimizer))
        self._own(optimizer)
        for hook in self.on_optimizer_hooks:
            hook(optimizer)

    def _own(self, optimizer: Any) -> None:
        for group in getattr(optimizer, "param_groups", ()):
            self.owned.update(id(p) for p in group.get("params", ()))

    def on_step_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_step += 1

    def on_step_end(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.in_step = max(0, self.in_step - 1)
        self._own(optimizer)
        self.on_step(optimizer, args, kwargs)

    def optimizer_index(self, optimizer: Any) -> int:
        if optimizer is None:
            return -1  # a manual update
        if isinstance(optimizer, str):
            return optimizer  # a JAX port's step function, by name
        for index, ref in enumerate(self.optimizers):
            if ref() is optimizer:
                return index
        self.optimizers.append(weakref.ref(optimizer))
        return len(self.optimizers) - 1

    def _step_losses(self, optimizer: Any) -> list:
        """The pending backward tensors that are this torch.optim optimizer's step: those whose
        graph reaches one of its parameters (a backward of plain tensors before the step, as a
        tutorial's autograd demonstration, gives them no gradient); all of them for a manual
        update or a JAX step, or where none reaches the parameters."""
        if optimizer is None or isinstance(optimizer, str) or not hasattr(optimizer, "param_groups"):
            return self.pending
        own = {id(p): p for group in optimizer.param_groups for p in group.get("params", ())}

        def reaches(leaves: dict) -> bool:
            return not leaves or any(key in own and ref() is own[key] for key, ref in leaves.items())

        kept = [t for t, leaves in zip(self.pending, self.pending_leaves) if reaches(leaves)]
        return kept or self.pending

    def on_step(self, optimizer: Any, args: Any, kwargs: Any, losses: list | None = None) -> None:
        self.close_open_step()  # no sync since the previous step: it ends here
        self.steps.append(
            {
                "optimizer": self.optimizer_index(optimizer),
                "losses": self._step_losses(optimizer) + list(losses or []),
                "time_s": time.perf_counter() - self.t0,
                "xla": None,
            }
        )
        self.pending = []
        self.pending_leaves = []
        if self.max_steps is not None and len(self.steps) > self.max_steps:
            self.steps.pop()  # the step after the last one asked for: not part of the record
            raise StopTrace(f"stopped after {self.max_steps} optimizer steps (--max-steps)")

    # -- result --
    def finish(self) -> dict[str, Any]:
        self.close_open_step()
        final = self.snapshot()
        notes: list[str] = []
        tensors = [t for step in self.steps for t in step["losses"]] + self.pending
        try:
            values = _to_floats(tensors)
        except Exception as error:  # a broken device must not lose the rest of the record
            notes.append(f"loss values could not be read: {type(error).__name__}: {error}")
            values = [None] * len(tensors)
        steps: list[dict[str, Any]] = []
        previous = dict.fromkeys(_METRIC_KEYS, 0)
        position = 0
        for index, step in enumerate(self.steps):
            count = len(step["losses"])
            record = {
                "step": index,
                "optimizer": step["optimizer"],
                "losses": values[position : position + count],
                "time_s": step["time_s"],
                "printed": index in self.printed,
            }
            position += count
            if step["xla"] is not None:
                record["xla"] = step["xla"]
                record["xla_delta"] = {k: step["xla"][k] - previous[k] for k in _METRIC_KEYS}
                previous = step["xla"]
            steps.append(record)
        result: dict[str, Any] = {
            "num_steps": len(steps),
            "optimizers_created": len(self.optimizers),
            "steps": steps,
            "losses": [s["losses"] for s in steps],
            "unstepped_losses": values[position:],
            "notes": notes,
        }
        if final is not None and self.jax is not None:
            result["xla"] = {"final": final, "execute_time_count": final["executions"], "fallback_ops": []}
            result["jax"] = self.jax.summary()
            with_xla = [s for s in steps if "xla_delta" in s]
            for key in _METRIC_KEYS:
                result[f"{key}_per_step"] = [s["xla_delta"][key] for s in with_xla]
        elif final is not None:
            with_xla = [s for s in steps if "xla_delta" in s]
            execute_time = self.met.metric_data("ExecuteTime")
            result["xla"] = {
                "final": final,
                "execute_time_count": execute_time[0] if execute_time else 0,
                "fallback_ops": list(self.met.executed_fallback_ops()),
            }
            for key in _METRIC_KEYS:
                result[f"{key}_per_step"] = [s["xla_delta"][key] for s in with_xla]
        else:
            result["xla"] = None
        return result


_DATA_DESCRIPTOR = torch._C.TensorBase.__dict__["data"]


class UpdateWatch(TorchFunctionMode):
    """Sees in-place changes of parameters outside an optimizer's ``step()`` (a manual update:
    ``p.data.add_(p.grad, alpha=-lr)``, ``p -= lr * p.grad``, ``p.copy_(...)``,
    ``p.data = p.data - lr * p.grad``) and tells the
    recorder. ``p.data`` is followed: the tensor it returns stands for ``p``."""

    def __init__(self, recorder: "_Recorder") -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        recorder = self.recorder
        if not args or not recorder.params:
            return result
        if getattr(func, "__self__", None) is _DATA_DESCRIPTOR:
            if getattr(func, "__name__", "") == "__set__":  # `p.data = p.data - lr * p.grad`
                if recorder.tracked(args[0]):
                    recorder.on_parameter_update()
            else:
                recorder.on_data(args[0], result)
            return result
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.startswith("_") and recorder.tracked(args[0]):
            recorder.on_parameter_update()
        return result


class StopTrace(BaseException):
    """Ends the traced script after --max-steps optimizer steps (a BaseException, so that the
    script's own ``except Exception`` handlers do not swallow it)."""


class _CountingStream:
    def __init__(self, stream: Any, recorder: "_Recorder") -> None:
        self._stream = stream
        self._recorder = recorder

    def write(self, text: str) -> int:
        if text.strip():
            self._recorder.on_output()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _to_floats(tensors: list[Any]) -> list[float]:
    import numpy

    arrays = {id(t): numpy.asarray(t, dtype=numpy.float64) for t in tensors if not isinstance(t, torch.Tensor)}
    tensors_only = [t for t in tensors if isinstance(t, torch.Tensor)]
    off_host = [t for t in tensors_only if t.device.type != "cpu"]
    on_host: dict[int, torch.Tensor] = {}
    if off_host:
        try:
            import torch_xla.core.xla_model as xm

            converted = xm._maybe_convert_to_cpu(off_host)
        except Exception:
            converted = [t.cpu() for t in off_host]
        on_host = {id(t): c for t, c in zip(off_host, converted)}
    values = []
    for tensor in tensors:
        if id(tensor) in arrays:  # a JAX port's loss
            a = arrays[id(tensor)]
            values.append(float(a.sum()) if a.size != 1 else float(a.reshape(())))
            continue
        host = on_host.get(id(tensor), tensor)
        values.append(float(host.double().sum()) if host.numel() != 1 else float(host.reshape(())))
    return values


# --- running -----------------------------------------------------------------------


def _script_traceback(error: BaseException, script: str) -> str:
    tb = error.__traceback__
    cursor = tb
    while cursor is not None and os.path.abspath(cursor.tb_frame.f_code.co_filename) != script:
        cursor = cursor.tb_next
    return "".join(traceback.format_exception(type(error), error, cursor if cursor is not None else tb))


def run(
    script: str,
    args: Sequence[str],
    *,
    cuda_shim: bool = False,
    host_random: bool = False,
    seed: int | None = None,
    dtype: str | None = None,
    max_steps: int | None = None,
    legacy_xla: bool = False,
    synthetic_data: bool = True,
    synthetic_size: int | None = None,
    synthetic_image_size: tuple[int, int] | None = None,
    export_weights: str | None = None,
    jax_weights: str | None = None,
    jax: bool = False,
    reseed_at_optimizer: bool = False,
    torch_weights: str | None = None,
    no_shuffle: bool = False,
    float64_reference: bool = False,
    init_apart: bool = False,
    jax_first: bool = False,
) -> tuple[dict[str, Any], int]:
    """Run SCRIPT in this process and return (record, exit code).

    ``dtype`` ("float64") sets torch's default floating dtype before the script runs, so
    parameters and data it creates without an explicit dtype use it. ``float64_reference`` (with
    ``host_random`` and float64): random samples drawn in float32 and float32 tensors widened
    (HostRandomMode): the float32 run's computation without its rounding. ``init_apart`` (with
    ``host_random``): torch.nn.init draws from a generator of its own, so a model's
    initialisation leaves the global stream where a JAX port's (drawn from nnx.Rngs) leaves it."""
    script = os.path.abspath(script)
    recorder = _Recorder()
    recorder.max_steps = max_steps
    import torch.autograd
    import torch.optim.optimizer as optim_mod

    if dtype is not None:
        torch.set_default_dtype(getattr(torch, dtype))

    original_backward = torch.autograd.backward

    def backward(tensors: Any, *b_args: Any, **b_kwargs: Any) -> Any:
        # torch_xla's own backward passes are no loss of the script: its scan (the nn.GRU it
        # puts in torch's place) traces the step's backward graph with one
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("torch_xla."):
            recorder.on_backward(tensors)
        return original_backward(tensors, *b_args, **b_kwargs)

    original_init = optim_mod.Optimizer.__init__

    def optimizer_init(self: Any, *o_args: Any, **o_kwargs: Any) -> None:
        original_init(self, *o_args, **o_kwargs)
        recorder.on_optimizer_created(self)

    torch.autograd.backward = backward
    optim_mod.Optimizer.__init__ = optimizer_init
    optim_mod.register_optimizer_step_pre_hook(recorder.on_step_start)
    optim_mod.register_optimizer_step_post_hook(recorder.on_step_end)
    exported: list[str] = []
    if export_weights is not None:
        from porter.verify import weights as weights_mod

        recorder.on_optimizer_hooks.append(
            lambda optimizer: exported.append(weights_mod.export(optimizer, export_weights, len(exported))))

        def export_manual(leaves: list) -> bool:
            # a script that updates its parameters by hand: the model its first loss of a module's
            # parameters reaches, as the weights of the port's first optimizer (the update comes
            # after the backward); a backward of plain tensors exports nothing (the next
            # optimizer's weights are still weights_0)
            model = weights_mod.model_with(leaves)
            if model is not None:
                exported.append(weights_mod.export_model(model, export_weights, 0, "manual updates"))
            return model is not None

        recorder.on_manual_hooks.append(export_manual)
    if reseed_at_optimizer and seed is not None:
        recorder.on_optimizer_hooks.append(lambda optimizer: _reseed(seed))
    loaded: list[str] = []
    if torch_weights is not None:
        from porter.verify import weights as weights_mod

        recorder.on_optimizer_hooks.append(
            lambda optimizer: loaded.append(weights_mod.load_into(optimizer, torch_weights, len(loaded))))
    if no_shuffle:
        _no_shuffle()
    if jax:
        from porter.verify import trace_jax

        recorder.jax = trace_jax.JaxHooks(recorder, jax_weights, seed if reseed_at_optimizer else None, _reseed,
                                          x64=dtype == "float64", host_random=host_random)
        recorder.jax.install()
    UpdateWatch(recorder).__enter__()

    host_mode = None
    if host_random:
        host_mode = HostRandomMode(float64_reference=float64_reference,
                                   init_seed=(seed or 0) if init_apart else None)
        host_mode.__enter__()
    if legacy_xla:
        from porter.verify import legacy_xla as legacy

        legacy.install()
    shim = None
    if cuda_shim:
        from porter.verify import cuda_shim as shim

        shim.install()
    synthetic = None
    if synthetic_data:
        from porter.verify import datasets as synthetic

        if synthetic_size is None:
            synthetic_size = synthetic.default_size(max_steps)
        synthetic.install(synthetic_size, seed if seed is not None else 0, synthetic_image_size)
    if jax_first and not jax:
        _import_jax_first()
    if seed is not None:
        _reseed(seed)

    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    status, exit_code, exception = "ok", 0, None
    ended_by = "end"  # how a run without an error ended: "end" of the script, "exit" (SystemExit 0), "stop" (--max-steps)
    start = time.perf_counter()
    recorder.t0 = start
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _CountingStream(sys.stdout, recorder), _CountingStream(sys.stderr, recorder)
    try:
        runpy.run_path(script, run_name="__main__")
    except StopTrace:
        status, exit_code, ended_by = "ok", 0, "stop"
    except SystemExit as error:
        code = error.code
        if code is None or code == 0:
            status, exit_code, ended_by = "ok", 0, "exit"
        else:
            status = "exit"
            exit_code = code if isinstance(code, int) else 1
            exception = {"type": "SystemExit", "message": str(code), "traceback": _script_traceback(error, script)}
    except BaseException as error:  # the record must say what happened, whatever it was
        status, exit_code = "error", 1
        exception = {"type": type(error).__name__, "message": str(error), "traceback": _script_traceback(error, script)}
    finally:
        sys.stdout, sys.stderr = streams
    wall = time.perf_counter() - start
    record = recorder.finish()
    record.update(
        {
            "script": script,
            "args": list(args),
            "cuda_shim": cuda_shim,
            "host_random": host_random,
            "seed": seed,
            "dtype": dtype or str(torch.get_default_dtype()).removeprefix("torch."),
            "status": status,
            "exit_code": exit_code,
            "ended_by": ended_by if status == "ok" else None,
            "exception": exception,
            "wall_time_s": wall,
            "torch_xla_imported": sys.modules.get("torch_xla") is not None,
        }
    )
    if export_weights is not None:
        record["exported_weights"] = exported
    if torch_weights is not None:
        record["weights_loaded"] = loaded
    if no_shuffle:
        record["notes"].append("torch.utils.data.DataLoader(shuffle=True) read its dataset in order (--no-shuffle)")
    if synthetic is not None:
        record["synthetic_datasets"] = synthetic.notes()
        record["notes"] = synthetic.notes() + record["notes"]
    if shim is not None:
        record["notes"] = shim.notes() + record["notes"]
    return record, exit_code


def _no_shuffle() -> None:
    """Every torch DataLoader reads its dataset in order (``shuffle=True`` made False): the
    other side of a comparison across frameworks shuffles with another generator."""
    import inspect

    import torch.utils.data as data

    real = data.DataLoader.__init__
    signature = inspect.signature(real)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        if bound.arguments.get("shuffle"):
            bound.arguments["shuffle"] = False
        real(*bound.args, **bound.kwargs)

    data.DataLoader.__init__ = init


def _reseed(seed: int) -> None:
    """Seed torch, random and numpy (before the script, and where both sides of a comparison
    of frameworks that build their models differently must continue from the same state)."""
    import random

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def _image_size(text: str) -> tuple[int, int]:
    """'HxW' or 'N' (square) -> (H, W)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"image size {text!r}: give HxW (e.g. 224x224) or one number")
    return parts[0], parts[1]


_JAX_FIRST = ("jax",) if importlib.util.find_spec("jax") is not None else ()


def _import_jax_first() -> None:
    """Import jax (where it is installed) before a torch side's script runs (``--jax-first``:
    both sides of a comparison whose port or original imports torch_xla). jax draws 13
    numbers from numpy's global generator as it is imported (the default arguments of a retry
    decorator in jax/_src/clusters/k8s_cluster.py: ``np.random.rand(5)``, ``np.random.rand(8)``),
    and torch_xla imports jax lazily, from the thread of its MpDeviceLoader
    (``torch_xla.debug.profiler.Trace`` -> ``maybe_get_jax``), after the script has seeded
    numpy: the port's ``np.random`` draws after its first batch were 13 numbers further along
    numpy's stream than the original's (measured: a mixup script's first ``np.random.beta`` gave
    0.929 in the port, 0.449 in the original). Imported first on both sides, jax has drawn its
    numbers before the script seeds numpy, so the seeded streams agree."""
    if _JAX_FIRST:
        import jax  # noqa: F401


def main(argv: Sequence[str] | None = None) -> int:
    own, script_args = _split_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m porter.verify.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the JSON record")
    parser.add_argument("--cuda-shim", action="store_true", help="run CUDA code on the CPU (original scripts only)")
    parser.add_argument("--host-random", action="store_true", help="draw random numbers on the CPU generator")
    parser.add_argument("--seed", type=int, default=None, help="seed torch/random/numpy before the script")
    parser.add_argument("--dtype", choices=("float32", "float64"), default=None,
                        help="torch's default floating dtype for the run")
    parser.add_argument("--legacy-xla", action="store_true",
                        help="put back torch_xla names removed since 2.6 (originals already on old torch_xla)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop the script after this many optimizer steps")
    parser.add_argument("--synthetic-size", type=int, default=None,
                        help="samples in each synthetic stand-in for a torchvision dataset (default 256 per --max-steps step)")
    parser.add_argument("--synthetic-image-size", type=_image_size, default=None, metavar="HxW",
                        help="size of the synthetic ImageFolder/ImageNet images (default 224x224)")
    parser.add_argument("--real-datasets", action="store_true",
                        help="keep torchvision's datasets as they are (they read local files or download)")
    parser.add_argument("--export-weights", default=None, metavar="DIR",
                        help="write the initial weights of each optimizer's model to DIR (weights_<i>.npz)")
    parser.add_argument("--jax", action="store_true", help="the script is a JAX port: count its jitted steps")
    parser.add_argument("--jax-weights", default=None, metavar="DIR",
                        help="load DIR/weights_<i>.npz into the model of the i-th nnx.Optimizer (the port's "
                             "load_torch_state_dict)")
    parser.add_argument("--reseed-at-optimizer", action="store_true",
                        help="seed torch/random/numpy again as each optimizer is created")
    parser.add_argument("--torch-weights", default=None, metavar="DIR",
                        help="load DIR/weights_<i>.npz into the model of the i-th torch.optim optimizer "
                             "(load_state_dict) as it is created")
    parser.add_argument("--no-shuffle", action="store_true", help="DataLoaders read their datasets in order")
    parser.add_argument("--float64-reference", action="store_true",
                        help="with --host-random and --dtype float64: draw random samples in float32 and widen "
                             "them, and widen every float32 tensor (a float64 run that computes what a float32 run "
                             "computes)")
    parser.add_argument("--jax-first", action="store_true",
                        help="import jax before the script runs (_import_jax_first)")
    parser.add_argument("--init-apart", action="store_true",
                        help="with --host-random: torch.nn.init draws from a generator of its own (seeded with "
                             "--seed), leaving the global generator as it was")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for SCRIPT (or after --)")
    options = parser.parse_args(own)
    script_args = [*options.script_args, *script_args]
    record, exit_code = run(
        options.script, script_args, cuda_shim=options.cuda_shim, host_random=options.host_random, seed=options.seed,
        dtype=options.dtype, max_steps=options.max_steps, legacy_xla=options.legacy_xla,
        synthetic_data=not options.real_datasets, synthetic_size=options.synthetic_size,
        synthetic_image_size=options.synthetic_image_size, export_weights=options.export_weights,
        jax=options.jax, jax_weights=options.jax_weights, reseed_at_optimizer=options.reseed_at_optimizer,
        torch_weights=options.torch_weights, no_shuffle=options.no_shuffle,
        float64_reference=options.float64_reference, init_apart=options.init_apart,
        jax_first=options.jax_first,
    )
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return exit_code


# --- Python API ----------------------------------------------------------------------


def trace_script(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    out: str | os.PathLike | None = None,
    *,
    cuda_shim: bool = False,
    host_random: bool = False,
    seed: int | None = None,
    dtype: str | None = None,
    max_steps: int | None = None,
    legacy_xla: bool = False,
    synthetic_data: bool = True,
    synthetic_size: int | None = None,
    synthetic_image_size: tuple[int, int] | None = None,
    export_weights: str | os.PathLike | None = None,
    jax: bool = False,
    jax_weights: str | os.PathLike | None = None,
    reseed_at_optimizer: bool = False,
    torch_weights: str | os.PathLike | None = None,
    no_shuffle: bool = False,
    float64_reference: bool = False,
    init_apart: bool = False,
    jax_first: bool = False,
    timeout: float = 600.0,
    memory_mb: float = 16384.0,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """Trace SCRIPT in a fresh subprocess and return the record.

    ``out`` is where the JSON goes (a temporary file when None). ``env`` entries are added
    to the current environment. The record gains ``returncode`` (of the trace command) and
    ``output`` (the last 4,000 characters of its stdout+stderr) and ``peak_mb`` (the resident
    memory of its process tree at its peak). On timeout, or past ``memory_mb``, the process
    group is killed and the record has ``status`` "timeout" or "memory".
    """
    import tempfile

    environment = side_environment(env)
    with tempfile.TemporaryDirectory(prefix="porter-trace-") as tmp:
        target = Path(out) if out is not None else Path(tmp) / "trace.json"
        if target.exists():
            target.unlink()
        command = [python or sys.executable, "-m", "porter.verify.trace", "--out", str(target)]
        command += ["--cuda-shim"] * cuda_shim + ["--host-random"] * host_random
        command += ["--seed", str(seed)] if seed is not None else []
        command += ["--dtype", dtype] if dtype is not None else []
        command += ["--max-steps", str(max_steps)] if max_steps is not None else []
        command += ["--legacy-xla"] * legacy_xla
        command += ["--real-datasets"] * (not synthetic_data)
        command += ["--synthetic-size", str(synthetic_size)] if synthetic_size is not None else []
        command += ["--export-weights", str(export_weights)] if export_weights is not None else []
        command += ["--jax"] * jax + ["--reseed-at-optimizer"] * reseed_at_optimizer
        command += ["--jax-weights", str(jax_weights)] if jax_weights is not None else []
        command += ["--torch-weights", str(torch_weights)] if torch_weights is not None else []
        command += ["--no-shuffle"] * no_shuffle + ["--float64-reference"] * float64_reference
        command += ["--init-apart"] * init_apart + ["--jax-first"] * jax_first
        if synthetic_image_size is not None:
            command += ["--synthetic-image-size", f"{synthetic_image_size[0]}x{synthetic_image_size[1]}"]
        command += [str(Path(script).resolve()), "--", *map(str, args)]
        side = run_side(command, environment, Path(tmp) / "trace.log", timeout, memory_mb, cwd=cwd, tail_chars=4000,
                        # (this module imports torch, and JAX's stack with --jax, jax itself with
                        # --jax-first where it is installed (_import_jax_first), before the script runs)
                        preload=preload_for_script(script, (*TORCH, *JAX_STACK) if jax else
                                                   (*TORCH, *_JAX_FIRST) if jax_first else TORCH))
        return traced_record(side, target, script, timeout, memory_mb)


def _flat_losses(losses: Any) -> list[list[float]]:
    if isinstance(losses, dict):
        losses = losses["losses"]
    return [list(step) if isinstance(step, (list, tuple)) else [step] for step in losses]


def compare_losses(a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-5) -> int | None:
    """First step (index) where the losses of A and B differ, or None if the common steps agree.

    A and B are trace records (dicts with "losses") or lists whose items are one step's
    loss (a float) or losses (a list of floats). Only the steps both have are compared; a
    step with a different number of backward calls, or a None/NaN value where the other is
    not NaN, differs. Floats agree when |x - y| <= atol + rtol * |y|.
    """
    for index, (left, right) in enumerate(zip(_flat_losses(a), _flat_losses(b))):
        if len(left) != len(right):
            return index
        for x, y in zip(left, right):
            if x is None or y is None:
                return index
            if math.isnan(x) or math.isnan(y):
                if not (math.isnan(x) and math.isnan(y)):
                    return index
                continue
            if abs(x - y) > atol + rtol * abs(y):
                return index
    return None


if __name__ == "__main__":
    sys.exit(main())
