import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _training as tr


class LoopStepMarker(Rule):
    """
    ## What it does
    Appends `torch_xla.sync()` to the body of a training loop (one that runs a backward pass
    itself, or calls a function or method of the file that does: a trainer's
    `for batch in self.train_data: self._run_batch(batch)`, a `train_step(model, batch, opt)`
    helper, a base class's loop calling a method that a subclass defines) or an evaluation loop (a loop under `torch.no_grad()` that
    calls a model) that does not iterate a device loader: a language model's
    `for i in range(0, data.size(0) - 1, bptt)`, a `while step < max_steps` loop, a loop
    over pre-built tensors or over `zip(...)` of loaders.

    A `continue` of the loop would skip a sync at the end of the body, so the fix also puts
    `torch_xla.sync()` right before each `continue` of that loop (not those of nested
    loops): every iteration, however it ends, cuts its graph. `break` and `return` need
    nothing: the loop ends and the next sync (or reading a value) runs what is pending.

    Loops that already have a step marker (`torch_xla.sync()`, `xm.mark_step()`,
    `with torch_xla.step():`, `xm.optimizer_step(opt, barrier=True)`) are left alone, and so
    are loops that iterate a `pl.MpDeviceLoader` (it syncs at every iteration) or a
    DataLoader that TX301 wraps in one.

    ## Why
    PyTorch/XLA records operations lazily and only compiles and runs them at a step marker.
    Without one, the graph of the whole loop keeps growing: a new, larger graph is compiled
    at every iteration until something (a `.item()`, a print) forces execution, and the
    memory of every iteration stays alive. One sync per iteration gives one graph per step,
    compiled once and reused.

    ## Fix safety
    Safe: a sync only cuts the pending graph and runs it; values and their order are
    unchanged.
    """

    code = "TX202"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-loop-step-marker"
    target = "torch-xla"
    summary = "training/eval loop without a device loader: add torch_xla.sync() per iteration"
    severity = Severity.WARNING
    needs_text = ("backward", "no_grad", "inference_mode")
    examples = [
        Example(
            """
            import torch

            def train_epoch(model, train_data, optimizer, criterion, bptt):
                model.train()
                for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
                    data, targets = get_batch(train_data, i)
                    output = model(data)
                    loss = criterion(output.view(-1, ntokens), targets)
                    optimizer.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                    optimizer.step()
            """,
            """
            import torch
            import torch_xla

            def train_epoch(model, train_data, optimizer, criterion, bptt):
                model.train()
                for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
                    data, targets = get_batch(train_data, i)
                    output = model(data)
                    loss = criterion(output.view(-1, ntokens), targets)
                    optimizer.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                    optimizer.step()
                    torch_xla.sync()
            """,
            title="a language model's bptt loop",
        ),
        Example(
            """
            import torch

            def evaluate(model, data_source, bptt):
                model.eval()
                total = 0.
                with torch.no_grad():
                    for i in range(0, data_source.size(0) - 1, bptt):
                        data, targets = get_batch(data_source, i)
                        if data.size(0) != bptt:
                            continue
                        output = model(data)
                        total += len(data) * criterion(output, targets)
                return total / (len(data_source) - 1)
            """,
            """
            import torch
            import torch_xla

            def evaluate(model, data_source, bptt):
                model.eval()
                total = 0.
                with torch.no_grad():
                    for i in range(0, data_source.size(0) - 1, bptt):
                        data, targets = get_batch(data_source, i)
                        if data.size(0) != bptt:
                            torch_xla.sync()
                            continue
                        output = model(data)
                        total += len(data) * criterion(output, targets)
                        torch_xla.sync()
                return total / (len(data_source) - 1)
            """,
            title="an eval loop with a continue",
        ),
        Example(
            """
            import torch

            step = 0
            while step < max_steps:
                x, y = next(batches)
                loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                step += 1
                if step % 10: continue
                log(step)
            """,
            """
            import torch
            import torch_xla

            step = 0
            while step < max_steps:
                x, y = next(batches)
                loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                step += 1
                if step % 10: torch_xla.sync(); continue
                log(step)
                torch_xla.sync()
            """,
            title="a while loop",
        ),
        Example(
            """
            import torch
            import torch.nn.functional as F

            class Trainer:
                def __init__(self, model, train_data, optimizer):
                    self.model = model
                    self.train_data = train_data
                    self.optimizer = optimizer

                def _run_batch(self, source, targets):
                    self.optimizer.zero_grad()
                    loss = F.cross_entropy(self.model(source), targets)
                    loss.backward()
                    self.optimizer.step()

                def _run_epoch(self, epoch):
                    for source, targets in self.train_data:
                        self._run_batch(source, targets)

                def train(self, max_epochs):
                    for epoch in range(max_epochs):
                        self._run_epoch(epoch)
            """,
            """
            import torch
            import torch.nn.functional as F
            import torch_xla

            class Trainer:
                def __init__(self, model, train_data, optimizer):
                    self.model = model
                    self.train_data = train_data
                    self.optimizer = optimizer

                def _run_batch(self, source, targets):
                    self.optimizer.zero_grad()
                    loss = F.cross_entropy(self.model(source), targets)
                    loss.backward()
                    self.optimizer.step()

                def _run_epoch(self, epoch):
                    for source, targets in self.train_data:
                        self._run_batch(source, targets)
                        torch_xla.sync()

                def train(self, max_epochs):
                    for epoch in range(max_epochs):
                        self._run_epoch(epoch)
            """,
            title="a trainer class: the batch loop calls the method that steps (the epoch loop gets nothing)",
        ),
        Example(
            """
            import torch

            def compute_loss(model, batch):
                return model(batch).mean()

            def train_step(model, batch, opt):
                loss = compute_loss(model, batch)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss

            def update(model, batch, opt):
                return train_step(model, batch, opt)

            def fit(model, batches, opt):
                it = 0
                while it < len(batches):
                    update(model, batches[it], opt)
                    it += 1
            """,
            """
            import torch
            import torch_xla

            def compute_loss(model, batch):
                return model(batch).mean()

            def train_step(model, batch, opt):
                loss = compute_loss(model, batch)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss

            def update(model, batch, opt):
                return train_step(model, batch, opt)

            def fit(model, batches, opt):
                it = 0
                while it < len(batches):
                    update(model, batches[it], opt)
                    it += 1
                    torch_xla.sync()
            """,
            title="the step two function calls away",
        ),
        Example(
            """
            import torch

            class BaseTrainer:
                def run(self):
                    for batch in self.batches:
                        self.training_step(batch)

            class LMTrainer(BaseTrainer):
                def training_step(self, batch):
                    self.model(batch).backward()
                    self.opt.step()

            trainer = LMTrainer()
            for chunk in chunks:
                trainer.training_step(chunk)
            """,
            """
            import torch
            import torch_xla

            class BaseTrainer:
                def run(self):
                    for batch in self.batches:
                        self.training_step(batch)
                        torch_xla.sync()

            class LMTrainer(BaseTrainer):
                def training_step(self, batch):
                    self.model(batch).backward()
                    self.opt.step()

            trainer = LMTrainer()
            for chunk in chunks:
                trainer.training_step(chunk)
                torch_xla.sync()
            """,
            title="a base class's loop calling the subclass's step, and a loop over an instance's method",
        ),
    ]
    valid = [
        # the step method holds the loop itself: the callers' loops are epoch loops
        """
        import torch
        import torch_xla
        class Trainer:
            def run_epoch(self):
                for x in self.loader:
                    self.model(x).sum().backward()
                    torch_xla.sync()
            def fit(self, epochs):
                for epoch in range(epochs):
                    self.run_epoch()
        """,
        # a method of another class of the same name that does no backward pass
        """
        import torch
        class Env:
            def step(self, a):
                return a
        class Agent:
            def step(self, x):
                self.net(x).sum().backward()
        env = Env()
        for t in range(10):
            env.step(t)
        """,
        # MpDeviceLoader syncs at each iteration
        """
        import torch
        import torch_xla.distributed.parallel_loader as pl
        def train(model, loader, device, opt):
            for x, y in pl.MpDeviceLoader(loader, device):
                model(x, y).backward()
                opt.step()
        """,
        # a device loader bound to a name
        """
        import torch
        import torch_xla.distributed.parallel_loader as pl
        def train(model, loader, device, opt):
            train_device_loader = pl.MpDeviceLoader(loader, device)
            for step, (x, y) in enumerate(train_device_loader):
                model(x, y).backward()
                opt.step()
        """,
        # already ported by hand
        """
        import torch
        import torch_xla.core.xla_model as xm
        for i in range(10):
            model(x).sum().backward()
            xm.mark_step()
        """,
        """
        import torch
        import torch_xla
        for i in range(10):
            with torch_xla.step():
                model(x).sum().backward()
        """,
        # a DataLoader: TX301 wraps it in pl.MpDeviceLoader instead
        """
        import torch
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            model(x, y).backward()
        """,
        # an epoch loop around a device-loader loop and a validation loop
        """
        import torch
        import torch_xla.distributed.parallel_loader as pl
        def fit(model, train_loader, val_loader, opt, device):
            for epoch in range(3):
                for x, y in pl.MpDeviceLoader(train_loader, device):
                    model(x, y).backward()
                    opt.step()
                with torch.no_grad():
                    for x, y in pl.MpDeviceLoader(val_loader, device):
                        model(x, y)
        """,
        # not a training loop: the backward pass is in a nested loop
        """
        import torch
        import torch_xla
        for epoch in range(3):
            for i in range(10):
                model(x).sum().backward()
                torch_xla.sync()
        """,
    ]

    def visit_For(self, node: cst.For) -> None:
        self._check(node)

    def visit_While(self, node: cst.While) -> None:
        self._check(node)

    def _check(self, loop: cst.CSTNode) -> None:
        kind = tr.loop_kind(loop, self.ctx)
        if kind not in ("train", "eval"):
            return
        if tr.has_step_marker(loop, self.ctx):
            return
        if isinstance(loop, cst.For):
            sources = tr.loop_source(loop, self.ctx)
            if any(s.kind == tr.DEVICE_LOADER for s in sources):
                return
            plan = tr.plan_loader_wrap(loop, self.ctx)
            if plan is not None and plan.problem is None:
                return  # TX301 wraps it in pl.MpDeviceLoader, which syncs every iteration
        edits = []
        sync = tr.sync_statement(self.ctx)
        for cont, line in tr.own_continues(loop):
            if line is not None:
                edits.append(Edit(line, astutil.insert_before([tr.sync_statement(self.ctx)])))
            else:
                edits.append(Edit(cont, tr.sync_before(self.ctx)))
        body = loop.body  # type: ignore[attr-defined]
        last = body.body[-1] if body.body else None
        ends_with_continue = (
            isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Continue)
        ) or isinstance(last, cst.Continue)
        if not ends_with_continue:
            if isinstance(body, cst.SimpleStatementSuite):
                edits.append(Edit(loop, _append_to_suite(cst.Expr(sync.body[0].value))))  # type: ignore[attr-defined]
            else:
                edits.append(Edit(loop, astutil.append_to_body(loop, [sync])))
        what = "training" if kind == "train" else "evaluation"
        self.report(
            loop,
            f"this {what} loop has no step marker: on XLA its graph grows and recompiles every "
            "iteration; add torch_xla.sync() at the end of each iteration (or iterate a "
            "pl.MpDeviceLoader)",
            Fix(tuple(edits), imports=("torch_xla",)),
        )


def _append_to_suite(expr: cst.BaseSmallStatement):
    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        suite = updated.body  # type: ignore[attr-defined]
        return updated.with_changes(body=suite.with_changes(body=[*suite.body, expr]))

    return apply
