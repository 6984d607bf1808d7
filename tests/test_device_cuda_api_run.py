"""The device-placement (TX1xx), CUDA-only-call (TX8xx) and deprecated-torch_xla-API (TX0xx)
rules together: statement removals keep every kind of block valid, the rules leave non-torch
code alone and stay quiet on their own output, a GPU-era script using old torch_xla names is
ported and then RUNS on torch_xla 2.9 (PJRT_DEVICE=CPU, DeprecationWarnings as errors), and
the torch_xla facts the rules rest on still hold in the installed version.
"""
import os
import subprocess
import sys
import textwrap

import libcst as cst
import pytest

from porter import engine, registry

FAMILIES = ("TX0", "TX1", "TX8")


def rules():
    return registry.select("torch-xla", FAMILIES)


def port(source: str, unsafe: bool = False) -> engine.FixResult:
    return engine.fix(textwrap.dedent(source), engine.Options(rules(), unsafe_fixes=unsafe))


def codes(findings) -> set:
    return {f.code for f in findings}


REMOVALS = """
import torch
import torch.backends.cudnn as cudnn
from torch import cuda


def a():
    try:
        torch.cuda.empty_cache()
    except RuntimeError:
        torch.cuda.empty_cache()
    finally:
        torch.cuda.set_device(0)


def b(flag):
    if flag:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = False  # trailing comment
    elif flag is None:
        cuda.empty_cache(); cuda.reset_peak_memory_stats()
    else:
        x = 1; torch.cuda.empty_cache()
    with torch.no_grad():
        cudnn.enabled = True
    for i in range(3):
        if i: torch.cuda.empty_cache(); torch.cuda.ipc_collect()
    while False:
        torch.cuda.set_device(int("0"))


class C:
    torch.backends.cudnn.benchmark = True


def d():
    x = 0

    torch.cuda.empty_cache()
    torch.backends.cudnn.benchmark = True
    return x


torch.backends.cudnn.benchmark = True
"""

REMOVED = """
import torch


def a():
    try:
        pass
    except RuntimeError:
        pass
    finally:
        pass


def b(flag):
    if flag:
        pass
    elif flag is None:
        pass
    else:
        x = 1
    with torch.no_grad():
        pass
    for i in range(3):
        pass
    while False:
        pass


class C:
    pass


def d():
    x = 0

    return x
"""


def test_removing_the_only_statements_of_blocks_leaves_valid_code():
    result = port(REMOVALS)
    assert result.source == REMOVED
    compile(result.source, "<ported>", "exec")
    assert not port(result.source).changed


UNRELATED = """
class Box:
    def cuda(self):
        return self

box = Box().cuda()
is_fast = box.is_cuda if hasattr(box, "is_cuda") else False
settings = dict(device="cuda")
"""


def test_files_without_torch_are_left_alone():
    found = engine.check(textwrap.dedent(UNRELATED), engine.Options(rules())).findings
    assert not found, [(f.code, f.message) for f in found]


def test_names_resolve_through_imports_not_spelling():
    source = """
    import torch as t
    from torch import cuda as tc

    device = t.device("cuda:0")
    tc.synchronize()
    tc.empty_cache()
    """
    result = port(source)
    assert result.source == textwrap.dedent(
        """
        import torch_xla
        import torch_xla.core.xla_model as xm

        device = torch_xla.device()
        xm.wait_device_ops()
        """
    )


GPU_ERA_SCRIPT = """
import io
import sys

import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.experimental.pjrt as pjrt
from torch_xla.core.xla_model import get_ordinal, xla_device


def run(out):
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    use_cuda = "--cpu" not in sys.argv and torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2)).cuda()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    model.load_state_dict(torch.load(buf, map_location=torch.device("cuda")))
    x = torch.randn(8, 4, device="cuda:0")
    y = torch.zeros(8, dtype=torch.long).cuda(non_blocking=True)
    ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))
    dl = torch.utils.data.DataLoader(ds, batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for xb, yb in pl.ParallelLoader(dl, [device]).per_device_loader(device):
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        xm.mark_step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    if xm.is_master_ordinal():
        ids = [xm.xrt_world_size(), get_ordinal(), xm.get_local_ordinal(), pjrt.world_size()]
    kind = torch.cuda.get_device_name(0)
    devices = {str(d) for d in (xla_device(), device, x.device, y.device, model(x).device)}
    torch.cuda.empty_cache()
    torch.save({"ids": ids, "kind": kind, "devices": sorted(devices),
                "losses": [float(l) for l in losses]}, out)


if __name__ == "__main__":
    run(sys.argv[1])
"""


