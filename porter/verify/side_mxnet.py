"""One side of a model-level verification for an MXNet/Gluon file, run in the MXNet venv
(``porter.verify.mxnet_env``): ``<mxnet python> -m porter.verify.side_mxnet REQUEST.json``.

It speaks the .npz + JSON protocol of every side (``porter.verify.sidenpz``): the file is
loaded as a module (its ``__main__`` block does not run), the model is built from the
request's expression, and the side writes the weights, inputs and projection (or, with
``shared``, loads them from the other side's file), then every block's output of the first
forward (``layer/<block>``, in execution order), the outputs, gradients, and per optimizer
step the loss, parameters and buffers; the meta JSON has ``order`` (the recording order) and
``notes``. Its imports are the standard library, numpy and mxnet (and porter's
``sideproto``, ``sidenpz`` and ``specs``, numpy only): the MXNet venv has numpy 1.23.5 and no
torch, jax, typer or rich.

Names: the torch names a port keeps
-----------------------------------
A port keeps the Gluon attribute names (``self.fc1`` stays ``self.fc1``) and containers keep
their indices, so the original's tensors are named as torch's ``state_dict()`` would name the
port's: the path of attribute names (``Block._children``: the attribute name, or the index
for ``HybridSequential.add``) down to the block, then the parameter's attribute name, mapped:

=========================================  ==================================  ==========
Gluon                                      torch-style name                    kind
=========================================  ==================================  ==========
Dense / Conv* / Conv*Transpose / Embedding ``weight``, ``bias`` (same layouts:  parameter
                                           Dense (out, in), Conv OIHW,
                                           Conv2DTranspose (in, out/g, kH, kW))
BatchNorm (and other norms) ``gamma``,     ``weight``, ``bias``                parameter
``beta``
BatchNorm ``running_mean``,                ``running_mean``, ``running_var``   buffer
``running_var``
PReLU ``alpha``                            ``weight``                          parameter
rnn.LSTM/GRU/RNN ``l<n>_i2h_weight``,      ``weight_ih_l<n>``, ``weight_hh_l<n>``,
``l<n>_h2h_weight``, ``l<n>_i2h_bias``,    ``bias_ih_l<n>``, ``bias_hh_l<n>``,    parameter
``l<n>_h2h_bias``, ``l<n>_h2r_weight``;    ``weight_hr_l<n>``; ``..._l<n>_reverse``
``r<n>_...`` (bidirectional)               (gate order i, f, g, o and r, z, n as torch)
rnn cells ``i2h_weight`` ...               ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``
any other parameter                        its attribute name
=========================================  ==================================  ==========

e.g. ``features.0.weight``, ``features.1.weight`` (a BatchNorm's gamma), ``fc.bias``,
``rnn.weight_ih_l0``. A shared parameter is exported under each of its names, as in a
``state_dict``. For every BatchNorm, ``init/<block>.num_batches_tracked`` (0, int64) is
exported too, so that a torch port's ``load_state_dict`` finds every key it has (JAX's
converter ignores those keys). A parameter that no attribute path reaches (made with
``self.params.get`` and never assigned to an attribute) is an error naming it, never a guess.
Layer outputs are named by the block's path (``layer/features.0``); the activation that a
``Dense``/``Conv`` creates for its ``activation=`` argument is part of that layer (the layer's
output is after it), not a layer of its own.

How the original is run
-----------------------
- On the CPU, imperatively: ``hybridize(False)`` on the whole model, so that every block's
  output is seen (hybridizing compiles the same operators into one graph).
- Parameters the expression left uninitialized get Gluon's default initialization
  (``Block.initialize()``: each parameter's own initializer, else ``Uniform(0.07)``), seeded
  by the request's seed. Gluon's lazy shapes (``in_units=0``, ``in_channels=0``) are known only
  after a forward: when a parameter's initialization is deferred, the model is run once on the
  inputs outside ``autograd.record`` (inference mode: BatchNorm's running statistics are not
  touched) before anything is exported.
- Dropout is switched off for the comparison (``nn.Dropout`` rate and the recurrent layers'
  ``dropout`` set to 0), and the notes say where.
- The forward passes run under ``autograd.record()`` (training mode, as torch's
  ``model.train()``: BatchNorm normalizes with the batch statistics). The loss is the one of
  ``side_torch``: for every floating-point output, ``sum(out * projection) / out.size``, with
  a fixed random projection, so every output element gets a gradient. Gradients come from
  ``loss.backward()``; a parameter whose gradient the backward did not write (unused in the
  forward) has no ``grad/`` entry, as a torch parameter whose ``.grad`` is None.
- K optimizer steps with ``gluon.Trainer`` over the trainable parameters, ``'sgd'`` with
  momentum 0.9 or ``'adam'``, at the request's learning rate, calling ``trainer.step(1)``: the
  gradients are not rescaled (``step(batch_size)`` would divide them by the batch size).
  MXNet's momentum SGD (``mom = 0.9 mom - lr g; w += mom``) is torch's (``buf = 0.9 buf + g;
  w -= lr buf``) at a constant learning rate. MXNet's Adam puts epsilon inside the bias
  correction (``lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)``): torch's and optax's
  epsilon is effectively ``eps / sqrt(1 - b2^t)`` smaller in early steps.

MXNet facts a port must match (measured with mxnet 1.9.1 on the CPU): BatchNorm updates its
running statistics in the BACKWARD pass (a forward without backward leaves them unchanged),
and its running variance uses the biased batch variance (torch's BatchNorm the unbiased one;
flax's the biased one); momentum 0.9 means ``running = 0.9 running + 0.1 batch``, torch's
``momentum=0.1``. Integer inputs (token ids) are passed as int64 NDArrays; Gluon's Embedding
takes them.
"""
from __future__ import annotations

