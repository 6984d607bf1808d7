"""A model that follows another by a parameter-wise average (an EMA of the weights, a mean
teacher, a target network's soft update): `for t, s in zip(teacher.parameters(),
student.parameters()):` with an in-place update of `t`, ported to JAX as one `nnx.update` over
the two models' NNX states (JX205); the teacher's freezing loop goes, and `copy.deepcopy(student)
.eval()` is bound, then switched (JX322: NNX's eval() returns None). Spellings of the update: a
`mul_(d).add_(s, alpha=1 - d)` chain in an EMA class, `t.data.copy_(...)` in a function, and
`t.lerp_(s, w)` / `t.data = ...` statements. The mean-teacher script's loss reads the teacher,
so from its second step on the losses compare the averaging too: the port's are the original's."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from lanes import fixture_slice
from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")), unsafe_fixes=False)

SCRIPT = '''
import copy
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


UPDATER


def main():
    torch.manual_seed(0)
    student = Net()
    opt = torch.optim.SGD(student.parameters(), lr=0.5)
    teacher = copy.deepcopy(student).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    data, labels = torch.randn(5, 16, 6), torch.randint(0, 3, (5, 16))
    for step in range(5):
        x, y = data[step], labels[step]
        out = student(x)
        loss = F.cross_entropy(out, y) + F.mse_loss(out, teacher(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        UPDATE
        print(step, loss.item())


if __name__ == "__main__":
    main()
'''

SPELLINGS = {
    "ema class": SCRIPT.replace("UPDATER", textwrap.dedent('''
        class EMA:
            def __init__(self, decay):
                self.decay = decay

            @torch.no_grad()
            def update(self, shadow, model):
                for s, p in zip(shadow.parameters(), model.parameters()):
                    s.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)
        ''')).replace("UPDATE", "EMA(0.7).update(teacher, student)"),
    "copy_ of data": SCRIPT.replace("UPDATER", textwrap.dedent('''
        def soft_update(target, online, tau=0.3):
            with torch.no_grad():
                for t, o in zip(target.parameters(), online.parameters()):
                    t.data.copy_(tau * o.data + (1.0 - tau) * t.data)
        ''')).replace("UPDATE", "soft_update(teacher, student)"),
    "lerp and assignment": SCRIPT.replace("UPDATER", textwrap.dedent('''
        def follow(target, online):
            for t, o in zip(target.parameters(), online.parameters()):
                t.data = 0.5 * t.data + 0.5 * o.data
                t.lerp_(o, 0.4)
        ''')).replace("UPDATE", "follow(teacher, student)"),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_average_is_one_nnx_update(name):
    result = engine.fix(SPELLINGS[name], JAX)
    port = result.source
    assert [(f.code, f.message) for f in result.remaining] == [], port
    assert "nnx.update(" in port and "jax.tree.map(lambda " in port and ".parameters()" not in port, port
    assert "teacher = copy.deepcopy(student)\n    teacher.eval()\n" in port, port
    assert "requires_grad" not in port, port
    assert engine.fix(port, JAX).source == port


def test_a_frozen_backbone_that_is_trained_keeps_its_loop():
    source = textwrap.dedent('''
        import torch
        backbone = torch.nn.Linear(3, 3)
        for p in backbone.parameters():
            p.requires_grad = False
        opt = torch.optim.SGD(backbone.parameters(), lr=0.1)
        ''')
    assert "for p in backbone.parameters():" in engine.fix(source, JAX).source


@pytest.mark.jax
@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("name", fixture_slice(["ema class", "copy_ of data"], 2))  # one per run of the suite
def test_the_mean_teacher_port_matches_its_original(name, tmp_path):
    original = textwrap.dedent(SPELLINGS[name])
    report = verify_json(tmp_path, original, engine.fix(original, JAX).source, 4)
    assert report["status"] in ("passed", "over-budget"), (report["summary"], report["notes"])
    assert len(report["steps"]) == 4
