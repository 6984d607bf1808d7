"""Run an MXNet/Gluon training script unmodified, in the MXNet venv, and record its optimizer
steps: the original's side of ``porter verify --script`` when the original is a Gluon script.

    <mxnet python> -m porter.verify.trace_mxnet --out RESULT.json [--seed N] [--max-steps K] \\
        [--export-weights DIR] [--no-shuffle] SCRIPT.py -- [script args...]

SCRIPT runs as ``__main__`` (``runpy.run_path``; ``sys.argv = [SCRIPT, *args]``; its folder
first on ``sys.path``). Its imports are the standard library, numpy and mxnet (and
``porter.verify.side_mxnet`` for the torch-style parameter names): the MXNet venv has no torch.

What counts as an optimizer step, whatever form the script's step takes:

* ``gluon.Trainer.step(batch_size)`` and ``Trainer.update(batch_size)`` (the updaters the trainer
  calls inside are part of that step); the step's index is the trainer's creation order;
* outside a trainer, the first call of an ``mx.optimizer`` updater (``get_updater(opt)(i, g, w)``)
  after a backward pass (index -2), and the first in-place change of an array that has a gradient
  (``param.set_data(...)``, ``w[:] = w - lr * w.grad``) after a backward pass (index -1).

The losses of a step are the heads of the backward passes since the previous step
(``loss.backward()``, ``autograd.backward([l1, l2])`` over the per-device losses of
``split_and_load``): each head is recorded as the loss whose gradient the step applies, the sum
of its elements (times ``head_grads`` where given) times the step's gradient scale, which is
``rescale_grad / batch_size`` for a trainer (``trainer.step(batch_size)`` divides the summed
gradient by the batch size), the optimizer's ``rescale_grad`` for an updater and 1 for a manual
update. A per-sample loss vector stepped with ``trainer.step(batch_size)`` is therefore recorded
as its mean, which is what a port that calls ``loss.mean().backward()`` records. Values are read
(``asnumpy``) at the end of the run.

``--max-steps K`` ends the script right after its K-th step. ``--export-weights DIR`` writes,
at the first backward pass after each trainer is made (Gluon's deferred shapes are known by
then, and BatchNorm's running statistics, which MXNet updates in the backward pass, are still
the initial ones), the parameters of the model that trainer trains under the names a port's
``state_dict`` has (``side_mxnet.torch_style_names``), as ``DIR/weights_<i>.npz`` of
``porter.verify.weights``. ``--no-shuffle`` makes every ``gluon.data.DataLoader`` read its
dataset in order (the port's shuffling draws from another generator). Without a GPU,
``mx.gpu(i)`` gives ``mx.cpu(i)``, so a script that names GPU contexts runs on the CPU. A
``gluon.data.vision`` dataset (CIFAR10, MNIST, ...) whose files exist but are not the published
ones (their sha1 differs: synthetic files in the dataset's layout) reads them as they are
instead of downloading the real ones. The record also counts
the calls of MXNet's random samplers once training has begun (a trainer exists; not the
initializers' draws), names the model's dropout layers and the random augmenters of the data
pipeline: random numbers MXNet draws cannot be drawn the same by a port.

Python API (porter's venv): ``trace_mxnet_script(...)`` runs this in a fresh subprocess of the
MXNet venv's python (``porter.verify.mxnet_env``) and returns the record.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import sys
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["trace_mxnet_script", "main"]

MANUAL, UPDATER = -1, -2  # the optimizer index of a manual update, of an mx.optimizer updater outside a trainer


class StopTrace(BaseException):
    """Ends the traced script after --max-steps steps (not caught by ``except Exception``)."""


class _Recorder:
    def __init__(self, max_steps: Optional[int], export: Optional[str]) -> None:
        self.max_steps = max_steps
        self.export_dir = export
        self.pending: list[tuple[Any, Any]] = []  # (head, head_grad or None) since the last step
        self.steps: list[dict[str, Any]] = []
        self.trainers: list[weakref.ref] = []
        self.exported: dict[int, str] = {}  # trainer index -> the line for the record
        self.in_trainer = 0
        self.random_calls: dict[str, int] = {}
        self.dropouts: set[str] = set()
        self.augmentations: set[str] = set()
        self.printed: set[int] = set()
        self.t0 = time.perf_counter()

    # -- backward passes --
    def on_backward(self, heads: Any, head_grads: Any) -> None:
        import mxnet as mx

        if isinstance(heads, mx.nd.NDArray):
            heads, head_grads = [heads], [head_grads] if head_grads is not None else None
        for i, head in enumerate(heads):
            grad = head_grads[i] if head_grads is not None else None
            self.pending.append((head.copy(), grad.copy() if isinstance(grad, mx.nd.NDArray) else None))
        self.export_weights()

    # -- steps --
    def on_step(self, index: int, scale: float) -> None:
        self.steps.append({"optimizer": index, "heads": self.pending, "scale": scale,
                           "time_s": time.perf_counter() - self.t0})
        self.pending = []
        if self.max_steps is not None and len(self.steps) >= self.max_steps:
            raise StopTrace(f"stopped after {self.max_steps} optimizer steps (--max-steps)")

    def trainer_index(self, trainer: Any) -> int:
        for i, ref in enumerate(self.trainers):
            if ref() is trainer:
                return i
        self.trainers.append(weakref.ref(trainer))
        return len(self.trainers) - 1

    def on_random(self, name: str, caller: str) -> None:
        # in the training (from the first trainer or backward pass on), not a parameter's
        # initializer (mx.init.Xavier draws through mx.nd.random too; the port loads those weights)
        if (self.trainers or self.pending or self.steps) and not caller.startswith("mxnet.initializer"):
            self.random_calls[name] = self.random_calls.get(name, 0) + 1

    # -- initial weights --
    def export_weights(self) -> None:
        if self.export_dir is None:
            return
        for index, ref in enumerate(self.trainers):
            trainer = ref()
            if index in self.exported or trainer is None:
                continue
            params = list(trainer._params)
            if any(p._data is None for p in params):
                continue  # deferred shapes not known yet: at a later backward pass
            self.exported[index] = _export(trainer, params, self.export_dir, index, self.dropouts)

    def finish(self) -> dict[str, Any]:
        notes: list[str] = []
        steps = []
        for k, step in enumerate(self.steps):
            losses = []
            for head, grad in step["heads"]:
                try:
                    value = head.asnumpy().astype("float64")
                    if grad is not None:
                        value = value * grad.asnumpy().astype("float64")
                    losses.append(float(value.sum()) * step["scale"])
                except Exception as exc:  # noqa: BLE001 - the rest of the record is kept
                    notes.append(f"a loss of step {k + 1} could not be read: {type(exc).__name__}: {exc}")
                    losses.append(None)
            steps.append({"step": k, "optimizer": step["optimizer"], "losses": losses, "scale": step["scale"],
                          "time_s": step["time_s"], "printed": k in self.printed})
        return {"num_steps": len(steps), "steps": steps, "losses": [s["losses"] for s in steps],
                "unstepped_losses": len(self.pending), "notes": notes,
                "exported_weights": [self.exported[i] for i in sorted(self.exported)],
                "random_calls": dict(sorted(self.random_calls.items())), "dropout_layers": sorted(self.dropouts),
                "random_augmentations": sorted(self.augmentations)}


def model_of(params: list) -> Any:
    """The live gluon.Block whose parameters are the most of PARAMS, all of them in PARAMS; of
    several with the same parameters (a wrapper and the block it wraps) the innermost."""
    from mxnet import gluon

    owned = {id(p) for p in params}
    best: dict[frozenset, list] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, gluon.Block):
                continue
        except Exception:  # noqa: BLE001 - objects whose __class__ misbehaves
            continue
        ids = frozenset(id(p) for p in obj.collect_params().values())
        if ids and ids <= owned:
            best.setdefault(ids, []).append(obj)
    if not best:
        return None
    group = best[max(best, key=len)]

    def descendants(block):
        for child in block._children.values():
            yield child
            yield from descendants(child)

    inner = [b for b in group if not any(d is not b and d in group for d in descendants(b))]
    return (inner or group)[0]


def _export(trainer: Any, params: list, folder: str, index: int, dropouts: set) -> str:
    import numpy as np
    from mxnet.gluon import nn, rnn

    from porter.verify import side_mxnet

    model = model_of(params)
    if model is None:
        return f"trainer {index}: no model of its own (its parameters are not one block's)"
    try:
        named = side_mxnet.torch_style_names(model)
    except RuntimeError as exc:
        return f"trainer {index}: the initial weights of its {type(model).__name__} could not be named: {exc}"
    state = {}
    for name, p, _kind in named:
        state[name] = p.list_data()[0].asnumpy().copy()
    for path, block in side_mxnet.named_blocks(model):
        if isinstance(block, nn.BatchNorm):
            state[f"{path}.num_batches_tracked"] = np.array(0, dtype=np.int64)
        if isinstance(block, nn.Dropout) and block._rate > 0:
            dropouts.add(f"{path} (rate {block._rate:g})")
        elif isinstance(block, rnn.rnn_layer._RNNLayer) and block._dropout > 0:
            dropouts.add(f"{path} (dropout {block._dropout:g})")
    from porter.verify import weights

    weights.write(folder, index, state, type(model).__name__)
    return f"trainer {index}: the initial weights of its {type(model).__name__} ({len(state)} tensors)"


# --- hooks --------------------------------------------------------------------------------


def install(recorder: _Recorder, no_shuffle: bool, synthetic_size: Optional[int] = None, seed: int = 0) -> list[str]:
    """Patch MXNet so that RECORDER sees backward passes, steps and random draws; the notes.
    With ``synthetic_size``, Gluon's vision datasets get the synthetic data the port's
    torchvision datasets get (``porter.verify.datasets``)."""
    import inspect

    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.optimizer import optimizer as optim_mod

    notes: list[str] = []
    if mx.context.num_gpus() == 0:
        # a script that names mx.gpu(i) without asking num_gpus() runs on the CPU (its GPU path)
        cpu = mx.context.cpu

        def gpu(device_id=0):
            if not any("mx.gpu" in n for n in notes):
                notes.append("the original's mx.gpu(i) contexts were served by mx.cpu(i) (no GPU here)")
            return cpu(device_id)

        mx.gpu = mx.context.gpu = gpu
    nd_backward = mx.nd.NDArray.backward

    def backward(self, out_grad=None, *args, **kwargs):
        recorder.on_backward(self, [out_grad] if out_grad is not None else None)
        return nd_backward(self, out_grad, *args, **kwargs)

    mx.nd.NDArray.backward = backward
    ag_backward = autograd.backward

    def autograd_backward(heads, head_grads=None, *args, **kwargs):
        recorder.on_backward(heads, head_grads)
        return ag_backward(heads, head_grads, *args, **kwargs)

    autograd.backward = autograd_backward
    mx.autograd.backward = autograd_backward

    trainer_init = gluon.Trainer.__init__

    def init(self, *args, **kwargs):
        trainer_init(self, *args, **kwargs)
        recorder.trainer_index(self)

    gluon.Trainer.__init__ = init

    def stepper(real):
        def step(self, batch_size, *args, **kwargs):
            if recorder.in_trainer:
                return real(self, batch_size, *args, **kwargs)
            recorder.in_trainer += 1
            try:
                result = real(self, batch_size, *args, **kwargs)
            finally:
                recorder.in_trainer -= 1
            recorder.on_step(recorder.trainer_index(self), float(self._scale) / float(batch_size))
            return result
        return step

    gluon.Trainer.step = stepper(gluon.Trainer.step)
    gluon.Trainer.update = stepper(gluon.Trainer.update)

    updater_call = optim_mod.Updater.__call__

    def call(self, *args, **kwargs):
        result = updater_call(self, *args, **kwargs)
        if not recorder.in_trainer and recorder.pending:
            recorder.on_step(UPDATER, float(getattr(self.optimizer, "rescale_grad", 1.0)))
        return result

    optim_mod.Updater.__call__ = call

    set_data = gluon.Parameter.set_data

    def parameter_set_data(self, data):
        result = set_data(self, data)
        if not recorder.in_trainer and recorder.pending:
            recorder.on_step(MANUAL, 1.0)
        return result

    gluon.Parameter.set_data = parameter_set_data
    setitem = mx.nd.NDArray.__setitem__

    def nd_setitem(self, key, value):
        result = setitem(self, key, value)
        if not recorder.in_trainer and recorder.pending and self.grad is not None:
            recorder.on_step(MANUAL, 1.0)
        return result

    mx.nd.NDArray.__setitem__ = nd_setitem

    from mxnet.gluon.data.vision import datasets as vision

    real_sha1 = vision.check_sha1

    def check_sha1(path, sha1):
        if real_sha1(path, sha1):
            return True
        if os.path.exists(path):  # a synthetic stand-in in the dataset's layout: offline, never downloaded
            note = (f"dataset files that are not the published ones were read as they are (not downloaded "
                    f"again): {os.path.basename(os.path.dirname(os.path.abspath(path)))}/")
            if note not in notes:
                notes.append(note)
            return True
        return False

    vision.check_sha1 = check_sha1
    if synthetic_size is not None:
        _synthetic_vision(vision, synthetic_size, seed, notes)
    # MXNet's random samplers as Python calls reach them (mx.nd.random.*, the operators
    # mx.nd.random_* / sample_*, the image augmenters mx.nd.image.random_* that the
    # gluon.data.vision transforms call); a hybridized graph's own random operators are not seen
    for module, prefix in ((mx.nd.random, "mx.nd.random"), (mx.random, "mx.random"), (mx.nd, "mx.nd"),
                           (mx.nd.image, "mx.nd.image")):
        for name in dir(module):
            sampler = name in ("uniform", "normal", "randn", "randint", "exponential", "gamma", "poisson",
                               "multinomial", "shuffle", "negative_binomial")
            if module in (mx.nd, mx.nd.image):
                sampler = name.startswith(("random_", "sample_", "_random_", "_sample_")) or name == "shuffle"
            real = getattr(module, name, None)
            if sampler and callable(real) and not isinstance(real, type):
                setattr(module, name, _counting(real, f"{prefix}.{name}", recorder))

    loader_init = gluon.data.DataLoader.__init__
    signature = inspect.signature(loader_init)

    def loader(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        recorder.augmentations.update(_random_transforms(bound.arguments.get("dataset")))
        if no_shuffle:
            if bound.arguments.get("shuffle"):
                bound.arguments["shuffle"] = False
                if "in order" not in " ".join(notes):
                    notes.append("gluon.data.DataLoader(shuffle=True) read its dataset in order (--no-shuffle), "
                                 "as the port's DataLoader does: the two sides' shuffles draw from different "
                                 "generators")
        return loader_init(*bound.args, **bound.kwargs)

    gluon.data.DataLoader.__init__ = loader
    record_iter = mx.io.ImageRecordIter

    def image_record_iter(*args, **kwargs):
        # mx.io.ImageRecordIter augments and shuffles in C++: its arguments say what it draws
        drawn = sorted(k for k, v in kwargs.items() if k.startswith(("rand", "random_", "max_", "min_random"))
                       or k in ("brightness", "contrast", "saturation", "hue", "pca_noise")
                       if v not in (None, False, 0, 0.0, "0", ""))
        if drawn:
            recorder.augmentations.add(f"ImageRecordIter({', '.join(drawn)})")
        if no_shuffle and kwargs.get("shuffle"):
            kwargs["shuffle"] = False
            notes.append("mx.io.ImageRecordIter(shuffle=True) read its records in order (--no-shuffle)")
        return record_iter(*args, **kwargs)

    mx.io.ImageRecordIter = image_record_iter
    return notes


def _random_transforms(dataset: Any) -> set:
    """The class names of the random augmenters (gluon.data.vision's RandomFlipLeftRight,
    gluoncv's RandomCrop, ...: blocks whose class name starts with Random) in a dataset's
    transform chain (``transform``/``transform_first`` closures, Compose's children)."""
    found: set = set()
    seen: set = set()
    todo = [dataset]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen or len(seen) > 2000:
            continue
        seen.add(id(obj))
        if type(obj).__name__.startswith("Random"):
            found.add(type(obj).__name__)
        for attr in ("_fn", "_data", "_dataset", "_transform", "_block", "_children"):
            value = getattr(obj, attr, None)
            if isinstance(value, dict):
                todo.extend(value.values())
            elif isinstance(value, (list, tuple)):
                todo.extend(value)
            elif value is not None and not isinstance(value, (str, bytes, int, float)):
                todo.append(value)
        if hasattr(obj, "__self__"):  # a bound method used as the transform
            todo.append(obj.__self__)
    return found


def _counting(real, name: str, recorder: _Recorder):
    def sample(*args, **kwargs):
        recorder.on_random(name, sys._getframe(1).f_globals.get("__name__", ""))
        return real(*args, **kwargs)

    sample.__name__ = getattr(real, "__name__", name)
    sample.__doc__ = real.__doc__
    return sample


class _CountingStream:
    def __init__(self, stream: Any, recorder: _Recorder) -> None:
        self._stream = stream
        self._recorder = recorder

    def write(self, text: str) -> int:
        if text.strip():
            self._recorder.printed.add(len(self._recorder.steps))
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _script_traceback(error: BaseException, script: str) -> str:
    tb = error.__traceback__
    cursor = tb
    while cursor is not None and os.path.abspath(cursor.tb_frame.f_code.co_filename) != script:
        cursor = cursor.tb_next
    return "".join(traceback.format_exception(type(error), error, cursor if cursor is not None else tb))


def _synthetic_vision(vision: Any, size: int, seed: int, notes: list[str]) -> None:
    """Gluon's MNIST, FashionMNIST, CIFAR10 and CIFAR100 (fine labels) read the synthetic samples
    the port's torchvision datasets of the same names read, instead of their files."""
    import mxnet as mx

    from porter.verify.datasets import GLUON_VISION, gluon_vision_arrays

    def patched(cls: Any) -> None:
        real = cls._get_data

        def _get_data(self: Any) -> None:
            name = next(c.__name__ for c in type(self).__mro__ if c.__name__ in GLUON_VISION)
            if name == "CIFAR100" and not getattr(self, "_fine_label", True):
                return real(self)  # coarse labels: no torchvision counterpart, the files as they are
            images, labels = gluon_vision_arrays(name, bool(self._train), size, seed)
            self._data = mx.nd.array(images, dtype=images.dtype)
            self._label = labels
            note = (f"gluon.data.vision.{name}(train={bool(self._train)}) replaced by {size} synthetic samples, "
                    f"those of the port's torchvision.datasets.{GLUON_VISION[name][0]}; nothing read or downloaded")
            if note not in notes:
                notes.append(note)

        cls._get_data = _get_data

    for name in GLUON_VISION:
        cls = getattr(vision, name, None)
        if cls is not None and "_get_data" in vars(cls):
            patched(cls)


def run(script: str, args: Sequence[str], *, seed: Optional[int] = None, max_steps: Optional[int] = None,
        export_weights: Optional[str] = None, no_shuffle: bool = False,
        synthetic_size: Optional[int] = None) -> tuple[dict, int]:
    """Run SCRIPT in this process (the MXNet venv) and return (record, exit code)."""
    import random

    import mxnet as mx
    import numpy as np

    script = os.path.abspath(script)
    recorder = _Recorder(max_steps, export_weights)
    notes = install(recorder, no_shuffle, synthetic_size, seed if seed is not None else 0)
    if seed is not None:
        mx.random.seed(seed)
        np.random.seed(seed)
        random.seed(seed)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    status, exit_code, exception = "ok", 0, None
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _CountingStream(sys.stdout, recorder), _CountingStream(sys.stderr, recorder)
    start = time.perf_counter()
    recorder.t0 = start
    try:
        runpy.run_path(script, run_name="__main__")
    except StopTrace:
        pass
    except SystemExit as error:
        if error.code not in (None, 0):
            status, exit_code = "exit", error.code if isinstance(error.code, int) else 1
            exception = {"type": "SystemExit", "message": str(error.code), "traceback": _script_traceback(error, script)}
    except BaseException as error:  # the record must say what happened, whatever it was
        status, exit_code = "error", 1
        exception = {"type": type(error).__name__, "message": str(error), "traceback": _script_traceback(error, script)}
    finally:
        sys.stdout, sys.stderr = streams
    try:
        mx.nd.waitall()
    except Exception as error:  # noqa: BLE001 - an asynchronous error of the script's last operators
        if exception is None:
            status, exit_code = "error", 1
            exception = {"type": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}
    wall = time.perf_counter() - start
    record = recorder.finish()
    record["notes"] = notes + record["notes"]
    record.update({"script": script, "args": list(args), "seed": seed, "dtype": "float32", "status": status,
                   "exit_code": exit_code, "exception": exception, "wall_time_s": wall, "mxnet": mx.__version__})
    return record, exit_code


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, script_args = _split_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m porter.verify.trace_mxnet",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the JSON record")
    parser.add_argument("--seed", type=int, default=None, help="seed mxnet/numpy/random before the script")
    parser.add_argument("--max-steps", type=int, default=None, help="stop the script after this many optimizer steps")
    parser.add_argument("--export-weights", default=None, metavar="DIR",
                        help="write the initial weights of each trainer's model to DIR (weights_<i>.npz)")
    parser.add_argument("--no-shuffle", action="store_true", help="gluon DataLoaders read their datasets in order")
    parser.add_argument("--synthetic-size", type=int, default=None, metavar="N",
                        help="Gluon's vision datasets read N synthetic samples, those of the port's torchvision datasets")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    options = parser.parse_args(own)
    record, exit_code = run(options.script, [*options.script_args, *script_args], seed=options.seed,
                            max_steps=options.max_steps, export_weights=options.export_weights,
                            no_shuffle=options.no_shuffle, synthetic_size=options.synthetic_size)
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return exit_code


# --- Python API (porter's venv) -----------------------------------------------------------


def trace_mxnet_script(script: "str | os.PathLike", args: Sequence[str] = (), *, seed: Optional[int] = None,
                       max_steps: Optional[int] = None, export_weights: "str | os.PathLike | None" = None,
                       no_shuffle: bool = False, timeout: float = 600.0, memory_mb: float = 16384.0,
                       env: Optional[dict] = None, cwd: "str | os.PathLike | None" = None,
                       python: Optional[str] = None, synthetic_size: Optional[int] = None) -> dict:
    """Trace SCRIPT in a fresh subprocess of the MXNet venv's python; the record, with
    ``returncode``, ``output`` (the last 4,000 characters) and ``peak_mb``, as
    ``porter.verify.trace.trace_script``. No MXNet venv: status "crashed" with the cause."""
    import tempfile

    from porter.verify.mxnet_env import MXNetEnvError, mxnet_python
    from porter.verify.process import run_side, side_environment, traced_record

    try:
        python = python or mxnet_python()
    except MXNetEnvError as exc:
        return {"status": "crashed", "cause": str(exc), "returncode": None, "output": "", "peak_mb": 0.0}
    # errors where they happen, no worker threads
    environment = side_environment({"MXNET_ENGINE_TYPE": os.environ.get("MXNET_ENGINE_TYPE", "NaiveEngine")}, env)
    with tempfile.TemporaryDirectory(prefix="porter-trace-mxnet-") as tmp:
        target = Path(tmp) / "trace.json"
        command = [python, "-m", "porter.verify.trace_mxnet", "--out", str(target)]
        command += ["--seed", str(seed)] if seed is not None else []
        command += ["--max-steps", str(max_steps)] if max_steps is not None else []
        command += ["--export-weights", str(export_weights)] if export_weights is not None else []
        command += ["--no-shuffle"] * no_shuffle
        command += ["--synthetic-size", str(synthetic_size)] if synthetic_size is not None else []
        command += [str(Path(script).resolve()), "--", *map(str, args)]
        side = run_side(command, environment, Path(tmp) / "trace.log", timeout, memory_mb, cwd=cwd, tail_chars=4000,
                        preload=("mxnet",))  # (imported by this module before the script runs)
        return traced_record(side, target, script, timeout, memory_mb)


if __name__ == "__main__":
    sys.exit(main())
