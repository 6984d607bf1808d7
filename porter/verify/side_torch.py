"""One side of a model-level verification, run in its own interpreter:
``python -m porter.verify.side_torch REQUEST.json``.

It loads a user's file as a module (its ``__main__`` block does not run), builds the model
from an expression, takes or exports the initial weights and inputs, and records forward
outputs (every submodule's output, in execution order), gradients, and the loss, parameters
and buffers after each of K optimizer steps, into an .npz file plus a JSON of metadata.
On the XLA device, nothing is read back until all steps ran, and torch_xla's metrics give
the compilations, transfers and CPU fallbacks of each step.
"""
from __future__ import annotations

import copy
import time
from typing import Optional

import numpy as np

from porter.verify import sidenpz, sideproto, tpu_lowerings


# libraries' random layers that drop whole samples (stochastic depth): class -> its probability
_DROP_PATHS = {("torchvision.ops.stochastic_depth", "StochasticDepth"): "p", ("timm.layers.drop", "DropPath"): "drop_prob"}


def _drop_path_attribute(mod) -> Optional[str]:
    """The probability attribute of a stochastic-depth layer (torchvision's StochasticDepth, timm's
    DropPath, and subclasses) that is not zero, else None."""
    for cls in type(mod).__mro__:
        attr = _DROP_PATHS.get((cls.__module__, cls.__name__))
        if attr is not None:
            return attr if getattr(mod, attr, 0.0) else None
    return None


def _to_numpy(t):
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy().copy()  # never a view of a tensor that training updates in place


def _flatten(obj, prefix: str, out: list):
    import torch

    out.extend(sideproto.flatten(obj, lambda t: isinstance(t, torch.Tensor), prefix))


def _uninitialized(t) -> bool:
    from torch.nn.parameter import UninitializedTensorMixin

    return isinstance(t, UninitializedTensorMixin)


