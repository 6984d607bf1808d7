import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from ._tables import CUDA_SEEDS, TORCH_XLA, XM, side_effect_free

# Calls that already seed (or will seed, after TX804) the XLA generator.
_XLA_SEEDS = (f"{TORCH_XLA}.manual_seed", f"{XM}.set_rng_state", *CUDA_SEEDS)


class XlaDeviceSeed(Rule):
    """
    ## What it does
    After a `torch.manual_seed(seed)` statement in device code (a file that mentions CUDA or
    torch_xla) that never seeds the XLA generator, adds `torch_xla.manual_seed(seed)`.

    ## Why
    `torch.manual_seed` seeds the CPU (and CUDA) generators, not the XLA device's: measured in
    torch_xla 2.9, `torch.rand(3, device=torch_xla.device())` after `torch.manual_seed(7)`
    gives different values on each repetition, while after `torch_xla.manual_seed(7)` they
    repeat. Random ops on the device (dropout, `torch.rand*(device=...)`, in-place `normal_`
    on XLA parameters) therefore ignore the user's seed unless the XLA generator is seeded
    too. A file that calls `torch.cuda.manual_seed(_all)` gets `torch_xla.manual_seed` from
    TX804 instead.

    ## Fix safety
    Safe: it only makes device randomness follow the user's seed. The seed expression is
    evaluated twice, so a seed computed by a call (other than int()/str()...) is reported.
    """

    code = "TX108"
    name = "xla-device-seed"
    target = "torch-xla"
    summary = "torch.manual_seed(s) does not seed the XLA device: add torch_xla.manual_seed(s)"
    severity = Severity.WARNING
    needs_text = ("manual_seed",)
    examples = [
        Example(
            """
            import torch

            def main(args):
                torch.manual_seed(args.seed)
                model = build().cuda()
            """,
            """
            import torch
            import torch_xla

            def main(args):
                torch.manual_seed(args.seed)
                torch_xla.manual_seed(args.seed)
                model = build().cuda()
            """,
        ),
    ]
    valid = [
        "import torch\nimport torch_xla\ntorch.manual_seed(0)\ntorch_xla.manual_seed(0)\n",
        "import torch\ntorch.manual_seed(0)\ntorch.cuda.manual_seed_all(0)\n",
        "import torch\ng = torch.manual_seed(0)\n",
        "import torch\ntorch.manual_seed(0)\nx = torch.randn(3)\n",  # CPU-only code
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # Decided at the end of the file: candidates, whether the XLA generator is seeded
        # anywhere, whether this is device code at all.
        self._candidates: list[tuple[cst.Call, cst.SimpleStatementLine]] = []
        self._seeds_xla = False
        self._device_code = False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if not self._device_code and (node.attr.value == "cuda" or (self.ctx.qualname(node) or "").startswith("torch_xla")):
            self._device_code = True

    def visit_Name(self, node: cst.Name) -> None:
        if not self._device_code and node.value == "torch_xla" and self.ctx.qualname(node) == "torch_xla":
            self._device_code = True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if not self._device_code and "cuda" in node.value:
            self._device_code = True

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.qualname(node.func)
        if name in _XLA_SEEDS:
            self._seeds_xla = True
            return
        if name != "torch.manual_seed" or len(node.args) != 1:
            return
        expr = self.ctx.parent
        line = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            self._candidates.append((node, line))

    def leave_Module(self, node: cst.Module) -> None:
        if self._seeds_xla or not self._device_code:
            return
        for call, line in self._candidates:
            self._seed_after(call, line)

    def _seed_after(self, node: cst.Call, line: cst.SimpleStatementLine) -> None:
        seed = node.args[0]
        if seed.star or seed.keyword is not None and seed.keyword.value != "seed":
            return
        if not side_effect_free(seed.value, self.ctx):
            self.report(node, "torch.manual_seed() does not seed the XLA device: also call torch_xla.manual_seed(seed)")
            return
        new = cst.parse_statement(f"{self.ctx.module_alias(TORCH_XLA)}.manual_seed(_)\n")
        call = new.body[0].value  # type: ignore[attr-defined]
        new = new.with_changes(body=[new.body[0].with_changes(value=call.with_changes(args=[cst.Arg(seed.value)]))])  # type: ignore[attr-defined]
        self.report(
            node,
            "torch.manual_seed() does not seed the XLA device's generator: torch_xla.manual_seed() added",
            Fix((self.replace(line, lambda updated: cst.FlattenSentinel([updated, new])),), imports=(TORCH_XLA,)),
        )
