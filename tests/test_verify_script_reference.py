"""`porter verify --script` in float32: losses past the tolerance are judged again against a
float64 run of the original that draws the float32 run's random numbers. The port passes
where it is as close to that reference as float32 rounding puts the original itself, and a
real difference still fails. Tolerances far below float32's resolution make every step
differ, so the reference decides each one."""
import textwrap

import pytest

from porter import engine, registry

from lanes import fixture_slice
from scripthelp import verify_json

pytestmark = pytest.mark.xla

# dropout and Adam: the reference must draw the float32 run's masks, and Adam's division by
# the root of tiny second moments is where float32 rounding grows
ORIGINAL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 20), torch.randint(0, 5, (96,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 5)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
''').lstrip("\n")


# the same script building float32 tensors of its own, as real scripts do (float32 NumPy data,
# `.float()`, `dtype=torch.float32`): it cannot run in float64, so both sides compare in
# float32, and the reference widens those tensors
EXPLICIT_FLOAT32 = ORIGINAL.replace(
    "data = TensorDataset(torch.randn(96, 20), torch.randint(0, 5, (96,)))",
    "import numpy as np\n"
    "features = np.random.RandomState(0).randn(96, 20).astype(np.float32)\n"
    "data = TensorDataset(torch.from_numpy(features), torch.randint(0, 5, (96,)))").replace(
    "x, y = x.to(device), y.to(device)",
    "x, y = x.to(device).float(), y.to(device)\n"
    "    x = x * torch.ones(20, dtype=torch.float32, device=device)")


def _verify(tmp_path, port_lr: str, original: str = ORIGINAL, dtype: str = "float32") -> dict:
    port = engine.fix(original.replace("LR", port_lr), engine.Options(tuple(registry.rules_for("torch-xla"))),
                      "train.py").source
    assert "torch_xla" in port
    return verify_json(tmp_path, original.replace("LR", "1e-2"), port, 4, "train_xla.py",
                       "--dtype", dtype, "--rtol", "1e-12", "--atol", "1e-12")


def test_float32_rounding_passes_against_the_float64_reference(tmp_path):
    report = _verify(tmp_path, "1e-2")
    assert report["passed"], (report["summary"], report["notes"])
    rounded = [s for s in report["steps"] if "reference" in s]
    assert rounded, report["steps"]  # 1e-12 is below float32's resolution: the reference decided
    assert "within float32 rounding" in report["summary"]
    assert any(n.startswith("float32 rounding, judged against a float64 run") for n in report["notes"])


def test_a_script_of_explicit_float32_tensors_is_judged_against_its_widened_reference(tmp_path):
    report = _verify(tmp_path, "1e-2", EXPLICIT_FLOAT32, dtype="auto")
    assert report["settings"]["dtype"] == "float32", report["notes"]  # float64 failed on the dtypes
    assert report["passed"], (report["summary"], report["notes"])
    assert any("reference" in s for s in report["steps"]), report["steps"]


def test_a_real_difference_still_diverges_with_the_reference(tmp_path):
    report = _verify(tmp_path, "1.01e-2")  # the port's learning rate 1% off: step 2 on differs
    assert report["status"] == "diverged", report["summary"]
    assert report["first_divergence"]["step"] == 2, report["first_divergence"]
    # the port widened to float64 as the reference is: still another computation
    assert any(n.startswith("widened to float64 (the same random numbers") and "still differ" in n
               for n in report["notes"]), report["notes"]
    assert any(n.startswith("not float32 rounding at step 2") for n in report["notes"]), report["notes"]


# a conv net trained by Adadelta at lr 1.0 on float32 images made with `.float()`
CONV_ADADELTA = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.rand(96, 1, 28, 28), torch.rand(96) > 0.5), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 12 * 12, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    for x, y in loader:
        x, y = x.to(device).float(), y.to(device).float()
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
        loss.backward()
        optimizer.step()
''').lstrip("\n")


# (each spelling is a verification with a widened run of each side: one of them per run of the
# suite, both with PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("shift", fixture_slice(["model((x + 4096.0) - 4096.0)", "(model(x) + 4096.0 - 4096.0)"], 2))
def test_a_port_that_rounds_more_than_the_original_passes_when_widened_it_is_the_same(tmp_path, shift):
    """A port whose own float32 rounding is far larger than the original's (XLA's kernels round
    otherwise than eager CPU's; here a shift through 4096 drops the low bits of the input or of
    the logits): judged
    against the reference alone, it is too far from it; widened to float64 the same way, the
    port computes what the original computes, and it passes with a note."""
    original = CONV_ADADELTA
    port = engine.fix(original, engine.Options(tuple(registry.rules_for("torch-xla"))), "train.py").source
    assert "model(x)" in port
    report = verify_json(tmp_path, original, port.replace("model(x)", shift), 4, "train_xla.py",
                         "--rtol", "1e-12", "--atol", "1e-12")
    assert report["settings"]["dtype"] == "float32" and report["passed"], (report["summary"], report["notes"])
    note = [n for n in report["notes"] if n.startswith("float32 rounding of the port: widened to float64")]
    assert note and "part by more than the original's own rounding at step(s)" in note[0], report["notes"]
    assert not any(n.startswith("not float32 rounding") for n in report["notes"]), report["notes"]
