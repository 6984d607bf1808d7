"""The MLP ported to Flax NNX by hand, following the JAX target's contract: attribute names
kept, `rngs` passed to every layer, and the two weight converters at module level."""
import jax.numpy as jnp
import numpy as np
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, d_in=16, hidden=32, n_out=10, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_in, hidden, rngs=rngs)
        self.act = nnx.relu
        self.fc2 = nnx.Linear(hidden, hidden, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.head = nnx.Linear(hidden, n_out, rngs=rngs)

    def __call__(self, x):
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.head(self.drop(x))


# torch name of each layer's weights -> (NNX variable, torch layout -> NNX, NNX -> torch layout)
def _linear(m):
    yield "weight", m.kernel, lambda w: w.T, lambda k: k.T
    if m.bias is not None:
        yield "bias", m.bias, lambda b: b, lambda b: b


def _entries(model):
    for path, m in nnx.iter_modules(model):
        if isinstance(m, nnx.Linear):
            prefix = ".".join(map(str, path))
            for suffix, var, to_nnx, to_torch in _linear(m):
                yield f"{prefix}.{suffix}", var, to_nnx, to_torch


def load_torch_state_dict(model, state_dict) -> None:
    entries = {name: rest for name, *rest in _entries(model)}
    for name in state_dict:
        if name not in entries and not name.endswith("num_batches_tracked"):
            raise KeyError(f"unexpected weight {name} (the port has no such parameter)")
    for name, (var, to_nnx, _) in entries.items():
        if name not in state_dict:
            raise KeyError(f"missing weight {name} (the original has no such parameter)")
        value = to_nnx(np.asarray(state_dict[name]))
        if value.shape != var[...].shape:
            raise ValueError(f"weight {name}: shape {np.shape(state_dict[name])} does not fit {var[...].shape}")
        var[...] = jnp.asarray(value, dtype=var[...].dtype)


def torch_state_dict(model) -> dict:
    return {name: np.asarray(to_torch(np.asarray(var[...])), dtype=np.float32)
            for name, var, _, to_torch in _entries(model)}
