from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity, module_fact

from . import _training as tr

# what builds a sparse tensor (torch 2.9)
_SPARSE_BUILDERS = frozenset({
    "torch.sparse_coo_tensor", "torch.sparse_csr_tensor", "torch.sparse_csc_tensor", "torch.sparse_bsr_tensor",
    "torch.sparse_compressed_tensor", "torch.sparse.FloatTensor", "torch.sparse.DoubleTensor",
    "torch.sparse.LongTensor", "torch.sparse.IntTensor",
})
_SPARSE_METHODS = frozenset({"to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc", "coalesce"})


class SparseToDevice(Rule):
    """
    ## What it does
    Makes a sparse tensor dense where it moves to the device: `adj = adj.to(device)` ->
    `adj = adj.to_dense().to(device)`, `adj.cuda()` -> `adj.to_dense().cuda()` (then
    ported by the device rules), for a tensor built sparse in the file
    (`torch.sparse_coo_tensor(...)`, `torch.sparse.FloatTensor(i, v, shape)`, `x.to_sparse()`,
    `.coalesce()`), directly, through a name bound to one, or through a function of the file
    that returns one (a graph script's `normalize_adj(...)`). `torch.spmm(adj, x)` and
    `torch.sparse.mm(adj, x)` take a dense matrix as they take a sparse one and stay.

    ## Why
    torch_xla has no sparse tensors: moving one to the XLA device fails at the first sparse
    operation (measured in torch_xla 2.9: `NotImplementedError: Could not run
    'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'SparseXLA'
    backend`), so a GCN-style script's port crashed where it moved its adjacency matrix. Dense,
    the matrix product runs on the accelerator's matrix units.

    ## Fix safety
    Safe: the dense matrix holds the same values (the zeros made explicit) and `spmm`/`mm`
    compute the same products. It takes rows x columns elements of device memory (a
    10,000-node graph's adjacency: 400 MB in float32); for a graph too large for that, keep the
    sparse product on the host or use a gather/scatter formulation.
    """

    code = "TX903"
    name = "sparse-to-device"
    target = "torch-xla"
    summary = "sparse tensor moved to XLA (no sparse support) -> .to_dense() before the move"
    severity = Severity.ERROR
    needs_text = ("sparse",)
    examples = [
        Example(
            """
            import torch

            def normalize(edge_index, n):
                values = torch.ones(edge_index.size(1))
                return torch.sparse_coo_tensor(edge_index, values, (n, n)).coalesce()

            adj = normalize(edges, 100)
            features = torch.randn(100, 16)
            if torch.cuda.is_available():
                features = features.cuda()
                adj = adj.cuda()
            out = torch.spmm(adj, features)
            """,
            """
            import torch

            def normalize(edge_index, n):
                values = torch.ones(edge_index.size(1))
                return torch.sparse_coo_tensor(edge_index, values, (n, n)).coalesce()

            adj = normalize(edges, 100)
            features = torch.randn(100, 16)
            if torch.cuda.is_available():
                features = features.cuda()
                adj = adj.to_dense().cuda()
            out = torch.spmm(adj, features)
            """,
            title="a function returning a sparse matrix, moved with .cuda()",
        ),
        Example(
            """
            import torch

            device = torch.device("cuda")
            graph = torch.sparse.FloatTensor(indices, values, torch.Size([50, 50])).to(device)
            laplacian = dense_laplacian.to_sparse()
            laplacian = laplacian.to(device, non_blocking=True)
            """,
            """
            import torch

            device = torch.device("cuda")
            graph = torch.sparse.FloatTensor(indices, values, torch.Size([50, 50])).to_dense().to(device)
            laplacian = dense_laplacian.to_sparse()
            laplacian = laplacian.to_dense().to(device, non_blocking=True)
            """,
            title="built and moved in one expression; a name bound to .to_sparse()",
        ),
    ]
    valid = [
        "import torch\nadj = torch.sparse_coo_tensor(i, v, (3, 3))\nadj = adj.to(torch.float64)\n",  # a dtype
        "import torch\nx = torch.randn(3, 3).to(device)\n",
        "import torch\nadj = torch.sparse_coo_tensor(i, v, (3, 3))\nadj = adj.to_dense().to(device)\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if tr.as_device_move(node, self.ctx) is None or not isinstance(node.func, cst.Attribute):
            return
        receiver = node.func.value
        fn = self.ctx.enclosing(cst.FunctionDef)
        scope = fn if isinstance(fn, cst.FunctionDef) and isinstance(receiver, cst.Name) and \
            receiver.value in astutil.function_locals(fn) else self.ctx.module
        if not _Sparse(self.ctx).of(receiver, scope):
            return
        self.report(node, "a sparse tensor moved to the XLA device: torch_xla has no sparse tensors (its first sparse "
                    "operation there raises NotImplementedError for the SparseXLA backend); .to_dense() before the "
                    "move keeps its values (rows x columns elements of device memory)",
                    Fix((Edit(receiver, cst.Call(cst.Attribute(receiver, cst.Name("to_dense")))),)))


class _Sparse:
    """Whether an expression is a tensor built sparse: a builder's call, a ``.to_sparse()`` /
    ``.coalesce()`` of one, a call of a file function whose every return is one, or a name
    whose every value in its scope is one (an element of a tuple a file function returns
    included: ``adj, features = load_data()``)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.functions = module_fact(ctx, _functions)

    def of(self, expr: Optional[cst.BaseExpression], scope: cst.CSTNode, depth: int = 0) -> bool:
        if expr is None or depth > 4:
            return False
        if isinstance(expr, cst.Call):
            q = self.ctx.qualname(expr.func) or ""
            if q in _SPARSE_BUILDERS:
                return True
            method = astutil.method_name(expr)
            if method in _SPARSE_METHODS and isinstance(expr.func, cst.Attribute):
                return method != "coalesce" or self.of(expr.func.value, scope, depth + 1)
            fn = self.functions.get(expr.func.value) if isinstance(expr.func, cst.Name) else None
            returns = self._returns(fn)
            return bool(returns) and all(self.of(r, fn, depth + 1) for r in returns)
        if isinstance(expr, cst.Name):
            values = self._values(expr.value, scope, depth)
            return bool(values) and all(v is not None and self.of(v[0], v[1], depth + 1) for v in values)
        return False

    def _returns(self, fn: Optional[cst.FunctionDef]) -> list[cst.BaseExpression]:
        if fn is None:
            return []
        return [n.value for n in astutil.walk(fn.body) if isinstance(n, cst.Return) and n.value is not None]

    def _values(self, name: str, scope: cst.CSTNode, depth: int) -> list:
        """(value, its scope) of each assignment to ``name`` in ``scope``; None for one whose value
        the code does not show. `name = name.cuda()`-like rebinds (a method chain on the name
        itself: moved, converted) are left out: they hold what the name held."""
        out: list = []
        for node in astutil.walk(scope.body if isinstance(scope, cst.FunctionDef) else scope):
            if not isinstance(node, cst.Assign):
                continue
            for target in node.targets:
                t = target.target
                if isinstance(t, cst.Name) and t.value == name:
                    if not (isinstance(node.value, cst.Call) and _root(node.value) == name):
                        out.append((node.value, scope))
                elif isinstance(t, (cst.Tuple, cst.List)) and name in astutil.target_names(t):
                    out.append(self._unpacked(t, node.value, name))
        return out

    def _unpacked(self, target: cst.BaseExpression, value: cst.BaseExpression, name: str):
        """``a, name = f(...)`` of a file function ``f`` whose every return is a tuple of that
        length: the element of each return (in ``f``'s scope)."""
        elements = target.elements  # type: ignore[attr-defined]
        index = next((i for i, e in enumerate(elements) if isinstance(e.value, cst.Name) and e.value.value == name), None)
        fn = self.functions.get(value.func.value) if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) \
            else None
        returns = self._returns(fn)
        if index is None or not returns or not all(isinstance(r, cst.Tuple) and len(r.elements) == len(elements)
                                                    for r in returns):
            return None
        parts = [r.elements[index].value for r in returns]  # type: ignore[attr-defined]
        return (parts[0], fn) if len(parts) == 1 else None


def _functions(ctx) -> dict[str, cst.FunctionDef]:
    """The file's module-level functions by name. (A module fact.)"""
    return {s.name.value: s for s in ctx.module.body if isinstance(s, cst.FunctionDef)}


def _root(call: cst.Call) -> Optional[str]:
    """The name a chain of method calls starts from (``adj`` of ``adj.float().cuda()``)."""
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        node = node.func.value
    return node.value if isinstance(node, cst.Name) else None
