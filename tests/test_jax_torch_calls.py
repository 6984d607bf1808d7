"""Torch calls with no meaning in a JAX port: device barriers (JX314), torch.compile (JX315),
torch's profiler (JX316) and a script's module-level CUDA device string (JX312): each rule on
several spellings, and a script with all of them ported and run where CUDA is absent."""
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def fix(codes, source: str, unsafe: bool = False):
    return engine.fix(dedent(source), engine.Options(registry.select("jax", codes), unsafe_fixes=unsafe))


def findings(codes, source: str):
    return engine.check(dedent(source), engine.Options(registry.select("jax", codes))).findings


# -- JX314 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    "torch.cuda.synchronize()", "torch.cuda.synchronize(0)", "torch.cuda.synchronize(device='cuda:1')",
    "torch.xpu.synchronize()", "torch.mps.synchronize()", "torch.accelerator.synchronize()",
    "torch.cuda.current_stream().synchronize()",
])
def test_device_barriers_become_jax_effects_barrier(call):
    result = fix(("JX314",), f"import torch\nt0 = time.time()\n{call}\n")
    assert "jax.effects_barrier()\n" in result.source and "synchronize" not in result.source, result.source
    assert "import jax\n" in result.source


def test_a_barrier_whose_argument_calls_something_is_reported_without_a_fix():
    source = "import torch\ntorch.cuda.synchronize(pick_device())\n"
    assert not fix(("JX314",), source).changed
    assert [f.code for f in findings(("JX314",), source)] == ["JX314"]


# -- JX315 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("before, after", [
    ("model = torch.compile(model)\nrun(model)\n", "run(model)\n"),
    ("model = torch.compile(model=model, dynamic=True)\n", ""),
    ("opt_model = torch.compile(model)\n", "opt_model = model\n"),
    ("def build(m):\n    return torch.compile(m, mode='max-autotune')\n", "def build(m):\n    return m\n"),
    ("if cfg.compile:\n    model = torch.compile(model)\nrun(model)\n", "run(model)\n"),
    ("if a:\n    x = 1\nelif compile:\n    model = torch.compile(model)\n",
     "if a:\n    x = 1\nelif compile:\n    pass\n"),
    ("if compile and step_ready():\n    model = torch.compile(model)\n", "if compile and step_ready():\n    pass\n"),
    ("@torch.compile(fullgraph=True)\ndef f(x):\n    return x\n", "def f(x):\n    return x\n"),
])
def test_the_compile_wrapper_goes(before, after):
    # torch stays used: `import torch` stays (an import the port leaves unused would go)
    result = fix(("JX315",), "import torch\n" + before + "torch.ones(1)\n")
    assert result.source == "import torch\n" + after + "torch.ones(1)\n", result.source
    assert not fix(("JX315",), result.source).changed


# -- JX316 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body, why", [
    ("with torch.profiler.profile(on_trace_ready=my_handler) as p:\n    run()\n", "a handler porter cannot map"),
    ("with torch.profiler.profile(on_trace_ready=torch.profiler.tensorboard_trace_handler('l')) as p:\n"
     "    run()\np.export_chrome_trace('t.json')\n", "read otherwise"),
    ("with torch.profiler.profile(on_trace_ready=torch.profiler.tensorboard_trace_handler('l'), "
     "use_device='cuda'):\n    run()\n", "use_device= has no JAX counterpart"),
])
def test_a_profiler_that_cannot_map_is_reported(body, why):
    source = "import torch\n" + body
    assert not fix(("JX316",), source, unsafe=True).changed
    [found] = findings(("JX316",), source)
    assert why in found.message


def test_record_function_in_a_with_and_step_marks_outside_a_for_loop():
    result = fix(("JX316",), """
        import torch
        from torch.autograd.profiler import record_function

        with torch.profiler.profile(on_trace_ready=torch.profiler.tensorboard_trace_handler(out)) as prof:
            while True:
                with record_function("load"), open(p) as f:
                    run(f)
                prof.step()
        """)
    assert "with jax.profiler.trace(out):" in result.source
    assert 'with jax.profiler.TraceAnnotation("load"), open(p) as f:' in result.source
    assert "prof" not in result.source.replace("profiler", ""), result.source


