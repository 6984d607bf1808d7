"""Training loops that step through a function or method (trainer classes): after a port,
every loop that calls backward(), itself or through a function or method of the file, has a
step marker (torch_xla.sync() or a pl.MpDeviceLoader), or a finding at its line says why not.
Several spellings of the class: a trainer's _run_epoch/_run_batch, a minGPT-style run() with
the loader built in __init__, a helper function two calls away, a base class's loop calling
a subclass's method, an instance method called from module-level code."""
import textwrap

import libcst as cst
import pytest

from porter import engine, registry

CASES = {
    "run_epoch_run_batch": """
        import torch
        import torch.nn.functional as F

        class Trainer:
            def __init__(self, model, train_data, optimizer, device):
                self.model = model.to(device)
                self.train_data = train_data
                self.optimizer = optimizer
                self.device = device

            def _run_batch(self, source, targets):
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(source), targets)
                loss.backward()
                self.optimizer.step()

            def _run_epoch(self, epoch):
                for source, targets in self.train_data:
                    self._run_batch(source.to(self.device), targets.to(self.device))

            def train(self, max_epochs):
                for epoch in range(max_epochs):
                    self._run_epoch(epoch)
        """,
    "loader_built_in_init": """
        import torch
        from torch.utils.data import DataLoader

        class Trainer:
            def __init__(self, model, dataset, device):
                self.model = model.to(device)
                self.device = device
                self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
                self.train_loader = DataLoader(dataset, batch_size=8, shuffle=True)

            def train_step(self, x, y):
                loss = self.model(x, y)
                self.model.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                return loss

            def run(self, epochs):
                for epoch in range(epochs):
                    for it, (x, y) in enumerate(self.train_loader):
                        x, y = x.to(self.device), y.to(self.device)
                        loss = self.train_step(x, y)
                        if it % 10 == 0:
                            print(f"epoch {epoch} iter {it}: train loss {loss.item():.5f}")
        """,
    "helper_two_calls_away": """
        import torch

        def forward_backward(model, x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        def step(model, opt, x, y):
            loss = forward_backward(model, x, y)
            opt.step()
            opt.zero_grad()
            return loss

        def fit(model, opt, X, Y, bs):
            i = 0
            while i + bs <= len(X):
                step(model, opt, X[i:i + bs], Y[i:i + bs])
                i += bs
        """,
    "base_class_loop": """
        import torch

        class Base:
            def fit(self, batches):
                for batch in batches:
                    self.training_step(batch)

        class Regressor(Base):
            def training_step(self, batch):
                x, y = batch
                (self.net(x) - y).pow(2).mean().backward()
                self.opt.step()
                self.opt.zero_grad()

        model = Regressor()
        for batch in batches:
            model.training_step(batch)
        """,
}


def _stepping_loops(module: cst.Module) -> list[cst.CSTNode]:
    """Loops whose own body (not nested loops) calls a name that, after the port, still
    leads to backward(): found again independently of porter's analysis, by name."""
    stepping = set()
    changed = True
    defs = [n for n in _walk(module) if isinstance(n, cst.FunctionDef)]
    while changed:
        changed = False
        for fn in defs:
            if fn.name.value in stepping:
                continue
            names = {_called(c) for c in _own(fn.body) if isinstance(c, cst.Call)}
            if "backward" in names or names & stepping:
                stepping.add(fn.name.value)
                changed = True
    loops = []
    for loop in _walk(module):
        if isinstance(loop, (cst.For, cst.While)):
            names = {_called(c) for c in _own(loop.body) if isinstance(c, cst.Call)}
            if "backward" in names or names & stepping:
                loops.append(loop)
    return loops


def _called(call: cst.Call):
    f = call.func
    return f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else None


def _walk(node):
    yield node
    for c in node.children:
        yield from _walk(c)


def _own(node):
    for c in node.children:
        yield c
        if not isinstance(c, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            yield from _own(c)


def _marked(loop: cst.CSTNode, module: cst.Module) -> bool:
    code = module.code_for_node(loop)
    header = code.split(":", 1)[0]
    return "torch_xla.sync()" in code or "MpDeviceLoader(" in header


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("unsafe", [False, True])
def test_every_stepping_loop_is_marked_or_reported(name, unsafe):
    source = textwrap.dedent(CASES[name]).lstrip("\n")
    result = engine.fix(source, engine.Options(registry.select("torch-xla"), unsafe_fixes=unsafe))
    module = cst.parse_module(result.source)
    loops = _stepping_loops(module)
    assert loops, "the case has a training loop"
    wrapper = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(cst.metadata.PositionProvider)
    reported = {f.position.line for f in result.remaining if f.position is not None}
    for loop in loops:
        line = positions[loop].start.line
        assert _marked(loop, module) or line in reported, f"{name}: loop at line {line} has no step marker\n{result.source}"
    # an epoch loop around a marked loop gets no marker of its own
    assert result.source.count("torch_xla.sync()") + result.source.count("MpDeviceLoader(") == len(loops)
    assert not engine.fix(result.source, engine.Options(registry.select("torch-xla"), unsafe_fixes=unsafe)).changed
