from porter import astutil
from porter.rules import Example, Rule, Severity

from . import _training as tr


class RaggedEvalBatch(tr.LoaderUsage, Rule):
    """
    ## What it does
    Reports a DataLoader that an evaluation loop of the file iterates (and no training
    loop does) when it batches and does not drop its last batch.

    ## Why
    XLA compiles one graph per input shape: when the evaluation set is not a multiple of
    the batch size, its last, smaller batch is traced and compiled once more (then cached,
    so the cost is one extra compilation per shape, not per evaluation). On large models the
    compile time and the memory of the second executable can matter.

    There is no automatic fix: `drop_last=True` would leave samples out of the evaluation
    and change the metrics. The static-shape alternative is to pad the dataset to a
    multiple of the batch size (repeat samples, or add dummy ones) and mask the padding out
    of the metrics, or to accept the one extra compilation.
    """

    code = "TX303"
    name = "xla-ragged-eval-batch"
    target = "torch-xla"
    summary = "evaluation DataLoader whose ragged last batch compiles a second graph (report only)"
    severity = Severity.INFO
    needs_text = ("DataLoader",)
    examples = [
        Example(
            """
            import torch

            test_loader = torch.utils.data.DataLoader(test_set, batch_size=100)

            def test(model):
                correct = 0
                with torch.no_grad():
                    for data, target in test_loader:
                        correct += (model(data).argmax(1) == target).sum()
                return correct
            """,
            None,
        ),
    ]
    valid = [
        # also iterated by a training loop: TX302's business
        """
        import torch
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        for x, y in loader:
            model(x, y).backward()
        with torch.no_grad():
            for x, y in loader:
                model(x, y)
        """,
        # drops its last batch already
        """
        import torch
        loader = torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
        with torch.no_grad():
            for x, y in loader:
                model(x, y)
        """,
        # one sample per batch: nothing is ragged
        """
        import torch
        loader = torch.utils.data.DataLoader(ds)
        with torch.no_grad():
            for x, y in loader:
                model(x, y)
        """,
    ]

    def check_loaders(self, loaders: list) -> None:
        for lc in loaders:
            if lc.role != "eval" or not tr.batches(lc.call, self.ctx):
                continue
            given = astutil.arg(lc.call, "drop_last", 6)
            if given is not None and tr.is_true(given.value):
                continue
            self.report(
                lc.call,
                "the last batch of this evaluation DataLoader is smaller when the dataset size is "
                "not a multiple of the batch size, and XLA compiles a second graph for it (once); "
                "to keep one graph, pad the dataset to a multiple of the batch size and mask the "
                "padding out of the metrics (drop_last=True would leave samples unevaluated)",
            )