import math
import re
import time

import numpy as np

from porter.verify import sidenpz, sideproto

_RNN_PARAM = re.compile(r"^(l|r)(\d+)_(i2h|h2h|h2r)_(weight|bias)$")
_CELL_PARAM = re.compile(r"^(i2h|h2h|h2r)_(weight|bias)$")
_GATES = {"i2h": "ih", "h2h": "hh", "h2r": "hr"}
_RENAMED = {"gamma": "weight", "beta": "bias"}
_BUFFERS = {"running_mean", "running_var"}
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's and optax.adam's defaults


def _param_name(block, attr: str) -> str:
    """The torch-style name of the parameter that ``block`` holds as attribute ``attr``."""
    from mxnet.gluon import nn, rnn

    m = _RNN_PARAM.match(attr)
    if m and isinstance(block, rnn.rnn_layer._RNNLayer):
        direction, layer, gate, kind = m.groups()
        return f"{kind}_{_GATES[gate]}_l{layer}{'_reverse' if direction == 'r' else ''}"
    m = _CELL_PARAM.match(attr)
    if m and isinstance(block, rnn.rnn_cell.RecurrentCell):
        return f"{m.group(2)}_{_GATES[m.group(1)]}"
    if attr == "alpha" and isinstance(block, nn.PReLU):
        return "weight"
    return _RENAMED.get(attr, attr)


def _is_internal(parent, name: str) -> bool:
    """The activation that a Dense or Conv block creates for its ``activation=`` argument."""
    from mxnet.gluon import nn

    return name == "act" and isinstance(parent, (nn.Dense, nn.conv_layers._Conv))


def named_blocks(block, prefix: str = ""):
    """(path, block) for ``block``'s descendants in registration order, parents first."""
    for name, child in block._children.items():
        if _is_internal(block, name):
            continue
        path = f"{prefix}.{name}" if prefix else name
        yield path, child
        yield from named_blocks(child, path)


