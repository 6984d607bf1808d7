"""The JAX port of mlp.py (Flax NNX + optax), with the JAX target's weight converter."""
import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--debug-print", action="store_true")
args = parser.parse_args()


class MLP(nnx.Module):
    def __init__(self, *, rngs):
        self.fc1 = nnx.Linear(10, 32, rngs=rngs)
        self.fc2 = nnx.Linear(32, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.relu(self.fc1(x)))


def load_torch_state_dict(model, state_dict):
    for name in ("fc1", "fc2"):
        layer = getattr(model, name)
        layer.kernel.value = jnp.asarray(np.asarray(state_dict[f"{name}.weight"]).T)
        layer.bias.value = jnp.asarray(np.asarray(state_dict[f"{name}.bias"]))


def torch_state_dict(model):
    out = {}
    for name in ("fc1", "fc2"):
        layer = getattr(model, name)
        out[f"{name}.weight"] = np.asarray(layer.kernel.value).T
        out[f"{name}.bias"] = np.asarray(layer.bias.value)
    return out


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        logits = model(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    if args.debug_print:
        jax.debug.print("loss {}", loss)
    return loss


rng = np.random.default_rng(0)
features = torch.from_numpy(rng.standard_normal((256, 10)).astype(np.float32))
labels = torch.from_numpy(rng.integers(0, 3, 256))
loader = DataLoader(TensorDataset(features, labels), batch_size=32, shuffle=True, drop_last=True)
model = MLP(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
for epoch in range(args.epochs):
    for i, (x, y) in enumerate(loader):
        loss = train_step(model, optimizer, x.numpy(), y.numpy().astype(np.int32))
        if i % 4 == 0:
            print(f"epoch {epoch} batch {i} loss {float(loss):.4f}")
print("done")