def _materialize(model, inputs_np) -> None:
    """Give lazy layers their parameters with one forward on the host, in eval mode (no running
    statistics move, no dropout), before the model is moved: torch_xla loses a lazy
    parameter's deferred shape when the module is moved to the XLA device before its first
    forward (measured on torch_xla 2.9)."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(*[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs_np])
    model.train(was_training)


def run(request: dict) -> dict:
    from porter.verify.trace import HostRandomMode

    # random numbers drawn in a forward (torch.randn_like in a VAE) come from the host
    # generator in the same order on both sides, as at script level
    with HostRandomMode():
        return _run(request)


def _run(request: dict) -> dict:
    import torch

    device_kind = request["device"]
    meta: dict = {"notes": [], "health": None}
    if device_kind == "cpu" and request.get("cuda_shim"):
        try:
            from porter.verify import cuda_shim

            cuda_shim.install()
            meta["notes"].append("CUDA calls of the original served by the CPU")
        except ImportError:
            pass
    torch.manual_seed(request["seed"])
    if device_kind == "xla":
        import torch_xla
        import torch_xla.debug.metrics as met

        try:
            import torch_xla.backends

            torch_xla.backends.set_mat_mul_precision("highest")
        except Exception:  # older torch_xla: the default is already highest on CPU
            pass
        device = torch_xla.device()
        sync = torch_xla.sync
    else:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        device = torch.device("cpu")
        sync = lambda: None  # noqa: E731
        met = None

    ns = sideproto.load_namespace(request["file"])
    try:
        model = eval(request["model"], ns)  # the user's expression, in the user's namespace
    except Exception as exc:
        raise RuntimeError(f"--model {request['model']!r} failed in {request['file']}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise RuntimeError(f"--model {request['model']!r} gave a {type(model).__name__}, not a torch.nn.Module")

    dropouts = []
    drop_paths = []  # (module name, probability attribute): the port's side zeroes the same ones
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.p > 0:
            mod.p = 0.0
            dropouts.append(name)
        elif isinstance(mod, (torch.nn.MultiheadAttention,)) and mod.dropout > 0:
            mod.dropout = 0.0
            dropouts.append(name)
        elif isinstance(mod, (torch.nn.RNNBase,)) and mod.dropout > 0:
            mod.dropout = 0.0
            dropouts.append(name)
        elif _drop_path_attribute(mod) is not None:
            drop_paths.append((name, _drop_path_attribute(mod)))
            setattr(mod, drop_paths[-1][1], 0.0)
            dropouts.append(name)
    if dropouts:
        meta["notes"].append(f"dropout switched off for the comparison in: {', '.join(dropouts)}")

    arrays = sidenpz.Arrays()
    if drop_paths:
        arrays.put("drop_paths", np.array([f"{n}\t{a}" for n, a in drop_paths]))
    shared = sidenpz.Shared(request["shared"]) if request.get("shared") else None
    if shared is not None:
        state = {k: torch.from_numpy(v) for k, v in shared.state().items()}
        own = model.state_dict()
        # a lazy layer (nn.LazyLinear, a port's Gluon layer with a deferred input size) takes
        # its shape from the loaded tensor, as load_state_dict materializes it
        mm = sidenpz.mismatch({k: None if _uninitialized(v) else tuple(v.shape) for k, v in own.items()},
                              {k: tuple(v.shape) for k, v in state.items()})
        if mm:
            meta["mismatch"] = mm
            return meta
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
        inputs_np = shared.inputs()
    else:
        inputs_np = sidenpz.request_inputs(
            request, ns, lambda t: _to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t))
        arrays.put_inputs(inputs_np)
        if any(_uninitialized(v) for v in model.state_dict().values()):
            _materialize(model, inputs_np)
            meta["notes"].append("lazy layers given their shapes by one forward of the inputs (in eval mode, on the host) before the comparison")
        for k, v in model.state_dict().items():
            arrays.put(f"init/{k}", _to_numpy(v))

    # the same model and inputs in float64, run once more at the end: the exact values the
    # float32 sides are both an approximation of (see ``_reference``)
    reference = copy.deepcopy(model) if request.get("reference") and shared is None and device_kind == "cpu" else None
    model = model.to(device)
    model.train()
    inputs = [torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in inputs_np]

    # every submodule's output of the first forward, in execution order
    layer_out: list[tuple[str, object]] = []
    names = {id(m): n for n, m in model.named_modules() if n}

    def record(mod, _inputs, out):
        # copied now: a later in-place op (nn.ReLU(inplace=True), `out += identity`) would
        # otherwise change what this layer is recorded to have produced
        sub: list = []
        _flatten(out, "", sub)
        layer_out.append((names[id(mod)], [(suffix, t.detach().clone()) for suffix, t in sub]))

    hooks = [m.register_forward_hook(record) for m in model.modules() if id(m) in names]

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt_name = request["optimizer"]
    if opt_name == "adam":
        opt = torch.optim.Adam([p for _, p in params], lr=request["lr"])
    else:
        opt = torch.optim.SGD([p for _, p in params], lr=request["lr"], momentum=0.9)
        # momentum buffers of zeros from the start (device data, copied from the host): the first
        # update is then 0.9 * 0 + grad = grad, exactly what SGD's first step does, and the same
        # graph as every later step's, so XLA compiles one step instead of two
        for _, p in params:
            opt.state[p]["momentum_buffer"] = torch.zeros(tuple(p.shape), dtype=p.dtype).to(device)

    projection = None
    kept: list[tuple[str, object]] = []  # device tensors, read back at the end
    health_steps = []
    t0 = time.perf_counter()

    def snapshot():
        if met is None:
            return None
        compiles = met.metric_data("CompileTime")
        transfers = met.metric_data("TransferFromDeviceTime")
        execs = met.metric_data("ExecuteTime")
        return {
            "compiles": compiles[0] if compiles else 0,
            "transfers": transfers[0] if transfers else 0,
            "executions": execs[0] if execs else 0,
            "fallbacks": sorted(met.executed_fallback_ops()),
            "off_tpu_fallbacks": tpu_lowerings.off_tpu_calls(met),
        }

    # the model's scalar buffers (BatchNorm's num_batches_tracked = 0) are constants of the graph
    # until materialized, and device data after the first step: materialized now, the first step
    # is the same graph as the others
    sync()
    if met is not None:
        met.clear_all()
    before = snapshot()
    for step in range(1, request["steps"] + 1):
        # optimizer step k: forward, loss, backward (the first one also records every layer's
        # output and the gradients), update; then the parameters and buffers it produced
        opt.zero_grad(set_to_none=True)
        out = model(*inputs)
        flat: list = []
        _flatten(out, "", flat)
        if not any(t.is_floating_point() for _, t in flat):
            raise RuntimeError("the model returned no floating-point tensor")
        if projection is None:
            projection_np = (shared.projection(len(flat)) if shared is not None
                             else arrays.put_projection((tuple(t.shape) for _, t in flat), request["seed"]))
            projection = [torch.from_numpy(p).to(device) for p in projection_np]
        # a fixed random projection of every output, so every output element gets a gradient
        loss = sum((t.float() * w).sum() / max(t.numel(), 1) for (_, t), w in zip(flat, projection) if t.is_floating_point())
        loss.backward()
        # every step copies the same tensors (its layer outputs and gradients too, only the
        # first step's are kept), so that each step is the same XLA graph: one compilation
        first = []
        for name, sub in layer_out:
            for suffix, t in sub:
                first.append((sidenpz.layer_key(name, suffix), t))
        layer_out.clear()
        for suffix, t in flat:
            first.append((sidenpz.output_key(suffix), t.detach().clone()))
        for n, p in params:
            if p.grad is not None:
                first.append((f"grad/{n}", p.grad.detach().clone()))
        if step == 1:
            kept += first
        kept.append((f"step{step}/loss", loss.detach().clone()))
        opt.step()
        for n, p in model.named_parameters():
            kept.append((f"step{step}/param/{n}", p.detach().clone()))
        for n, b in model.named_buffers():
            if b.is_floating_point():
                kept.append((f"step{step}/buffer/{n}", b.detach().clone()))
        sync()
        del first
        after = snapshot()
        if after is not None:
            health_steps.append({k: (after[k] - before[k]) if k != "fallbacks" else after[k] for k in after})
            before = after
    elapsed = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    if reference is not None and projection is not None:
        t_ref = time.perf_counter()
        try:
            arrays.arrays.update(_reference(reference, inputs_np, [_to_numpy(w) for w in projection], request["steps"],
                                      opt_name, request["lr"]))
            meta["reference_s"] = round(time.perf_counter() - t_ref, 3)
        except Exception as exc:  # noqa: BLE001 - a model that does not run in float64: no reference
            meta["notes"].append(f"no float64 reference: the model did not run in float64 ({type(exc).__name__}: {exc})")
        del reference
    for key, t in kept:
        arrays.keep(key, _to_numpy(t))
    meta["seconds"] = elapsed
    if met is not None:
        meta["health"] = {"steps": health_steps}
    arrays.save(request["out"], meta)
    return meta


def _reference(model, inputs_np, projection_np, steps: int = 1, optimizer: str = "sgd", lr: float = 0.01) -> dict:
    """The original's run again, in float64 on the CPU, from the same weights, inputs and output
    projection: ``ref/<key>`` for every layer output, model output and gradient of the first
    forward and backward, and for each of ``steps`` optimizer steps (the same optimizer) its loss,
    parameters and floating-point buffers. The comparison uses it to tell float32 rounding (the
    port as far from these values as the original is) from a real difference; over the steps
    the rounding of every gradient adds up in the loss and the weights."""
    import torch

    model = model.double().train()
    names = {id(m): n for n, m in model.named_modules() if n}
    recorded: list = []

    def record(mod, _inputs, out):
        sub: list = []
        _flatten(out, "", sub)
        recorded.append((names[id(mod)], [(suffix, t.detach().clone()) for suffix, t in sub]))

    hooks = [m.register_forward_hook(record) for m in model.modules() if id(m) in names]
    inputs = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs_np]
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if optimizer == "adam":
        opt = torch.optim.Adam([p for _, p in params], lr=lr)
    else:
        opt = torch.optim.SGD([p for _, p in params], lr=lr, momentum=0.9)
    projection = [torch.from_numpy(w).double() for w in projection_np]
    ref = {}
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        out = model(*inputs)
        flat: list = []
        _flatten(out, "", flat)
        loss = sum((t.double() * w).sum() / max(t.numel(), 1)
                   for (_, t), w in zip(flat, projection) if t.is_floating_point())
        loss.backward()
        if step == 1:
            for h in hooks:
                h.remove()
            for name, sub in recorded:
                for suffix, t in sub:
                    ref["ref/" + sidenpz.layer_key(name, suffix)] = t
            for suffix, t in flat:
                ref["ref/" + sidenpz.output_key(suffix)] = t.detach().clone()
            for n, p in params:
                if p.grad is not None:
                    ref[f"ref/grad/{n}"] = p.grad.detach().clone()
        ref[f"ref/step{step}/loss"] = loss.detach().clone()
        opt.step()
        for n, p in model.named_parameters():
            ref[f"ref/step{step}/param/{n}"] = p.detach().clone()
        for n, b in model.named_buffers():
            if b.is_floating_point():
                ref[f"ref/step{step}/buffer/{n}"] = b.detach().clone()
    return {k: t.detach().numpy().copy() for k, t in ref.items() if t.is_floating_point()}


def main() -> None:
    sideproto.main(run)


if __name__ == "__main__":
    main()
