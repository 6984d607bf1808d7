from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from . import _training as tr

_PAD_SEQUENCE = ("torch.nn.utils.rnn.pad_sequence",)
# the padded length is rounded up to a multiple of this: at most one graph per bucket
BUCKET = 64


class PaddedCollate(Rule):
    """
    ## What it does
    Reports batches padded to the longest sequence of the batch, which give the step a new
    shape at almost every batch:

    * `pad_sequence(...)` (`torch.nn.utils.rnn`) in a function that a DataLoader uses as its
      `collate_fn`, or in a training/evaluation loop;
    * a `collate_fn` that sizes its batch tensor from the longest item
      (`max_len = max(len(s) for s in batch)`, then `torch.zeros(len(batch), max_len)`).

    The unsafe fix, for `padded = pad_sequence(seqs, ...)`, rounds the padded length up to a
    multiple of 64 with the same padding value (bucketing), right after the call:
    `padded = F.pad(padded, (0, 0) * (padded.dim() - 2) + (0, -padded.size(1) % 64), value=0)`
    (`batch_first=True`; the time dimension is 0 otherwise).

    ## Why
    XLA compiles one graph per input shape. Padded to the batch maximum, a text or speech
    batch has a different length at nearly every step: the step (forward, backward and
    optimizer) recompiles over and over, each compilation far slower than the step. With
    lengths rounded up to a bucket, lengths up to 64·N compile at most N graphs; padding to
    one fixed maximum length (`--max-len`) compiles one.

    ## Fix safety
    Unsafe: the batches get longer (more padding), which changes what a model computes unless
    it masks the padding out everywhere (attention masks, `ignore_index` in the loss, packed
    sequences); the memory and time per step grow with the padding.
    """

    code = "TX307"
    name = "xla-padded-collate"
    target = "torch-xla"
    summary = "batches padded to the batch's longest sequence: a new shape (and graph) almost every step; bucket or pad to a fixed length"
    severity = Severity.WARNING
    needs_text = ("pad_sequence", "collate_fn")
    examples = [
        Example(
            """
            import torch
            from torch.nn.utils.rnn import pad_sequence
            from torch.utils.data import DataLoader

            def collate(batch):
                seqs, labels = zip(*batch)
                padded = pad_sequence(seqs, batch_first=True, padding_value=0)
                return padded, torch.tensor(labels)

            loader = DataLoader(dataset, batch_size=32, collate_fn=collate)
            """,
            """
            import torch
            from torch.nn.utils.rnn import pad_sequence
            from torch.utils.data import DataLoader

            def collate(batch):
                seqs, labels = zip(*batch)
                padded = pad_sequence(seqs, batch_first=True, padding_value=0)
                padded = torch.nn.functional.pad(padded, (0, 0) * (padded.dim() - 2) + (0, -padded.size(1) % 64), value=0)
                return padded, torch.tensor(labels)

            loader = DataLoader(dataset, batch_size=32, collate_fn=collate)
            """,
            unsafe=True,
            title="pad_sequence in a collate_fn: the length is rounded up to a bucket",
        ),
        Example(
            """
            import torch
            import torch.nn.utils.rnn as rnn_utils

            def train(model, loader, opt):
                for seqs, y in loader:
                    x = rnn_utils.pad_sequence(seqs)
                    model(x, y).backward()
                    opt.step()
            """,
            """
            import torch
            import torch.nn.utils.rnn as rnn_utils

            def train(model, loader, opt):
                for seqs, y in loader:
                    x = rnn_utils.pad_sequence(seqs)
                    x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, -x.size(0) % 64), value=0.0)
                    model(x, y).backward()
                    opt.step()
            """,
            unsafe=True,
            title="pad_sequence in the training loop, time first",
        ),
        Example(
            """
            import torch
            from torch.utils.data import DataLoader

            def pad_batch(batch):
                max_len = max(len(tokens) for tokens, _ in batch)
                ids = torch.zeros(len(batch), max_len, dtype=torch.long)
                for row, (tokens, _) in enumerate(batch):
                    ids[row, :len(tokens)] = torch.tensor(tokens)
                return ids, torch.tensor([label for _, label in batch])

            train_loader = DataLoader(train_set, batch_size=16, shuffle=True, collate_fn=pad_batch)
            """,
            None,
            title="a collate_fn padding to the longest item by hand: reported",
        ),
    ]
    valid = [
        # padded to a fixed length
        "import torch\nfrom torch.utils.data import DataLoader\ndef collate(batch):\n"
        "    ids = torch.zeros(len(batch), 128, dtype=torch.long)\n    return ids\n"
        "loader = DataLoader(ds, collate_fn=collate)\n",
        # pad_sequence outside data loading and training
        "import torch\nfrom torch.nn.utils.rnn import pad_sequence\ndef show(seqs):\n    print(pad_sequence(seqs))\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        collates = self._collate_functions(node)
        for fn in collates:
            found = False
            for n in astutil.walk(fn.body):
                if isinstance(n, cst.Call) and self.ctx.qualname(n.func) in _PAD_SEQUENCE:
                    self._report_pad(fn, n)
                    found = True
            if not found:
                self._hand_padding(fn)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _PAD_SEQUENCE:
            return
        loop = next((a for a in reversed(self.ctx.ancestors) if isinstance(a, (cst.For, cst.While))), None)
        if loop is None or tr.loop_kind(loop, self.ctx) not in ("train", "eval"):
            return
        self._report_pad(loop, node)

    def _collate_functions(self, module: cst.Module) -> list[cst.FunctionDef]:
        names = set()
        for n in astutil.walk(module, into_functions=True):
            if isinstance(n, cst.Call) and self.ctx.qualname(n.func) in tr.DATALOADER_NAMES:
                a = astutil.arg(n, "collate_fn")
                if a is not None:
                    name = dotted_name(a.value)
                    if name:
                        names.add(name.rsplit(".", 1)[-1])
        return [n for n in astutil.walk(module, into_functions=True)
                if isinstance(n, cst.FunctionDef) and n.name.value in names]

    def _report_pad(self, where: cst.CSTNode, call: cst.Call) -> None:
        message = ("pad_sequence pads each batch to its longest sequence: a new shape, and a new XLA "
                   "graph, at almost every step; round the length up to a bucket, or pad to one fixed "
                   "maximum length")
        if self._bucketed(where, call):
            return
        fix = self._bucket_fix(where, call)
        if fix is None:
            self.report(call, message)
            return
        self.report(call, message + f" (unsafe fix: lengths rounded up to a multiple of {BUCKET})", fix)

    def _bucketed(self, where: cst.CSTNode, call: cst.Call) -> bool:
        """The padded batch is padded again (F.pad of the name bound to the call): bucketed,
        by hand or by this rule's fix."""
        names = {t.target.value for n in astutil.walk(where) if isinstance(n, cst.Assign) and n.value is call
                 for t in n.targets if isinstance(t.target, cst.Name)}
        for n in astutil.walk(where):
            if (isinstance(n, cst.Call) and self.ctx.qualname(n.func) == "torch.nn.functional.pad" and n.args
                    and isinstance(n.args[0].value, cst.Name) and n.args[0].value.value in names):
                return True
        return False

    def _bucket_fix(self, where: cst.CSTNode, call: cst.Call) -> Optional[Fix]:
        line = None
        for n in astutil.walk(where):
            if (isinstance(n, cst.SimpleStatementLine) and len(n.body) == 1 and isinstance(n.body[0], cst.Assign)
                    and n.body[0].value is call and len(n.body[0].targets) == 1
                    and isinstance(n.body[0].targets[0].target, cst.Name)):
                line = n
        if line is None:
            return None
        name = line.body[0].targets[0].target.value  # type: ignore[attr-defined]
        first = astutil.arg(call, "batch_first", 1)
        if first is not None and not (isinstance(first.value, cst.Name) and first.value.value in ("True", "False")):
            return None
        batch_first = first is not None and first.value.value == "True"  # type: ignore[attr-defined]
        side = astutil.arg(call, "padding_side", 3)
        if side is not None and astutil.string_value(side.value) != "right":
            return None  # left padding: the bucket's padding would go on the other side
        value = astutil.arg(call, "padding_value", 2)
        value_code = self.ctx.module.code_for_node(value.value) if value is not None else "0.0"
        dim, rest = (1, 2) if batch_first else (0, 1)
        torch = self.ctx.module_alias("torch")
        stmt = cst.parse_statement(
            f"{name} = {torch}.nn.functional.pad({name}, (0, 0) * ({name}.dim() - {rest}) + "
            f"(0, -{name}.size({dim}) % {BUCKET}), value={value_code})\n")
        return Fix((Edit(line, astutil.insert_after([stmt])),), Safety.UNSAFE, imports=("torch",))

    def _hand_padding(self, fn: cst.FunctionDef) -> None:
        """``m = max(len(x) for ...)`` used to size a tensor of the batch."""
        longest: set[str] = set()
        for n in astutil.walk(fn.body):
            if (isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Name)
                    and n.value.func.value == "max" and any(isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
                                                         and c.func.value == "len" for c in astutil.walk(n.value))):
                for t in n.targets:
                    if isinstance(t.target, cst.Name):
                        longest.add(t.target.value)
        if not longest:
            return
        for n in astutil.walk(fn.body):
            if isinstance(n, cst.Call) and (self.ctx.qualname(n.func) or "").startswith("torch.") and any(
                    isinstance(m, cst.Name) and m.value in longest for a in n.args for m in astutil.walk(a.value)):
                self.report(
                    n,
                    f"`{fn.name.value}` (a collate_fn) sizes the batch from its longest item: a new shape, and "
                    "a new XLA graph, at almost every step; pad to one fixed maximum length, or round the "
                    f"length up to a bucket (a multiple of {BUCKET})",
                )
                return
