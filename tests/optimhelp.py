"""torch.optim optimizers and LR schedulers against porter's optax ports (JX201): a small
training script is run as written in torch and, ported, in JAX on the same problem (a linear
model, the same initial parameters, the same batches); the parameters before every update are
compared (tests/test_jax_ops_run.py, tests/test_jax_optim.py)."""
import numpy as np

EPOCHS, BATCHES = 4, 5  # 20 optimizer steps


def training_script(optimizer: str, scheduler=None, when=None, epochs_var: str = "EPOCHS", step_arg: str = "") -> str:
    """The script: ``optimizer = <optimizer>``, ``scheduler = <scheduler>`` stepped per "epoch",
    per "batch", or per epoch around a "function" that runs the epoch's batches;
    ``step_arg``: what ``scheduler.step(...)`` is given (ReduceLROnPlateau's metric)."""
    lines = ["import torch", ""]
    if when == "function":
        lines += ["def train_epoch(model, loader, optimizer):", "    for x, y in loader:", "        optimizer.zero_grad()",
                  "        loss_fn(model(x), y).backward()", "        optimizer.step()", ""]
    if when == "global":  # the epoch's function loops over the module's loader
        lines += ["def train_epoch(epoch):", "    for x, y in train_loader:", "        optimizer.zero_grad()",
                  "        loss_fn(model(x), y).backward()", "        optimizer.step()", ""]
    lines.append(f"optimizer = {optimizer}")
    if scheduler:  # "part = ...\n...\nSequentialLR(...)": statements before the scheduler's
        *before, last = scheduler.split("\n")
        lines += [*before, f"scheduler = {last}"]
    lines += ["", f"for epoch in range({epochs_var}):"]
    if when == "function":
        lines.append("    train_epoch(model, train_loader, optimizer)")
    elif when == "global":
        lines.append("    train_epoch(epoch)")
    else:
        lines += ["    for x, y in train_loader:", "        optimizer.zero_grad()", "        loss = loss_fn(model(x), y)",
                  "        loss.backward()", "        optimizer.step()"]
        if when == "batch":
            lines.append(f"        scheduler.step({step_arg})")
    if when in ("epoch", "function", "global"):
        lines.append(f"    scheduler.step({step_arg})")
    return "\n".join(lines) + "\n"


def problem(batches: int = BATCHES):
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    b0 = rng.standard_normal(2).astype(np.float32)
    data = [(rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)) for _ in range(batches)]
    return w0, b0, data


class Recorder:
    """The torch side's train_loader: records the parameters before each batch."""

    def __init__(self, batches, model, trace):
        self.batches, self.model, self.trace = batches, model, trace

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        import torch

        for x, y in self.batches:
            self.trace.append(np.concatenate([p.detach().numpy().ravel().copy() for p in self.model.parameters()]))
            yield torch.from_numpy(x), torch.from_numpy(y)


def torch_trace(src: str, epochs: int = EPOCHS, batches: int = BATCHES, extra=None) -> list:
    """The parameters before every update of the original script, and after the last."""
    import torch

    w0, b0, data = problem(batches)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w0))
        model.bias.copy_(torch.from_numpy(b0))
    trace: list = []
    ns = {"model": model, "EPOCHS": epochs, "loss_fn": lambda out, y: ((out - y) ** 2).mean(), **(extra or {})}
    ns["train_loader"] = Recorder(data, model, trace)
    exec(compile(src, "<torch>", "exec"), ns)
    trace.append(np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]))
    return trace


def jax_model(w0, b0):
    import jax.numpy as jnp
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self):
            self.weight = nnx.Param(jnp.asarray(w0))
            self.bias = nnx.Param(jnp.asarray(b0))

        def __call__(self, x):
            return x @ self.weight.T + self.bias

    return Linear()


def flat(m) -> np.ndarray:
    return np.concatenate([np.asarray(m.weight[...]).ravel(), np.asarray(m.bias[...]).ravel()])


def jax_trace(head: str, epochs: int = EPOCHS, batches: int = BATCHES, per_epoch=None, extra=None) -> list:
    """The port's optimizer (and schedule) built by ``head`` (the ported script up to its
    loop), driven by the same updates; ``per_epoch(namespace, epoch)`` runs after each epoch
    (a host-side scheduler step)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    w0, b0, data = problem(batches)
    model = jax_model(w0, b0)
    ns = {"model": model, "train_loader": data, "EPOCHS": epochs, **(extra or {})}
    exec(compile(head, "<port>", "exec"), ns)
    optimizer = ns["optimizer"]
    trace = []
    for epoch in range(epochs):
        for x, y in data:
            trace.append(flat(model))
            grads = nnx.grad(lambda m: jnp.mean((m(jnp.asarray(x)) - jnp.asarray(y)) ** 2))(model)
            optimizer.update(model, grads)
        if per_epoch is not None:
            per_epoch(ns, epoch)
    trace.append(flat(model))
    del jax
    return trace


def assert_same_traces(trace_t: list, trace_j: list, tol: float = 1e-5) -> None:
    assert len(trace_t) == len(trace_j), (len(trace_t), len(trace_j))
    for step, (t, j) in enumerate(zip(trace_t, trace_j)):
        # relative to the parameters' scale (an element crossing zero has no relative error)
        err = np.max(np.abs(j - t)) / np.max(np.abs(t))
        assert err <= tol, f"parameters after {step} steps: relative error {err:.2e}\ntorch {t}\nport  {j}"
