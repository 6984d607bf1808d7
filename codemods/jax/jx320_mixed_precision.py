from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.grad_scalers import Parents, find_scalers, removal_edits, unwind
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

AUTOCASTS = ("torch.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast", "torch.cpu.amp.autocast",
             "torch.amp.autocast_mode.autocast")
# the names AMP code imports: removed with their last use (an import still used stays)
_AMP_IMPORTS = tuple((module, name) for module in ("torch.amp", "torch.cuda.amp", "torch.cpu.amp")
                     for name in ("GradScaler", "autocast"))
_PRECISION = ("the JAX port computes in float32 (for bfloat16 on a TPU, build the model with "
              "param_dtype=/dtype=jnp.bfloat16 and keep the loss in float32)")


class MixedPrecision(Rule):
    """
    ## What it does
    Takes torch's automatic mixed precision out of a JAX port:
    - a `GradScaler` (`torch.cuda.amp.GradScaler(...)`, `torch.amp.GradScaler('cuda', ...)`)
      bound to a variable or a `self.` attribute goes, and its calls unwind:
      `scaler.scale(loss).backward()` -> `loss.backward()`, `scaler.step(optimizer)` ->
      `optimizer.step()`, `scaler.update()` and `scaler.unscale_(optimizer)` are removed, so
      the training step is the plain one the step rule (JX301) rewrites. A scaler used any
      other way (its `state_dict()` in a checkpoint, passed to a function) is reported and
      its construction kept;
    - `with torch.autocast(...):` / `with torch.cuda.amp.autocast(enabled=...):` gives way to
      its body (an autocast among other `with` items leaves that item alone); an autocast
      decorator goes; an autocast made as a value (`ctx = nullcontext() if cpu else
      torch.amp.autocast(device_type, dtype=ptdtype)`) becomes `contextlib.nullcontext()` (the
      conditional its other arm when that is a `nullcontext()`), and
      `with ctx:` of a name the file only ever gives such contexts gives way to its body.

    ## Why
    JAX has no autocast and no loss scaling: a computation runs in the dtypes of its arrays.
    Left in, the scaler's calls hide the optimizer step from the step rewrite and the autocast
    contexts are torch code around JAX calls.

    ## Fix safety
    Safe. A GradScaler multiplies the loss by a power of two and divides the gradients by it
    before the step (exact in float32, where nothing over- or underflows the way float16
    does); without autocast the port computes in float32, at least as precise as the
    original's float16/bfloat16 regions.
    """

    code = "JX320"
    name = "jax-mixed-precision"
    target = "jax"
    summary = "GradScaler removed and unwound (scaler.step(opt) -> opt.step()), torch autocast contexts dropped"
    severity = Severity.WARNING
    needs_text = ("GradScaler", "autocast")
    examples = [
        Example(
            """
            import torch

            scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
            for x, y in loader:
                optimizer.zero_grad()
                with torch.cuda.amp.autocast(enabled=args.amp):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            """,
            title="the usual AMP step",
        ),
        Example(
            """
            from contextlib import nullcontext
            import torch

            ptdtype = torch.bfloat16
            ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)


            class Trainer:
                def __init__(self, model, optimizer):
                    self.model = model
                    self.optimizer = optimizer
                    self.scaler = torch.amp.GradScaler('cuda')

                def step(self, x):
                    with torch.no_grad(), torch.autocast('cuda'):
                        warm = self.model(x)
                    with ctx:
                        loss = self.model(x).mean()
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
            """
            from contextlib import nullcontext
            import torch

            ptdtype = torch.bfloat16
            ctx = nullcontext()


            class Trainer:
                def __init__(self, model, optimizer):
                    self.model = model
                    self.optimizer = optimizer

                def step(self, x):
                    with torch.no_grad():
                        warm = self.model(x)
                    loss = self.model(x).mean()
                    loss.backward()
                    self.optimizer.step()
            """,
            title="a self.scaler across methods, an autocast among other with items, an autocast made as a value and used by name",
        ),
        Example(
            """
            import torch

            scaler = torch.cuda.amp.GradScaler()
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(optimizer)
                scaler.update()
            torch.save({"scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            """
            import torch

            scaler = torch.cuda.amp.GradScaler()
            for x in loader:
                model(x).backward()
                optimizer.step()
            torch.save({"scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            title="a scaler saved in a checkpoint: its calls unwound, the construction kept and reported",
        ),
    ]
    valid = [
        "import torch\nscaler = StandardScaler()\nscaler.fit(x)\n",
        "import torch\nscaler = torch.amp.GradScaler('cpu')\nscaler.scale(loss).backward()\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        parents = Parents(node)
        scalers, others = find_scalers(self.ctx, parents)
        for call in others:
            self.report(call, "GradScaler: JAX has no loss scaling; remove it and unwind its calls by hand "
                              "(scaler.scale(loss).backward() -> loss.backward(), scaler.step(opt) -> opt.step())")
        for scaler in scalers:
            if scaler.ambiguous:
                self.report(scaler.construction, f"GradScaler `{scaler.label}`: JAX has no loss scaling, but "
                                                 f"{scaler.ambiguous}; remove it and unwind its calls by hand")
                continue
            edits, removed, kept = unwind(parents, scaler.uses, _plain_step)
            if not kept:
                removed.append(scaler.statement)
            edits.extend(removal_edits(parents, removed))
            for use in kept:
                shown = astutil.source_of(use.call if use.call is not None else use.node)
                self.report(use.call if use.call is not None else use.node,
                            f"`{shown}`: JAX has no loss scaling; drop the GradScaler `{scaler.label}` here "
                            "(checkpoint code: stop saving/loading its state), then its construction")
            if edits:
                what = "removed and its calls unwound" if not kept else "its calls unwound, kept for its other uses"
                self.report(scaler.construction, f"GradScaler `{scaler.label}`: JAX has no loss scaling; {what}",
                            Fix(tuple(edits), Safety.SAFE, description="remove the GradScaler",
                                remove_imports=_AMP_IMPORTS))

    def visit_With(self, node: cst.With) -> None:
        items = [i for i in node.items if (self._autocast(i.item) or self._null_context_name(i.item)) and i.asname is None]
        if not items:
            return
        if len(items) < len(node.items):
            kept = [i for i in node.items if not any(i is a for a in items)]
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            self.report(node, f"autocast: {_PRECISION}", Fix((Edit(node, node.with_changes(items=kept)),), Safety.SAFE, remove_imports=_AMP_IMPORTS),
                        severity=Severity.INFO)
            return
        if not isinstance(node.body, cst.IndentedBlock):
            return
        body = list(node.body.body)
        body[0] = body[0].with_changes(leading_lines=[*node.leading_lines, *body[0].leading_lines])
        self.report(node, f"autocast: {_PRECISION}", Fix((Edit(node, cst.FlattenSentinel(body)),), Safety.SAFE, remove_imports=_AMP_IMPORTS),
                    severity=Severity.INFO)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        kept = [d for d in node.decorators if not self._autocast(d.decorator)]
        if len(kept) == len(node.decorators):
            return
        self.report(node, f"an autocast decorator: {_PRECISION}",
                    Fix((Edit(node, node.with_changes(decorators=kept)),), Safety.SAFE, remove_imports=_AMP_IMPORTS),
                    severity=Severity.INFO)

    def visit_Call(self, node: cst.Call) -> None:
        # an autocast made as a value (`ctx = ... else torch.amp.autocast(...)`): a context that does nothing
        parent = self.ctx.parent
        if not self._autocast(node) or isinstance(parent, (cst.WithItem, cst.Decorator)):
            return
        if isinstance(parent, cst.IfExp) and parent.test is not node:
            other = parent.orelse if parent.body is node else parent.body
            if self._no_op_context(other) and not self._autocast(other):
                # `nullcontext() if cpu else autocast(...)`: the other arm, whichever path is taken
                self.report(node, f"autocast as a value: {_PRECISION}",
                            Fix((Edit(parent, other.with_changes(lpar=parent.lpar, rpar=parent.rpar)),), Safety.SAFE,
                                remove_imports=_AMP_IMPORTS), severity=Severity.INFO)
                return
        contextlib = self.ctx.module_alias("contextlib")
        self.report(node, f"autocast as a value: {_PRECISION}",
                    Fix((Edit(node, cst.parse_expression(f"{contextlib}.nullcontext()")),), Safety.SAFE,
                        imports=("contextlib",), remove_imports=_AMP_IMPORTS), severity=Severity.INFO)

    def _null_context_name(self, expr: cst.CSTNode) -> bool:
        """``ctx`` in ``with ctx:`` where every value the file gives the name is an autocast or a
        ``nullcontext()`` (``ctx = nullcontext() if cpu else torch.amp.autocast(...)``): no
        context at all in the port."""
        if not isinstance(expr, cst.Name):
            return False
        values = astutil.assigned_values(self.ctx.module, expr.value)
        return bool(values) and all(v is not None and self._no_op_context(v) for v in values)

    def _no_op_context(self, expr: cst.CSTNode) -> bool:
        if isinstance(expr, cst.IfExp):
            return self._no_op_context(expr.body) and self._no_op_context(expr.orelse)
        return self._autocast(expr) or (isinstance(expr, cst.Call) and not expr.args
                                        and self.ctx.qualname(expr.func) == "contextlib.nullcontext")

    def _autocast(self, expr: cst.CSTNode) -> bool:
        call = expr if isinstance(expr, cst.Call) else None
        return call is not None and self.ctx.qualname(call.func) in AUTOCASTS


def _plain_step(opt: cst.BaseExpression) -> cst.BaseExpression:
    return cst.Call(cst.Attribute(astutil.parenthesized(opt), cst.Name("step")))
