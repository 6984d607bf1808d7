from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from . import _training as tr


class DropLastTrainBatch(tr.LoaderUsage, Rule):
    """
    ## What it does
    Adds `drop_last=True` to a training DataLoader: one that a training loop of the file
    iterates (directly or through `enumerate`/`tqdm`/`pl.MpDeviceLoader`, linked by the name
    it is bound to), or that shuffles (`shuffle=True`, a random or distributed sampler).
    `**kwargs` built from dict literals in the file (also `{...} if cond else {...}`, whose
    branches are both read) are read to make sure `drop_last` is not passed twice; when they cannot be read, or `drop_last` is given as something else than
    `True`, the loader is reported without a fix.

    ## Why
    XLA compiles one graph per input shape. When the dataset size is not a multiple of the
    batch size, the last batch of each epoch is smaller: the step is traced and compiled a
    second time for that shape (and the optimizer update of that step differs too), which
    costs a compilation and the memory of a second executable.

    ## Fix safety
    Unsafe: with `drop_last=True` the last partial batch of every epoch is skipped, so the
    model trains on up to `batch_size - 1` fewer samples per epoch (different ones every
    epoch when the loader shuffles), and `len(loader)` drops by one. Padding the dataset to
    a multiple of the batch size is the alternative that keeps every sample.
    """

    code = "TX302"
    name = "xla-drop-last-train-batch"
    target = "torch-xla"
    summary = "training DataLoader without drop_last=True: the ragged last batch compiles a second graph"
    severity = Severity.WARNING
    needs_text = ("DataLoader",)
    examples = [
        Example(
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(train_set, batch_size=32, shuffle=True)
            """,
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(train_set, batch_size=32, shuffle=True, drop_last=True)
            """,
            unsafe=True,
            title="a shuffling loader",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(
                train_set,
                batch_size=32,

                shuffle=True)
            other = DataLoader(train_set, batch_size=32,  # per device
                               shuffle=True)
            """,
            """
            import torch
            from torch.utils.data import DataLoader

            loader = DataLoader(
                train_set,
                batch_size=32,

                shuffle=True,
                drop_last=True)
            other = DataLoader(train_set, batch_size=32,  # per device
                               shuffle=True,
                               drop_last=True)
            """,
            unsafe=True,
            title="the new argument takes its neighbours' line break and indentation, not their blank line or comment",
        ),
        Example(
            """
            from torch.utils.data import DataLoader

            loader = DataLoader(
                dataset,
                batch_size=32,
                sampler=sampler
            )

            def train(model, optimizer):
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
            """,
            """
            from torch.utils.data import DataLoader

            loader = DataLoader(
                dataset,
                batch_size=32,
                sampler=sampler,
                drop_last=True
            )

            def train(model, optimizer):
                for x, y in loader:
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
            """,
            unsafe=True,
            title="a closing parenthesis on a line of its own stays there",
        ),
        Example(
            """
            import torch

            def train(model, device, train_loader, optimizer):
                for data, target in train_loader:
                    optimizer.zero_grad()
                    model(data.to(device)).sum().backward()
                    optimizer.step()

            def main():
                train_kwargs = {'batch_size': 64}
                cuda_kwargs = {'num_workers': 1, 'pin_memory': True}
                train_kwargs.update(cuda_kwargs)
                train_loader = torch.utils.data.DataLoader(
                    dataset1,
                    **train_kwargs,
                )
                train(model, device, train_loader, optimizer)
            """,
            """
            import torch

            def train(model, device, train_loader, optimizer):
                for data, target in train_loader:
                    optimizer.zero_grad()
                    model(data.to(device)).sum().backward()
                    optimizer.step()

            def main():
                train_kwargs = {'batch_size': 64}
                cuda_kwargs = {'num_workers': 1, 'pin_memory': True}
                train_kwargs.update(cuda_kwargs)
                train_loader = torch.utils.data.DataLoader(
                    dataset1,
                    **train_kwargs,
                    drop_last=True,
                )
                train(model, device, train_loader, optimizer)
            """,
            unsafe=True,
            title="iterated by a training loop, keyword arguments from dict literals",
        ),
        Example(
            """
            import torch

            kwargs = {'num_workers': 1, 'pin_memory': True} if use_cuda else {}
            loader = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True, **kwargs)
            """,
            """
            import torch

            kwargs = {'num_workers': 1, 'pin_memory': True} if use_cuda else {}
            loader = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True, **kwargs, drop_last=True)
            """,
            unsafe=True,
            title="keyword arguments from a conditional between dict literals",
        ),
        Example(
            """
            import torch

            kwargs = {'drop_last': False} if small else {}
            loader = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True, **kwargs)
            """,
            None,
            title="a branch of the conditional may pass drop_last: reported",
        ),
        Example(
            """
            import torch

            loader = torch.utils.data.DataLoader(train_set, shuffle=True, **get_kwargs())
            """,
            None,
            title="keyword arguments porter cannot read: reported",
        ),
    ]
    valid = [
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)\n",
        # an evaluation loader (TX303 speaks about it)
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False)\n",
        # no batching: nothing is ragged
        "import torch\nloader = torch.utils.data.DataLoader(ds, shuffle=True)\n",
        # batch_sampler decides the batches
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_sampler=bs)\n",
        # not torch's DataLoader
        "from torch_geometric.loader import DataLoader\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n",
    ]

    def check_loaders(self, loaders: list) -> None:
        for lc in loaders:
            if lc.role != "train" or not tr.batches(lc.call, self.ctx):
                continue
            if astutil.arg(lc.call, "batch_sampler", 4) is not None:
                continue
            given = astutil.arg(lc.call, "drop_last", 6)
            if given is not None:
                if not tr.is_true(given.value):
                    self.report(
                        lc.call,
                        "this training DataLoader sets drop_last to something else than True: a "
                        "ragged last batch makes XLA compile a second step graph; use "
                        "drop_last=True (skips up to batch_size-1 samples per epoch) or pad the "
                        "dataset to a multiple of the batch size",
                    )
                continue
            keys = tr.kwargs_keys(lc.call, self.ctx)
            if keys is None or "drop_last" in keys:
                self.report(
                    lc.call,
                    "this training DataLoader may yield a ragged last batch, which makes XLA "
                    "compile a second step graph; "
                    + ("porter cannot read its **kwargs" if keys is None else "its **kwargs may pass drop_last")
                    + ": pass "
                    "drop_last=True (skips up to batch_size-1 samples per epoch) or pad the "
                    "dataset to a multiple of the batch size",
                )
                continue
            self.report(
                lc.call,
                "the last batch of this training DataLoader is smaller when the dataset size is "
                "not a multiple of the batch size, and XLA compiles a second step graph for it; "
                "drop_last=True avoids that but skips up to batch_size-1 samples per epoch "
                "(unsafe fix)",
                Fix((Edit(lc.call, tr.append_kwarg("drop_last", "True")),), Safety.UNSAFE),
            )
