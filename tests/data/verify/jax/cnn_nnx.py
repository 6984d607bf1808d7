"""The CNN ported to Flax NNX by hand, following the JAX target's contract.

Tensors between layers stay NCHW, as in the original; around the channels-last NNX layers
(nnx.Conv, BatchNorm over the last axis, pooling) the transposes are explicit, so
`flatten(1)` before the Linear means what it meant in torch. BatchNorm: torch's momentum 0.1
is flax's 0.9, and torch updates the running variance with the unbiased batch variance, so the
port uses a BatchNorm that does the same."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

NHWC = (0, 2, 3, 1)
NCHW = (0, 3, 1, 2)


def max_pool2(x):  # channels-last
    return nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2))


class BatchNorm(nnx.BatchNorm):
    """nnx.BatchNorm whose running variance is updated with the unbiased batch variance
    (n / (n - 1)), as torch.nn.BatchNorm2d does; normalization uses the biased one."""

    def __call__(self, x, use_running_average=None):
        if self.use_running_average if use_running_average is None else use_running_average:
            return super().__call__(x, use_running_average=True)
        axis = self.axis % x.ndim
        axes = tuple(i for i in range(x.ndim) if i != axis)
        mean = x.mean(axes)
        var = jnp.mean(jnp.square(x - jnp.expand_dims(mean, axes)), axes)
        n = x.size // x.shape[axis]
        self.mean[...] = self.momentum * self.mean[...] + (1 - self.momentum) * mean
        self.var[...] = self.momentum * self.var[...] + (1 - self.momentum) * var * (n / (n - 1))
        shape = [1] * x.ndim
        shape[axis] = -1
        y = (x - mean.reshape(shape)) * jax.lax.rsqrt(var.reshape(shape) + self.epsilon)
        return y * self.scale[...].reshape(shape) + self.bias[...].reshape(shape)


class SmallCNN(nnx.Module):
    def __init__(self, num_classes=10, *, rngs: nnx.Rngs):
        self.features = nnx.Sequential(  # channels-last inside
            nnx.Conv(3, 8, kernel_size=(3, 3), padding=((1, 1), (1, 1)), rngs=rngs),
            BatchNorm(8, momentum=0.9, epsilon=1e-5, rngs=rngs),
            nnx.relu,
            max_pool2,
        )
        self.conv2 = nnx.Conv(8, 16, kernel_size=(3, 3), padding=((1, 1), (1, 1)), use_bias=False, rngs=rngs)
        self.bn2 = BatchNorm(16, momentum=0.9, epsilon=1e-5, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.fc = nnx.Linear(16 * 4 * 4, num_classes, rngs=rngs)

    def __call__(self, x):  # x: (N, 3, 16, 16)
        x = jnp.transpose(self.features(jnp.transpose(x, NHWC)), NCHW)  # (N, 8, 8, 8)
        y = self.bn2(self.conv2(jnp.transpose(x, NHWC)))
        x = jnp.transpose(max_pool2(nnx.relu(y)), NCHW)  # (N, 16, 4, 4)
        return self.fc(self.drop(x.reshape(x.shape[0], -1)))


# torch name -> (NNX variable, torch layout -> NNX, NNX -> torch layout), per layer kind
def _layer_entries(m):
    same = (lambda v: v, lambda v: v)
    if isinstance(m, nnx.Linear):
        yield "weight", m.kernel, lambda w: w.T, lambda k: k.T
        if m.bias is not None:
            yield "bias", m.bias, *same
    elif isinstance(m, nnx.Conv):
        yield "weight", m.kernel, lambda w: w.transpose(2, 3, 1, 0), lambda k: k.transpose(3, 2, 0, 1)  # OIHW <-> HWIO
        if m.bias is not None:
            yield "bias", m.bias, *same
    elif isinstance(m, nnx.BatchNorm):
        yield "weight", m.scale, *same
        yield "bias", m.bias, *same
        yield "running_mean", m.mean, *same
        yield "running_var", m.var, *same


def _entries(model):
    modules = dict(nnx.iter_modules(model))
    for path, m in modules.items():
        # nnx.Sequential keeps its layers in `layers`: torch's features.0 is features.layers.0
        parts = [str(p) for i, p in enumerate(path)
                 if not (p == "layers" and isinstance(modules.get(path[:i]), nnx.Sequential))]
        for suffix, var, to_nnx, to_torch in _layer_entries(m):
            yield ".".join(parts + [suffix]), var, to_nnx, to_torch


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
