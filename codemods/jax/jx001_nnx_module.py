from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _layers, _nnx

# left unused by the port of the module classes: removed when nothing else reads them
_TORCH_IMPORTS = (("torch.nn", None), ("torch", "nn"), ("torch", None))


class NnxModule(Rule):
    """
    ## What it does
    Turns every `nn.Module` subclass of the file into a Flax NNX module:

    - the base `nn.Module` becomes `nnx.Module` (subclasses of the file's own modules keep
      their base);
    - `__init__` gets a keyword-only `rngs: nnx.Rngs` parameter, and so does every method
      (ResNet's `_make_layer`) and module-level factory function (`conv3x3`) that builds
      layers; each construction of a submodule of the file, call of such a method or factory,
      and `super().__init__(...)` of a subclass passes `rngs=rngs` on (the layers themselves
      get it from JX002). A parameter that holds a module class of the file is called with
      `rngs=rngs` as well: annotated as one (`block: Type[BasicBlock]`), or unannotated and
      given a module class (or such a parameter of the caller) at every call of its function
      in the file (`resnet18()` -> `ResNet(BasicBlock, ...)` -> `self._make_layer(block, ...)`
      -> `block(...)`). So is an attribute of another object that the file's classes declare
      as holding one (a config's field `block: Callable[..., nn.Module]`, or `self.block =
      block` set from a module class in a config's `__init__`): `cfg.block(cfg, ...)`;
    - `super().__init__()` (and `super(Net, self).__init__()`, `nn.Module.__init__(self)`) is
      removed: `nnx.Module` needs no initialisation;
    - `forward` becomes `__call__` (`self.forward(...)` / `super().forward(...)` too).

    Attribute names are kept, so the original's parameter names (`fc1.weight`) map onto the
    port's (`fc1.kernel`) and the weight converter (JX010) can follow them.

    ## Why
    NNX modules are plain Python objects whose layers draw their initial parameters from an
    explicit `nnx.Rngs`; calling a module runs `__call__`.

    ## Fix safety
    Safe: the module's structure and names are kept. Callers outside the file must now pass
    `rngs=` (the JAX loop rules do it for the file's own script code).
    """

    code = "JX001"
    name = "nnx-module"
    target = "jax"
    summary = "nn.Module subclass -> nnx.Module (rngs, forward -> __call__, no super().__init__())"
    severity = Severity.ERROR
    # a factory function building layers has no module class; "import": a class deriving only
    # from a model class of another file of the program names no `nn.` (`class Net(Trunk)`)
    needs_text = ("Module", "nn.", "import")
    examples = [
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self, hidden=128):
                    super().__init__()
                    self.fc1 = nn.Linear(784, hidden)
                    self.fc2 = nn.Linear(hidden, 10)

                def forward(self, x):
                    return self.fc2(self.fc1(x))
            """,
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nnx.Module):
                def __init__(self, hidden=128, *, rngs: nnx.Rngs):
                    self.fc1 = nn.Linear(784, hidden)
                    self.fc2 = nn.Linear(hidden, 10)

                def __call__(self, x):
                    return self.fc2(self.fc1(x))
            """,
            title="the class, its __init__ and forward (the layers are JX002's)",
        ),
        Example(
            """
            import torch.nn as nn

            def conv3x3(cin, cout, stride=1):
                return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)

            class Block(nn.Module):
                def __init__(self, cin, cout, stride=1):
                    super(Block, self).__init__()
                    self.conv = conv3x3(cin, cout, stride)

            class Net(nn.Module):
                def __init__(self, block: type[Block], widths):
                    super().__init__()
                    self.layers = self._make_layers(block, widths)

                def _make_layers(self, block, widths):
                    return nn.Sequential(*[block(a, b) for a, b in zip(widths, widths[1:])])
            """,
            """
            import torch.nn as nn
            import flax.nnx as nnx

            def conv3x3(cin, cout, stride=1, *, rngs: nnx.Rngs):
                return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)

            class Block(nnx.Module):
                def __init__(self, cin, cout, stride=1, *, rngs: nnx.Rngs):
                    self.conv = conv3x3(cin, cout, stride, rngs=rngs)

            class Net(nnx.Module):
                def __init__(self, block: type[Block], widths, *, rngs: nnx.Rngs):
                    self.layers = self._make_layers(block, widths, rngs=rngs)

                def _make_layers(self, block: type[Block], widths, *, rngs: nnx.Rngs):
                    return nn.Sequential(*[block(a, b, rngs=rngs) for a, b in zip(widths, widths[1:])])
            """,
            title="rngs through factory functions, helper methods and block classes",
        ),
        Example(
            """
            from dataclasses import dataclass
            from typing import Callable
            import torch.nn as nn

            class Block(nn.Module):
                def __init__(self, cfg):
                    super().__init__()

            @dataclass
            class StageConfig:
                width: int
                block: Callable[..., nn.Module]

            class OldConfig:
                def __init__(self, width, block=Block):
                    self.width = width
                    self.block = block

            class Net(nn.Module):
                def __init__(self, configs):
                    super().__init__()
                    self.stages = nn.ModuleList([cfg.block(cfg) for cfg in configs])
            """,
            """
            from dataclasses import dataclass
            from typing import Callable
            import torch.nn as nn
            import flax.nnx as nnx

            class Block(nnx.Module):
                def __init__(self, cfg, *, rngs: nnx.Rngs):
                    pass

            @dataclass
            class StageConfig:
                width: int
                block: Callable[..., nnx.Module]

            class OldConfig:
                def __init__(self, width, block=Block):
                    self.width = width
                    self.block = block

            class Net(nnx.Module):
                def __init__(self, configs, *, rngs: nnx.Rngs):
                    self.stages = nn.ModuleList([cfg.block(cfg, rngs=rngs) for cfg in configs])
            """,
            title="a block class read from a config object",
        ),
    ]
    valid = [
        "from flax import nnx\nclass M(nnx.Module):\n    def __init__(self, *, rngs: nnx.Rngs):\n        self.fc = nnx.Linear(2, 2, rngs=rngs)\n",
        "import torch\nclass Config:\n    def forward(self):\n        pass\n",
        "import torch.nn as nn\ndef f(m: nn.Module):\n    pass\n",
    ]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        classes = _nnx.module_classes(self.ctx)
        if classes.get(node.name.value) is not node:
            return
        torch_rooted = _nnx.root_kind(node, self.ctx) == "torch"
        nnx = _nnx.nnx_name(self.ctx)
        plan = _nnx.rngs_plan(self.ctx)
        edits: list[Edit] = []
        if _nnx.direct_base(node, self.ctx) == "torch":
            for base in node.bases:
                if self.ctx.qualname(base.value) in _nnx.TORCH_MODULE:
                    edits.append(self.replace(base.value, cst.parse_expression(f"{nnx}.Module")))
                elif (container := _nnx.TORCH_CONTAINER_BASES.get(self.ctx.qualname(base.value) or "")):
                    edits.append(self.replace(base.value, cst.Name(container)))  # emitted by JX011
        methods = [s for s in node.body.body if isinstance(s, cst.FunctionDef)]
        derives_module = any(self.ctx.qualname(b.value) in _nnx.TORCH_MODULE for b in node.bases)
        if derives_module and not any(m.name.value == "__init__" for m in methods):
            init = cst.parse_statement(f"def __init__(self, *, rngs: {nnx}.Rngs):\n    pass\n")
            edits.append(self.replace(node.body, _insert_first(init)))
        for method in methods:
            if torch_rooted:
                edits.extend(self._method_edits(node, method, plan, nnx))
            elif method in plan.functions:  # already NNX: only rngs for what builds layers
                edits.extend(self._rngs_edits(method, node, plan, nnx))
        if edits:
            self.report(
                node,
                f"class {node.name.value}: a torch nn.Module -> a Flax NNX module (rngs, __call__)",
                Fix(tuple(edits), imports=("flax.nnx",), remove_imports=_TORCH_IMPORTS),
            )

    def visit_Annotation(self, node: cst.Annotation) -> None:
        """`Optional[nn.Module]` -> `Optional[nnx.Module]`, `-> nn.Conv2d` -> `-> TorchConv2d`."""
        if not _nnx.module_classes(self.ctx):
            return
        nnx = _nnx.nnx_name(self.ctx)
        edits = []
        for n in astutil.walk(node.annotation, into_functions=True):
            if not isinstance(n, (cst.Name, cst.Attribute)):
                continue
            qual = self.ctx.qualname(n) or ""
            if qual in _nnx.TORCH_MODULE:
                edits.append(self.replace(n, cst.parse_expression(f"{nnx}.Module")))
            elif qual.startswith("torch.nn.") and (new := _layers.annotation_for(qual[len("torch.nn."):], nnx)):
                edits.append(self.replace(n, cst.parse_expression(new)))
        if edits:
            self.report(node, "an annotation naming a torch module class -> its NNX counterpart",
                        Fix(tuple(edits), imports=("flax.nnx",), remove_imports=_TORCH_IMPORTS))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """Module-level factory functions that build layers or modules."""
        plan = _nnx.rngs_plan(self.ctx)
        if plan.functions.get(node, "absent") is not None or node not in plan.functions:
            return
        edits = self._rngs_edits(node, None, plan, _nnx.nnx_name(self.ctx))
        if edits:
            self.report(
                node,
                f"{node.name.value}() builds layers: it takes the caller's nnx.Rngs (rngs=rngs)",
                Fix(tuple(edits), imports=("flax.nnx",)),
            )

    # ---------------------------------------------------------------------------------
    def _method_edits(self, cls: cst.ClassDef, method: cst.FunctionDef, plan, nnx: str) -> list[Edit]:
        edits: list[Edit] = []
        if method in plan.functions:
            edits.extend(self._rngs_edits(method, cls, plan, nnx))
        if method.name.value == "forward":
            edits.append(self.replace(method.name, cst.Name("__call__")))
        direct_torch = _nnx.direct_base(cls, self.ctx) == "torch"
        for stmt in astutil.walk(method.body):
            if isinstance(stmt, cst.Attribute) and stmt.attr.value == "forward" and _is_self_or_super(stmt.value):
                edits.append(self.replace(stmt.attr, cst.Name("__call__")))
        if direct_torch and method.name.value == "__init__":
            body = method.body.body
            supers = [s for s in body if _is_super_init(s, self.ctx)]
            for s in supers:
                if len(supers) == len(body):
                    edits.append(self.replace(s, cst.parse_statement("pass")))
                else:
                    edits.append(self.remove(s))
        return edits

    def _rngs_edits(self, func: cst.FunctionDef, cls: Optional[cst.ClassDef], plan, nnx: str) -> list[Edit]:
        edits: list[Edit] = []
        if not _nnx.has_param(func, "rngs"):
            edits.append(self.replace(func, _nnx.add_rngs_param(nnx)))
        for call in astutil.calls_in(func.body):
            if not _nnx.has_kwarg(call, "rngs") and plan.passes_rngs(call, func, cls):
                edits.append(self.replace(call, _nnx.with_rngs))
            elif _nnx.has_kwarg(call, "rngs") and plan.passes_rngs(call.with_changes(args=[a for a in call.args if not (
                    a.keyword is not None and a.keyword.value == "rngs")]), func, cls):
                # a fresh nnx.Rngs(seed) (from the script-level rngs rule) inside a function that
                # has its caller's rngs: the caller's stream, as torch's global generator would
                for a in call.args:
                    if a.keyword is not None and a.keyword.value == "rngs" and isinstance(a.value, cst.Call) \
                            and self.ctx.qualname(a.value.func) == "flax.nnx.Rngs":
                        edits.append(self.replace(a.value, cst.Name("rngs")))
        # a parameter that receives a module class from an annotated parameter of the caller:
        # `self._make_layer(block, ...)` with `block: Type[BasicBlock]` -> annotate it the same way
        if cls is not None:
            edits.extend(self._propagate_annotations(func, cls))
        return edits

    def _propagate_annotations(self, func: cst.FunctionDef, cls: cst.ClassDef) -> list[Edit]:
        annotated = {
            p.name.value: p.annotation for p in (*func.params.params, *func.params.kwonly_params)
            if p.annotation is not None and _mentions(p.annotation, _nnx.module_classes(self.ctx))
        }
        if not annotated:
            return []
        methods = {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}
        edits: list[Edit] = []
        for call in astutil.calls_in(func.body):
            f = call.func
            if not (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self"):
                continue
            target = methods.get(f.attr.value)
            if target is None:
                continue
            positional = [p for p in target.params.params][1:]  # without self
            for i, a in enumerate(x for x in call.args if x.keyword is None and not x.star):
                if i < len(positional) and isinstance(a.value, cst.Name) and a.value.value in annotated:
                    param = positional[i]
                    if param.annotation is None:
                        edits.append(self.replace(param, param.with_changes(annotation=annotated[a.value.value])))
        return edits


def _mentions(annotation: cst.Annotation, classes) -> bool:
    return any(isinstance(n, cst.Name) and n.value in classes for n in astutil.walk(annotation.annotation, into_functions=True))


def _insert_first(stmt: cst.BaseStatement):
    def apply(body: cst.IndentedBlock) -> cst.IndentedBlock:
        items = list(body.body)
        at = 1 if items and _is_docstring(items[0]) else 0
        if len(items) == 1 and isinstance(items[0], cst.SimpleStatementLine) and isinstance(items[0].body[0], cst.Pass):
            return body.with_changes(body=[stmt])
        rest = items[at:]
        if rest and not rest[0].leading_lines:
            rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine()])
        return body.with_changes(body=[*items[:at], stmt, *rest])
    return apply


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _is_self_or_super(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Name) and node.value == "self":
        return True
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "super"


def _is_super_init(stmt: cst.CSTNode, ctx) -> bool:
    """`super().__init__()`, `super(Cls, self).__init__()`, `nn.Module.__init__(self)` alone on a line."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"):
        return False
    receiver = call.func.value
    if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and receiver.func.value == "super":
        return not call.args
    return ctx.qualname(receiver) in _nnx.TORCH_MODULE
