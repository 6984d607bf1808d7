"""JX204 in whole ports: hand-written SGD updates, in several spellings, become an optimizer and
then one jitted train step (JX201, JX301) with nothing of torch's autograd left; a rate the
script changes is reported and the loop left alone. fixtures/jax/manual_sgd runs one such port
against its original."""
import textwrap

import pytest

from porter import engine, registry

from scripthelp import SMALL_NET, verify_json

from lanes import fixture_slice

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=True)

HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


model = Net()
learning_rate = 0.05
'''

UPDATES = {
    "isub-no-grad": "    with torch.no_grad():\n        for p in model.parameters():\n            p -= learning_rate * p.grad\n",
    "data-isub": "    for p in model.parameters():\n        p.data -= learning_rate * p.grad.data\n",
    "add-alpha": "    for p in model.parameters():\n        p.data.add_(p.grad, alpha=-learning_rate)\n",
    "add-old-api": "    for f in model.parameters():\n        f.data.add_(-learning_rate, f.grad.data)\n",
    "sub": "    for p in model.parameters():\n        p.data.sub_(p.grad * learning_rate)\n",
    "assign": "    for w in model.parameters():\n        w.data = w.data - learning_rate * w.grad\n",
    "literal-rate-and-zero": "    with torch.no_grad():\n        for p in model.parameters():\n            p.sub_(0.05 * p.grad)\n            p.grad.zero_()\n",
    "grad-none": "    for p in model.parameters():\n        p.data.add_(-learning_rate * p.grad)\n        p.grad = None\n",
}


def script(update: str, zero: str = "    model.zero_grad()\n") -> str:
    loop = "for x, y in loader:\n" + zero + "    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n" + update
    return HEAD + loop


@pytest.mark.parametrize("name", list(UPDATES))
def test_manual_update_becomes_the_jitted_step(name):
    zero = "" if "zero" in name or "none" in name else "    model.zero_grad()\n"
    result = engine.fix(script(UPDATES[name], zero), JAX)
    src = result.source
    assert "def train_step(model, optimizer, x, y):" in src, src
    assert "optax.sgd(learning_rate)" in src or "optax.sgd(0.05)" in src, src
    for gone in (".backward()", ".grad", "zero_grad", "model.parameters()"):
        assert gone not in src, (gone, src)
    assert not [f for f in result.remaining if f.code in ("JX204", "JX301", "JX901")], result.remaining
    compile(src, "<port>", "exec")


@pytest.mark.parametrize("change", [
    "    learning_rate = learning_rate * 0.5\n",  # every epoch
    "    if epoch == 1:\n        learning_rate /= 4.0\n",  # on a plateau (word-level LMs)
])
def test_a_rate_the_script_changes_is_set_before_each_step(change):
    src = HEAD + textwrap.dedent("""
        for epoch in range(3):
            for x, y in loader:
                model.zero_grad()
                F.cross_entropy(model(x), y).backward()
                for p in model.parameters():
                    p.data -= learning_rate * p.grad
    """) + change
    src = engine.fix(src, JAX).source
    assert "optax.inject_hyperparams(optax.sgd)(learning_rate)" in src, src
    # the rate the loop reads goes into the optimizer's state before the step that uses it
    assert ('optimizer.opt_state.hyperparams["learning_rate"][...] = learning_rate\n'
            '        loss = train_step(model, optimizer, x, y)\n') in src, src
    for gone in (".backward()", ".grad", "param_groups"):
        assert gone not in src, (gone, src)
    compile(src, "<port>", "exec")


def test_a_rate_first_bound_inside_the_training_loop_is_reported():
    src = HEAD + textwrap.dedent("""
        for epoch in range(3):
            rate = 0.1 * 0.5 ** epoch
            for x, y in loader:
                model.zero_grad()
                F.cross_entropy(model(x), y).backward()
                for p in model.parameters():
                    p.data -= rate * p.grad
    """)
    result = engine.fix(src, JAX)
    found = [f for f in result.remaining if f.code == "JX204"]
    assert found and "rate the script changes" in found[0].message, result.remaining
    assert "for p in model.parameters():  # porter: manual" in result.source
    assert any(f.code == "JX901" and "backward" in f.message for f in result.remaining), result.remaining


@pytest.mark.parametrize("loop", [
    "for t in range(100):\n    loss = ((model(x) - y) ** 2).sum()\n    model.zero_grad()\n    loss.backward()\n",
    "for xb, yb in DataLoader(TensorDataset(x, y), batch_size=4):\n    loss = F.mse_loss(model(xb), yb)\n"
    "    loss.backward()\n",
])
def test_a_module_level_loop_of_a_file_without_classes_has_the_converter_before_it(loop):
    """A script with no class (an nn.Sequential model) that updates by hand at module level: the
    optimizer JX204 writes is built just before the loop, so the weight converter (which the
    verifier calls when the optimizer is built) is defined after the imports, not at the end."""
    src = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
           "from torch.utils.data import DataLoader, TensorDataset\n\n"
           "x = torch.randn(16, 3)\ny = torch.randn(16, 1)\n"
           "model = nn.Sequential(nn.Linear(3, 1))\nlearning_rate = 1e-3\n" + loop
           + "    with torch.no_grad():\n        for p in model.parameters():\n            p -= learning_rate * p.grad\n")
    port = engine.fix(src, JAX).source
    assert "nnx.Optimizer" in port, port
    assert port.index("def load_torch_state_dict(") < port.index("nnx.Optimizer(") < port.index("\nfor "), port


VERIFIED = ["add-alpha", "isub-no-grad", "assign", "decaying", "init-in-place", "no-class"]


@pytest.mark.jax
# half of them per run of the suite (their ports: test_manual_update_becomes_the_jitted_step)
@pytest.mark.parametrize("name", fixture_slice(VERIFIED, 2))
def test_a_manual_update_port_matches_its_original_in_verify(tmp_path, name):
    """`porter verify --script` of such a port: the original has no torch.optim optimizer, so
    its weights are exported at its first backward (the model the loss reaches) and loaded
    into the port's nnx.Optimizer; the model's initialisation draws apart from the global
    generator on both sides, so the data drawn after it (here the dataset and the shuffling)
    is the same. Before, nothing aligned the two and step 1 differed."""
    original = SMALL_NET + textwrap.dedent('''
        torch.manual_seed(0)
        model = Net()
        learning_rate = 0.05
        data = TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,)))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        for x, y in loader:
            model.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
    ''') + textwrap.indent(textwrap.dedent(UPDATES.get(name, UPDATES["add-alpha"])), "    ")
    if name == "decaying":  # a rate that changes after every update: each step uses its own
        original += "    learning_rate *= 0.5\n"
    if name == "init-in-place":  # a model that initialises its weights in place (word-level LMs' init_weights)
        original = original.replace(
            "        self.layers = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))\n",
            "        self.layers = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))\n"
            "        self.first = nn.Linear(10, 10)\n"
            "        self.first.weight.data.uniform_(-0.1, 0.1)\n"
            "        self.first.bias.data.zero_()\n").replace(
            "        return self.layers(x)\n", "        return self.layers(self.first(x))\n")
        assert "uniform_" in original
    if name == "no-class":  # a Sequential model, no class in the file: the converter goes before the loop
        original = original.split("class Net", 1)[0] + original.split("        return self.layers(x)\n", 1)[1].replace(
            "model = Net()", "model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))")
    port = engine.fix(original, JAX).source
    assert "nnx.Optimizer" in port, port
    report = verify_json(tmp_path, original, port, 3)
    assert report["passed"], (report["summary"], report["notes"])
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]
    tensors = 6 if name == "init-in-place" else 4
    model = "Sequential" if name == "no-class" else "Net"
    assert f"original: manual updates: the initial weights of its {model} ({tensors} tensors)" in report["notes"], report["notes"]


def test_the_model_of_manual_updates_is_exported_after_a_plain_backward(tmp_path):
    """A backward of plain tensors first (an autograd demo) exports nothing: the model whose
    parameters a later loss reaches is weights_0, which the port's first nnx.Optimizer loads."""
    import numpy as np

    from porter.verify.trace import trace_script

    script = tmp_path / "train.py"
    script.write_text(SMALL_NET + textwrap.dedent('''
        a = torch.tensor(2.0, requires_grad=True)
        (a ** 3).backward()
        torch.manual_seed(0)
        model = Net()
        for step in range(3):
            model.zero_grad()
            F.cross_entropy(model(torch.randn(8, 10)), torch.randint(0, 4, (8,))).backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
    '''))
    record = trace_script(script, host_random=True, seed=0, max_steps=2, export_weights=tmp_path / "w",
                          reseed_at_optimizer=True, init_apart=True, cwd=tmp_path, timeout=120)
    assert record["num_steps"] == 2 and record["optimizers_created"] == 0, record.get("exception")
    assert record["exported_weights"] == ["manual updates: the initial weights of its Net (4 tensors)"]
    assert sorted(np.load(tmp_path / "w" / "weights_0.npz").files) == [
        "layers.0.bias", "layers.0.weight", "layers.2.bias", "layers.2.weight"]
