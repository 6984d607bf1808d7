"""Run the PyTorch port (`porter migrate --to torch`) or the JAX port (`--to jax`) of a Gluon
fixture for a few training steps from the same initial weights, and record each step's loss.
Used by tests/test_gluon_jax_scripts.py.

    python jax_harness.py torch torch_port.py --steps 5 --out torch.npz -- ARGS
    python jax_harness.py jax   jax_port.py   --weights torch.npz --steps 5 --out jax.json -- ARGS

Both scripts run unmodified, as ``__main__``, with the fixture's port.toml ``run`` arguments.
The harness only watches, and aligns what two frameworks cannot draw alike:

* data order: a shuffling ``torch.utils.data.DataLoader`` (both ports keep torch's loader)
  gets its own generator seeded with 0 on both sides (the PyTorch port draws its initial
  weights from torch's global generator before the loader shuffles; the JAX port does not);
* noise (``--same-noise``): the loop's noise (``torch.randn`` in the PyTorch port,
  ``np.random.standard_normal`` in the JAX port: JX101) draws from one numpy generator seeded
  alike on both sides, in the order the script asks (zeros would not do: a generator fed with zeros gives a
  constant batch, whose BatchNorm variance 0 magnifies rounding by 1/sqrt(eps));
* weights: the torch side exports, at its first ``backward()``, the state dict of every
  top-level model of the script (lazy layers have their shapes by then: the ports run one
  sample through the model before training); the JAX side loads into each model, just before
  its ``nnx.Optimizer`` is built, the state dict whose names and shapes fit it, with the
  port's own ``load_torch_state_dict``.

Recorded: torch side, the loss of every ``backward()`` and the optimizer steps (stops after
``--steps`` iterations' worth of ``optimizer.step()``); JAX side, the first output of each
call of an ``@nnx.jit`` function whose name starts with ``train_step`` (kept on the device
until the run ends) and each such function's jit cache size.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import sys
import warnings
from pathlib import Path

import numpy as np


class Stop(BaseException):
    """Raised after the last recorded step (a BaseException: scripts catch Exception)."""


def _run(script: Path, args: list[str]) -> None:
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Stop:
        pass


class NumpyShuffle:
    """Gluon's RandomSampler: a permutation of numpy's global generator at each epoch."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        indices = np.arange(self.length)
        np.random.shuffle(indices)
        return iter(indices.tolist())

    def __len__(self) -> int:
        return self.length


def _seeded_loaders(numpy_shuffle: bool = False) -> None:
    import torch

    init = torch.utils.data.DataLoader.__init__

    def seeded(self, *a, **k):
        if k.get("shuffle") and k.get("generator") is None:
            if numpy_shuffle:  # the MXNet original's order (np.random.seed seeds both)
                dataset = a[0] if a else k["dataset"]
                k["shuffle"] = False
                k["sampler"] = NumpyShuffle(len(dataset))
            else:
                k["generator"] = torch.Generator().manual_seed(0)
        init(self, *a, **k)

    torch.utils.data.DataLoader.__init__ = seeded


def torch_side(script: Path, steps: int, out: Path, args: list[str], same_noise: bool) -> None:
    import torch
    import torch.nn as nn

    _seeded_loaders()
    if same_noise:
        noise = np.random.RandomState(1234)
        randn = torch.randn
        torch.randn = lambda *a, **k: torch.from_numpy(
            noise.standard_normal(tuple(randn(*a, **k).shape)).astype(np.float32))
    losses: list[float] = []
    states: list[dict] = []
    done = {"steps": 0}
    backward = torch.Tensor.backward

    def recording_backward(self, *a, **k):
        if not states:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mine = [o for o in gc.get_objects() if isinstance(o, nn.Module) and type(o).__module__ == "__main__"
                        or isinstance(o, nn.Sequential)]
            inner = {id(m) for o in mine for m in o.modules() if m is not o}
            for model in [o for o in mine if id(o) not in inner and any(True for _ in o.parameters())]:
                states.append({k2: v.detach().cpu().numpy().copy() for k2, v in model.state_dict().items()})
        losses.append(float(self.detach()))
        return backward(self, *a, **k)

    def count_step(optimizer, a, k):
        done["steps"] += 1
        if done["steps"] >= steps:
            raise Stop()

    torch.Tensor.backward = recording_backward
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(count_step)
    _run(script, args)
    arrays = {f"state{i}/{k}": v for i, state in enumerate(states) for k, v in state.items()}
    np.savez(out, losses=np.array(losses, dtype=np.float64), **arrays)


