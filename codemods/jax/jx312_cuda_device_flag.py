from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Rule, Severity

from . import _ops_table as ops


class CudaDeviceFlag(Rule):
    """
    ## What it does
    Reports a command-line option for the device whose default is CUDA
    (`parser.add_argument('--device', default='cuda')`, `'cuda:0'`, any option whose name
    holds "device"), at its default.

    ## Why
    A JAX port has no CUDA device to name: JAX places arrays on its default device (the TPU
    on a TPU VM). Whatever still reads the flag runs as before: a library's device setup
    (`timm.utils.init_distributed_device(args)` asserts "CUDA is not available but cuda was
    specified"), `torch.device(args.device)` in the data code, an `if args.device ==
    'cuda'` branch. With the default the port fails before its first step on a machine
    without CUDA; what reads the flag needs a hand port (or the default `'cpu'` for the torch
    code that stays, such as the DataLoader).

    ## Fix safety
    Report only: which code reads the flag, and what it should do in the port, is the
    script's.
    """

    code = "JX312"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-cuda-device-flag"
    target = "jax"
    summary = "add_argument('--device', default='cuda'): the JAX port has no CUDA (reported)"
    severity = Severity.WARNING
    needs_text = ("add_argument",)
    examples = [
        Example(
            """
            import argparse

            parser = argparse.ArgumentParser()
            parser.add_argument('--device', default='cuda', type=str, help='device to train on')
            """,
            None,
            title="a device flag defaulting to CUDA",
        ),
    ]
    valid = [
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--device', default='cpu')\n",
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--name', default='cuda')\n",
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--device', default=None)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if astutil.method_name(node) != "add_argument":
            return
        names = [ops.literal(a.value) for a in node.args if a.keyword is None]
        if not any(isinstance(n, str) and n.startswith("-") and "device" in n.lower() for n in names):
            return
        default = astutil.arg(node, "default")
        value = ops.literal(default.value) if default is not None else None
        if not (isinstance(value, str) and value.split(":")[0].lower() == "cuda"):
            return
        flag = next(n for n in names if isinstance(n, str) and "device" in n.lower())
        self.report(default, f"{flag} defaults to {value!r}: the JAX port has no CUDA device, and code that still reads "
                             "the flag (a library's device setup, torch.device(args.device)) fails with CUDA is not "
                             "available but cuda was specified: port what reads it by hand, or default to 'cpu' for "
                             "the torch code that stays")