@pytest.mark.xla
@pytest.mark.slow
def test_ported_gpu_era_script_runs_on_torch_xla(tmp_path):
    result = port(GPU_ERA_SCRIPT, unsafe=True)
    assert not [f for f in result.remaining if f.fixable], [(f.code, f.message) for f in result.remaining]
    assert not codes(result.remaining), [(f.code, f.message) for f in result.remaining]
    ported = result.source
    for old in ("xrt_world_size", "get_ordinal()", "mark_step", "experimental.pjrt", ".cuda(", "torch.cuda."):
        assert old not in ported, old
    script = tmp_path / "ported.py"
    script.write_text(ported, encoding="utf-8")
    out = tmp_path / "out.pt"
    env = dict(os.environ, PJRT_DEVICE="CPU")
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", str(script), str(out)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        import torch

        runs.append(torch.load(out))
    first = runs[0]
    assert first["ids"] == [1, 0, 0, 1]
    assert first["kind"] == "cpu"
    assert first["devices"] == ["xla:0"]
    assert len(first["losses"]) == 4
    # Dropout runs on the XLA device: the same losses twice only because the port seeds it.
    assert runs[0]["losses"] == runs[1]["losses"]


FACTS = r"""
import io, os, warnings
os.environ.pop("PJRT_DEVICE", None)
import torch, torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
facts = {}
facts["device_type_after_import"] = xr.device_type()
facts["initialized_by_device_type"] = torch_xla._XLAC._xla_runtime_is_initialized()
facts["removed"] = sorted(n for n in ("xrt_world_size", "get_ordinal", "world_size", "parse_xla_device") if hasattr(xm, n))
facts["using_pjrt"] = hasattr(xr, "using_pjrt")
try:
    import torch_xla.experimental.pjrt
    facts["experimental_pjrt"] = True
except ModuleNotFoundError:
    facts["experimental_pjrt"] = False
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    xm.xla_device(); xm.mark_step()
facts["deprecations"] = sorted(str(w.message) for w in caught if issubclass(w.category, DeprecationWarning))
dev = torch_xla.device()
facts["device_count"] = torch_xla.device_count()
buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf)
failed = 0
for loc in ("xla", torch.device("xla:0"), dev):
    buf.seek(0)
    try:
        torch.load(buf, map_location=loc)
    except RuntimeError:
        failed += 1
facts["load_to_xla_fails"] = failed
def draws(seed_fn):
    out = []
    for _ in range(2):
        seed_fn(7); t = torch.rand(3, device=dev); torch_xla.sync(); out.append(t.cpu())
    return torch.equal(*out)
facts["torch_seed_repeats_on_xla"] = draws(torch.manual_seed)
facts["xla_seed_repeats_on_xla"] = draws(torch_xla.manual_seed)
facts["is_cuda"] = torch.zeros(1, device=dev).is_cuda
facts["kind"] = xm.xla_device_kind()
try:
    xm.get_memory_info(dev); facts["memory_info_on_cpu"] = "works"
except RuntimeError as exc:
    facts["memory_info_on_cpu"] = "UNIMPLEMENTED" if "UNIMPLEMENTED" in str(exc) else str(exc)
xm.wait_device_ops()
print(repr(facts))
"""


@pytest.mark.xla
@pytest.mark.slow
def test_the_torch_xla_facts_the_rules_rest_on():
    proc = subprocess.run([sys.executable, "-c", FACTS], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = eval(proc.stdout.strip().splitlines()[-1])  # a dict literal printed by the probe above
    assert facts == {
        "device_type_after_import": "CPU",  # TX101/TX107: a PJRT device is always selected
        "initialized_by_device_type": False,  # TX107: xr.device_type() does not start the runtime
        "removed": [],  # TX001
        "using_pjrt": False,  # TX001
        "experimental_pjrt": False,  # TX005
        "deprecations": ["Use torch_xla.device instead", "Use torch_xla.sync instead"],  # TX001
        "device_count": 1,  # TX104
        "load_to_xla_fails": 3,  # TX105
        "torch_seed_repeats_on_xla": False,  # TX108
        "xla_seed_repeats_on_xla": True,  # TX804/TX108
        "is_cuda": False,  # TX106
        "kind": "cpu",  # TX805
        "memory_info_on_cpu": "UNIMPLEMENTED",  # TX805: memory queries are reported, not rewritten
    }
