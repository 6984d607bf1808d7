from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

_LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")


class DropLast(Rule):
    """
    ## What it does
    Adds `drop_last=True` to a shuffling `torch.utils.data.DataLoader` (the training loader:
    `shuffle=True`) that does not say what to do with a partial last batch.

    The loader itself stays a torch DataLoader: torch is still importable for data, and the
    loop hands its batches to the jitted step as NumPy arrays (JX303: `x.numpy()`).

    ## Why
    A jitted JAX function is compiled for the shapes it is called with: the smaller last
    batch of an epoch compiles the train step a second time (and keeps both programs).
    Dropping it keeps one compiled step.

    ## Fix safety
    Unsafe: each epoch skips the last `len(dataset) % batch_size` samples (a different set
    each epoch, since the loader shuffles), and `len(loader)` is one less, which a schedule
    or a progress count built from it sees.
    """

    code = "JX306"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-drop-last"
    target = "jax"
    summary = "DataLoader(..., shuffle=True) -> drop_last=True (one compiled train step)"
    severity = Severity.WARNING
    needs_text = ("DataLoader",)
    examples = [
        Example(
            """
            from torch.utils.data import DataLoader

            train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
            test_loader = DataLoader(test_set, batch_size=1000)
            """,
            """
            from torch.utils.data import DataLoader

            train_loader = DataLoader(train_set, batch_size=64, shuffle=True, drop_last=True)
            test_loader = DataLoader(test_set, batch_size=1000)
            """,
            unsafe=True,
        ),
    ]
    valid = [
        "from torch.utils.data import DataLoader\nl = DataLoader(d, batch_size=4, shuffle=True, drop_last=False)\n",
        "import torch\nl = torch.utils.data.DataLoader(d, batch_size=4)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _LOADERS:
            return
        shuffle = astutil.arg(node, "shuffle", 2)
        if shuffle is None or not (isinstance(shuffle.value, cst.Name) and shuffle.value.value == "True"):
            return
        if astutil.arg(node, "drop_last", 8) is not None or any(a.star for a in node.args):
            return
        args = list(node.args)
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("drop_last"),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        self.report(node, "a partial last batch compiles the jitted train step again: drop_last=True",
                    Fix((self.replace(node, node.with_changes(args=args)),), Safety.UNSAFE))
