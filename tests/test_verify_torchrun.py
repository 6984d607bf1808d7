"""`porter verify --script` on a script written for torchrun (it reads LOCAL_RANK/RANK from
the environment, or lets init_process_group's env:// rendezvous read them): run without
torchrun, the original stopped before its first step. Both sides now run as torchrun's single
process, and the report says so."""
import textwrap

import pytest

from porter import engine, registry

from scripthelp import verify_json

from lanes import fixture_slice

pytestmark = pytest.mark.xla

BODY = '''
    import os

    import torch
    import torch.nn.functional as F
    from torch.distributed import destroy_process_group, init_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def main():
        SETUP
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 10), torch.randint(0, 3, (64,)))
        loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
        model = DDP(torch.nn.Linear(10, 3).to(local_rank), device_ids=[local_rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(local_rank), y.to(local_rank)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        destroy_process_group()


    if __name__ == "__main__":
        main()
'''

SETUPS = {
    # the environment read first: KeyError without torchrun
    "environ_first": 'local_rank = int(os.environ["LOCAL_RANK"])\n    init_process_group(backend="nccl")\n'
                     '    torch.cuda.set_device(local_rank)',
    # the rendezvous first: "environment variable RANK expected, but not set"
    "rendezvous_first": 'init_process_group(backend="nccl")\n    local_rank = int(os.environ["LOCAL_RANK"])\n'
                        '    torch.cuda.set_device(local_rank)',
}


# one order of the set-up per run of the suite (both with PORTER_TEST_EVERY_FIXTURE=1)
@pytest.mark.parametrize("setup", fixture_slice(sorted(SETUPS), 2))
def test_a_torchrun_script_runs_as_its_single_process(tmp_path, setup):
    original = textwrap.dedent(BODY).replace("SETUP", SETUPS[setup]).lstrip("\n")
    port = engine.fix(original, engine.Options(tuple(registry.rules_for("torch-xla"))), "train.py").source
    report = verify_json(tmp_path, original, port, 3)
    assert report["status"] in ("passed", "over-budget"), (report["summary"], report["notes"])
    assert len(report["steps"]) == 3 and all(s["ok"] for s in report["steps"]), report["steps"]
    assert any(n.startswith("the script reads torchrun's environment") for n in report["notes"]), report["notes"]
