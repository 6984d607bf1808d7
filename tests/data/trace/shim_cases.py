"""Exercises each kind of CUDA call under the porter CUDA shim; writes what it saw as JSON.

Run as: python -m porter.verify.trace --cuda-shim --out T.json shim_cases.py -- RESULT.json
The last part trains with autocast('cuda') and an enabled GradScaler, so the trace's
recorded losses can be checked against the values the script computed.
"""

import importlib.util
import io
import json
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

out: dict = {}


def devices(*tensors):
    return sorted({str(t.device) for t in tensors})


# -- torch.cuda queries
out["is_available"] = torch.cuda.is_available()
out["device_count"] = torch.cuda.device_count()
out["current_device"] = torch.cuda.current_device()
torch.cuda.set_device(0)
out["device_name"] = torch.cuda.get_device_name(0)
out["capability"] = list(torch.cuda.get_device_capability())
out["total_memory_positive"] = torch.cuda.get_device_properties(0).total_memory > 0
out["bf16"] = torch.cuda.is_bf16_supported()
torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
out["memory"] = [torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()]
out["accelerator"] = [torch.accelerator.is_available(), str(torch.accelerator.current_accelerator())]
with torch.cuda.device(0):
    out["device_context"] = torch.cuda.current_device()

# -- CUDA seeding leaves the CPU stream alone
torch.manual_seed(0)
a = torch.randn(5)
torch.manual_seed(0)
torch.cuda.manual_seed(123)
torch.cuda.manual_seed_all(123)
b = torch.randn(5, device="cuda")
out["cuda_seed_keeps_cpu_stream"] = bool(torch.equal(a, b))
out["rng_state_is_cpu_state"] = bool(torch.equal(torch.cuda.get_rng_state(), torch.get_rng_state()))

# -- placements
cuda = torch.device("cuda", 0)
x = torch.ones(3)
out["factories"] = devices(
    torch.randn(2, device="cuda"),
    torch.zeros(2, device="cuda:0"),
    torch.ones(2, device=cuda),
    torch.arange(3, device=0),
    torch.tensor([1.0, 2.0], device="cuda"),
    torch.empty(2, device="cuda", pin_memory=True),
    torch.full((2,), 7.0, device="cuda"),
    torch.zeros_like(x, device="cuda"),
    x.new_zeros(2, device="cuda"),
)
out["tensor_moves"] = devices(
    x.cuda(), x.cuda(0), x.to("cuda"), x.to("cuda:0", non_blocking=True), x.to(cuda), x.to(0), x.to(device="cuda")
)
out["to_keeps_dtype_change"] = str(x.to("cuda", torch.float64).dtype)
out["cuda_returns_same_tensor"] = x.cuda() is x
out["pin_memory"] = [str(x.pin_memory().device), x.is_pinned()]
model = nn.Linear(3, 2)
model.cuda()
model.to("cuda")
model.to(device=cuda)
model.to(torch.device("cuda"), dtype=torch.float64)
out["module_moves"] = [devices(*model.parameters()), str(next(model.parameters()).dtype)]
loader = DataLoader(TensorDataset(torch.randn(6, 3)), batch_size=2, pin_memory=True)
out["pinned_loader"] = devices(*(batch[0] for batch in loader))
seen = {}
thread = threading.Thread(target=lambda: seen.update(d=str(torch.zeros(1, device="cuda").device)))
thread.start()
thread.join()
out["other_thread"] = seen["d"]

# -- torch.load
buffer = io.BytesIO()
torch.save({"w": torch.arange(4.0)}, buffer)
loads = {}
for label, location in [
    ("str", "cuda"),
    ("str0", "cuda:0"),
    ("device", cuda),
    ("dict", {"cpu": "cuda:0"}),
    ("callable", lambda storage, loc: storage.cuda()),
]:
    buffer.seek(0)
    loads[label] = str(torch.load(buffer, map_location=location)["w"].device)
out["load"] = loads


# a checkpoint whose storages are tagged 'cuda:0', as one saved on a GPU machine
def gpu_tag(storage):
    return "cuda:0" if TAG_AS_GPU else None


