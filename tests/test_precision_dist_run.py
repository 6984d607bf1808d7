"""End to end: a CUDA-style mixed-precision, DDP training script ported by the precision
(TX6xx) and distributed (TX7xx) rules alone, run on torch_xla (PJRT_DEVICE=CPU).

The script already places its model and batches on the XLA device and marks the step with
``torch_xla.sync()`` by hand (device placement belongs to other rules). Everything else is
the GPU idiom: ``mp.spawn``, an NCCL process group with rank/world size, DDP with device ids,
``torch.autocast('cuda', enabled=AMP)``, a custom autograd function with
``@custom_fwd(cast_inputs=torch.float32)``, a ``GradScaler(enabled=AMP)`` with scale / unscale_ /
step / update, ``dist.barrier()``, ``dist.get_rank()`` and ``torch.save``. The port runs to
completion in one process: with AMP off its losses equal an eager float32 CPU run of the same
model; with AMP on, the matmul inside the autocast region is bfloat16 on XLA while the custom
function still computes in float32.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from porter import engine, registry

STEPS = 6

PROGRAM = textwrap.dedent(
    """
    import sys

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
    import torch_xla
    from torch.cuda.amp import GradScaler, custom_bwd, custom_fwd
    from torch.nn.parallel import DistributedDataParallel as DDP

    AMP = AMP_FLAG


    class Float32Linear(torch.autograd.Function):
        @staticmethod
        @custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a, w):
            ctx.save_for_backward(a, w)
            return a @ w.t()

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            a, w = ctx.saved_tensors
            return grad @ w, grad.t() @ a


    def main_worker(gpu, steps, out):
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:23456", rank=gpu, world_size=1)
        device = torch_xla.device()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
        model = DDP(model, device_ids=[gpu], output_device=gpu)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = GradScaler(enabled=AMP)
        x = torch.randn(32, 8).to(device)
        y = torch.randn(32, 1).to(device)
        losses, dtypes = [], []
        for step in range(steps):
            optimizer.zero_grad()
            with torch.autocast("cuda", enabled=AMP):
                hidden = model.module[0](x)
                exact = Float32Linear.apply(x, model.module[0].weight)
                loss = F.mse_loss(model(x).float(), y)
            dtypes.append((str(hidden.dtype), str(exact.dtype)))
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            torch_xla.sync()
            losses.append(loss.item())
        dist.barrier()
        if dist.get_rank() == 0:
            state = {"weights": model.module.state_dict(), "losses": losses, "dtypes": dtypes,
                     "world": dist.get_world_size(), "index": gpu}
            torch.save(state, out)


    if __name__ == "__main__":
        mp.spawn(main_worker, args=(STEPS, sys.argv[1]), nprocs=torch.cuda.device_count() + 1, join=True)
    """
).replace("STEPS", str(STEPS))


def port(source: str) -> str:
    rules = registry.select("torch-xla", ("TX6", "TX7"))
    result = engine.fix(source, engine.Options(rules, unsafe_fixes=False))
    assert result.changed
    assert not [f for f in result.remaining if f.fixable], [f.message for f in result.remaining]
    again = engine.fix(result.source, engine.Options(rules, unsafe_fixes=False))
    assert not again.changed
    return result.source


def run(tmp_path, source: str, name: str):
    import torch

    script = tmp_path / f"{name}.py"
    out = tmp_path / f"{name}.pt"
    script.write_text(source)
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env.pop("CPU_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, map_location="cpu")


def reference_losses(steps: int):
    """The same training, eager float32 on the CPU, without DDP or scaling."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 8)
    y = torch.randn(32, 1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.fixture(scope="module")
def ported():
    pytest.importorskip("torch_xla")
    return {amp: port(PROGRAM.replace("AMP_FLAG", str(amp))) for amp in (False, True)}


def test_port_is_what_the_rules_say(ported):
    src = ported[False]
    assert "import torch_xla.distributed.xla_backend\n" in src
    assert 'dist.init_process_group("xla", init_method=\'xla://\')' in src
    assert "model = DDP(model, gradient_as_bucket_view=True)" in src
    assert "GradScaler(" not in src and "scaler." not in src
    assert "with torch.autocast(\"xla\", dtype=torch.bfloat16, enabled=AMP):" in src
    assert "        loss.backward()\n" in src
    # DDP all-reduces the gradients in backward(): the scaler's step becomes a plain step
    assert "        optimizer.step()\n" in src and "xm.optimizer_step" not in src
    assert "xm.rendezvous('main_worker')" in src
    assert "if xr.global_ordinal() == 0:" in src
    assert '"world": xr.world_size()' in src
    assert "xm.save(state, out)" in src
    assert "torch_xla.launch(main_worker, args=(6, sys.argv[1]))" in src
    assert "@torch.amp.custom_fwd(device_type='xla', cast_inputs=torch.float32)" in src
    assert "@torch.amp.custom_bwd(device_type='xla')" in src


@pytest.mark.xla
@pytest.mark.slow
def test_amp_off_runs_and_matches_float32(ported, tmp_path):
    import torch

    state = run(tmp_path, ported[False], "amp_off")
    ref_losses, ref_weights = reference_losses(STEPS)
    assert state["world"] == 1 and state["index"] == 0
    assert [tuple(d) for d in state["dtypes"]] == [("torch.float32", "torch.float32")] * STEPS
    assert state["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert state["losses"][-1] < state["losses"][0]
    for name, tensor in state["weights"].items():
        assert tensor.device.type == "cpu"  # xm.save moved it off the XLA device
        assert torch.allclose(tensor, ref_weights[name], atol=1e-5), name


@pytest.mark.xla
@pytest.mark.slow
def test_amp_on_computes_in_bfloat16(ported, tmp_path):
    state = run(tmp_path, ported[True], "amp_on")
    ref_losses, _ = reference_losses(STEPS)
    # autocast matmul in bfloat16; the custom_fwd(cast_inputs=float32) function in float32
    assert [tuple(d) for d in state["dtypes"]] == [("torch.bfloat16", "torch.float32")] * STEPS
    # bfloat16 matmuls: the same descent within bfloat16 precision, and not float32-exact
    assert state["losses"] == pytest.approx(ref_losses, rel=5e-2)
    assert state["losses"] != pytest.approx(ref_losses, rel=1e-6, abs=0)
    assert state["losses"][-1] < state["losses"][0]
