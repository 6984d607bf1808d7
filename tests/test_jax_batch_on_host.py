"""JAX ports: the items of a DataLoader batch are read on the host as NumPy arrays before the
jitted step (`x, y = x.numpy(), y.numpy()`, as the loop rules write it, or one item per line);
torch's methods the script calls on them afterwards (accuracy and counts outside the step:
`y.float()`, `y.to(torch.float32)`, `y.size(0)`) are translated as on arrays, and the
conversion itself stays torch's `.numpy()` of the torch batch. Before, `y.float()` stayed with
no finding and raised AttributeError on the NumPy array."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from porter import engine, registry

SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))), batch_size=8)
for {target} in loader:
{read}    opt.zero_grad()
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    {use}
"""

SPELLINGS = {
    "float": ("correct = (out.argmax(1) == y.float()).float().sum().item()", "y.astype(jnp.float32)"),
    "to": ("correct = (out.argmax(1) == y.to(torch.float32)).sum().item()", "y.astype(jnp.float32)"),
    "size": ("seen = y.size(0)", "y.shape[0]"),
}


def _port(text: str) -> str:
    result = engine.fix(textwrap.dedent(text), engine.Options(registry.select("jax")))
    return result.source if result.changed else text


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("form", ["tuple", "batch"])
def test_batch_methods_after_the_host_read_are_translated(spelling, form):
    use, expected = SPELLINGS[spelling]
    if form == "tuple":
        target, read = "x, y", ""
    else:  # the batch indexed in the loop
        target, read = "batch", "    x, y = batch[0], batch[1]\n"
    out = _port(SCRIPT.format(target=target, read=read, use=use))
    cst.parse_module(out)
    assert expected in out, out
    assert ".float()" not in out.split("train_step(")[-1] and "torch.float32" not in out.split("train_step(")[-1]
    if form == "tuple":
        assert "x, y = x.numpy(), y.numpy()" in out  # the conversion reads the torch batch
    assert _port(out) == out
