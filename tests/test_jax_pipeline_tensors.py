"""A tensor of the torch input pipeline read outside it (a fixed batch of samples shown after each
epoch, a validation set evaluated in one call) is still a torch tensor in a JAX port: its move to
the device becomes a NumPy array (before, `model(images[:8].to(device))` lost its `.to()` and
handed a torch tensor to the jitted model: a TypeError, no finding)."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))
HEAD = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    images = torch.rand(32, 6)
    labels = torch.arange(32) % 3
    loader = DataLoader(TensorDataset(images, labels), batch_size=8)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    """)
# spelling -> code after the training
SPELLINGS = {
    "moved in the call": "with torch.no_grad():\n    out = model(images[:8].to(device))\nprint(out.sum().item())\n",
    "moved, then called": "fixed = images[:4].to(device)\nwith torch.no_grad():\n    out = model(fixed)\n"
                          "print(out.argmax(1).tolist())\n",
    "cuda() in a function": "def evaluate(net):\n    with torch.no_grad():\n        return net(images.cuda()).argmax(1)\n\n\n"
                            "print(int((evaluate(model) == labels.cuda()).sum()))\n",
}


def _port(name: str) -> str:
    return engine.fix(HEAD + SPELLINGS[name], JAX, "train.py").source


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_pipelines_tensor_reaches_jax_as_a_numpy_array(name):
    port = _port(name)
    compile(port, "train.py", "exec")
    assert ".to(device)" not in port and ".cuda()" not in port, port
    assert "images[:8].numpy()" in port or "images[:4].numpy()" in port or "images.numpy()" in port \
        or "np.asarray(images" in port, port


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("name", ["moved in the call", "cuda() in a function"])
def test_the_port_matches_its_original_in_verify(name, tmp_path):
    """Run to its end, the port's samples and evaluation included (the step after the last compared
    one holds them): the losses of its 4 steps are the original's."""
    report = verify_json(tmp_path, HEAD + SPELLINGS[name], _port(name), 4)
    assert report["status"] == "passed", (report["summary"], report["notes"])
    assert not [n for n in report["notes"] if " failed after its " in n], report["notes"]