TAG_AS_GPU = True
torch.serialization.register_package(1, gpu_tag, lambda obj, location: None)
gpu_buffer = io.BytesIO()
torch.save({"w": torch.arange(4.0)}, gpu_buffer)
TAG_AS_GPU = False
gpu_results = {}
locations = []
gpu_buffer.seek(0)
torch.load(gpu_buffer, map_location=lambda storage, loc: locations.append(loc))
out["gpu_checkpoint_locations"] = locations
for label, location in [("none", None), ("str", "cuda"), ("callable", lambda storage, loc: storage.cuda(int(loc.split(":")[1])))]:
    gpu_buffer.seek(0)
    loaded = torch.load(gpu_buffer, map_location=location)["w"]
    gpu_results[label] = [str(loaded.device), loaded.tolist()]
out["load_gpu_checkpoint"] = gpu_results

# -- backend flags
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = True
out["cudnn_flags"] = [torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32]
out["matmul_tf32"] = torch.backends.cuda.matmul.allow_tf32
torch.backends.cuda.matmul.allow_tf32 = False

# -- timing and streams
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    y = torch.randn(4, device="cuda") * 2
y.record_stream(stream)
torch.cuda.current_stream().wait_stream(stream)
end.record()
torch.cuda.synchronize()
out["elapsed_ms_nonnegative"] = start.elapsed_time(end) >= 0.0

# -- autocast
lin = nn.Linear(4, 4).cuda()
inp = torch.randn(2, 4, device="cuda")
reference = lin(inp)
with torch.autocast("cuda", enabled=False):
    off = lin(inp)
    off_enabled = torch.is_autocast_enabled()
with torch.autocast("cuda", dtype=torch.float16):
    on = lin(inp)
    on_enabled = torch.is_autocast_enabled()
with torch.cuda.amp.autocast():
    legacy = lin(inp)
out["autocast_off"] = [bool(torch.equal(off, reference)), off_enabled]
out["autocast_on"] = [bool(torch.equal(on, reference)), str(on.dtype), on_enabled]
out["autocast_legacy"] = [bool(torch.equal(legacy, reference)), str(legacy.dtype)]

# -- GradScaler
scaler = torch.amp.GradScaler("cuda")
legacy_scaler = torch.cuda.amp.GradScaler()
off_scaler = torch.amp.GradScaler("cuda", enabled=False)
loss = lin(inp).pow(2).mean()
out["scaler"] = [scaler.is_enabled(), legacy_scaler.is_enabled(), scaler.scale(loss) is loss, scaler.get_scale()]
out["scaler_off"] = [off_scaler.is_enabled(), off_scaler.scale(loss) is loss]

# -- distributed
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
out["dist_backend"] = dist.get_backend()
ddp = DistributedDataParallel(nn.Linear(3, 1).cuda(), device_ids=[0], output_device=0)
out["ddp_forward"] = list(ddp(torch.randn(2, 3, device="cuda")).shape)
dist.destroy_process_group()

# -- DataParallel: the single-device module it is on one CPU, however its devices are named
data_parallel = []
for ids in (None, [0], ["cuda:0"], [torch.device("cuda", 0)], list(range(torch.cuda.device_count()))):
    net = nn.DataParallel(nn.Linear(3, 1).cuda(), device_ids=ids) if ids is not None else nn.DataParallel(nn.Linear(3, 1))
    net = net.cuda()
    data_parallel.append([list(net(torch.randn(2, 3, device="cuda")).shape), isinstance(net.module, nn.Linear)])
out["data_parallel"] = data_parallel

# -- torch_xla stays out
try:
    import torch_xla  # noqa: F401

    out["torch_xla_import"] = "imported"
except ModuleNotFoundError:
    out["torch_xla_import"] = "ModuleNotFoundError"
out["torch_xla_find_spec"] = importlib.util.find_spec("torch_xla") is None

# -- a short mixed-precision training loop, as written for a GPU
torch.manual_seed(1)
net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).cuda()
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
amp_scaler = torch.amp.GradScaler("cuda")
data = torch.randn(16, 4, device="cuda")
target = torch.randn(16, 1, device="cuda")
values = []
for _ in range(3):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        step_loss = nn.functional.mse_loss(net(data), target)
    amp_scaler.scale(step_loss).backward()
    amp_scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    amp_scaler.step(opt)
    amp_scaler.update()
    values.append(step_loss.item())
out["amp_losses"] = values

# -- uninstall restores torch (the trace harness installed the shim)
from porter.verify import cuda_shim  # noqa: E402

cuda_shim.uninstall()
try:
    torch.zeros(1, device="cuda")
    cuda_after = "allocated"
except (RuntimeError, AssertionError) as error:
    cuda_after = type(error).__name__
out["after_uninstall"] = [torch.cuda.is_available(), cuda_after, "torch_xla" in sys.modules]

with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
