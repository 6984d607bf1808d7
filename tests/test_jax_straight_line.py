"""Autograd written out without a training loop (the tutorials' first steps), ported to JAX
and run: gradients of plain `requires_grad=True` tensors (JX313: `y.backward()`, `x.grad` ->
`jax.value_and_grad`), one optimizer step at a script's top level or in a function (JX301
outside a loop, `.grad` reads of a layer's arrays between `backward()` and `step()` -> the
step's gradients) and layer arrays read by name (JX021: `linear.weight` ->
`linear.kernel[...].T`). The gradients are compared with torch's (printed by both runs); the
optimizer steps with `porter verify --script` (same initial weights, losses compared)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry
from porter.verify.script import ScriptRequest, verify_script

pytestmark = [pytest.mark.jax, pytest.mark.slow]  # torch and JAX runs, two script verifications

JAX_RULES = tuple(registry.rules_for("jax"))


def _port(src: str) -> str:
    return engine.fix(src, engine.Options(JAX_RULES)).source


# each prints one JSON list of floats (the gradients) as its last line
GRADS = {
    "scalars_module_level": """
        import json
        import torch

        x = torch.tensor(1.5, requires_grad=True)
        w = torch.tensor(-2.0, requires_grad=True)
        b = torch.tensor(0.5, requires_grad=True)
        y = w * x ** 2 + b
        y.backward()
        print(json.dumps([float(x.grad), float(w.grad), float(b.grad)]))
        """,
    "vector_chain_in_function": """
        import json
        import torch

        def grads():
            a = torch.ones(4, requires_grad=True)
            scale = 3.0
            h = torch.tanh(a * scale) + a
            total = (h ** 2).sum()
            total.backward()
            return a.grad.tolist()

        print(json.dumps(grads()))
        """,
    "matrix_product_mean": """
        import json
        import torch

        m = torch.tensor([[1.0, 2.0], [3.0, -1.0]], requires_grad=True)
        v = torch.tensor([0.5, -0.25], requires_grad=True)
        out = (m @ v).exp().mean()
        out.backward()
        g_m = m.grad
        g_v = v.grad
        print(json.dumps(g_m.flatten().tolist() + g_v.tolist()))
        """,
}


def _last_json(path, cwd) -> list:
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=240, cwd=cwd,
                         env={"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(GRADS))
def test_tensor_gradients_match_torch(name, tmp_path):
    src = textwrap.dedent(GRADS[name]).lstrip()
    port = _port(src)
    assert ".backward(" not in port and ".grad" not in port and "jax.value_and_grad" in port, port
    assert _port(port) == port  # a second run changes nothing
    (tmp_path / "orig.py").write_text(src)
    (tmp_path / "port.py").write_text(port)
    want = _last_json(tmp_path / "orig.py", tmp_path)
    got = _last_json(tmp_path / "port.py", tmp_path)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


# one optimizer step outside a loop: losses compared by porter verify --script
STEPS = {
    "module_level_linear_grads_read": """
        import torch
        import torch.nn as nn

        inputs = torch.randn(16, 5)
        targets = torch.randn(16, 3)
        layer = nn.Linear(5, 3)
        print('weight before:', layer.weight)
        loss_fn_obj = nn.MSELoss()
        opt = torch.optim.SGD(layer.parameters(), lr=0.05)
        out = layer(inputs)
        loss = loss_fn_obj(out, targets)
        loss.backward()
        print('grad of the weight:', layer.weight.grad.sum())
        print('grad of the bias:', layer.bias.grad)
        opt.step()
        print('loss after:', loss_fn_obj(layer(inputs), targets).item())
        """,
    # a plain tensors' backward before the step: no part of it (the tracer keeps the losses
    # whose graph reaches the optimizer's parameters)
    "plain_autograd_then_step": """
        import torch
        import torch.nn as nn

        a = torch.tensor(2.0, requires_grad=True)
        c = a ** 3
        c.backward()
        print('dc/da', a.grad)
        feats = torch.randn(8, 4)
        goal = torch.randn(8, 1)
        model = nn.Linear(4, 1)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sgd.zero_grad()
        err = ((model(feats) - goal) ** 2).mean()
        err.backward()
        sgd.step()
        print(err.item())
        """,
    "function_body_model_class": """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(6, 8)
                self.fc2 = nn.Linear(8, 4)

            def forward(self, x):
                return self.fc2(torch.relu(self.fc1(x)))

        def main(data, labels):
            net = Net()
            optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
            optimizer.zero_grad()
            logits = net(data)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            print('first loss', loss.item())

        main(torch.randn(10, 6), torch.randint(0, 4, (10,)))
        """,
}


@pytest.fixture(scope="module")
def step_reports(tmp_path_factory):
    out = {}
    for name, text in STEPS.items():
        folder = tmp_path_factory.mktemp(name)
        src = textwrap.dedent(text).lstrip()
        port = _port(src)
        (folder / "train.py").write_text(src)
        (folder / "train_jax.py").write_text(port)
        out[name] = (port, verify_script(ScriptRequest(folder / "train.py", folder / "train_jax.py", 1, timeout=300)))
    return out


@pytest.mark.parametrize("name", sorted(STEPS))
def test_straight_line_step_verifies(name, step_reports):
    port, report = step_reports[name]
    assert ".backward(" not in port and "@nnx.jit" in port and ".update(" in port, port
    assert ".weight" not in port, port
    assert _port(port) == port
    assert report.status == "passed", report.summary


def test_tensor_grad_reported_where_not_rewritten():
    src = textwrap.dedent("""
        import torch
        x = torch.ones(2, requires_grad=True)
        h = x * 2
        h.mul_(3)
        y = h.sum()
        y.backward()
        print(x.grad)
    """).lstrip()
    findings = [f for f in engine.check(src, engine.Options(JAX_RULES)).findings if f.code == "JX313"]
    assert findings and "not a plain assignment" in findings[0].message and "h.mul_(3)" in findings[0].message


def test_model_gradients_are_not_plain_tensors():
    # a hand-written SGD step over model.parameters() (p.grad of a loop variable) and a
    # training loop's backward: JX301's and JX204's, not JX313's
    src = textwrap.dedent("""
        import torch
        def train(model, loader, optimizer, lr):
            for x, y in loader:
                loss = model(x).sum()
                loss.backward(retain_graph=True)
                with torch.no_grad():
                    for p in model.parameters():
                        p -= lr * p.grad
                optimizer.step()
    """).lstrip()
    assert not [f for f in engine.check(src, engine.Options(JAX_RULES)).findings if f.code == "JX313"]