def jax_side(script: Path, weights: Path, steps: int, out: Path, args: list[str], same_noise: bool,
             numpy_shuffle: bool = False) -> None:
    from flax import nnx

    _seeded_loaders(numpy_shuffle)
    if same_noise:
        noise = np.random.RandomState(1234)
        np.random.standard_normal = lambda size=None: noise.standard_normal(size)
    states: dict[int, dict] = {}
    with np.load(weights) as data:
        for key in data.files:
            if key.startswith("state"):
                head, _, name = key.partition("/")
                states.setdefault(int(head[len("state"):]), {})[name] = data[key]
    loaded: list[str] = []
    seen: list[tuple[str, object]] = []
    jitted: dict[str, object] = {}
    optimizer_init = nnx.Optimizer.__init__

    def init(self, model, *a, **k):
        port = sys.modules[type(model).__module__] if type(model).__module__ in sys.modules else None
        if port is None or not hasattr(port, "load_torch_state_dict"):
            port = sys.modules["__main__"]
        own = port.torch_state_dict(model)
        fits = [i for i, s in states.items()
                if {n for n in s if not n.endswith("num_batches_tracked")} == set(own)
                and all(np.shape(s[n]) == np.shape(own[n]) for n in own)]
        if len(fits) != 1:
            raise RuntimeError(f"{len(fits)} torch state dicts fit the {type(model).__name__} model "
                               f"({sorted(own)[:5]}...)")
        port.load_torch_state_dict(model, states.pop(fits[0]))
        loaded.append(type(model).__name__)
        optimizer_init(self, model, *a, **k)

    nnx.Optimizer.__init__ = init
    real_jit = nnx.jit

    def jit(*a, **k):
        if not a:
            return lambda f: jit(f, **k)
        fn = a[0]
        compiled = real_jit(*a, **k)
        name = getattr(fn, "__name__", "")
        if not name.startswith("train_step"):
            return compiled
        jitted[name] = compiled

        def step(*sa, **sk):
            result = compiled(*sa, **sk)
            seen.append((name, result[0] if isinstance(result, tuple) else result))
            if len(seen) >= steps:
                raise Stop()
            return result

        step.__name__ = name
        return step

    nnx.jit = jit
    _run(script, args)
    report = {
        "loaded": loaded,
        "losses": [float(loss) for _, loss in seen],
        "steps": [name for name, _ in seen],
        "cache_sizes": {name: f.jitted_fn._cache_size() for name, f in jitted.items()},
    }
    out.write_text(json.dumps(report), encoding="utf-8")


def main(argv: list[str]) -> None:
    at = argv.index("--") if "--" in argv else len(argv)
    argv, script_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=["torch", "jax"])
    parser.add_argument("script", type=Path)
    parser.add_argument("--weights", type=Path)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--same-noise", action="store_true")
    parser.add_argument("--numpy-shuffle", action="store_true",
                        help="shuffling loaders draw Gluon's permutation (numpy's global generator), for a "
                             "comparison with the MXNet original")
    opts = parser.parse_args(argv)
    if opts.side == "torch":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        torch_side(opts.script.resolve(), opts.steps, opts.out.resolve(), script_args, opts.same_noise)
    else:
        jax_side(opts.script.resolve(), opts.weights.resolve(), opts.steps, opts.out.resolve(), script_args, opts.same_noise,
                 opts.numpy_shuffle)


if __name__ == "__main__":
    main(sys.argv[1:])
