from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _training as tr
from ._availability import answer
from ._devices import device_variable, places_on_device, xla_device_value


class MpDeviceLoader(Rule):
    """
    ## What it does
    A training or evaluation loop over a `torch.utils.data.DataLoader` is rewritten to
    iterate `pl.MpDeviceLoader(loader, device)`, and the per-batch moves of the loop's batch
    variables are dropped: `data, target = data.to(device), target.to(device)` and
    `images = images.cuda(non_blocking=True)` go away, `x = batch['x'].to(device)` becomes
    `x = batch['x']`, `model(x.to(device))` becomes `model(x)`,
    `batch = {k: v.to(device) for k, v in batch.items()}` goes away, and
    `x.to(device, dtype=torch.float32)` keeps its conversion: `x.to(dtype=torch.float32)`.

    The device is the one of those moves (`.to(device)`, `.to(args.device)`); `.cuda()`,
    `.to('cuda')` or no move at all give `torch_xla.device()`; but a file that places nothing on
    a device (a CPU-only script: its model stays on the CPU) keeps its loops, reported: the
    device loader would hand XLA tensors to a CPU model ("Expected XLA tensor. Got:
    torch.FloatTensor"); a device value that nothing is moved to (`device = torch.device(...)`,
    printed) places nothing. Loops through `enumerate(...)`
    (with a start), `tqdm(...)` and both nestings are handled; the loop is wrapped, never the
    DataLoader's construction, so `len(loader)`, `loader.dataset` and
    `loader.sampler.set_epoch(epoch)` keep working, and each loop over the loader gets its
    own wrapper.

    Only loaders the file builds with `torch.utils.data.DataLoader(...)` (or a function
    parameter whose name says loader, when the file binds that name to nothing else) are
    wrapped. Reported without a fix: a loop whose batch holds values used without a device
    move (say the `lengths` that `pack_padded_sequence` wants on the CPU), since the device
    loader moves every tensor of the batch; and `zip(loader_a, loader_b)` (TX202 adds a
    sync there instead). Loops that already call `torch_xla.sync()`/`xm.mark_step()` are
    left as they are, and a loop that still tests CUDA availability waits for TX107 (the next
    fix pass wraps it). The device of `.cuda()` moves is the script's device variable where
    the loop can read one (a parameter `device`, or a `device = ...` before it), else
    `torch_xla.device()`.

    ## Why
    `MpDeviceLoader` uploads the next batches to the device in background threads while
    the current step runs, and it marks the step (`torch_xla.sync()`) at each iteration, so
    each iteration is one graph, compiled once. A per-batch `.to(device)` in the loop body
    uploads synchronously and leaves the loop without a step marker.

    ## Fix safety
    Safe: the loop sees the same batches in the same order, already on the device; only the
    batch values that the loop moved anyway change place. `MpDeviceLoader` needs an XLA
    device ("Check failed: device.type() == at::kXLA (cpu vs. xla)" with a CPU one), and a
    script's device variable may hold the CPU (the port keeps the user's `--no-cuda`), so the
    wrapper is unconditional only where the device is provably XLA: `torch_xla.device()` (the
    loop moved its batch with `.cuda()`/`'cuda'`, or not at all) or a name every binding of which
    in the file is the XLA device (`device = torch_xla.device()`, `torch.device('cuda')`, a
    `'cuda' if torch.cuda.is_available() else 'cpu'` choice) and that is no parameter of an
    enclosing function. Otherwise the loop iterates
    `pl.MpDeviceLoader(loader, device) if torch.device(device).type == "xla" else loader`: on the
    XLA device the device loader, on the CPU the plain loader, whose batches are already where
    the dropped moves put them (`torch.device(...)` also reads a device string).
    """

    code = "TX301"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-mp-device-loader"
    target = "torch-xla"
    summary = "loop over a DataLoader -> iterate pl.MpDeviceLoader(loader, device), drop per-batch .to(device)"
    severity = Severity.WARNING
    needs_text = ("loader", "Loader")
    examples = [
        Example(
            """
            import torch
            import torch.nn.functional as F

            def train(args, model, device, train_loader, optimizer, epoch):
                model.train()
                for batch_idx, (data, target) in enumerate(train_loader):
                    data, target = data.to(device), target.to(device)
                    optimizer.zero_grad()
                    output = model(data)
                    loss = F.nll_loss(output, target)
                    loss.backward()
                    optimizer.step()
            """,
            """
            import torch
            import torch.nn.functional as F
            import torch_xla.distributed.parallel_loader as pl

            def train(args, model, device, train_loader, optimizer, epoch):
                model.train()
                for batch_idx, (data, target) in enumerate(pl.MpDeviceLoader(train_loader, device) if torch.device(device).type == "xla" else train_loader):
                    optimizer.zero_grad()
                    output = model(data)
                    loss = F.nll_loss(output, target)
                    loss.backward()
                    optimizer.step()
            """,
            title="the mnist training loop: `device` is a parameter, it may be the CPU (a user's --no-cuda)",
        ),
        Example(
            """
            import torch
            import torch_xla

            device = torch_xla.device()

            def train(model, train_loader, opt):
                for x, y in train_loader:
                    x, y = x.to(device), y.to(device)
                    model(x, y).backward()
                    opt.step()
            """,
            """
            import torch
            import torch_xla
            import torch_xla.distributed.parallel_loader as pl

            device = torch_xla.device()

            def train(model, train_loader, opt):
                for x, y in pl.MpDeviceLoader(train_loader, device):
                    model(x, y).backward()
                    opt.step()
            """,
            title="a device variable that is always the XLA device",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader
            from tqdm import tqdm

            val_loader = DataLoader(val_set, batch_size=64)

            @torch.no_grad()
            def validate(model):
                correct = 0
                for images, labels in tqdm(val_loader, desc="val"):
                    images = images.cuda(non_blocking=True)
                    labels = labels.cuda(non_blocking=True)
                    correct += (model(images).argmax(1) == labels).sum()
                return correct
            """,
            """
            import torch
            from torch.utils.data import DataLoader
            from tqdm import tqdm
            import torch_xla
            import torch_xla.distributed.parallel_loader as pl

            val_loader = DataLoader(val_set, batch_size=64)

            @torch.no_grad()
            def validate(model):
                correct = 0
                for images, labels in tqdm(pl.MpDeviceLoader(val_loader, torch_xla.device()), desc="val"):
                    correct += (model(images).argmax(1) == labels).sum()
                return correct
            """,
            title="an eval loop with .cuda() moves",
        ),
        Example(
            """
            import torch

            def fit(model, dataloader, opt, device):
                for step, batch in enumerate(dataloader, 1):
                    x = batch["x"].to(device, dtype=torch.float32)
                    y = batch["y"].to(device)
                    loss = model(x, y)
                    loss.backward()
                    opt.step()
            """,
            """
            import torch
            import torch_xla.distributed.parallel_loader as pl

            def fit(model, dataloader, opt, device):
                for step, batch in enumerate(pl.MpDeviceLoader(dataloader, device) if torch.device(device).type == "xla" else dataloader, 1):
                    x = batch["x"].to(dtype=torch.float32)
                    y = batch["y"]
                    loss = model(x, y)
                    loss.backward()
                    opt.step()
            """,
            title="dict batches, a dtype conversion kept",
        ),
        Example(
            """
            import torch

            def validate(val_loader, model, args):
                with torch.no_grad():
                    for i, (images, target) in enumerate(val_loader):
                        if args.gpu is not None:
                            images = images.cuda(args.gpu, non_blocking=True)
                        if args.cuda:
                            target = target.cuda(args.gpu, non_blocking=True)
                        output = model(images)
            """,
            """
            import torch
            import torch_xla
            import torch_xla.distributed.parallel_loader as pl

            def validate(val_loader, model, args):
                with torch.no_grad():
                    for i, (images, target) in enumerate(pl.MpDeviceLoader(val_loader, torch_xla.device())):
                        output = model(images)
            """,
            title="conditional moves: the emptied ifs go too",
        ),
        Example(
            """
            import torch

            def train(model, train_loader, opt, device):
                for batch in train_loader:
                    batch = {k: v.to(device) for k, v in batch.items()}
                    model(**batch).loss.backward()
                    opt.step()
            """,
            """
            import torch
            import torch_xla.distributed.parallel_loader as pl

            def train(model, train_loader, opt, device):
                for batch in (pl.MpDeviceLoader(train_loader, device) if torch.device(device).type == "xla" else train_loader):
                    model(**batch).loss.backward()
                    opt.step()
            """,
            title="a dict comprehension move",
        ),
        Example(
            """
            import torch
            from torch.nn.utils.rnn import pack_padded_sequence

            def train(model, train_loader, opt, device):
                for x, y, lengths in train_loader:
                    x, y = x.to(device), y.to(device)
                    out = model(pack_padded_sequence(x, lengths, batch_first=True))
                    loss = out.sum()
                    loss.backward()
                    opt.step()
            """,
            None,
            title="a batch value kept on the CPU: reported",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader

            model = torch.nn.Linear(784, 10)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            train_loader = DataLoader(train_set, batch_size=100, shuffle=True)
            for epoch in range(2):
                for i, (images, labels) in enumerate(train_loader):
                    loss = torch.nn.functional.cross_entropy(model(images.reshape(-1, 784)), labels)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            """,
            title="a CPU-only script (nothing is placed on a device): reported, the loop is kept",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader

            net = Net()
            optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
            for inputs, labels in DataLoader(train_set, batch_size=4):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(inputs), labels).backward()
                optimizer.step()

            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            print(f"training on the GPU would use {device}")
            """,
            title="a device value that nothing is moved to (a tutorial that names the GPU it does not use): "
                  "still a CPU-only script, the loop is kept",
        ),
        Example(
            """
            import torch
            import torch_xla
            import torch_xla.distributed.parallel_loader as pl

            def train(loader, model, optimizer, device):
                for x, y in (pl.MpDeviceLoader(loader, device) if torch.device(device).type == "xla" else loader):
                    optimizer.zero_grad()
                    model(x, y).backward()
                    optimizer.step()

            def main(loader, model, optimizer):
                device = torch_xla.device()
                train(loader, model, optimizer, device)
            """,
            """
            import torch_xla
            import torch_xla.distributed.parallel_loader as pl

            def train(loader, model, optimizer, device):
                for x, y in pl.MpDeviceLoader(loader, device):
                    optimizer.zero_grad()
                    model(x, y).backward()
                    optimizer.step()

            def main(loader, model, optimizer):
                device = torch_xla.device()
                train(loader, model, optimizer, device)
            """,
            title="the test for a CPU device goes once every call passes the XLA device (TX107 folded "
                  "`device = torch.device('cuda' if ... else 'mps' if ... else 'cpu')`)",
        ),
    ]
    valid = [
        # already a device loader
        """
        import torch
        import torch_xla.distributed.parallel_loader as pl
        def train(model, train_loader, device, opt):
            for x, y in pl.MpDeviceLoader(train_loader, device):
                model(x, y).backward()
                opt.step()
        """,
        # an iterable the file does not build as a DataLoader
        """
        import torch
        def train(model, batches, opt):
            for x, y in batches:
                model(x, y).backward()
                opt.step()
        """,
        # a name bound to something else than a DataLoader
        """
        import torch
        loader = make_batches()
        for x, y in loader:
            model(x, y).backward()
        """,
        # not a training or evaluation loop
        """
        import torch
        loader = torch.utils.data.DataLoader(ds)
        for x, y in loader:
            print(x.shape)
        """,
        # ported by hand with an explicit step marker
        """
        import torch
        import torch_xla
        loader = torch.utils.data.DataLoader(ds)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            model(x, y).backward()
            torch_xla.sync()
        """,
    ]

    def visit_For(self, node: cst.For) -> None:
        kind = tr.loop_kind(node, self.ctx)
        if kind not in ("train", "eval"):
            return
        if any(answer(n, self.ctx) is not None for n in astutil.walk(node.body)):
            return  # TX107 folds the availability tests in the body first; the next pass wraps
        plan = tr.plan_loader_wrap(node, self.ctx)
        if plan is None:
            return
        if plan.problem is not None:
            self.report(node.iter, plan.problem, severity=Severity.INFO)
            return
        pl = self.ctx.module_alias("torch_xla.distributed.parallel_loader")
        imports = ["torch_xla.distributed.parallel_loader"]
        variable = device_variable(self.ctx) if plan.device is None else None
        if plan.device is None and variable is None and not plan.drop_calls and not plan.drop_statements \
                and not places_on_device(self.ctx):
            self.report(node.iter, "nothing in this file is placed on a device, so the port trains on the CPU: "
                        "to train on XLA, move the model to torch_xla.device() before its optimizer is built and "
                        "iterate pl.MpDeviceLoader(loader, torch_xla.device()) (with every tensor the step "
                        "creates on that device)", severity=Severity.INFO)
            return
        if plan.device is None and variable is None:
            device_code = f"{self.ctx.module_alias('torch_xla')}.device()"
            imports.append("torch_xla")
            test = None
        else:
            device_code = plan.device or variable
            xla = xla_device_value(cst.parse_expression(device_code), self.ctx, node)
            test = None if xla else f"{self.ctx.module_alias('torch')}.device({device_code}).type == \"xla\""
            if test is not None:
                imports.append("torch")
        edits = [Edit(plan.loader, _wrap(pl, device_code, test, parens=plan.loader is node.iter))]
        for call in plan.drop_calls:
            edits.append(Edit(call, tr.strip_move))
        for stmt in plan.drop_statements:
            edits.append(Edit(stmt, cst.RemoveFromParent()))
        for node in plan.emptied_ifs:
            edits.append(Edit(node, tr.remove_if_empty))
        what = "training" if kind == "train" else "evaluation"
        self.report(
            plan.loader,
            f"this {what} loop iterates a DataLoader: iterate pl.MpDeviceLoader(loader, device), "
            "which uploads batches in the background and marks each step, and drop the "
            "per-batch .to(device)",
            Fix(tuple(edits), imports=tuple(imports)),
        )


    def visit_IfExp(self, node: cst.IfExp) -> None:
        """`pl.MpDeviceLoader(loader, d) if torch.device(d).type == "xla" else loader` whose `d` a
        later pass made provably XLA (TX107 folded the CUDA/MPS branches that bound it): the
        device loader alone."""
        test, body = node.test, node.body
        if not (isinstance(body, cst.Call) and len(body.args) == 2
                and self.ctx.qualname(body.func) == "torch_xla.distributed.parallel_loader.MpDeviceLoader"
                and isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                and isinstance(test.comparisons[0].operator, cst.Equal)):
            return
        probe, expected = test.left, test.comparisons[0].comparator
        if not (isinstance(expected, cst.SimpleString) and expected.evaluated_value == "xla"
                and isinstance(probe, cst.Attribute) and probe.attr.value == "type"
                and isinstance(probe.value, cst.Call) and self.ctx.qualname(probe.value.func) == "torch.device"
                and len(probe.value.args) == 1):
            return
        loader, device = body.args[0].value, body.args[1].value
        same = cst.Module([]).code_for_node
        if same(probe.value.args[0].value) != same(device) or same(loader) != same(node.orelse):
            return
        if not xla_device_value(device, self.ctx, node):
            return
        edit = self.replace(node, body)
        parent = self.ctx.parent
        if node.lpar and isinstance(parent, cst.For) and parent.iter is node and parent.whitespace_after_in.value:
            # `for x in (a if t else b):` -> `for x in a:`, not `for x in (a):` (the engine keeps a
            # replaced expression's parentheses where it cannot tell they are not needed)
            edit = self.replace(parent, lambda updated: updated.with_changes(iter=updated.iter.body)
                                if isinstance(updated.iter, cst.IfExp) else updated)
        self.report(node, f"the device {same(device)} is the XLA device on every path now: the device loader alone, "
                    "without the test for a CPU device", Fix((edit,)))


def _wrap(pl: str, device_code: str, test: Optional[str], parens: bool = False):
    """`pl.MpDeviceLoader(loader, device)`; with a ``test``, only when it holds:
    `pl.MpDeviceLoader(loader, device) if test else loader`."""
    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        call = cst.parse_expression(f"{pl}.MpDeviceLoader(_, {device_code})")
        assert isinstance(call, cst.Call)
        call = call.with_changes(args=[call.args[0].with_changes(value=updated), call.args[1]])
        if test is None:
            return call
        assert isinstance(updated, cst.BaseExpression)
        choice = cst.IfExp(test=cst.parse_expression(test), body=call, orelse=updated)
        return choice.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if parens else choice

    return apply
