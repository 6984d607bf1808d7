from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import CPU_CONTEXTS as _CPU
from ._script import GPU_CONTEXTS as _GPU
from ._script import context_renames as renamed

_CONTEXT_CLASS = ("mxnet.Context", "mxnet.context.Context")
_NUM_GPUS = ("mxnet.context.num_gpus", "mxnet.num_gpus", "mxnet.util.get_gpu_count")
class MxnetContext(Rule):
    """
    ## What it does
    Translates MXNet contexts to torch devices:

    | MXNet | PyTorch |
    | --- | --- |
    | `mx.gpu() if mx.context.num_gpus() else mx.cpu()` | `torch.device("cuda" if torch.cuda.is_available() else "cpu")` |
    | `mx.gpu()`, `mx.gpu(i)` | `torch.device("cuda")`, `torch.device("cuda", i)` |
    | `mx.cpu()` | `torch.device("cpu")` |
    | `mx.context.num_gpus()`, `mx.num_gpus()` | `torch.cuda.device_count()` |
    | `mx.Context` (`isinstance(ctx, mx.Context)`) | `torch.device` |
    | `[mx.gpu(i) for i in range(n)]`, `[mx.gpu(0), mx.gpu(1)]`, `[...] if n > 0 else [mx.cpu()]` | `[torch.device("cuda" if torch.cuda.is_available() else "cpu")]` |

    A list of contexts is Gluon's single-process data parallelism: `split_and_load` cuts each
    batch into one shard per context, each shard's loss is backpropagated on its context and
    `trainer.step` sums the gradients of all contexts. The port keeps one device per process
    (torch-xla's and JAX's model: more devices are more processes, or a sharding): the list
    becomes a list of that one device, `split_and_load` (GL003) puts the whole batch on it and
    the per-shard `backward` + `trainer.step(batch_size)` (GL303) then compute the same summed
    gradients. A one-element list (`[mx.cpu()]`) keeps its context.

    The variable a context is assigned to (`ctx`) is renamed `device` in the whole file
    (helpers' parameters of the same name included), the name PyTorch code gives it and the
    torch-xla and JAX rules recognise; when the file already uses the name `device`, or holds
    two context variables, the names stay.

    ## Why
    PyTorch places tensors and modules on a `torch.device`; `torch.cuda.is_available()` is
    the GPU check the downstream rules turn into the XLA device.

    ## Fix safety
    Safe: the same device choice; for a context list, one device takes the whole batch (the
    same gradients; BatchNorm's batch statistics are then over the whole batch, as on one
    GPU, where Gluon's are per shard when it has several GPUs).
    """

    code = "GL002"
    name = "gluon-context"
    target = "torch"
    summary = "mx.gpu()/mx.cpu()/num_gpus() -> torch.device / torch.cuda; the context variable becomes `device`"
    severity = Severity.ERROR
    needs_text = sc.NEEDS_MXNET
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx

            ctx = mx.gpu() if mx.context.num_gpus() else mx.cpu()

            def evaluate(net, data, ctx):
                return net(data.as_in_context(ctx))
            """,
            """
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

            def evaluate(net, data, device):
                return net(data.as_in_context(device))
            """,
            title="the usual context choice (as_in_context is GL003's)",
        ),
        Example(
            """
            import mxnet as mx

            device = mx.gpu(1)
            cpu = mx.cpu()
            """,
            """
            import torch

            device = torch.device("cuda", 1)
            cpu = torch.device("cpu")
            """,
        ),
        Example(
            """
            import mxnet as mx

            def contexts(num_gpus):
                return [mx.gpu(i) for i in range(num_gpus)] if num_gpus > 0 else [mx.cpu()]

            ctx = [mx.gpu(i) for i in range(mx.num_gpus())]
            pair = [mx.gpu(0), mx.gpu(1)]
            one = [mx.cpu()]

            def train(ctx):
                if isinstance(ctx, mx.Context):
                    ctx = [ctx]
            """,
            """
            import torch

            def contexts(num_gpus):
                return [torch.device("cuda" if torch.cuda.is_available() else "cpu")]

            ctx = [torch.device("cuda" if torch.cuda.is_available() else "cpu")]
            pair = [torch.device("cuda" if torch.cuda.is_available() else "cpu")]
            one = [torch.device("cpu")]

            def train(ctx):
                if isinstance(ctx, torch.device):
                    ctx = [ctx]
            """,
            title="context lists (data parallelism): one device per process",
        ),
    ]
    valid = [
        "import torch\nctx = torch.device('cpu')\n",
        "import mxnet as mx\nx = mx.nd.ones((2,))\n",
    ]

    def _context_list(self, node: cst.CSTNode) -> bool:
        """The outermost context list rewritten as a whole (not a one-element list display)."""
        if not sc.is_context_list(self.ctx, node):
            return False
        if isinstance(node, cst.List) and len(node.elements) == 1:
            return False
        return not any(sc.is_context_list(self.ctx, a) for a in self.ctx.ancestors[:-1] if isinstance(a, cst.IfExp))

    def _inside_context_list(self) -> bool:
        return any(self._context_list(a) for a in self.ctx.ancestors[:-1]
                   if isinstance(a, (cst.IfExp, cst.ListComp, cst.List)))

    def _rewrite_list(self, node: cst.BaseExpression) -> None:
        torch = sc.torch_name(self.ctx)
        new = sc.expr(f'[{torch}.device("cuda" if {torch}.cuda.is_available() else "cpu")]')
        self.report(node, "a list of MXNet contexts (single-process data parallelism) -> a list of one torch device: "
                    "one device per process, the whole batch on it", Fix((self.replace(node, new),), imports=("torch",)))

    def visit_ListComp(self, node: cst.ListComp) -> None:
        if self._context_list(node):
            self._rewrite_list(node)

    def visit_List(self, node: cst.List) -> None:
        if self._context_list(node):
            self._rewrite_list(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if sc.qualname(self.ctx, node) in _CONTEXT_CLASS:
            new = sc.expr(f"{sc.torch_name(self.ctx)}.device")
            self.report(node, "mx.Context -> torch.device", Fix((self.replace(node, new),), imports=("torch",)))

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if self._context_list(node):
            self._rewrite_list(node)
            return
        if self._inside_context_list():
            return
        if not (sc.call_name(self.ctx, node.body) in _GPU and sc.call_name(self.ctx, node.orelse) in _CPU):
            return
        if not self._is_gpu_check(node.test):
            return
        torch = sc.torch_name(self.ctx)
        new = sc.expr(f'{torch}.device("cuda" if {torch}.cuda.is_available() else "cpu")')
        self.report(node, "MXNet context choice -> torch.device", Fix((self.replace(node, new),), imports=("torch",)))

    def _is_gpu_check(self, test: cst.BaseExpression) -> bool:
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            comp = test.comparisons[0]
            if isinstance(comp.operator, cst.GreaterThan) and isinstance(comp.comparator, cst.Integer) and comp.comparator.value == "0":
                test = test.left
        return sc.call_name(self.ctx, test) in _NUM_GPUS

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        if name not in (*_GPU, *_CPU, *_NUM_GPUS):
            return
        if self._inside_choice(node) or self._inside_context_list():
            return
        torch = sc.torch_name(self.ctx)
        if name in _NUM_GPUS:
            new = sc.expr(f"{torch}.cuda.device_count()")
            self.report(node, "mx.context.num_gpus() -> torch.cuda.device_count()", Fix((self.replace(node, new),), imports=("torch",)))
            return
        kind = "cuda" if name in _GPU else "cpu"
        args = [a for a in node.args if a.keyword is None or a.keyword.value == "device_id"]
        if kind == "cuda" and args:
            index = args[0].value

            def build(updated: cst.Call, kind=kind) -> cst.BaseExpression:
                value = [a for a in updated.args if a.keyword is None or a.keyword.value == "device_id"][0].value
                return sc.expr(f'{torch}.device("cuda", _)').with_changes(
                    args=[cst.Arg(cst.SimpleString('"cuda"')), cst.Arg(value)])

            del index
            self.report(node, "mx.gpu(i) -> torch.device(\"cuda\", i)", Fix((self.replace(node, build),), imports=("torch",)))
            return
        new = sc.expr(f'{torch}.device("{kind}")')
        self.report(node, f"{sc.code(node.func)}() -> torch.device(\"{kind}\")", Fix((self.replace(node, new),), imports=("torch",)))

    def _inside_choice(self, node: cst.Call) -> bool:
        for anc in reversed(self.ctx.ancestors[:-1]):
            if isinstance(anc, cst.IfExp):
                return sc.call_name(self.ctx, anc.body) in _GPU and sc.call_name(self.ctx, anc.orelse) in _CPU and self._is_gpu_check(anc.test)
            if not isinstance(anc, (cst.Call, cst.Arg, cst.Comparison, cst.ComparisonTarget)):
                return False
        return False

    # the context variable's new name ---------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        new = renamed(self.ctx).get(node.value)
        if new is None or self._is_keyword_or_attr(node):
            return
        self.report(node, f"the context variable {node.value!r} is a torch device: named {new!r}",
                    Fix((self.replace(node, cst.Name(new)),)), severity=Severity.INFO)

    def _is_keyword_or_attr(self, node: cst.Name) -> bool:
        parent: Optional[cst.CSTNode] = self.ctx.parent
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return True
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return True
        if isinstance(parent, (cst.ImportAlias, cst.AsName)):
            return True
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is node:
            return True
        return False
