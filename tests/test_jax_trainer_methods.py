"""JAX ports of trainer classes whose training step is a method of its own, written out without
a loop (`def _run_batch(self, source, targets): self.optimizer.zero_grad(); ...; self.optimizer.step()`),
called from an epoch loop elsewhere: the step becomes a module-level jitted function given
`self.model`, `self.optimizer`, ... (as a loop in a method is), the batches reach it as NumPy
arrays, and device numbers (`.to(self.gpu_id)`, `.to(local_rank)`) go like devices."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

from scripthelp import SMALL_NET

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

HEAD = SMALL_NET + '''
'''

TRAINERS = {
    "run_batch": '''
class Trainer:
    def __init__(self, model, data, gpu_id=0):
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.data = data
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.criterion = nn.CrossEntropyLoss()

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = self.criterion(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def train(self, epochs):
        for epoch in range(epochs):
            for source, targets in self.data:
                source = source.to(self.gpu_id)
                targets = targets.to(self.gpu_id)
                print("loss", self._run_batch(source, targets).item())
''',
    "train_step_batch": '''
class Trainer:
    def __init__(self, model, data, local_rank=0, max_norm=0.5):
        self.local_rank = local_rank
        self.model = model.to(local_rank)
        self.data = data
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.max_norm = max_norm

    def train_step(self, batch):
        x, y = batch
        x, y = x.to(self.local_rank), y.to(self.local_rank)
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
        self.opt.step()
        return loss.item()

    def train(self, epochs):
        for epoch in range(epochs):
            for batch in self.data:
                print("loss", self.train_step(batch))
''',
    "step_then_zero": '''
class Trainer:
    def __init__(self, model, data):
        self.model = model.cuda()
        self.data = data
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def step(self, inputs, labels):
        logits = self.model(inputs)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        self.optim.step()
        self.optim.zero_grad()
        return loss

    def train(self, epochs):
        for epoch in range(epochs):
            for inputs, labels in self.data:
                inputs, labels = inputs.cuda(0), labels.cuda(0)
                print("loss", self.step(inputs, labels).item())
''',
}

TAIL = '''

torch.manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,))), batch_size=16)
Trainer(Net(), data).train(2)
'''


def script(name: str) -> str:
    return textwrap.dedent(HEAD).lstrip("\n") + TRAINERS[name] + TAIL


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_step_method_becomes_a_jitted_step(name):
    result = engine.fix(script(name), JAX, "train.py")
    out = result.source
    assert "@nnx.jit" in out and "nnx.value_and_grad" in out, out
    assert ".backward(" not in out and "zero_grad" not in out and ".to(" not in out and ".cuda(" not in out, out
    assert not [f for f in result.remaining if f.code in ("JX301", "JX901")], [f.message for f in result.remaining]


@pytest.mark.parametrize("stored", [
    "        self.model = model\n        self.optimizer = optimizer\n",
    "        self.model, self.optimizer = model, optimizer\n",  # one tuple assignment
    "        (self.model, self.optimizer) = (model.cuda(), optimizer)\n",
])
def test_a_trainer_given_its_model_and_optimizer_steps_in_jax(stored):
    """The model and optimizer handed to the trainer's constructor, stored one by one or in one
    tuple assignment (before, the tuple kept the torch step: JX901 at its backward())."""
    source = textwrap.dedent(HEAD).lstrip("\n") + (
        "\nclass Trainer:\n    def __init__(self, model, optimizer, data):\n" + stored + "        self.data = data\n\n"
        "    def step(self, x, y):\n        self.optimizer.zero_grad()\n"
        "        loss = F.cross_entropy(self.model(x), y)\n        loss.backward()\n        self.optimizer.step()\n"
        "        return loss\n\n    def train(self, epochs):\n        for epoch in range(epochs):\n"
        "            for x, y in self.data:\n                print('loss', self.step(x, y).item())\n\n\n"
        "torch.manual_seed(0)\n"
        "data = DataLoader(TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,))), batch_size=16)\n"
        "net = Net()\noptimizer = torch.optim.SGD(net.parameters(), lr=0.1)\nTrainer(net, optimizer, data).train(2)\n")
    result = engine.fix(source, JAX, "train.py")
    out = result.source
    assert "@nnx.jit" in out and ".backward(" not in out and "zero_grad" not in out, out
    assert not [f for f in result.remaining if f.code in ("JX301", "JX901")], [f.message for f in result.remaining]


def test_a_step_porter_cannot_port_is_reported_at_its_backward():
    # an optimizer of unknown making, or one over a list of tensors (no model to differentiate)
    for made in ("make_optimizer(self.model)", "torch.optim.SGD([torch.zeros(3, requires_grad=True)], lr=0.1)"):
        source = script("run_batch").replace(
            "self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)",
            f"self.optimizer = {made}")
        result = engine.fix(source, JAX, "train.py")
        backward = result.source.splitlines().index("        loss.backward()") + 1  # the port's lines
        lines = {f.position.line for f in result.remaining if f.code in ("JX301", "JX901")}
        assert backward in lines, [(f.code, f.position.line, f.message) for f in result.remaining]


@pytest.mark.jax
@pytest.mark.parametrize("name", ["run_batch", "train_step_batch"])
def test_the_port_matches_the_original(tmp_path, name):
    original = tmp_path / "original.py"
    original.write_text(script(name))
    ported = tmp_path / "ported.py"
    ported.write_text(engine.fix(original.read_text(), JAX, "train.py").source)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original), str(ported),
                           "--steps", "3", "--format", "json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
