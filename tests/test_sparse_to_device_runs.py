"""A graph script's sparse adjacency matrices, ported in default mode and run on XLA: torch_xla
has no sparse tensors, and the port moved them as they were ("Could not run
'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'SparseXLA' backend",
no finding). TX903 makes each dense where it moves, and the port trains with the original's
losses. Spellings in one program: a matrix a helper returns inside a tuple (`adj, feats, labels
= load_data()`, pygcn's form) moved with `.cuda()` under the script's flag, one built and moved
in one expression (`torch.sparse.FloatTensor(i, v, size).to(device)`), one from `.to_sparse()`
moved with `.to(device)`; products through `torch.spmm`, `torch.sparse.mm` and `@`."""
import textwrap

import pytest
from scripthelp import run_script

from porter import engine, registry

pytestmark = [pytest.mark.xla, pytest.mark.slow]

ORIGINAL = textwrap.dedent('''
    import argparse

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cuda", action="store_true", default=False)
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(0)
    device = torch.device("cuda" if args.cuda else "cpu")


    def normalize(edge_index, n):
        edge_index = torch.cat([edge_index, torch.arange(n).repeat(2, 1)], dim=1)
        adj = torch.sparse_coo_tensor(edge_index, torch.ones(edge_index.size(1)), (n, n)).coalesce()
        deg = torch.sparse.sum(adj, dim=1).to_dense()
        idx = adj.indices()
        return torch.sparse_coo_tensor(idx, adj.values() / deg[idx[0]], (n, n)).coalesce()


    def load_data(n=30, d=8):
        edges = torch.randint(0, n, (2, 60))
        return normalize(edges, n), torch.randn(n, d), torch.randint(0, 3, (n,))


    adj, features, labels = load_data()
    walk = torch.sparse.FloatTensor(adj.indices(), adj.values() * 0.5, torch.Size([30, 30])).to(device)
    smooth = torch.eye(30).add(0.1).to_sparse()
    smooth = smooth.to(device)
    model = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 3)])
    if args.cuda:
        model.cuda()
        features = features.cuda()
        adj = adj.cuda()
        labels = labels.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for epoch in range(5):
        optimizer.zero_grad()
        h = F.relu(torch.spmm(adj, model[0](features)))
        h = torch.sparse.mm(walk, h) + smooth @ h
        loss = F.cross_entropy(model[1](h), labels)
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.8f}")
''').lstrip("\n")


def _losses(stdout: str) -> list[float]:
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("loss ")]


def test_sparse_matrices_are_made_dense_where_they_move_and_the_port_trains_on_xla(tmp_path):
    port = engine.fix(ORIGINAL, engine.Options(registry.select("torch-xla"), unsafe_fixes=False), "train.py").source
    assert port.count(".to_dense().") == 3, port
    (tmp_path / "original.py").write_text(ORIGINAL, encoding="utf-8")
    (tmp_path / "port.py").write_text(port, encoding="utf-8")
    original = run_script(tmp_path / "original.py", [], tmp_path, xla=False)
    assert original.returncode == 0, original.stderr[-3000:]
    ported = run_script(tmp_path / "port.py", [], tmp_path, xla=True)
    assert ported.returncode == 0, ported.stderr[-3000:]
    assert int(ported.stdout.strip().splitlines()[-1].split(": ")[1]) >= 5, ported.stdout  # trained on XLA
    expected, got = _losses(original.stdout), _losses(ported.stdout)
    assert len(got) == len(expected) == 5
    assert got == pytest.approx(expected, rel=1e-5), (expected, got)
