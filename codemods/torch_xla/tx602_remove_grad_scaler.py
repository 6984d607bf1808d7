from __future__ import annotations

import libcst as cst

from porter.rules import Edit, Example, Fix, Rule, Severity

from ._amp_dist import (
    Parents,
    Scaler,
    ScalerUse,
    expression_statement,
    find_scalers,
    parenthesized,
    positional,
    removal_edits,
    source_of,
    walk_scope,
)
from ._imports import pairs_in

_WHY = "bfloat16 autocast on XLA needs no loss scaling"


class RemoveGradScaler(Rule):
    """
    ## What it does
    Removes a CUDA `GradScaler` (`torch.cuda.amp.GradScaler(...)`,
    `torch.amp.GradScaler('cuda', ...)`, `GradScaler(enabled=args.amp)`) and unwinds its
    calls: `scaler.scale(loss).backward()` -> `loss.backward()`, `scaler.step(optimizer)` ->
    `xm.optimizer_step(optimizer)`, `scaler.update()` and `scaler.unscale_(optimizer)` are
    removed (`loss = scaler.scale(loss)` too). The scaler is followed by name from its
    assignment (a local or module variable, or `self.<attr>` across the methods of a
    class), through the file's imports (`from torch.cuda.amp import GradScaler`).

    Other uses (`scaler.state_dict()` / `load_state_dict` in checkpoints, `get_scale()`,
    passing the scaler to a function, `if scaler is not None`) are reported; while one
    remains the construction is kept, so the program still runs, and the calls above are
    unwound all the same. A GradScaler that is not bound by a plain assignment is reported,
    and so is a function parameter named like a scaler that the body uses as one
    (`def train_one_epoch(..., scaler)` with `scaler.scale(...)` and `scaler.step(...)`):
    what the caller passes cannot be seen from there.

    ## Why
    Loss scaling exists because float16 underflows. XLA autocast computes in bfloat16, which
    has float32's exponent range, so it needs no scaling (torch_xla 2.9 has no GradScaler
    of its own). Left in place, a CUDA GradScaler still runs on XLA (torch_xla counts as
    "amp available"): it multiplies the loss, checks every gradient for inf/NaN and reads
    the result back to the host each step, a device-to-host sync per step for nothing.

    ## Fix safety
    Safe. With bfloat16 (or float32) no gradient under/overflows the way float16 ones do, and
    an enabled scaler only multiplies the loss and divides the gradients by the same power
    of two before the step, so the update is the same; a disabled one (`enabled=False`) is
    already a pass-through. `scaler.step(opt)` becomes `xm.optimizer_step(opt)` (what TX201
    makes of `opt.step()`). All edits of one scaler form one fix, so the construction never
    disappears while a call to it remains. Once the construction is gone, the import it used
    (`from torch.cuda.amp import GradScaler`, `from torch.amp import GradScaler`, `import
    torch.cuda.amp as amp`...) is removed when nothing else in the file uses it; other names
    of the same import line stay.
    """

    code = "TX602"
    name = "remove-grad-scaler"
    target = "torch-xla"
    summary = "GradScaler removed, scaler.scale(loss).backward() -> loss.backward(), scaler.step -> xm.optimizer_step"
    severity = Severity.WARNING
    needs_text = ("GradScaler", "scaler")
    examples = [
        Example(
            """
            import torch

            scaler = torch.cuda.amp.GradScaler()
            for x, y in loader:
                optimizer.zero_grad()
                with torch.autocast('xla', dtype=torch.bfloat16):
                    loss = loss_fn(model(x), y)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            """
            import torch
            import torch_xla.core.xla_model as xm

            for x, y in loader:
                optimizer.zero_grad()
                with torch.autocast('xla', dtype=torch.bfloat16):
                    loss = loss_fn(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                xm.optimizer_step(optimizer)
            """,
            title="the usual AMP step",
        ),
        Example(
            """
            from torch.cuda.amp import GradScaler, autocast

            class Trainer:
                def __init__(self, model, optimizer, args):
                    self.model = model
                    self.optimizer = optimizer
                    self.scaler = GradScaler(enabled=args.amp)

                def step(self, x, y):
                    loss = self.model(x, y)
                    self.scaler.scale(loss * 0.5 + 1).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    return loss
            """,
            """
            from torch.cuda.amp import autocast
            import torch_xla.core.xla_model as xm

            class Trainer:
                def __init__(self, model, optimizer, args):
                    self.model = model
                    self.optimizer = optimizer

                def step(self, x, y):
                    loss = self.model(x, y)
                    (loss * 0.5 + 1).backward()
                    xm.optimizer_step(self.optimizer)
                    return loss
            """,
            title="self.scaler across methods, GradScaler(enabled=...) through imports; its import goes",
        ),
        Example(
            """
            import torch

            def train(model, opt, data, amp):
                scaler = torch.amp.GradScaler('cuda', enabled=amp)
                for x in data:
                    loss = model(x)
                    loss = scaler.scale(loss)
                    loss.backward()
                    scaler.step(opt)
                    if amp:
                        scaler.update()
                torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            """
            import torch
            import torch_xla.core.xla_model as xm

            def train(model, opt, data, amp):
                scaler = torch.amp.GradScaler('cuda', enabled=amp)
                for x in data:
                    loss = model(x)
                    loss.backward()
                    xm.optimizer_step(opt)
                    if amp:
                        pass
                torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            title="checkpointed scaler state: calls unwound, construction kept and reported",
        ),
        Example(
            """
            from torch.amp import GradScaler

            def train(model, opt, data):
                scaler = GradScaler('cuda')
                for x in data:
                    scaler.scale(model(x)).backward()
                    scaler.step(opt)
                    scaler.update()
            """,
            """
            import torch_xla.core.xla_model as xm

            def train(model, opt, data):
                for x in data:
                    model(x).backward()
                    xm.optimizer_step(opt)
            """,
            title="from torch.amp import GradScaler: the import goes with the last use",
        ),
        Example(
            """
            import torch

            scaler = torch.cuda.amp.GradScaler() if use_amp else None
            """,
            None,
            title="a conditional scaler is reported",
        ),
        Example(
            """
            import torch

            def train_one_epoch(model, optimizer, loader, scaler):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
            None,
            title="a scaler passed in as a parameter is reported",
        ),
    ]
    valid = [
        "import torch\nscaler = StandardScaler()\nscaler.fit(x)\n",
        "from sklearn.preprocessing import StandardScaler\ndef prep(x, scaler):\n    return scaler.transform(x)\n",
        "import torch\nscaler = torch.amp.GradScaler('cpu')\nscaler.scale(loss).backward()\n",
        "import torch\nclass A:\n    scale = 1\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        parents = Parents(node)
        scalers, others = find_scalers(self.ctx, parents)
        for call in others:
            self.report(
                call,
                f"GradScaler: {_WHY}; remove it and unwind its calls by hand "
                "(scaler.scale(loss).backward() -> loss.backward(), scaler.step(opt) -> "
                "xm.optimizer_step(opt), drop scaler.update()/unscale_())",
            )
        for scaler in scalers:
            self._scaler(parents, scaler)
        self._parameters(parents)

    def _parameters(self, parents: Parents) -> None:
        """A scaler handed to a function (`def train(..., scaler)`) cannot be followed to its
        construction: report the parameter when the body uses it like a GradScaler."""
        for fn in parents.nodes:
            if not isinstance(fn, cst.FunctionDef):
                continue
            for param in [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]:
                name = param.name.value
                if "scaler" not in name.lower():
                    continue
                methods = {
                    n.func.attr.value
                    for n in walk_scope(fn.body)
                    if isinstance(n, cst.Call)
                    and isinstance(n.func, cst.Attribute)
                    and isinstance(n.func.value, cst.Name)
                    and n.func.value.value == name
                }
                if "scale" in methods and ({"step", "update", "unscale_"} & methods):
                    self.report(
                        param,
                        f"`{name}` is used like a GradScaler passed in: {_WHY}; unwind its calls here "
                        f"({name}.scale(loss).backward() -> loss.backward(), {name}.step(opt) -> "
                        f"xm.optimizer_step(opt), drop {name}.update()/unscale_()) and stop passing it",
                    )

    def _scaler(self, parents: Parents, scaler: Scaler) -> None:
        label = scaler.label
        if scaler.ambiguous:
            self.report(
                scaler.construction,
                f"GradScaler `{label}`: {_WHY}, but {scaler.ambiguous}; remove it and unwind its calls by hand",
            )
            return
        edits: list[Edit] = []
        removed: list[cst.BaseSmallStatement] = []
        kept: list[ScalerUse] = []
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        uses_xm = False
        for use in scaler.uses:
            call, method = use.call, use.method
            if call is None or len(call.args) != len(positional(call)):
                kept.append(use)
                continue
            n = len(call.args)
            stmt = expression_statement(parents, call)
            if method == "scale" and n == 1:
                value = call.args[0].value
                receiver = parents.of(call)
                if isinstance(receiver, cst.Attribute) and receiver.value is call:
                    value = parenthesized(value)
                if _self_assignment(parents, call, value):
                    removed.append(parents.of(call))  # `loss = scaler.scale(loss)` goes
                else:
                    edits.append(Edit(call, value))
            elif method == "step" and n == 1:
                new = cst.parse_expression(f"{xm}.optimizer_step(_)").with_changes(
                    args=[cst.Arg(call.args[0].value)]
                )
                edits.append(Edit(call, new))
                uses_xm = True
            elif method == "update" and n <= 1 and stmt is not None:
                removed.append(stmt)
            elif method == "unscale_" and n == 1 and stmt is not None:
                removed.append(stmt)
            else:
                kept.append(use)
        if not kept:
            removed.append(scaler.statement)
        edits.extend(removal_edits(parents, removed))
        for use in kept:
            shown = source_of(use.call if use.call is not None else use.node)
            self.report(
                use.call if use.call is not None else use.node,
                f"`{shown}`: {_WHY}; drop the GradScaler `{label}` here (checkpoint code: stop "
                "saving/loading its state), then its construction",
            )
        imports = ("torch_xla.core.xla_model",) if uses_xm else ()
        if kept and not edits:
            message = (
                f"GradScaler `{label}`: {_WHY}; remove it once its other use(s), reported "
                "separately, are gone"
            )
        elif kept:
            message = (
                f"GradScaler `{label}`: {_WHY}; its step calls are unwound but the scaler is kept "
                f"for {len(kept)} other use(s) reported separately"
            )
        else:
            message = f"GradScaler `{label}`: {_WHY}; removed and its calls unwound"
        fix = Fix(
            tuple(edits), imports=imports, description="remove the GradScaler",
            remove_imports=pairs_in(self.ctx, removed),
        ) if edits else None
        self.report(scaler.construction, message, fix)


def _self_assignment(parents: Parents, call: cst.Call, value: cst.BaseExpression) -> bool:
    """``name = scaler.scale(name)``: unwound, it would read ``name = name``."""
    assign = parents.of(call)
    return (
        isinstance(assign, cst.Assign)
        and assign.value is call
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and isinstance(value, cst.Name)
        and assign.targets[0].target.value == value.value
    )
