"""The seed a JAX port's `nnx.Rngs` takes, and the torch data pipeline it keeps, in the spellings
scripts use. The seed is what the statements before the model run give torch: a
`torch.manual_seed(s)` at the same level, or a call of the script's own seeding function
(`set_seed(args.seed)`); a function's body runs nothing where it is defined, so the
`torch.manual_seed(worker_id)` of a DataLoader's `worker_init_fn` is no seed (before, the port
read `rngs = nnx.Rngs(worker_id)` at module level: a NameError, no finding). The pipeline's
functions (a transform set as an attribute, a `functools.partial` collate, a worker init
function) stay torch, and the port matches its original."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

JAX = engine.Options(tuple(registry.rules_for("jax")))
HEAD = "import random\n\nimport torch\nimport torch.nn as nn\n\n"
MODEL = "model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))\n"
# spelling -> (code before the model, the seed of its nnx.Rngs)
SEEDS = {
    "manual_seed": ("torch.manual_seed(3)\n", "3"),
    "a worker init function's seed is no seed": (
        "def seed_worker(worker_id):\n    torch.manual_seed(worker_id)\n    random.seed(worker_id)\n\n\n", "0"),
    "the script's seeding function": (
        "def set_seed(seed):\n    random.seed(seed)\n    torch.manual_seed(seed)\n\n\nset_seed(11)\n", "11"),
    "its seed by keyword": (
        "def seed_all(verbose, seed):\n    torch.manual_seed(seed)\n\n\nseed_all(False, seed=5)\n", "5"),
    "a worker init function beside the script's seed": (
        "def seed_worker(worker_id):\n    torch.manual_seed(worker_id)\n\n\ntorch.manual_seed(9)\n", "9"),
}


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_the_model_takes_the_seed_the_script_runs(name):
    code, seed = SEEDS[name]
    port = engine.fix(HEAD + code + MODEL, JAX, "train.py").source
    compile(port, "train.py", "exec")
    assert f"rngs = nnx.Rngs({seed})" in port, port
    assert port.count("nnx.Rngs(") == 1, port


PIPELINE = textwrap.dedent('''\
    import functools

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset


    class Pairs(Dataset):
        def __init__(self, n, transform=None):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, 6, generator=g)
            self.y = torch.arange(n) % 3
            self.transform = transform

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            x = self.x[i]
            if self.transform is not None:
                x = self.transform(x)
            return x, self.y[i]


    def scale(x):
        return x * 2.0


    def collate(batch, shift):
        return torch.stack([b[0] for b in batch]) + shift, torch.stack([b[1] for b in batch])


    def seed_worker(worker_id):
        torch.manual_seed(worker_id)


    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Pairs(48)
    data.transform = scale
    loader = DataLoader(data, batch_size=8, collate_fn=functools.partial(collate, shift=0.5),
                        worker_init_fn=seed_worker)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(epoch, loss.item())
    ''')


def test_the_pipelines_functions_stay_torch():
    port = engine.fix(PIPELINE, JAX, "train.py").source
    for kept in ("    return x * 2.0\n", "torch.stack([b[0] for b in batch]) + shift", "    torch.manual_seed(worker_id)\n",
                 "data.transform = scale", "rngs = nnx.Rngs(0)"):
        assert kept in port, (kept, port)


@pytest.mark.jax
@pytest.mark.slow
def test_the_pipeline_port_matches_its_original_in_verify(tmp_path):
    report = verify_json(tmp_path, PIPELINE, engine.fix(PIPELINE, JAX, "train.py").source, 4)
    assert report["status"] == "passed", (report["summary"], report["notes"])
    assert len(report["steps"]) == 4
