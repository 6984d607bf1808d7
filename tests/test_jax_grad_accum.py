"""JX301 on gradient accumulation and on optimizers made by a factory, in whole JAX ports.

Micro-steps (an inner loop of forward and backward passes, then clipping, step() and
zero_grad(); or a backward pass every iteration and the step under an `if`) become a jitted
gradient step per micro-batch, the gradients summed, and a jitted update step that clips as
torch's clip_grad_norm_ does; an optimizer made by a method of the model's class
(`model.configure_optimizers(...)`, in the script or in a module beside it) or by a function
of the program trains the model it is given. The ports run on JAX against their originals
(`porter verify --script`: the losses of each optimizer step, micro-steps summed)."""
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
    def configure_optimizers(self, weight_decay, learning_rate):
        params = {n: p for n, p in self.named_parameters()}
        decay = [p for n, p in params.items() if p.dim() >= 2]
        rest = [p for n, p in params.items() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=learning_rate)
        return optimizer


def make_optimizer(net, lr):
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    return opt


torch.manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(24, 10), torch.randint(0, 4, (24,))), batch_size=8)
model = Net()
'''

SCRIPTS = {
    # nanoGPT's train.py: micro-steps, an optional clip, step(), zero_grad(set_to_none=True)
    "nested-clip": '''
optimizer = model.configure_optimizers(0.1, 1e-2)
accum_steps = 3
grad_clip = 0.05
for it in range(4):
    for micro_step, (x, y) in enumerate(data):
        if False:
            model.require_backward_grad_sync = micro_step == accum_steps - 1
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss = loss / accum_steps
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print("loss", loss.item() * accum_steps)
''',
    # zero_grad first, the step every `accum` batches, in a function
    "gated-function": '''
def train(model, accum, epochs):
    optimizer = make_optimizer(model, 0.05)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(data):
            loss = F.cross_entropy(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)
                optimizer.step()
                optimizer.zero_grad()
                print("loss", loss.item())


train(model, 3, 4)
''',
    # nanoGPT's bench.py: the optimizer from configure_optimizers, the next batch fetched
    # between the forward pass and backward()
    "factory-prefetch": '''
optimizer = model.configure_optimizers(weight_decay=1e-2, learning_rate=1e-2)
batches = [(x.numpy(), y.numpy()) for x, y in data]
def get_batch(k):
    x, y = batches[k % len(batches)]
    return torch.from_numpy(x), torch.from_numpy(y)
X, Y = get_batch(0)
for k in range(4):
    logits = model(X)
    loss = F.cross_entropy(logits, Y)
    X, Y = get_batch(k + 1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print("loss", loss.item())
''',
}


def script(name: str) -> str:
    return textwrap.dedent(HEAD).lstrip("\n") + SCRIPTS[name]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_step_is_rewritten(name):
    result = engine.fix(script(name), JAX, "train.py")
    out = result.source
    assert "nnx.value_and_grad" in out and ".backward(" not in out and "zero_grad" not in out, out
    assert not [f for f in result.remaining if f.code in ("JX301",)], [f.message for f in result.remaining]
    if name != "factory-prefetch":
        assert "def grad_step(" in out and "def update_step(" in out, out
        assert "jax.tree.map(jnp.add, grads, micro_grads)" in out, out
        assert "optimizer.step()" not in out and "clip_grad_norm_" not in out, out
    compile(out, "<port>", "exec")


def test_a_factory_in_a_module_beside_the_script(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(HEAD).split("torch.manual_seed(0)")[0])
    main = tmp_path / "train.py"
    main.write_text(textwrap.dedent('''
        import torch
        import torch.nn.functional as F
        from model import Net

        model = Net()
        optimizer = model.configure_optimizers(0.1, 1e-2)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    '''))
    result = engine.fix(main.read_text(), JAX, str(main))
    assert "def train_step(model, optimizer, x, y):" in result.source, result.source
    assert not [f for f in result.remaining if f.code == "JX301"], [f.message for f in result.remaining]


@pytest.mark.parametrize("loop", [
    # gradients never zeroed: they would accumulate across optimizer steps
    "for it in range(3):\n    for x, y in data:\n        F.cross_entropy(model(x), y).backward()\n    optimizer.step()\n",
    # the clipping edits other parameters than the model's
    "for it in range(3):\n    for x, y in data:\n        F.cross_entropy(model(x), y).backward()\n"
    "    torch.nn.utils.clip_grad_norm_(other.parameters(), 1.0)\n    optimizer.step()\n    optimizer.zero_grad()\n",
    # something else between the micro-steps and the step
    "for it in range(3):\n    for x, y in data:\n        F.cross_entropy(model(x), y).backward()\n"
    "    print(model.layers[0].weight.grad)\n    optimizer.step()\n    optimizer.zero_grad()\n",
])
def test_what_is_not_ported_is_reported_at_the_loop(loop):
    source = textwrap.dedent(HEAD).lstrip("\n") + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n" + loop
    result = engine.fix(source, JAX, "train.py")
    found = [f for f in result.remaining if f.code == "JX301"]
    assert found and "gradient accumulation" in found[0].message, [f.message for f in result.remaining]
    assert "# porter: manual (JX301): gradient accumulation" in result.source


@pytest.mark.jax
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_port_matches_the_original(tmp_path, name):
    original = tmp_path / "original.py"
    original.write_text(script(name))
    ported = tmp_path / "ported.py"
    ported.write_text(engine.fix(original.read_text(), JAX, "train.py").source)
    proc = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(original), str(ported),
                           "--steps", "3", "--format", "json"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PJRT_DEVICE": "CPU"}, cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], (report["summary"], ported.read_text())
    if name != "factory-prefetch":  # every step compares the micro-steps' losses
        assert all(len(s["port"]) == 3 for s in report["steps"]), report["steps"]


@pytest.mark.parametrize("after", ["        scheduler.step()\n", "        print(epoch)\n"])
def test_an_epoch_loop_around_a_whole_step_is_no_accumulation(after):
    source = textwrap.dedent(HEAD).lstrip("\n") + textwrap.dedent('''
        def fit(model, loader, epochs):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
            for epoch in range(epochs):
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    optimizer.step()
    ''') + after
    result = engine.fix(source, JAX, "train.py")
    assert "loss = train_step(model, optimizer, x, y)" in result.source, result.source
    assert "grad_step" not in result.source and "porter: manual (JX301)" not in result.source, result.source
    assert not [f for f in result.remaining if f.code == "JX301"], [f.message for f in result.remaining]
