from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _ops_table as ops
from . import _optax


class LRScheduler(Rule):
    """
    ## What it does
    Reports torch LR schedulers that porter cannot fold into the optimizer's optax schedule
    (JX201 folds StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, ConstantLR,
    PolynomialLR, CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR, LambdaLR, MultiplicativeLR
    (a constant factor) and, host-side,
    ReduceLROnPlateau): a LambdaLR function that reads the step on the host
    (`int(step)`, `and`/`or` on it, loops: a traced step count cannot), chained or sequential schedulers, a scheduler cycling RMSprop's momentum, a
    scheduler whose optimizer porter cannot see, or a LambdaLR/SequentialLR whose `step()`
    porter cannot place relative to the optimizer updates. The line is marked `# porter: manual`.
    The other schedulers stepped where porter cannot count the updates between two steps (a
    function given the scheduler under another name, a step under a phase's condition) become,
    host-side, the port's `TorchLRScheduler(optimizer, schedule)` (JX201, on an optimizer built
    with `optax.inject_hyperparams`): each `step()` writes the schedule's rate for that many
    steps into the optimizer's state, as torch's scheduler does.

    A scheduler and its optimizer given to the constructor of a trainer class of the file
    (`Trainer(model, loader, optimizer, scheduler)`, kept as `self.sched = sched`) are followed
    into the trainer's methods: a `self.sched.step()` in the loop that steps
    `self.optimizer` (or `scaler.step(self.optimizer)`) is one update per step, JX203 drops it,
    and `self.sched.get_last_lr()` reads `self.optimizer`'s update count.

    Once a scheduler is folded in, `scheduler.get_last_lr()` where the optimizer is in scope
    under the name it was built with (a parameter of the function, or the same block) becomes
    `[float(scheduler(optimizer.step[...]))]` (`get_last_lr()[0]`: the float alone; divided by
    the loader length for a per-epoch scheduler): the rate of the next update, as torch's
    after as many `scheduler.step()` calls. Elsewhere it is reported. So is
    `optimizer.param_groups` (an `nnx.Optimizer` has none), except
    `optimizer.param_groups[0]["lr"]` read where the optimizer is built with a constant
    learning rate (a Gluon script's `trainer.learning_rate`), which becomes that expression,
    and an optimizer JX201 built with `optax.inject_hyperparams` (the script sets its rate):
    `optimizer.param_groups[0]["lr"]` reads and writes, and `for g in optimizer.param_groups:
    g["lr"] = v` writes, `optimizer.opt_state[i].hyperparams["learning_rate"][...]` (also in
    a function of the file that every call gives such an optimizer: `def set_lr(opt, lr)`).
    An optimizer the file gets from a function of another file next to it
    (nanoGPT's `optimizer = model.configure_optimizers(...)` in train.py, model.py building and
    returning a torch AdamW, which JX201 there injects as this file sets its rate in a loop):
    its `param_groups` reads and loop writes become `optimizer.opt_state.hyperparams[
    "learning_rate"][...]`. Otherwise (the builder not found, a chain, one group set by index)
    they are reported with what to write there and here.

    ## Why
    optax takes the learning rate as a function of the update count; a torch scheduler that
    mutates the optimizer from outside has to be rewritten as such a function, and these
    cannot be rewritten mechanically with the same values.

    ## Fix safety
    Safe: `get_last_lr()` reads the same schedule the optimizer uses; otherwise the fix only
    adds the `# porter: manual` marker.
    """

    code = "JX202"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "lr-scheduler-to-optax"
    target = "jax"
    summary = "LR schedulers optax cannot express mechanically (a LambdaLR reading the step on the host, SequentialLR, ...): reported"
    severity = Severity.ERROR
    needs_text = ("lr_scheduler", "param_groups", "get_last_lr")
    examples = [
        Example(
            """
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0 if int(epoch) % 2 else 0.5)
            """,
            """
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0 if int(epoch) % 2 else 0.5)  # porter: manual
            """,
            title="a LambdaLR function that reads the step on the host (int(epoch))",
        ),
        Example(
            """
            import optax
            from flax import nnx

            optimizer = nnx.Optimizer(model, optax.sgd(args.lr), wrt=nnx.Param)
            print(optimizer.param_groups[0]["lr"])
            """,
            """
            import optax
            from flax import nnx

            optimizer = nnx.Optimizer(model, optax.sgd(args.lr), wrt=nnx.Param)
            print(args.lr)
            """,
            title="a constant learning rate read from a ported optimizer: its expression",
        ),
        Example(
            """
            import optax
            from flax import nnx

            scheduler = optax.exponential_decay(0.1, 1, 0.5)
            optimizer = nnx.Optimizer(model, optax.sgd(scheduler), wrt=nnx.Param)
            print(optimizer.param_groups[0]["lr"])
            """,
            """
            import optax
            from flax import nnx

            scheduler = optax.exponential_decay(0.1, 1, 0.5)
            optimizer = nnx.Optimizer(model, optax.sgd(scheduler), wrt=nnx.Param)
            print(optimizer.param_groups[0]["lr"])  # porter: manual
            """,
            title="torch's learning-rate state of a scheduled optimizer",
        ),
        Example(
            """
            import optax
            from flax import nnx


            def main(args, model, loader):
                optimizer = nnx.Optimizer(model, optax.inject_hyperparams(optax.sgd)(args.lr, momentum=0.9), wrt=nnx.Param)
                for epoch in range(args.epochs):
                    if epoch in args.decay_epochs:
                        for param_group in optimizer.param_groups:
                            param_group["lr"] = optimizer.param_groups[0]["lr"] * 0.1
                    print(f"lr={optimizer.param_groups[0]['lr']:g}")
            """,
            """
            import optax
            from flax import nnx


            def main(args, model, loader):
                optimizer = nnx.Optimizer(model, optax.inject_hyperparams(optax.sgd)(args.lr, momentum=0.9), wrt=nnx.Param)
                for epoch in range(args.epochs):
                    if epoch in args.decay_epochs:
                        optimizer.opt_state.hyperparams["learning_rate"][...] = optimizer.opt_state.hyperparams["learning_rate"][...] * 0.1
                    print(f"lr={optimizer.opt_state.hyperparams['learning_rate'][...]:g}")
            """,
            title="a learning rate the script sets: read and written in the optimizer's state",
        ),
    ]
    valid = [
        "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\nfor e in range(3):\n"
        "    for x in loader:\n        optimizer.step()\n    scheduler.step()\n",
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = node.attr.value
        if name not in ("get_last_lr", "param_groups"):
            return
        owner = cst.Module([]).code_for_node(node.value)
        if name == "get_last_lr" and self._last_lr(node, owner):
            return
        if name == "get_last_lr" and (owner in _optax.folded_schedules(self.ctx) or (
                owner.startswith("self.") and _optax.stored_name(self.ctx, owner) in _optax.folded_schedules(self.ctx))):
            ops.report_manual(self, node, f"{owner}.get_last_lr(): {owner} is an optax schedule: the rate of epoch e is "
                                          f"{owner}(e) (per-update schedules: the update count)")
        elif name == "param_groups" and owner in _optax.nnx_optimizers(self.ctx) and self._injected_lr(node, owner):
            return
        elif name == "param_groups" and self._setter_path(owner) is not None:
            self._injected_lr(node, owner, self._setter_path(owner))
            return
        elif name == "param_groups" and owner in _optax.nnx_optimizers(self.ctx) and self._constant_lr(node, owner):
            return
        elif name == "param_groups" and owner not in _optax.nnx_optimizers(self.ctx) and self._built_elsewhere(owner) \
                and self._sibling_path(owner) is not None and self._injected_lr(node, owner, self._sibling_path(owner)):
            return
        elif name == "param_groups" and owner not in _optax.nnx_optimizers(self.ctx) and self._built_elsewhere(owner):
            ops.report_manual(self, node, (
                f"{owner}.param_groups: {owner} comes from `{self._built_elsewhere(owner)}` (built in another function or "
                f"file) and an nnx.Optimizer has no parameter groups. Where it is built, wrap its optax transformation as "
                f"optax.inject_hyperparams(optax.adamw, static_args=('mask',))(learning_rate=lr, ...) (a callable argument "
                f"that is no schedule, such as adamw's mask, in static_args), then read and write the rate here as "
                f"{owner}.opt_state.hyperparams['learning_rate'][...] (opt_state[i] for the i-th transformation of an "
                f"optax.chain): for g in {owner}.param_groups: g['lr'] = v -> "
                f"{owner}.opt_state.hyperparams['learning_rate'][...] = v"))
        elif name == "param_groups" and owner in _optax.nnx_optimizers(self.ctx):
            ops.report_manual(self, node, f"{owner}.param_groups: an nnx.Optimizer has no parameter groups; the learning rate "
                                          "is the schedule given to its optax transformation")

    def _last_lr(self, node: cst.Attribute, owner: str) -> bool:
        """``scheduler.get_last_lr()`` of a scheduler JX201 folds in, where its optimizer is in
        scope under the name it was built with -> ``[float(scheduler(optimizer.step[...]))]``
        (divided by the loader length for a per-epoch scheduler): the rate the next update
        uses, as torch's after as many scheduler steps."""
        call = self.ctx.parent
        if not (isinstance(call, cst.Call) and call.func is node and not call.args):
            return False
        # `self.scheduler` in a method of a trainer whose constructor is given the scheduler
        base = _optax.stored_name(self.ctx, owner) if owner.startswith("self.") else None
        plan = next((p for p in _optax.plans(self.ctx) if p.scheduler_target == (base or owner)), None)
        if plan is not None:
            try:
                _optax.fold(self.ctx, plan)
            except ops.Manual:
                return False
            factor = _optax.updates_per_step(self.ctx, plan.scheduler_target, plan.target)
            target, block = plan.target, plan.block
        else:  # folded already: read the nnx.Optimizer that takes the schedule
            found = _optax.folded_optimizer(self.ctx, base or owner)
            if found is None:
                return False
            target, block, factor = found
        if base is not None:
            # the trainer keeps the optimizer too (`self.optimizer`): its update count is there
            cls = self.ctx.enclosing(cst.ClassDef)
            kept = [attr for c, attr in _optax.stored_by_constructors(self.ctx, target) if c is cls]
            if factor is None or len(set(kept)) != 1:
                return False
            target = kept[0]
        elif factor is None or not self._visible(target, block):
            return False
        count = f"{target}.step[...]" if factor == "1" else f"{target}.step[...] // {factor}"
        target_node, new = call, cst.parse_expression(f"[float({owner}({count}))]")
        outer = self.ctx.ancestors[-3] if len(self.ctx.ancestors) > 2 else None
        if isinstance(outer, cst.Subscript) and outer.value is call and len(outer.slice) == 1 \
                and isinstance(outer.slice[0].slice, cst.Index) and cst.Module([]).code_for_node(outer.slice[0].slice.value) == "0":
            target_node, new = outer, cst.parse_expression(f"float({owner}({count}))")  # get_last_lr()[0]
        self.report(node, f"{owner}.get_last_lr(): the rate of the optax schedule at the optimizer's update count",
                    Fix((Edit(target_node, new),)))
        return True

    def _optimizer_call(self, owner: str):
        """(the ``owner = nnx.Optimizer(...)`` call, its block), or None."""
        for block in _optax._blocks(self.ctx.module):
            for stmt in block.body:
                got = _optax._assign_of(stmt)
                if got and got[0] == owner and (self.ctx.qualname(got[1].func) or "") == "flax.nnx.Optimizer":
                    return got[1], block
        return None

    def _built_elsewhere(self, owner: str):
        """``owner = <call>`` in the file, the call being neither a torch.optim optimizer nor an
        nnx.Optimizer (``model.configure_optimizers(...)``, a factory of another file): the
        call's code (its callee and arguments), else None."""
        key = ("jx202.built_elsewhere", owner)
        if key not in self.ctx.cache:
            found = None
            for n in astutil.walk(self.ctx.module, into_functions=True):
                if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call) \
                        and cst.Module([]).code_for_node(n.targets[0].target) == owner:
                    qual = self.ctx.qualname(n.value.func) or ""
                    if qual.startswith("torch.optim") or qual == "flax.nnx.Optimizer" or _optax.optimizer_qual(
                            self.ctx, n.value.func) in _optax.OPTIMIZERS:
                        found = None
                        break
                    found = cst.Module([]).code_for_node(n.value.func) + "(...)"
            self.ctx.cache[key] = found
        return self.ctx.cache[key]

    def _sibling_path(self, owner: str):
        """``owner = m.fn(...)``, ``fn`` a function of another file next to this one that builds
        and returns the optimizer, injected by JX201 there (this file sets its rate in a loop,
        no group by index): where its hyperparameters are, else None."""
        if _optax.one_group_lr_written(self.ctx, owner):
            return None
        fn = self._built_elsewhere(owner)[:-len("(...)")].rsplit(".", 1)[-1]
        return _optax.built_by_sibling(self.ctx, fn)

    def _setter_path(self, owner: str):
        """``owner`` is the optimizer parameter of a function of the file that sets its rate
        (``def set_lr(opt, lr)``), and every call of it gives an nnx.Optimizer built with
        optax.inject_hyperparams, its hyperparameters at the same place: that place."""
        fn = next((a for a in self.ctx.ancestors if isinstance(a, cst.FunctionDef)), None)
        setters = _optax.lr_setters(self.ctx)
        if fn is None or setters.get(fn.name.value, (None, None))[1] != owner:
            return None
        i = setters[fn.name.value][0]
        paths = set()
        for call in astutil.walk(self.ctx.module, into_functions=True):
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == fn.name.value:
                arg = astutil.arg(call, owner, i)
                found = self._optimizer_call(cst.Module([]).code_for_node(arg.value)) if arg is not None else None
                paths.add(_optax.hyperparams_path(self.ctx, found[0]) if found else None)
        return paths.pop() if len(paths) == 1 else None

    def _injected_lr(self, node: cst.Attribute, owner: str, path=None) -> bool:
        """An optimizer whose learning rate the script sets (JX201 built it with
        optax.inject_hyperparams): ``owner.param_groups[0]["lr"]`` reads and writes, and
        ``for g in owner.param_groups: g["lr"] = v`` writes, the rate in its state."""
        if path is None:
            found = self._optimizer_call(owner)
            if found is None or not self._visible(owner, found[1]):
                return False
            path = _optax.hyperparams_path(self.ctx, found[0])
            if path is None:
                return False
        rate = f'{owner}.{path}.hyperparams["learning_rate"][...]'
        anc = self.ctx.ancestors
        loop = anc[-2] if len(anc) > 1 else None
        if isinstance(loop, cst.For) and loop.iter is node and _optax.lr_set_loop(loop, owner) is not None:
            group = loop.target.value  # type: ignore[attr-defined]

            class _Group(cst.CSTTransformer):  # the loop's own `param_group["lr"]` in the value
                def leave_Subscript(self, original, updated):
                    if _optax._lr_subscript(original, group):
                        return cst.parse_expression(rate)
                    return updated

            def write(updated: cst.For) -> cst.CSTNode:
                value = updated.body.body[0].body[0].value.visit(_Group())
                stmt = cst.parse_statement(f"{rate} = {cst.Module([]).code_for_node(value)}\n")
                return stmt.with_changes(leading_lines=updated.leading_lines)

            self.report(node, f"{owner}'s learning rate set through param_groups: the rate in its optax state "
                              "(inject_hyperparams), set between steps without a new compilation",
                        Fix((Edit(loop, write),)))
            return True
        if len(anc) > 2:
            first, second = anc[-2], anc[-3]
            if (isinstance(first, cst.Subscript) and first.value is node and _index(first) == "0"
                    and isinstance(second, cst.Subscript) and second.value is first and _index(second) in ('"lr"', "'lr'")):
                quote = _index(second)[0]  # the key's quotes fit where it is (an f-string's)
                read = rate.replace('"', quote)
                self.report(node, f"{owner}.param_groups[0]['lr']: the learning rate in its optax state",
                            Fix((Edit(second, cst.parse_expression(read)),)))
                return True
        return False

    def _constant_lr(self, node: cst.Attribute, owner: str) -> bool:
        """``optimizer.param_groups[0]["lr"]`` read where the nnx.Optimizer is built (same
        block) with a constant learning rate (``optax.sgd(args.lr)``, the last
        transformation of an ``optax.chain``) -> that expression."""
        anc = self.ctx.ancestors
        if len(anc) < 5:
            return False
        first, second = anc[-2], anc[-3]
        if not (isinstance(first, cst.Subscript) and first.value is node and _index(first) == "0"
                and isinstance(second, cst.Subscript) and second.value is first and _index(second) in ('"lr"', "'lr'")):
            return False
        if _optax.lr_written(self.ctx, owner) or (len(anc) > 3 and isinstance(anc[-4], (cst.AssignTarget, cst.AugAssign))
                                                  and getattr(anc[-4], "target", None) is second):
            return False  # the script changes the rate: not a constant
        for block in _optax._blocks(self.ctx.module):
            for stmt in block.body:
                got = _optax._assign_of(stmt)
                if not got or got[0] != owner or (self.ctx.qualname(got[1].func) or "") != "flax.nnx.Optimizer":
                    continue
                call = got[1]
                if len(call.args) < 2 or not self._visible(owner, block):
                    return False
                tx = call.args[1].value
                while isinstance(tx, cst.Call) and (self.ctx.qualname(tx.func) or "") == "optax.chain" and tx.args:
                    tx = tx.args[-1].value
                if not isinstance(tx, cst.Call):
                    return False
                lr = astutil.arg(tx, "learning_rate", 0)
                if lr is None or isinstance(lr.value, cst.Lambda) or cst.Module([]).code_for_node(lr.value) in _optax.folded_schedules(self.ctx):
                    return False  # a schedule: the rate changes with the update count
                if any(isinstance(n, cst.Call) for n in astutil.walk(lr.value)):
                    return False
                self.report(node, f"{owner}.param_groups[0]['lr']: the constant learning rate of its optax transformation",
                            Fix((Edit(second, lr.value),)))
                return True
        return False

    def _visible(self, name: str, block) -> bool:
        """The optimizer's name is a parameter of the function around the current node, or the
        current node is in the block the optimizer is built in."""
        for anc in reversed(self.ctx.ancestors[:-1]):
            if anc is block:
                return True
            if isinstance(anc, cst.FunctionDef):
                p = anc.params
                return any(q.name.value == name for q in (*p.posonly_params, *p.params, *p.kwonly_params))
        return False

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if not _optax.is_scheduler(qual):
            return
        kind = qual.rsplit(".", 1)[1]
        if not kind[:1].isupper():
            return
        plan = _optax.scheduler_plan(self.ctx, node)
        if plan is None:
            ops.report_manual(self, node, f"{kind}: porter cannot see the torch.optim optimizer it schedules "
                                          "(optax takes the schedule as the optimizer's learning rate)")
            return
        try:
            _optax.fold(self.ctx, plan)
        except ops.Manual as exc:
            ops.report_manual(self, node, f"{kind}: {exc}")


def _index(sub: cst.Subscript) -> str | None:
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
        return None
    return cst.Module([]).code_for_node(sub.slice[0].slice.value)
