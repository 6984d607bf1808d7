from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity, module_fact

from . import _loop as lp

_SAVE = ("torch.save",)
_LOAD = ("torch.load",)


class Checkpoint(Rule):
    """
    ## What it does
    - `model.load_state_dict(state)` of a state dict the script builds (torch names, e.g. the
      Gluon weight converter's) becomes `load_torch_state_dict(model, state)`, the port's own
      converter (JX010), once the port defines it; a copy of `model.state_dict()` (a best
      model kept in memory: `copy.deepcopy(model.state_dict())`) becomes
      `copy.deepcopy(torch_state_dict(model))`, the same converter's other half; any other
      read of an NNX model's `state_dict()` is reported (torch's holds the model's own tensors,
      the port's are copies).
    - `torch.save(model.state_dict(), path)` becomes a pickle of the model's state as a
      nested dict of NumPy arrays:

          with open(path, "wb") as checkpoint_file:
              pickle.dump(jax.device_get(nnx.to_pure_dict(nnx.state(model))), checkpoint_file)

    - `model.load_state_dict(torch.load(path, ...))` reads it back into the model
      (`nnx.replace_by_pure_dict` on the model's state, then `nnx.update`).
    - Any other `torch.save` / `torch.load` (a dict holding an optimizer's state, an epoch
      counter) is marked `# porter: manual` and reported: the optimizer state of an
      `nnx.Optimizer` is `nnx.state(optimizer)`, to be saved the same way.

    ## Why
    A port's model holds JAX arrays in NNX variables; it has no `state_dict()`. The pure
    dict (`{"fc1": {"kernel": array, "bias": array}, ...}`) is plain data that pickle (or
    orbax, when installed) stores, and `nnx.replace_by_pure_dict` puts back.

    ## Fix safety
    Safe: the same parameters (and batch statistics) are saved and restored. The file is
    not a PyTorch checkpoint: the port's `torch_state_dict(model)` gives the torch names and
    layouts when one is needed.
    """

    code = "JX307"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-checkpoint"
    target = "jax"
    summary = "torch.save(model.state_dict(), p) / model.load_state_dict(torch.load(p)) -> pickle of nnx.state"
    severity = Severity.ERROR
    needs_text = ("torch.save", "torch.load", "state_dict")
    examples = [
        Example(
            """
            import torch

            if args.save_model:
                torch.save(model.state_dict(), "mnist_cnn.pt")
            model.load_state_dict(torch.load("mnist_cnn.pt", map_location="cpu"))
            """,
            """
            import jax
            import pickle
            import flax.nnx as nnx

            if args.save_model:
                with open("mnist_cnn.pt", "wb") as checkpoint_file:
                    pickle.dump(jax.device_get(nnx.to_pure_dict(nnx.state(model))), checkpoint_file)
            with open("mnist_cnn.pt", "rb") as checkpoint_file:
                state = nnx.state(model)
                nnx.replace_by_pure_dict(state, pickle.load(checkpoint_file))
                nnx.update(model, state)
            """,
        ),
        Example(
            """
            import torch

            torch.save({"epoch": epoch, "model": model.state_dict(), "optim": optimizer.state_dict()}, path)
            """,
            """
            import torch

            torch.save({"epoch": epoch, "model": model.state_dict(), "optim": optimizer.state_dict()}, path)  # porter: manual (JX307): save nnx.state(model) / nnx.state(optimizer) as pure dicts (see JX307)
            """,
            title="anything else is marked for a manual port",
        ),
        Example(
            """
            import numpy as np
            import torch


            def load_torch_state_dict(model, state_dict):
                ...


            def load_gluon_parameters(model, path):
                state = {name: torch.from_numpy(value) for name, value in read_gluon_parameters(path).items()}
                model.load_state_dict(state)
            """,
            """
            import numpy as np
            import torch


            def load_torch_state_dict(model, state_dict):
                ...


            def load_gluon_parameters(model, path):
                state = {name: torch.from_numpy(value) for name, value in read_gluon_parameters(path).items()}
                load_torch_state_dict(model, state)
            """,
            title="a state dict of torch names built in the script: the port's converter",
        ),
    ]
    valid = ["import torch\nx = torch.zeros(3)\n"]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            if any(self._mentions(small) for small in node.body):
                self._manual(node)
            return
        call = node.body[0].value
        if not isinstance(call, cst.Call):
            return
        q = self.ctx.qualname(call.func)
        if q in _SAVE:
            model = self._state_dict_of(astutil.arg(call, "obj", 0))
            path = astutil.arg(call, "f", 1)
            if model is not None and path is not None and len(call.args) == 2:
                self._save(node, model, path.value)
                return
        elif astutil.method_name(call) == "load_state_dict" and len(call.args) == 1:
            inner = call.args[0].value
            if isinstance(inner, cst.Call) and self.ctx.qualname(inner.func) in _LOAD:
                path = astutil.arg(inner, "f", 0)
                if path is not None:
                    self._load(node, call.func.value, path.value)  # type: ignore[attr-defined]
                    return
            elif call.args[0].keyword is None and not self._mentions(node.body[0]) and self._has_converter():
                # a state dict of torch names built in the script (a converted checkpoint):
                # the port's own converter puts it into the NNX model
                model = lp.code(call.func.value)  # type: ignore[attr-defined]
                new = cst.parse_statement(f"load_torch_state_dict({model}, {lp.code(inner)})\n")
                new = new.with_changes(leading_lines=node.leading_lines, trailing_whitespace=node.trailing_whitespace)
                self.report(node, "an NNX model has no load_state_dict(): the port's load_torch_state_dict "
                                  "converts the torch names and layouts", Fix((self.replace(node, new),), Safety.SAFE))
                return
        if self._mentions(node.body[0]):
            self._manual(node)

    def visit_Call(self, node: cst.Call) -> None:
        """`model.state_dict()` read as a value (`copy.deepcopy(model.state_dict())`, a best
        model kept in memory) of a model of the file: the port's torch_state_dict (JX010)."""
        if astutil.method_name(node) != "state_dict" or node.args or not self._has_converter():
            return
        receiver = node.func.value  # type: ignore[attr-defined]
        name = lp.dotted_name(receiver)
        if name is None or name not in lp.file_facts(self.ctx).modules:
            return
        parent = self.ctx.parent
        grand = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and self.ctx.qualname(grand.func) in _SAVE:
            return  # torch.save(model.state_dict(), path): the statement's rewrite
        message = ("an NNX model has no state_dict(): the port's torch_state_dict gives its parameters and buffers "
                   "under the torch names, as NumPy arrays (load_torch_state_dict puts them back)")
        if not (isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and len(grand.args) == 1
                and self.ctx.qualname(grand.func) == "copy.deepcopy"):
            # torch's state dict holds the model's own tensors: code that updates them in place
            # (`sd[k].copy_(...)`) would update copies in the port
            self.report(node, message + "; they are copies, not the model's own arrays: where the code updates "
                                        "them to change the model, call load_torch_state_dict after")
            return
        self.report(node, message, Fix((self.replace(node, cst.parse_expression(f"torch_state_dict({lp.code(receiver)})")),),
                                       Safety.SAFE))

    def _has_converter(self) -> bool:
        """The port defines the weight converter (JX010's load_torch_state_dict)."""
        return module_fact(self.ctx, _has_converter)

    def _mentions(self, small) -> bool:
        return any(self.ctx.qualname(c.func) in _SAVE + _LOAD for c in astutil.calls_in(small))

    def _state_dict_of(self, a: Optional[cst.Arg]) -> Optional[cst.CSTNode]:
        if a is None or not isinstance(a.value, cst.Call) or astutil.method_name(a.value) != "state_dict" or a.value.args:
            return None
        receiver = a.value.func.value  # type: ignore[attr-defined]
        return receiver if lp.dotted_name(receiver) else None

    def _save(self, node, model, path) -> None:
        nnx = lp.nnx_name(self.ctx)
        jax = self.ctx.module_alias("jax")
        pickle = self.ctx.module_alias("pickle")
        text = (f"with open({lp.code(path)}, \"wb\") as checkpoint_file:\n"
                f"    {pickle}.dump({jax}.device_get({nnx}.to_pure_dict({nnx}.state({lp.code(model)}))), checkpoint_file)\n")
        new = cst.parse_statement(text).with_changes(leading_lines=node.leading_lines)
        self.report(node, "an NNX model has no state_dict(): save its state as a pure dict",
                    Fix((self.replace(node, new),), Safety.SAFE, ("flax.nnx", "jax", "pickle")))

    def _load(self, node, model, path) -> None:
        nnx = lp.nnx_name(self.ctx)
        pickle = self.ctx.module_alias("pickle")
        m = lp.code(model)
        text = (f"with open({lp.code(path)}, \"rb\") as checkpoint_file:\n"
                f"    state = {nnx}.state({m})\n"
                f"    {nnx}.replace_by_pure_dict(state, {pickle}.load(checkpoint_file))\n"
                f"    {nnx}.update({m}, state)\n")
        new = cst.parse_statement(text).with_changes(leading_lines=node.leading_lines)
        self.report(node, "an NNX model has no load_state_dict(): restore its state from the pure dict",
                    Fix((self.replace(node, new),), Safety.SAFE, ("flax.nnx", "pickle")))

    def _manual(self, node) -> None:
        reason = "save nnx.state(model) / nnx.state(optimizer) as pure dicts (see JX307)"
        if lp.has_manual_marker(node):
            self.report(node, f"torch checkpoint not translated: {reason}")
            return
        self.report(node, f"torch checkpoint not translated: {reason}",
                    Fix((self.replace(node, lp.with_manual_comment(node, self.code, reason)),), Safety.SAFE))


def _has_converter(ctx) -> bool:
    """Whether the module defines JX010's load_torch_state_dict (a module fact,
    porter.rules.module_fact)."""
    return any(isinstance(stmt, cst.FunctionDef) and stmt.name.value == "load_torch_state_dict"
               for stmt in ctx.module.body)