def test_a_training_loop_in_the_profiler_is_rewritten_first():
    result = fix(tuple(r.code for r in registry.rules_for("jax")), """
        import torch
        import torch.nn as nn

        model = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.profiler.profile(on_trace_ready=torch.profiler.tensorboard_trace_handler("log")) as prof:
            for step, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                optimizer.step()
                prof.step()
        """)
    assert "loss = train_step(model, optimizer, x, y)" in result.source, result.source
    assert "with jax.profiler.trace(\"log\"):" in result.source
    assert "backward" not in result.source and "prof.step" not in result.source


# -- JX312: a module-level device string ------------------------------------------------------
def test_a_module_level_device_string_read_as_a_device_is_cpu():
    result = fix(("JX312",), """
        import torch
        device = 'cuda:0'

        def load(path):
            return torch.load(path, map_location=device)

        def other(device):
            return device == 'cuda'

        def moved(x):
            global device
            return x.to(device)
        """)
    assert "device = 'cpu'" in result.source, result.source


@pytest.mark.parametrize("read, quoted", [
    ("use_amp = 'cuda' in device", "'cuda' in device"),
    ("if device.startswith('cuda'):\n    pass", "device.startswith('cuda')"),
    ("setup(device)", "setup(device)"),
])
def test_a_module_level_device_string_read_otherwise_gets_an_unsafe_fix(read, quoted):
    source = "import torch\ndevice = \"cuda\"\nx = torch.zeros(3, device=device)\n" + read + "\n"
    assert not fix(("JX312",), source).changed
    assert 'device = "cpu"' in fix(("JX312",), source, unsafe=True).source
    [found] = findings(("JX312",), source)
    assert quoted in found.message


@pytest.mark.parametrize("source", [
    "import torch\nbackend = 'cuda'\nrun(backend)\n",  # not a device's name, no device use
    "import torch\ndef f():\n    device = 'cuda'\n    return torch.zeros(1, device=device)\n",  # not the top level
    "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n",
])
def test_other_strings_are_left(source):
    assert not findings(("JX312",), source)


# -- a script with all of them, ported and run ------------------------------------------------
SCRIPT = '''
import os
import sys
import time
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8
device = 'cuda' # examples: 'cpu', 'cuda', 'cuda:0'
compile = True
log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'trace')


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


@torch.compile
def scale(x):
    return x * 2.0


torch.manual_seed(0)
data = torch.randn(64, 6, device=device)
target = torch.randint(0, 3, (64,), device=device)
model = Net()
model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if compile:
    print("compiling the model")
    model = torch.compile(model)


def get_batch(k):
    i = (k * batch_size) % 64
    return data[i:i + batch_size], target[i:i + batch_size]


torch.cuda.synchronize()
t0 = time.time()
with torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
    on_trace_ready=torch.profiler.tensorboard_trace_handler(log_dir),
    record_shapes=False,
) as prof:
    for k in range(4):
        with torch.profiler.record_function("batch"):
            x, y = get_batch(k)
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.6f}")
        prof.step()
torch.cuda.synchronize(device)
print(f"time {time.time() - t0:.3f}")
print(f"scaled {float(scale(torch.ones(2)).sum()):.1f}")
'''


@pytest.mark.jax
def test_the_port_runs_where_cuda_is_absent(tmp_path):
    original = tmp_path / "original.py"
    original.write_text(dedent(SCRIPT))
    env = {**os.environ, "PJRT_DEVICE": "CPU", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    before = subprocess.run([sys.executable, str(original)], capture_output=True, text=True, timeout=300, env=env,
                            cwd=tmp_path)
    assert before.returncode != 0  # the original asks for CUDA
    result = engine.fix(original.read_text(), engine.Options(tuple(registry.rules_for("jax"))), "train.py")
    for gone in ("torch.compile", "synchronize", "torch.profiler", "prof.step", "device = 'cuda'"):
        assert gone not in result.source, gone
    ported = tmp_path / "ported.py"
    ported.write_text(result.source)
    proc = subprocess.run([sys.executable, str(ported)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("loss ") == 4 and "scaled 4.0" in proc.stdout, proc.stdout
    assert list((tmp_path / "trace").rglob("*.xplane.pb")), "jax.profiler.trace wrote no profile"
