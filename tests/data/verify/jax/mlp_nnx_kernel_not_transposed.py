"""A broken port of the MLP: its converter copies Linear weights without transposing them
(torch keeps (out, in), an NNX kernel is (in, out))."""
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


def _entries(model):
    for path, m in nnx.iter_modules(model):
        if isinstance(m, nnx.Linear):
            prefix = ".".join(map(str, path))
            yield f"{prefix}.weight", m.kernel  # BUG: the kernel is W.T
            yield f"{prefix}.bias", m.bias


def load_torch_state_dict(model, state_dict) -> None:
    entries = dict(_entries(model))
    for name, var in entries.items():
        if name not in state_dict:
            raise KeyError(f"missing weight {name}")
        value = np.asarray(state_dict[name])
        if value.shape != var[...].shape:
            raise ValueError(f"weight {name}: shape {value.shape} does not fit {var[...].shape}")
        var[...] = jnp.asarray(value)


def torch_state_dict(model) -> dict:
    return {name: np.asarray(var[...], dtype=np.float32) for name, var in _entries(model)}
