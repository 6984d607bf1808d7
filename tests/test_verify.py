"""`porter verify` from the user's side: the port that matches passes; a deliberately broken
port is caught with the right tensor named; a side that cannot run gives exit 2 and says why."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from porter.verify.compare import Tolerance, compare_tensor
from porter.verify.specs import InputSpec, SpecError

DATA = Path(__file__).parent / "data" / "verify"


def porter(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "porter", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "PJRT_DEVICE": "CPU"})


def test_input_specs():
    assert InputSpec.parse("float32[8,3,32,32]").shape == (8, 3, 32, 32)
    spec = InputSpec.parse("int64[8,128]<30000")
    values = spec.generate(np.random.default_rng(0))
    assert values.dtype == np.int64 and values.max() < 30000 and values.min() >= 0
    for bad in ("float32", "int64[8]", "complex[2]", "int64[4]<0"):
        with pytest.raises(SpecError):
            InputSpec.parse(bad)


def test_tolerances_by_dtype_and_first_divergence_naming():
    a = np.ones(4, dtype=np.float32)
    assert compare_tensor("grad/fc.weight", a, a + 5e-6, Tolerance()).ok
    bad = compare_tensor("step3/buffer/layer2.0.bn1.running_var", a, a * 1.01, Tolerance())
    assert not bad.ok and bad.where == "buffer layer2.0.bn1.running_var at step 3"
    assert not compare_tensor("output/0", a, np.ones(5, np.float32), Tolerance()).ok


@pytest.mark.xla
@pytest.mark.slow
def test_matching_port_passes_with_health_in_json():
    proc = porter("verify", DATA / "convnet.py", DATA / "convnet_xla.py", "--model", "ConvNet()",
                  "--input", "float32[4,3,16,16]", "--format", "json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], report["summary"]
    assert report["health"]["compiles_after_warmup"] == 0 and report["health"]["max_transfers_per_step"] == 0
    # every step is the same graph (momentum buffers from the start, the same tensors copied in
    # each step): one compilation, in the first step
    assert [s["compiles"] for s in report["health"]["steps"]] == [1] + [0] * (report["settings"]["steps"] - 1)
    assert any("dropout switched off" in n for n in report["notes"])


@pytest.mark.xla
@pytest.mark.slow
def test_changed_batchnorm_momentum_is_named(tmp_path):
    html = tmp_path / "report.html"
    proc = porter("verify", DATA / "convnet.py", DATA / "convnet_xla_bn_momentum.py", "--model", "ConvNet()",
                  "--input", "float32[4,3,16,16]", "--format", "html", "--out", html)
    assert proc.returncode == 1
    assert "buffer layer1.0.bn1.running_mean at step 1" in proc.stderr
    assert "layer1.0.bn1.running_mean" in html.read_text()


@pytest.mark.xla
@pytest.mark.slow
def test_a_side_that_raises_gives_exit_2_naming_the_side():
    proc = porter("verify", DATA / "convnet.py", DATA / "convnet_xla_raises.py", "--model", "ConvNet()",
                  "--input", "float32[4,3,16,16]")
    assert proc.returncode == 2
    assert "the port could not run" in proc.stdout and "layer widths were lost in the port" in proc.stdout


def test_usage_errors_exit_2():
    proc = porter("verify", DATA / "convnet.py", DATA / "convnet_xla.py")
    assert proc.returncode == 2 and "--model" in proc.stderr
    proc = porter("verify", DATA / "convnet.py", DATA / "convnet_xla.py", "--model", "ConvNet()", "--input", "float32")
    assert proc.returncode == 2 and "bad input spec" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("port,limits,cause", [
    ("hangs.py", ("--timeout", "10"), "timed out after 10 s"),
    ("hog.py", ("--memory-mb", "2000"), "memory limit exceeded"),
])
def test_a_port_that_hangs_or_exhausts_memory_gives_exit_2(port, limits, cause):
    original = Path(__file__).parent / "data" / "trace" / "mlp_cuda.py"
    proc = porter("verify", "--script", original, DATA / port, "--steps", "3", *limits)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the port could not run" in proc.stdout and cause in proc.stdout


@pytest.mark.xla
@pytest.mark.slow
def test_lazy_layers_take_their_shapes_on_both_sides():
    """The original's side materializes lazy layers with one eval-mode forward on the host; the
    port's side takes their shapes from the original's weights (torch_xla would lose a lazy
    parameter's deferred shape if the module moved to the device first)."""
    proc = porter("verify", DATA / "lazy_net.py", DATA / "lazy_net.py", "--model", "LazyNet()",
                  "--input", "float32[4,3,8,8]", "--steps", "2", "--format", "json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], (report["summary"], proc.stderr[-2000:])
    assert any("lazy layers" in n for n in report["notes"])
    assert any(t["name"].endswith("fc.weight") for t in report["tensors"])


_VOCAB_SCRIPT = '''
import torch
import torch.nn as nn

words = open("data/corpus.txt").read().split()
word_to_ix = {w: i for i, w in enumerate(set(words))}
ids = torch.tensor([word_to_ix[w] for w in words])
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(len(word_to_ix), 4), nn.Linear(4, len(word_to_ix)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(3):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(ids[:-1]), ids[1:])
    loss.backward()
    optimizer.step()
'''


@pytest.mark.xla
@pytest.mark.slow
def test_script_sides_read_the_given_files_and_hash_strings_alike(tmp_path):
    """A script that reads its text by a relative path (`--files` gives both sides the folder's
    contents) and numbers its words in the order of a set (string hashing pinned alike on both
    sides: else the port's vocabulary differs from the original's and the losses diverge)."""
    from porter import engine, registry

    (tmp_path / "original.py").write_text(_VOCAB_SCRIPT, encoding="utf-8")
    port = engine.fix(_VOCAB_SCRIPT, engine.Options(registry.select("torch-xla")), "port.py").source
    (tmp_path / "port.py").write_text(port, encoding="utf-8")
    data = tmp_path / "given" / "data"
    data.mkdir(parents=True)
    (data / "corpus.txt").write_text(" ".join(f"w{i % 7} x{i % 5} y{i % 3}" for i in range(40)), encoding="utf-8")
    args = ("verify", "--script", tmp_path / "original.py", tmp_path / "port.py", "--steps", "3", "--format", "json")
    proc = porter(*args)
    assert proc.returncode == 2 and "FileNotFoundError" in json.loads(proc.stdout)["summary"]
    proc = porter(*args, "--files", tmp_path / "given")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["passed"], (report["summary"], proc.stderr[-2000:])
    proc = porter(*args, "--files", tmp_path / "given" / "data" / "corpus.txt")
    assert proc.returncode == 2 and "not a folder" in proc.stderr
