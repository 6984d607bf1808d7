import libcst as cst

from porter.astutil import arg, method_name, name_values, walk
from porter.rules import Example, Fix, Rule, Severity

from ._tables import XLA_DEVICE, is_cpu_string, is_cuda_string, string_node


class LoadMapLocation(Rule):
    """
    ## What it does
    Rewrites `torch.load(..., map_location=<CUDA>)` to `map_location='cpu'`, where the
    location is a CUDA string (`'cuda'`, `'cuda:0'`, `f'cuda:{gpu}'`), `torch.device('cuda')`,
    a dict mapping to CUDA locations, a lambda moving storages with `.cuda()`, or a choice
    between CUDA and CPU (`'cuda' if torch.cuda.is_available() else 'cpu'`); and a
    variable of the function (or module) whose every assignment is a CUDA or an XLA device
    (`loc = 'cuda:{}'.format(gpu)`, `device = torch.device('cuda', rank)`: the port's
    `torch_xla.device()`). Another `map_location` given by a variable is reported.

    ## Why
    `torch.load` cannot restore storages onto an XLA device: measured in torch 2.9 /
    torch_xla 2.9, `map_location` of `'xla'`, `'xla:0'`, `torch.device('xla:0')` or
    `torch_xla.device()` all raise `RuntimeError: don't know how to restore data location of
    torch.storage.UntypedStorage (tagged with xla:0)`. The documented pattern is to load on the
    CPU and move: `model.load_state_dict(...)` copies into the XLA parameters, and
    `optimizer.load_state_dict(...)` moves its state to the parameters' device. A variable
    (`map_location=device`) is reported because after the port it usually holds the XLA
    device, which fails as above.

    ## Fix safety
    Safe: loading on the CPU is what works on XLA. Tensors of the checkpoint used directly
    (not through `load_state_dict`) must then be moved with `.to(torch_xla.device())`.
    """

    code = "TX105"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "load-map-location"
    target = "torch-xla"
    summary = "torch.load(map_location='cuda'...) -> map_location='cpu' (XLA cannot be a map_location)"
    severity = Severity.ERROR
    needs_text = ("map_location",)
    examples = [
        Example(
            """
            import torch

            ckpt = torch.load(path, map_location="cuda:0")
            state = torch.load(path, map_location=torch.device("cuda"))
            other = torch.load(path, map_location=lambda storage, loc: storage.cuda(gpu))
            last = torch.load(path, map_location="cuda" if torch.cuda.is_available() else "cpu")
            """,
            """
            import torch

            ckpt = torch.load(path, map_location="cpu")
            state = torch.load(path, map_location="cpu")
            other = torch.load(path, map_location="cpu")
            last = torch.load(path, map_location="cpu")
            """,
        ),
        Example(
            """
            import torch

            def resume(path, device):
                return torch.load(path, map_location=device)
            """,
            None,
            title="a variable location is reported",
        ),
    ]
    valid = [
        "import torch\nckpt = torch.load(path, map_location='cpu')\n",
        "import torch\nckpt = torch.load(path)\n",
        "import torch\nckpt = torch.load(path, map_location=torch.device('cpu'))\n",
        "import torch\nckpt = torch.load(path, map_location=lambda storage, loc: storage)\n",
        "import torch\nckpt = torch.load(path, map_location={'cuda:0': 'cpu'})\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load":
            return
        loc = arg(node, "map_location", 1)
        if loc is None:
            return
        value = loc.value
        if self._is_cpu(value):
            return
        if self._is_cuda(value):
            like = value if isinstance(value, cst.SimpleString) else next(
                (n for n in walk(value, into_functions=True) if isinstance(n, cst.SimpleString)), None)
            self.report(
                value,
                "torch.load cannot restore onto an XLA device: load with map_location='cpu', then move (load_state_dict copies)",
                Fix((self.replace(value, string_node("cpu", like)),)),
            )
            return
        if isinstance(value, cst.Name) and self._holds_an_accelerator(value.value):
            self.report(
                value,
                f"torch.load(map_location={value.value}): {value.value} holds the accelerator (CUDA in the original, "
                "the XLA device in the port), onto which torch.load cannot restore: load with map_location='cpu', "
                "then move (load_state_dict copies)",
                Fix((self.replace(value, string_node("cpu")),)),
            )
            return
        if isinstance(value, (cst.Name, cst.Attribute, cst.Call)):
            self.report(
                value,
                "torch.load(map_location=<variable>): if it holds the XLA device the load fails (XLA cannot be a "
                "map_location); load with map_location='cpu' and move the tensors",
                severity=Severity.WARNING,
            )

    def _holds_an_accelerator(self, name: str) -> bool:
        """Every value the code can give ``name`` here is a CUDA or XLA device."""
        values = name_values(self.ctx, name)
        return values is not None and all(self._is_cuda(v) or self._is_xla(v) for v in values)

    def _is_xla(self, value: cst.CSTNode) -> bool:
        if isinstance(value, cst.SimpleString):
            text = value.evaluated_value
            return isinstance(text, str) and (text == "xla" or text.startswith("xla:"))
        if isinstance(value, cst.Call):
            qual = self.ctx.qualname(value.func)
            if qual in ("torch_xla.device", XLA_DEVICE):
                return True
            if qual == "torch.device":
                first = arg(value, "type", 0)
                return first is not None and self._is_xla(first.value)
        return False

    def _is_cpu(self, value: cst.CSTNode) -> bool:
        if is_cpu_string(value):
            return True
        if isinstance(value, cst.Call) and self.ctx.qualname(value.func) == "torch.device":
            first = arg(value, "type", 0)
            return first is not None and is_cpu_string(first.value)
        return False

    def _is_cuda(self, value: cst.CSTNode) -> bool:
        if is_cuda_string(value):
            return True
        if isinstance(value, cst.Call) and self.ctx.qualname(value.func) == "torch.device":
            first = arg(value, "type", 0)
            return first is not None and is_cuda_string(first.value)
        if isinstance(value, cst.IfExp):
            return self._is_cuda(value.body) or self._is_cuda(value.orelse)
        if isinstance(value, cst.Dict):
            return any(isinstance(e, cst.DictElement) and is_cuda_string(e.value) for e in value.elements)
        if isinstance(value, cst.Lambda):
            return any(
                method_name(n) == "cuda" or is_cuda_string(n) for n in walk(value.body, into_functions=True)
            )
        return False
