"""JAX ports of training code in shapes other than `opt = torch.optim.X(model.parameters())` and
`for x, y in loader:` in one function: an optimizer a function or method returns
(`return torch.optim.AdamW(...)`), batches no for loop binds (`x, y = next(iter(loader))`,
`batch = next(it)` in a while loop, a batch handed to a function that takes it apart), and a
device-type string derived from the device (`'cuda' if 'cuda' in device else 'cpu'`)."""
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
    def configure_optimizers(self, weight_decay, lr):
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
        nodecay = [p for n, p in self.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr)


def make_optimizer(net, lr):
    return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)


torch.manual_seed(0)
dataset = TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,)))
loader = DataLoader(dataset, batch_size=16)
model = Net()
'''

OPTIMIZERS = {
    "method": "optimizer = model.configure_optimizers(0.1, 1e-2)\n",
    "function": "optimizer = make_optimizer(model, 0.05)\n",
}

LOOPS = {
    # the one-batch overfit
    "overfit": '''
x, y = next(iter(loader))
for step in range(4):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print("loss", loss.item())
''',
    # an iterator refilled in a while loop, the batch taken apart by index
    "while": '''
it = iter(loader)
step = 0
while step < 6:
    try:
        batch = next(it)
    except StopIteration:
        it = iter(loader)
        batch = next(it)
    inputs, targets = batch[0], batch[1]
    optimizer.zero_grad()
    loss = F.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    step += 1
    print("loss", loss.item())
''',
    # a step function given the whole batch, which it unpacks
    "function": '''


def train_step(model, optimizer, batch):
    features, labels = batch
    optimizer.zero_grad()
    loss = F.cross_entropy(model(features), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


for epoch in range(2):
    for batch in loader:
        print("loss", train_step(model, optimizer, batch))
''',
    # the same as a trainer's method, the batch given by keyword (the optimizer made by the
    # trainer: the one the module makes goes unused)
    "method": '''


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = make_optimizer(self.model, 0.05)
        self.loader = DataLoader(dataset, batch_size=16)

    def train_step(self, batch):
        features, labels = batch
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(features), labels)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def fit(self, epochs):
        for epoch in range(epochs):
            for i, batch in enumerate(self.loader):
                print("loss", self.train_step(batch=batch))


