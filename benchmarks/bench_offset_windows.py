"""Windows of a device tensor taken at a loop offset (a language model's bptt loop), two ways,
side by side in one run on torch_xla (PJRT_DEVICE=CPU): the slice `source[i:i + bptt]` (what
TX306 reports) and the gather TX306 writes,
`source.index_select(0, torch.arange(source.size(0))[i:i + bptt].to(source.device))`.

For each: XLA compilations over one epoch of --windows full windows (torch_xla.debug.metrics
CompileTime), the wall time of that epoch, and whether both give the same losses. The JSON
goes to benchmarks/results/bench_offset_windows.json.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/bench_offset_windows.py --windows 24
"""
import argparse
import json
import time
from pathlib import Path

import torch
import torch_xla
import torch_xla.debug.metrics as met


def epoch(take, source, windows, bptt, seed):
    torch.manual_seed(seed)
    device = torch_xla.device()
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    met.clear_all()
    losses = []
    start = time.perf_counter()
    for i in range(0, windows * bptt, bptt):
        x, y = take(source, i, bptt), take(source, i + 1, bptt)
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, 50), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
        losses.append(loss.detach())
    out = torch.stack(losses).cpu()
    seconds = time.perf_counter() - start
    compiles = met.metric_data("CompileTime")
    return {"compilations": compiles[0] if compiles else 0, "seconds": round(seconds, 3)}, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=24)
    parser.add_argument("--bptt", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    source = torch.randint(0, 50, (args.windows * args.bptt + 1, 4)).to(torch_xla.device())
    sliced, a = epoch(lambda s, i, n: s[i:i + n], source, args.windows, args.bptt, 1)
    gathered, b = epoch(lambda s, i, n: s.index_select(0, torch.arange(s.size(0))[i:i + n].to(s.device)),
                        source, args.windows, args.bptt, 1)
    result = {"windows": args.windows, "bptt": args.bptt, "slice": sliced, "gather": gathered,
              "same_losses": bool(torch.equal(a, b)),
              "time_ratio_slice_over_gather": round(sliced["seconds"] / gathered["seconds"], 2)}
    out = Path(__file__).parent / "results" / "bench_offset_windows.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
