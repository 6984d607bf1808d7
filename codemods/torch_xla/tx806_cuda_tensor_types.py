import libcst as cst

from porter.astutil import string_value
from porter.rules import Example, Rule, Severity

from ._tables import imports_torch

_TYPES = {
    "FloatTensor": "torch.float32", "DoubleTensor": "torch.float64", "HalfTensor": "torch.float16",
    "BFloat16Tensor": "torch.bfloat16", "ByteTensor": "torch.uint8", "CharTensor": "torch.int8",
    "ShortTensor": "torch.int16", "IntTensor": "torch.int32", "LongTensor": "torch.int64", "BoolTensor": "torch.bool",
}


class CudaTensorTypes(Rule):
    """
    ## What it does
    Reports the legacy CUDA tensor types: `torch.cuda.FloatTensor(...)`, `x.type(torch.cuda.LongTensor)`,
    `isinstance(x, torch.cuda.FloatTensor)`, and `'torch.cuda.FloatTensor'` strings such as
    `torch.set_default_tensor_type('torch.cuda.FloatTensor')`.

    ## Why
    These types exist only for CUDA tensors: constructing one needs CUDA, and an `isinstance`
    or `.type()` test against one is always false for an XLA tensor. The XLA form names the
    dtype and the device: `torch.tensor(data, dtype=torch.float32, device=torch_xla.device())`,
    `x.to(torch_xla.device(), torch.int64)`, `x.dtype == torch.float32 and x.device.type == 'xla'`.
    Which form fits depends on the use, so it is reported.
    """

    code = "TX806"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-tensor-types"
    target = "torch-xla"
    summary = "report torch.cuda.FloatTensor and the other legacy CUDA tensor types"
    severity = Severity.ERROR
    needs_text = ("Tensor",)
    examples = [
        Example(
            """
            import torch

            mask = torch.cuda.ByteTensor(10).zero_()
            labels = labels.type(torch.cuda.LongTensor)
            """,
            None,
        ),
    ]
    valid = [
        "import torch\nx = torch.tensor([1.0], dtype=torch.float32)\n",
        "import torch\nt = torch.FloatTensor(3)\n",
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = self.ctx.qualname(node)
        if name is None or not name.startswith("torch.cuda.") or name.count(".") != 2:
            return
        kind = name.rsplit(".", 1)[1]
        if kind in _TYPES:
            self.report(node, f"{name} is a CUDA-only tensor type: use dtype={_TYPES[kind]} with device=torch_xla.device() "
                              f"(or .to(torch_xla.device(), {_TYPES[kind]}))")

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value and value.startswith("torch.cuda.") and value[len("torch.cuda."):] in _TYPES and imports_torch(self.ctx):
            self.report(node, f"'{value}' names a CUDA-only tensor type: set the dtype (torch.set_default_dtype) and pass "
                              "device=torch_xla.device() where tensors are created")
