"""JX319 and the trainer-class facts on scripts written for torchrun + DistributedDataParallel,
ported to JAX (one process per host): the process group, the DDP wrapper (and `.module`), the
launcher's rank variables and the DistributedSampler's defaults go or come from jax; a trainer
class given its model and optimizer in its constructor gets its `_run_batch` step jitted.
Each spelling is ported in the default mode, has no finding left, and verifies against its
original (which verify runs as torchrun's single process)."""
import textwrap

import pytest

from porter import engine, registry

from scripthelp import SMALL_NET, verify_json

SAFE = engine.Options(tuple(registry.rules_for("jax")))

DATA = '''
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,)))
'''

SCRIPTS = {
    # a trainer class given its model and optimizer; torchrun's LOCAL_RANK; a checkpoint of `.module`
    "trainer-class": '''
        import os
        from torch.distributed import destroy_process_group, init_process_group
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data.distributed import DistributedSampler


        class Trainer:
            def __init__(self, model, loader, optimizer):
                self.gpu_id = int(os.environ["LOCAL_RANK"])
                self.model = model.to(self.gpu_id)
                self.loader = loader
                self.optimizer = optimizer
                self.model = DDP(self.model, device_ids=[self.gpu_id])

            def _run_batch(self, source, targets):
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(source), targets)
                loss.backward()
                self.optimizer.step()
                return loss

            def train(self, epochs):
                for epoch in range(epochs):
                    self.loader.sampler.set_epoch(epoch)
                    for source, targets in self.loader:
                        source, targets = source.to(self.gpu_id), targets.to(self.gpu_id)
                        loss = self._run_batch(source, targets)
                        print(f"[GPU{self.gpu_id}] {epoch} {loss.item():.4f}")
                    if self.gpu_id == 0:
                        torch.save(self.model.module.state_dict(), "checkpoint.pt")


        def main():
            init_process_group(backend="nccl")
            DATA
            loader = DataLoader(data, batch_size=8, shuffle=False, sampler=DistributedSampler(data))
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            Trainer(model, loader, optimizer).train(2)
            destroy_process_group()


        if __name__ == "__main__":
            main()
    ''',
    # torch.distributed as a module: ranks asked of the process group, a barrier, another name for the wrapper
    "dist-module": '''
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel


        def run():
            dist.init_process_group("gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
            DATA
            sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=True)
            loader = DataLoader(data, batch_size=8, sampler=sampler)
            net = Net()
            ddp_net = DistributedDataParallel(net)
            opt = torch.optim.Adam(ddp_net.parameters(), lr=1e-2)
            for x, y in loader:
                opt.zero_grad()
                loss = F.cross_entropy(ddp_net(x), y)
                loss.backward()
                opt.step()
                if rank == 0:
                    print(f"{world} {loss.item():.4f}")
            dist.barrier()
            dist.destroy_process_group()


        run()
    ''',
}


def original(name: str) -> str:
    body = textwrap.dedent(SCRIPTS[name]).replace("    DATA\n", textwrap.indent(textwrap.dedent(DATA), "    "))
    return SMALL_NET + body


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_ddp_setup_becomes_one_process_per_host(name):
    result = engine.fix(original(name), SAFE)
    src = result.source
    for gone in ("init_process_group", "destroy_process_group", "DistributedDataParallel", "DDP(", ".module",
                 'os.environ["LOCAL_RANK"]', "dist.get_rank", ".backward()", "zero_grad"):
        assert gone not in src, (gone, src)
    assert "num_replicas=jax.process_count(), rank=jax.process_index()" in src, src
    assert "def train_step" in src, src
    assert not [f for f in result.remaining if f.code in ("JX319", "JX301", "JX901")], result.remaining
    compile(src, "<port>", "exec")


@pytest.mark.jax
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_ddp_port_matches_its_original_in_verify(tmp_path, name):
    src = original(name)
    port = engine.fix(src, SAFE).source
    report = verify_json(tmp_path, src, port, 3)
    assert report["passed"], (report["summary"], report["notes"])
    assert max(step["diff"] for step in report["steps"]) < 1e-9, report["steps"]
