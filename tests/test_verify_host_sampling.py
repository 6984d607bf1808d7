"""`torch.multinomial` under the verifier's host-random mode (porter.verify.trace.HostRandomMode):
`Categorical(probs).sample()` of a policy-gradient script drew its actions from XLA's generator
in the port and the CPU's in the original, and the verification diverged at step 1 (0.469).
Sampled from host uniforms, the draws follow the distribution (with and without replacement,
batched, through `Categorical`) and are the same numbers on the CPU and on an XLA device."""
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from porter.verify.trace import HostRandomMode  # noqa: E402

pytestmark = pytest.mark.framework

ROOT = Path(__file__).resolve().parents[1]


def test_draws_follow_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([[1.0, 6.0, 3.0], [5.0, 0.0, 5.0]])  # unnormalised weights, as torch takes them
    with HostRandomMode():
        drawn = torch.multinomial(probs, 20000, replacement=True)
        one = probs.multinomial(1)
        distinct = torch.multinomial(torch.tensor([1.0, 2.0, 3.0, 4.0]), 4)
        actions = torch.distributions.Categorical(probs=probs / probs.sum(-1, keepdim=True)).sample((5,))
    freq = [[(drawn[r] == k).double().mean().item() for k in range(3)] for r in range(2)]
    assert freq[0] == pytest.approx([0.1, 0.6, 0.3], abs=0.015) and freq[1] == pytest.approx([0.5, 0.0, 0.5], abs=0.015)
    assert one.shape == (2, 1) and one.dtype == torch.long
    assert sorted(distinct.tolist()) == [0, 1, 2, 3]  # without replacement: each category once
    assert actions.shape == (5, 2) and int(actions[:, 1].eq(1).sum()) == 0  # a zero weight is never drawn


SAME = """
import sys
sys.path.insert(0, {root!r})
import torch
import torch_xla
from porter.verify.trace import HostRandomMode

probs = torch.tensor([[0.2, 0.5, 0.3], [0.7, 0.2, 0.1]], dtype=torch.float64)
out = []
for device in ("cpu", torch_xla.device()):
    torch.manual_seed(3)
    with HostRandomMode():
        p = probs.to(device)
        out.append([torch.multinomial(p, 6, replacement=True).cpu().tolist(),
                    torch.multinomial(p, 2).cpu().tolist(),
                    torch.distributions.Categorical(probs=p).sample((3,)).cpu().tolist()])
print("same" if out[0] == out[1] else f"differ {{out}}")
"""


@pytest.mark.xla
def test_the_cpu_and_an_xla_device_draw_the_same_samples(tmp_path):
    script = tmp_path / "same.py"
    script.write_text(SAME.format(root=str(ROOT)), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PJRT_DEVICE": "CPU"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "same", proc.stdout