Trainer(model).fit(2)
''',
}


def script(optimizer: str, loop: str) -> str:
    return textwrap.dedent(HEAD).lstrip("\n") + OPTIMIZERS[optimizer] + LOOPS[loop]


CASES = [("method", "overfit"), ("function", "while"), ("method", "function"), ("function", "method")]


@pytest.mark.parametrize("optimizer,loop", CASES)
def test_the_step_is_jitted_and_the_batches_become_arrays(optimizer, loop):
    result = engine.fix(script(optimizer, loop), JAX, "train.py")
    out = result.source
    assert "@nnx.jit" in out and "return nnx.Optimizer(" in out and "torch.optim" not in out, out
    assert ".backward(" not in out and "zero_grad" not in out, out
    converted = {"overfit": "x, y = x.numpy(), y.numpy()", "while": "inputs, targets = inputs.numpy(), targets.numpy()",
                 "function": "features, labels = np.asarray(features), np.asarray(labels)",
                 "method": "features, labels = np.asarray(features), np.asarray(labels)"}[loop]
    assert converted in out, out
    assert "batch = batch.numpy()" not in out, out  # a list of tensors: its parts are converted
    assert not [f for f in result.remaining if f.code in ("JX201", "JX301", "JX303", "JX901")], \
        [(f.code, f.position.line, f.message) for f in result.remaining]
    again = engine.fix(out, JAX, "train.py")
    assert not again.changed, again.source


def test_an_optimizer_returned_with_other_values_is_reported_at_its_line():
    source = script("method", "overfit").replace(
        "        return torch.optim.AdamW(groups, lr=lr)",
        "        return [torch.optim.AdamW(groups, lr=lr)], []")
    result = engine.fix(source, JAX, "train.py")
    line = next(i for i, text in enumerate(result.source.splitlines(), 1) if "return [torch.optim.AdamW" in text)
    assert any(f.code == "JX201" and f.position.line == line and "other values" in f.message for f in result.remaining), \
        [(f.code, f.position.line, f.message) for f in result.remaining]


DEVICE_TYPES = {
    "in": "device_type = 'cuda' if 'cuda' in device else 'cpu'",
    "startswith": "device_type = 'cuda' if str(device).startswith('cuda') else 'cpu'",
    "negated": "device_type = 'cpu' if not device.startswith('cuda') else 'cuda'",
    "torch.device": "device_type = torch.device(device).type",
    "type test": "device_type = 'cuda' if torch.device(device).type == 'cuda' else 'cpu'",
}


@pytest.mark.parametrize("derived", list(DEVICE_TYPES))
def test_a_device_type_derived_from_the_device_follows_it(derived):
    body = f'''
        import torch

        device = 'cuda:0'
        {DEVICE_TYPES[derived]}
        amp = torch.autocast(device_type=device_type, dtype=torch.bfloat16)
        x = torch.zeros(3).to(device)
    '''
    source = textwrap.dedent(body).lstrip("\n")
    result = engine.fix(source, JAX, "train.py")
    assert "device = 'cpu'" in result.source, result.source
    # tested, the derived type keeps the fix unsafe (as a test of the device does)
    tested = source.replace("amp = torch.autocast(device_type=device_type, dtype=torch.bfloat16)",
                            "if device_type == 'cuda':\n    print('on a GPU')")
    result = engine.fix(tested, JAX, "train.py")
    assert "device = 'cuda:0'" in result.source, result.source
    found = [f for f in result.remaining if f.code == "JX312"]
    assert found and "device_type == 'cuda'" in found[0].message, [f.message for f in result.remaining]


@pytest.mark.jax
def test_the_ports_run_and_match_the_original(tmp_path):
    """Each port runs under JAX; one (a returned optimizer, a batch handed to a step function)
    is verified against torch step by step."""
    runner = ["import runpy"]
    for optimizer, loop in CASES:
        path = tmp_path / f"{optimizer}_{loop}.py"
        path.write_text(engine.fix(script(optimizer, loop), JAX, "train.py").source)
        if (optimizer, loop) != ("method", "function"):  # verified below
            runner.append(f"runpy.run_path({str(path)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", "\n".join(runner)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("loss")]
    assert len(losses) == 4 + 6 + 8 and all(v == v for v in losses), proc.stdout
    original = tmp_path / "original.py"
    original.write_text(script("method", "function"))
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original),
                           str(tmp_path / "method_function.py"), "--steps", "3", "--format", "json"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PJRT_DEVICE": "CPU"},
                          cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]


# a training step JX301 cannot rewrite into a jitted step stays torch's: its loop keeps the
# loader's torch tensors (the torch code left in it takes them; a NumPy batch crashed at the
# first tensor method, timm's mixup), and the backward() left is reported at its line
TORCH_STEPS = {
    # the optimizer comes from another file's factory: its model is not known
    "unknown optimizer": '''
def train(model, loader, optimizer, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''',
    # the backward pass in a function defined in the loop body
    "nested backward": '''
def train(model, loader, optimizer, device):
    for batch_idx, (x, y) in enumerate(loader):
        x = x.to(device)
        y = y.to(device)

        def _backward(_loss):
            _loss.backward()
            optimizer.step()

        optimizer.zero_grad()
        _backward(F.cross_entropy(model(x), y))
''',
    # a batch the loop never moves, and the backward pass in a helper defined in the body
    "unmoved batch": '''
def train(model, loader, optimizer, device):
    for inputs, labels in loader:
        def closure():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            return loss
        optimizer.step(closure)
''',
}


@pytest.mark.parametrize("spelling", list(TORCH_STEPS))
def test_a_step_left_in_torch_keeps_torch_batches_and_is_reported(spelling):
    source = SMALL_NET + TORCH_STEPS[spelling] + '''

def main():
    device = torch.device("cuda")
    loader = DataLoader(TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,))), batch_size=16)
    model = Net().to(device)
    optimizer = make_optimizer(model)
    train(model, loader, optimizer, device)
'''
    source = source.replace("from torch.utils.data import", "from helpers import make_optimizer\nfrom torch.utils.data import")
    result = engine.fix(source, JAX, "train.py")
    train = result.source[result.source.index("def train("):result.source.index("def main(")]
    assert ".numpy()" not in train and "np.asarray" not in train, train
    backward = next(i for i, line in enumerate(result.source.splitlines(), 1)
                    if "backward()" in line and not line.lstrip().startswith("#"))
    reported = {(f.code, f.position.line) for f in result.remaining if f.position}
    assert ("JX901", backward) in reported, (backward, sorted(reported))
