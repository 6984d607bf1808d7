from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx


_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


class NnxParamsBuffers(Rule):
    """
    ## What it does
    - `nn.Parameter(t)` -> `nnx.Param(t)`; `nn.Parameter(t, requires_grad=False)` ->
      `nnx.Variable(t)` (kept in the state dict, not trained: `nnx.Optimizer(..., wrt=nnx.Param)`
      and `nnx.grad` leave it alone, as torch's optimizer skips a parameter without grad).
    - `m.add_module(name, module)` / `m.register_module(name, module)` -> `setattr(m, name,
      module)` (an NNX module's children are its attributes; `TorchSequential`, the port's
      base for classes deriving from `nn.Sequential`, keeps the order they were added in).
    - `self.register_buffer("name", t)` -> `self.name = nnx.Variable(t)`;
      `persistent=False` -> `nnx.Variable(t, persistent=False)` (not in the state dict: the
      weight converter skips it, as torch's `state_dict()` does).

    The tensor expression inside is left to the op rules (`torch.zeros` -> `jnp.zeros`...).
    A buffer registered as `None`, or under a name that is not a string literal, is reported
    by JX090.

    ## Why
    NNX keeps a module's state in `nnx.Variable` attributes: `nnx.Param` for what is trained,
    other variable types for the rest. A buffer is state that is saved and loaded with the
    model but not trained.

    ## Fix safety
    Safe: names are kept, so the weight converter maps `pos_embed` and `running_stats`
    exactly as torch names them.
    """

    code = "JX005"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "nnx-params-buffers"
    target = "jax"
    summary = "nn.Parameter -> nnx.Param, register_buffer -> nnx.Variable attribute"
    severity = Severity.ERROR
    needs_text = ("Parameter", "register_buffer", "add_module", "register_module")
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn

            class Embed(nn.Module):
                def __init__(self, n, d):
                    super().__init__()
                    self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
                    self.scale = nn.Parameter(torch.ones(1), requires_grad=False)
                    self.register_buffer("pos", torch.arange(n))
                    self.register_buffer("cache", torch.zeros(n, d), persistent=False)
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            class Embed(nn.Module):
                def __init__(self, n, d):
                    super().__init__()
                    self.cls_token = nnx.Param(torch.zeros(1, 1, d))
                    self.scale = nnx.Variable(torch.ones(1))
                    self.pos = nnx.Variable(torch.arange(n))
                    self.cache = nnx.Variable(torch.zeros(n, d), persistent=False)
            """,
        ),
    ]
    valid = ["from flax import nnx\np = nnx.Param(1.0)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            self._parameter(node)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if isinstance(call, cst.Call) and astutil.method_name(call) in ("add_module", "register_module"):
            self._add_module(node, call)
            return
        if not (isinstance(call, cst.Call) and astutil.method_name(call) == "register_buffer"):
            return
        receiver = call.func.value  # type: ignore[attr-defined]
        if not (isinstance(receiver, cst.Name) and receiver.value == "self"):
            return
        name = astutil.arg(call, "name", 0)
        tensor = astutil.arg(call, "tensor", 1)
        persistent = astutil.arg(call, "persistent", 2)
        key = astutil.string_value(name.value) if name else None
        if key is None or not key.isidentifier() or tensor is None or _nnx.literal(tensor.value) is None:
            return  # JX090
        nnx = _nnx.nnx_name(self.ctx)
        extra = ""
        if persistent is not None:
            value = _nnx.literal(persistent.value)
            if value is False:
                extra = ", persistent=False"
            elif value is not True:
                return  # JX090
        new = cst.parse_statement(f"self.{key} = {nnx}.Variable(_{extra})")
        assign = new.body[0]  # type: ignore[attr-defined]
        value = assign.value.with_changes(args=[cst.Arg(tensor.value), *assign.value.args[1:]])
        new = new.with_changes(body=[assign.with_changes(value=value)], leading_lines=node.leading_lines,
                               trailing_whitespace=node.trailing_whitespace)
        self.report(
            node,
            f"register_buffer({key!r}, ...) -> self.{key} = {nnx}.Variable(...): module state that is not trained",
            Fix((self.replace(node, new),), imports=("flax.nnx",)),
        )

    def _add_module(self, node: cst.SimpleStatementLine, call: cst.Call) -> None:
        """`m.add_module(name, module)` / `m.register_module(...)` -> `setattr(m, name, module)`
        where the file defines module classes (an NNX module's children are its attributes;
        the emitted TorchSequential keeps their order)."""
        if not _nnx.module_classes(self.ctx):
            return
        name = astutil.arg(call, "name", 0)
        module = astutil.arg(call, "module", 1)
        if name is None or module is None or any(a.star for a in call.args):
            return
        receiver = call.func.value  # type: ignore[attr-defined]
        new = cst.Call(cst.Name("setattr"), [cst.Arg(receiver, comma=_COMMA), cst.Arg(name.value, comma=_COMMA),
                                             cst.Arg(module.value)])
        self.report(
            call,
            f"{astutil.method_name(call)}(name, module) -> setattr(..., name, module): NNX modules hold their children "
            "as attributes",
            Fix((self.replace(call, new),)),
        )

    def _parameter(self, node: cst.Call) -> None:
        data = astutil.arg(node, "data", 0)
        grad = astutil.arg(node, "requires_grad", 1)
        if data is None:
            return
        nnx = _nnx.nnx_name(self.ctx)
        kind = "Param"
        if grad is not None:
            value = _nnx.literal(grad.value)
            if value is False:
                kind = "Variable"
            elif value is not True:
                return
        new = cst.Call(cst.parse_expression(f"{nnx}.{kind}"), args=[cst.Arg(data.value)])
        self.report(
            node,
            f"nn.Parameter -> {nnx}.{kind}",
            Fix((self.replace(node, new),), imports=("flax.nnx",)),
        )