def torch_style_names(model) -> list[tuple[str, object, str]]:
    """(torch-style name, Parameter, "param" or "buffer") for every parameter of ``model``,
    in ``state_dict`` order (a block's own parameters, then its children's)."""
    out = []

    def walk(block, prefix):
        for attr, p in block._reg_params.items():
            name = _param_name(block, attr)
            out.append((f"{prefix}{name}", p, "buffer" if attr in _BUFFERS else "param"))
        for name, child in block._children.items():
            walk(child, f"{prefix}{name}.")

    walk(model, "")
    seen = {id(p) for _, p, _ in out}
    unnamed = [p.name for p in model.collect_params().values() if id(p) not in seen]
    if unnamed:
        raise RuntimeError("parameters that no attribute of the model reaches (torch-style names need "
                           f"attribute paths; assign each parameter to an attribute): {', '.join(unnamed)}")
    names = [n for n, _, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuntimeError(f"two parameters map to the same torch-style name: {', '.join(dup)}")
    return out


def _flatten(obj, prefix: str, out: list):
    import mxnet as mx

    out.extend(sideproto.flatten(obj, lambda a: isinstance(a, mx.nd.NDArray), prefix))


def _is_float(a) -> bool:
    return np.dtype(a.dtype).kind == "f"


def _numpy(a) -> np.ndarray:
    return a.asnumpy().copy()


def run(request: dict) -> dict:
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn, rnn

    meta: dict = {"notes": [], "health": None}
    seed = int(request["seed"])
    mx.random.seed(seed)
    np.random.seed(seed)
    ctx = mx.cpu()

    ns = sideproto.load_namespace(request["file"])
    try:
        model = eval(request["model"], ns)  # the user's expression, in the user's namespace
    except Exception as exc:
        raise RuntimeError(f"--model {request['model']!r} failed in {request['file']}: {exc}") from exc
    if not isinstance(model, gluon.Block):
        raise RuntimeError(f"--model {request['model']!r} gave a {type(model).__name__}, not a gluon.Block")
    model.hybridize(False)

    blocks = list(named_blocks(model))
    dropouts = []
    for name, blk in blocks:
        if isinstance(blk, nn.Dropout) and blk._rate > 0:
            blk._rate = 0.0
            dropouts.append(name)
        elif isinstance(blk, rnn.rnn_layer._RNNLayer) and blk._dropout > 0:
            blk._dropout = 0.0
            dropouts.append(name)
    if dropouts:
        meta["notes"].append(f"dropout switched off for the comparison in: {', '.join(dropouts)}")

    all_params = list(model.collect_params().values())
    fresh = [p for p in all_params if p._data is None and not p._deferred_init]
    if fresh:
        for p in fresh:
            p.initialize(ctx=ctx)  # Gluon's default: the parameter's own init, else Uniform(0.07)
        meta["notes"].append("the original's uninitialized parameters got Gluon's default initialization")
    model.collect_params().reset_ctx(ctx)  # an expression may have initialized on mx.gpu()

    arrays = sidenpz.Arrays()
    shared = sidenpz.Shared(request["shared"]) if request.get("shared") else None
    if shared is not None:
        inputs_np = shared.inputs()
    else:
        inputs_np = sidenpz.request_inputs(
            request, ns, lambda x: x.asnumpy() if isinstance(x, mx.nd.NDArray) else np.asarray(x))
    for x in inputs_np:
        if x.dtype.kind not in "fiu":
            raise RuntimeError(f"input of dtype {x.dtype} is not supported by the MXNet side (use float or int)")
    inputs = [mx.nd.array(x, dtype=x.dtype, ctx=ctx) for x in inputs_np]

    if any(p._deferred_init for p in all_params):
        with autograd.pause():
            model(*inputs)  # Gluon infers the lazy shapes (in_units=0, ...) on the first forward
        mx.nd.waitall()
        meta["notes"].append("one forward outside autograd.record resolved Gluon's deferred parameter shapes")
    pending = [p.name for p in all_params if p._data is None]
    if pending:
        raise RuntimeError(f"parameters still uninitialized after a forward: {', '.join(pending)}")

    named = torch_style_names(model)
    batchnorms = [name for name, blk in blocks if isinstance(blk, nn.BatchNorm)]
    if shared is not None:
        state = {k: v for k, v in shared.state().items() if not k.endswith(".num_batches_tracked")}
        own = {n: p for n, p, _ in named}
        mm = sidenpz.mismatch({k: tuple(p.shape) for k, p in own.items()}, {k: v.shape for k, v in state.items()})
        if mm:
            meta["mismatch"] = mm
            return meta
        for k, p in own.items():
            p.set_data(mx.nd.array(state[k], dtype=p.dtype, ctx=ctx))
    else:
        for n, p, _ in named:
            arrays.put(f"init/{n}", _numpy(p.data(ctx)))
        for name in batchnorms:
            arrays.put(f"init/{name}.num_batches_tracked", np.array(0, dtype=np.int64))
        arrays.put_inputs(inputs_np)

    # every block's output of the first forward, in execution order (hooks run after forward)
    layer_out: list[tuple[str, object]] = []
    handles = [blk.register_forward_hook(lambda b, _i, out, name=name: layer_out.append((name, out)))
               for name, blk in blocks]

    trainable = [(n, p) for n, p, kind in named if kind == "param" and p.grad_req != "null"]
    unique, seen = [], set()
    for n, p in trainable:
        if id(p) not in seen:
            seen.add(id(p))
            unique.append((n, p))
    # after each step: every parameter once (under its first name, as named_parameters), every buffer
    recorded, seen = [], set()
    for n, p, kind in named:
        if id(p) not in seen:
            seen.add(id(p))
            recorded.append((n, p, kind))
    opt_name = request["optimizer"]
    lr = float(request["lr"])
    if opt_name == "adam":
        trainer = gluon.Trainer([p for _, p in unique], "adam", {"learning_rate": lr, "beta1": ADAM_BETA1,
                                                                 "beta2": ADAM_BETA2, "epsilon": ADAM_EPS},
                                kvstore=None)
        meta["notes"].append("adam: Gluon's epsilon rescaled at each step to give torch's and optax's Adam update")
    else:
        trainer = gluon.Trainer([p for _, p in unique], "sgd", {"learning_rate": lr, "momentum": 0.9},
                                kvstore=None)

    projection = None
    kept: list[tuple[str, np.ndarray]] = []
    t0 = time.perf_counter()
    for step in range(1, int(request["steps"]) + 1):
        with autograd.record():  # training mode, as torch's model.train()
            out = model(*inputs)
            flat: list = []
            _flatten(out, "", flat)
            if not any(_is_float(t) for _, t in flat):
                raise RuntimeError("the model returned no floating-point NDArray")
            if projection is None:
                projection_np = (shared.projection(len(flat)) if shared is not None
                                 else arrays.put_projection((tuple(t.shape) for _, t in flat), seed))
                projection = [mx.nd.array(w, dtype="float32", ctx=ctx) for w in projection_np]
            # a fixed random projection of every output, so every output element gets a gradient
            loss = sum((t.astype("float32") * w).sum() / max(t.size, 1)
                       for (_, t), w in zip(flat, projection) if _is_float(t))
        loss.backward()
        if step == 1:
            for h in handles:
                h.detach()
            for name, o in layer_out:
                sub: list = []
                _flatten(o, "", sub)
                for suffix, t in sub:
                    kept.append((sidenpz.layer_key(name, suffix), _numpy(t)))
            for suffix, t in flat:
                kept.append((sidenpz.output_key(suffix), _numpy(t)))
            for n, p in unique:
                # the flag is on the data array: set by a backward that wrote the gradient (the
                # parameter took part in the forward), cleared by the trainer's update
                if p.list_data()[0]._fresh_grad:
                    kept.append((f"grad/{n}", _numpy(p.grad(ctx))))
        kept.append((f"step{step}/loss", loss.asnumpy().reshape(())))
        if opt_name == "adam":
            # Gluon: lr sqrt(1-b2^t)/(1-b1^t) m/(sqrt(v) + e); with e = eps sqrt(1-b2^t) that is
            # torch's lr/(1-b1^t) m/(sqrt(v/(1-b2^t)) + eps)
            trainer.optimizer.epsilon = ADAM_EPS * math.sqrt(1.0 - ADAM_BETA2 ** step)
        trainer.step(1, ignore_stale_grad=True)  # 1: no rescaling of the gradients
        for n, p, kind in recorded:
            if kind == "param":
                kept.append((f"step{step}/param/{n}", _numpy(p.data(ctx))))
            elif _is_float(p.data(ctx)):
                kept.append((f"step{step}/buffer/{n}", _numpy(p.data(ctx))))
    mx.nd.waitall()
    elapsed = time.perf_counter() - t0
    for key, a in kept:
        arrays.keep(key, a)
    meta["seconds"] = elapsed
    arrays.save(request["out"], meta)
    return meta


def main() -> None:
    sideproto.main(run)


if __name__ == "__main__":
    main()
