from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from porter.astutil import parenthesized, source_of
from porter.grad_scalers import Parents, Scaler, ScalerUse, find_scalers, removal_edits, unwind, walk_scope
from ._imports import pairs_in
from . import _training as tr

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
    already a pass-through. A scaler parameter is unwound and dropped only when every call
    in the file passes the file's GradScaler; a function whose name is public (no leading
    underscore) may also be imported and called by another module with the old signature,
    so that fix is unsafe (safe for `_private` functions). `scaler.step(opt)` becomes `xm.optimizer_step(opt)` (what TX201
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
            title="a scaler passed in as a parameter, callers not in the file: reported",
        ),
        Example(
            """
            import torch

            def train(model, optimizer, loader, scaler, epoch):
                for x in loader:
                    optimizer.zero_grad()
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()

            def main(model, optimizer, loader, args):
                scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
                for epoch in range(args.epochs):
                    train(model, optimizer, loader, scaler, epoch)
            """,
            """
            import torch_xla.core.xla_model as xm

            def train(model, optimizer, loader, epoch):
                for x in loader:
                    optimizer.zero_grad()
                    model(x).backward()
                    xm.optimizer_step(optimizer)

            def main(model, optimizer, loader, args):
                for epoch in range(args.epochs):
                    train(model, optimizer, loader, epoch)
            """,
            unsafe=True,
            title="a scaler passed to a function of the file by every caller: unwound there, parameter dropped (and `import torch`, now unused); unsafe: train() is public",
        ),
        Example(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def _train(model, optimizer, loader, scaler):
                model = DDP(model, gradient_as_bucket_view=True)
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()

            def main(model, optimizer, loader):
                scaler = torch.cuda.amp.GradScaler()
                _train(model, optimizer, loader, scaler)
                torch.save({"scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def _train(model, optimizer, loader):
                model = DDP(model, gradient_as_bucket_view=True)
                for x in loader:
                    model(x).backward()
                    optimizer.step()

            def main(model, optimizer, loader):
                scaler = torch.cuda.amp.GradScaler()
                _train(model, optimizer, loader)
                torch.save({"scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            title="with DistributedDataParallel scaler.step(opt) becomes opt.step() (DDP reduced the gradients); a private function: safe",
        ),
        Example(
            """
            import torch

            def train(model, optimizer, loader, scaler):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
                    scaler.update()

            def main(model, optimizer, loader, make_scaler):
                scaler = torch.cuda.amp.GradScaler()
                train(model, optimizer, loader, scaler)
                train(model, optimizer, loader, make_scaler())
            """,
            None,
            title="a caller passes something else than the file's GradScaler: reported",
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
        # a scaler variable passed whole as a call argument (`train(..., scaler, ...)`)
        passed = {id(u.node) for sc in scalers if not sc.ambiguous for u in sc.uses if u.call is None}
        self._parameters(parents, passed)

    def _parameters(self, parents: Parents, passed: set[int]) -> None:
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
                    if self._unwind_parameter(parents, fn, param, passed):
                        continue
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
        edits, removed, kept, uses_xm = self._unwind(parents, scaler.uses)
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


    def _unwind_parameter(self, parents: Parents, fn: cst.FunctionDef, param: cst.Param, passed: set[int]) -> bool:
        """`def train(..., scaler, ...)` of the module, called only as `train(...)` and every
        call passing a GradScaler variable of the file for `scaler`: unwind its calls in the
        body and drop the parameter and the arguments. False (nothing done) otherwise."""
        name = param.name.value
        if not isinstance(parents.of(fn), cst.Module) or param.default is not None or param.star:
            return False
        if fn.decorators or param not in fn.params.params:
            return False
        position = len(fn.params.posonly_params) + list(fn.params.params).index(param)
        calls = _calls_of_function(parents, fn)
        if not calls:
            return False
        for call in calls:
            arg = _argument_for(call, position, name)
            if arg is None or id(arg.value) not in passed:
                return False
        uses = _parameter_uses(parents, fn, name)
        edits, removed, kept, uses_xm = self._unwind(parents, uses)
        if kept or not edits and not removed:
            return False
        edits.extend(removal_edits(parents, removed))
        edits.append(Edit(fn.params, _without_parameter(fn.params, param)))
        for call in calls:
            edits.append(self.replace(call, _drop_argument(position, name)))
        imports = ("torch_xla.core.xla_model",) if uses_xm else ()
        public = not fn.name.value.startswith("_")
        self.report(
            param,
            f"`{name}` is the GradScaler every call of {fn.name.value}() in this file passes: {_WHY}; its "
            "calls are unwound here and the parameter and the arguments dropped"
            + (f" (unsafe: a module that imports {fn.name.value}() would still pass it)" if public else ""),
            Fix(tuple(edits), Safety.UNSAFE if public else Safety.SAFE, imports=imports,
                description="unwind the GradScaler parameter"),
        )
        return True

    def _unwind(self, parents: Parents, uses: list[ScalerUse]):
        """The edits that unwind `scaler.scale/step/update/unscale_` calls, the statements
        to remove, the uses left (kept), and whether the step became xm.optimizer_step."""
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        ddp = tr.wraps_in_ddp(self.ctx)
        used_xm = []

        def step(opt: cst.BaseExpression) -> cst.BaseExpression:
            if ddp:  # DistributedDataParallel reduced the gradients in backward(): a plain step
                return cst.Call(cst.Attribute(parenthesized(opt), cst.Name("step")))
            used_xm.append(True)
            return cst.parse_expression(f"{xm}.optimizer_step(_)").with_changes(args=[cst.Arg(opt)])

        edits, removed, kept = unwind(parents, uses, step)
        return edits, removed, kept, bool(used_xm)


def _calls_of_function(parents: Parents, fn: cst.FunctionDef) -> list[cst.Call]:
    """The calls `f(...)` of the module function `fn`; empty when its name is read or bound
    any other way (passed as a callback, rebound, shadowed by a parameter, imported)."""
    name = fn.name.value
    defs = [n for n in parents.nodes if isinstance(n, (cst.FunctionDef, cst.ClassDef)) and n.name.value == name]
    if defs != [fn]:
        return []
    calls: list[cst.Call] = []
    for node in parents.nodes:
        if not isinstance(node, cst.Name) or node.value != name or node is fn.name:
            continue
        parent = parents.of(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue  # `obj.train`: another name
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            continue  # `f(train=...)`
        if isinstance(parent, cst.Call) and parent.func is node and all(not a.star for a in parent.args):
            calls.append(parent)
            continue
        return []
    return calls


def _argument_for(call: cst.Call, position: int, name: str) -> Optional[cst.Arg]:
    positional = [a for a in call.args if a.keyword is None]
    if position < len(positional):
        return positional[position]
    hits = [a for a in call.args if a.keyword is not None and a.keyword.value == name]
    return hits[0] if hits else None


def _parameter_uses(parents: Parents, fn: cst.FunctionDef, name: str) -> list[ScalerUse]:
    uses: list[ScalerUse] = []
    for node in walk_scope(fn.body):
        if not isinstance(node, cst.Name) or node.value != name:
            continue
        parent = parents.of(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        call = parents.of(parent) if isinstance(parent, cst.Attribute) and parent.value is node else None
        if isinstance(call, cst.Call) and call.func is parent:
            uses.append(ScalerUse(node, call, parent.attr.value))
        else:
            uses.append(ScalerUse(node))
    return uses


def _without_parameter(params: cst.Parameters, param: cst.Param) -> cst.Parameters:
    kept = [p for p in params.params if p is not param]
    rest = params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or params.kwonly_params or params.star_kwarg
    if kept and not rest and params.params[-1] is param:
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return params.with_changes(params=kept)


def _drop_argument(position: int, name: str):
    def apply(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        target = _argument_for(updated, position, name)
        args = [a for a in updated.args if a is not target]
        if args and updated.args[-1] is target:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)
    return apply
