import libcst as cst

from porter import astutil

from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _ops_table as ops
from . import _optax


class OptimizerToOptax(Rule):
    """
    ## What it does
    Rewrites a torch optimizer (`torch.optim.X(model.parameters(), ...)`) to
    `nnx.Optimizer(model, <optax transformation>, wrt=nnx.Param)` with torch's semantics and
    defaults: SGD `momentum`/`nesterov` -> `optax.sgd`; torch's coupled (L2) `weight_decay`
    -> `optax.add_decayed_weights` chained before the update; AdamW's decoupled decay ->
    `optax.adamw(weight_decay=...)` (torch's default 0.01 spelled out); RMSprop ->
    `optax.rmsprop(decay=alpha, eps_in_sqrt=False)` (torch adds eps outside the square root);
    Adadelta -> `optax.adadelta(rho=, eps=)`; Adamax -> `optax.adamax`; ASGD -> `optax.sgd`
    with torch's step size lr / (1 + lambd * lr * t) ** alpha and lambd as decay (its averaged
    copy of the weights is not kept). Where optax's own optimizer differs from torch's,
    the port gets torch's update as an optax transformation of its own, emitted once at the
    top of the file (templates/jax_torch_optim.py.j2): `torch_adagrad` (eps outside the
    square root, `lr_decay`, `initial_accumulator_value` 0 as torch), `torch_nadam` (torch's
    `momentum_decay` schedule of the momentum), `torch_radam` (eps before the bias correction,
    rectified where rho_t > 5, rho_t computed without float32 cancellation), `torch_rprop`
    (no step where the gradient's sign flips). torch's default learning rates are spelled out.
    Other torch.optim classes are reported at their line: LBFGS (its closure runs several
    times per step), SparseAdam, NAdam/RAdam with `decoupled_weight_decay=True`.

    A learning-rate scheduler built on the optimizer (StepLR, MultiStepLR, ExponentialLR,
    CosineAnnealingLR, LinearLR, ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts,
    CyclicLR, OneCycleLR, LambdaLR, MultiplicativeLR with a constant factor (`lr * factor ** epoch`);
    ReduceLROnPlateau below) is folded in: its statement becomes the optax
    schedule (`scheduler = optax.exponential_decay(...)`), placed before the optimizer (or
    both where the scheduler was, when the code between them does not use the optimizer),
    and the optimizer takes it as learning rate. LambdaLR(optimizer, f) becomes
    `scheduler = lambda step: lr * f(step)` (torch multiplies the initial rate by f of the
    number of scheduler steps); optax calls it with a traced count inside the jitted update,
    so f is made traceable: a lambda's `a if c else b` and a def's `if c: return a` ...
    `return b` become `jnp.where(c, a, b)`, `min`/`max` of two values `jnp.minimum` /
    `jnp.maximum`, `math.cos`... `jnp.cos`; a function that reads the step on the host
    (`int(step)`, `and`/`or`, loops, other calls of the step) is left manual. torch steps most schedulers once per epoch while
    optax counts optimizer updates, so the rule reads the loops: when `scheduler.step()` runs
    in a loop around the loop over `train_loader` (or around a call of a function of the file
    that loops over the loader it is given), the learning rate is
    `lambda step: scheduler(step // len(train_loader))`; stepped next to the optimizer, it
    is `scheduler`. JX203 then removes the `scheduler.step()` calls; `optimizer.zero_grad()`
    and `optimizer.step()` are the training-loop rules' business. Each schedule is torch's
    closed form (torch's defaults: LinearLR start_factor 1/3 over 5 steps, ConstantLR factor
    1/3 for 5 steps, PolynomialLR power 1; OneCycleLR cos annealing, pct_start 0.3,
    div_factor 25, final_div_factor 1e4, `three_phase` and `anneal_strategy='linear'` as
    given; CyclicLR triangular / triangular2 / exp_range from base_lr, which torch sets as
    the rate). OneCycleLR and CyclicLR cycle the momentum unless `cycle_momentum=False`:
    SGD's momentum or Adam's beta1 then is a schedule too, through
    `optax.inject_hyperparams(optax.sgd)(learning_rate=..., momentum=...)`.
    SequentialLR(optimizer, schedulers=[...], milestones=[...]) over those of the schedulers
    above that torch restarts exactly at a milestone (`step(0)` sets their closed form at 0:
    StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, ConstantLR,
    PolynomialLR), built inline in the list or in statements of their own before it, becomes
    `optax.join_schedules([...], milestones)` (the next schedule counts from its milestone,
    as the restarted one does); the parts' statements go.
    ReduceLROnPlateau reads a metric each epoch, on the host: the optimizer keeps its rate in
    `optax.inject_hyperparams` state and the scheduler becomes `TorchReduceLROnPlateau(optimizer,
    ...)` (emitted into the port, torch's arguments and rules), built after the optimizer;
    `scheduler.step(val_loss)` stays and writes the new rate into the optimizer's state (no
    new compilation).

    Options with no exact optax counterpart (SGD dampening, amsgrad, maximize, other parameter
    groups, a scheduler that cycles RMSprop's momentum, a LambdaLR function porter cannot make
    traceable, other schedulers (ChainedScheduler or two schedulers on one optimizer, a SequentialLR part with no closed form, MultiplicativeLR of the epoch), a scheduler stepped with an argument (`scheduler.step(epoch + i / n)`),
    a schedule whose steps per epoch porter cannot see, Rprop and ASGD under a scheduler)
    leave the optimizer in place, marked `# porter: manual`, with the reason.

    Two parameter groups that differ only in `weight_decay` (one of them 0), each a list
    comprehension over the model's parameters split by a condition on the parameter alone
    and its negation (nanoGPT's `configure_optimizers`: `param_dict = {pn: p for pn, p in
    self.named_parameters()}`, a `requires_grad` filter, `[p for n, p in param_dict.items() if
    p.dim() >= 2]` and `< 2`; `[p for p in model.parameters() if not ...]`; the groups as
    `{...}` or `dict(...)` literals, inline or named) become one transformation whose decay
    applies where the condition holds: `optax.adamw(..., weight_decay=wd, mask=lambda params:
    jax.tree.map(lambda p: p.ndim >= 2, params))` over the nnx.State (AdamW), or torch's
    coupled decay as `optax.masked(optax.add_decayed_weights(wd), mask)` chained before the
    update (Adam, SGD...). The lists stay, built from the model's (NNX path, nnx.Param) pairs
    (`nnx.to_flat_state(nnx.state(model, nnx.Param))`), so what the script prints of them
    still holds; the `requires_grad` filters go (the port trains every nnx.Param). A
    `**extra_args` whose dict holds only implementation switches (`dict(fused=True) if
    use_fused else dict()`) is dropped with them.

    The Gluon front end's `GluonAdam` (a `torch.optim.Adam` subclass it emits for
    `gluon.Trainer(..., "adam")`: MXNet puts epsilon inside the bias correction) becomes
    `gluon_adam(lr, b1=, b2=, eps=, weight_decay=)`, an optax transformation emitted in its
    place (templates/gluon_script_optim_jax.py.j2) with MXNet's update,
    lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t), w -= lr_t * m / (sqrt(v) + eps), and MXNet's
    coupled wd; the class goes once every construction of it is ported.

    An optimizer whose learning rate the script sets between steps
    (`for g in optimizer.param_groups: g["lr"] = v`, `optimizer.param_groups[0]["lr"] = v`,
    either in a function of the file given the optimizer (`def set_lr(opt, lr)`), a Gluon
    script's `set_learning_rate`) is built with `optax.inject_hyperparams(optax.sgd)(lr, ...)`
    (in a chain: its last transformation; a decay mask is one of its `static_args`): the rate
    is an array of the optimizer's state, which JX202 reads and sets (no new compilation when
    it changes). So is an optimizer a function builds and returns where another file next to
    this one sets the rate of what that function returns (nanoGPT: model.py's
    `configure_optimizers`, train.py's loop). With two parameter groups (a decay mask), setting one group's rate
    (`param_groups[0]["lr"] = v`) is reported: the port has one rate for both.

    An optimizer a function or method returns alone (`return torch.optim.AdamW(groups, ...)` in
    `configure_optimizers`, the groups built before it as above; `def make_optimizer(net, lr):
    return torch.optim.SGD(net.parameters(), ...)`) becomes `return nnx.Optimizer(...)`, which
    JX301 follows to the caller's `optimizer = model.configure_optimizers(...)`; where that
    caller, in this file or another next to it, sets the rate through param_groups, the
    transformation is built with `optax.inject_hyperparams`. An optimizer returned with other
    values (`return [torch.optim.SGD(...)], [scheduler]`, Lightning's lists) is reported.

    ## Why
    A JAX training step updates parameters with an optax transformation; the learning rate
    schedule is part of it rather than a separate object mutating the optimizer.

    ## Fix safety
    Safe: tests/test_jax_ops_run.py and tests/test_jax_optim.py run 20 steps of each optimizer
    and scheduler (defaults and options spelled out, weight decay, per-epoch and per-batch
    stepping, momentum cycling) in torch and in the port on the same problem and compare the
    parameters before every step (1e-5 relative);
    tests/test_jax_init.py compares a LambdaLR warm-up/decay port's rates with torch's.
    """

    code = "JX201"
    name = "optimizer-to-optax"
    target = "jax"
    summary = "torch.optim.X(model.parameters()) (+ LR scheduler) -> nnx.Optimizer(model, optax..., wrt=nnx.Param); LBFGS, SparseAdam reported"
    severity = Severity.ERROR
    needs_text = ("optim",)
    examples = [
        Example(
            """
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
            """,
            """
            import optax
            import flax.nnx as nnx

            optimizer = nnx.Optimizer(model, optax.chain(optax.add_decayed_weights(5e-4), optax.sgd(0.1, momentum=0.9)), wrt=nnx.Param)
            """,
            title="SGD with torch's (coupled) weight decay",
        ),
        Example(
            """
            import torch

            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
            """,
            """
            import optax
            import flax.nnx as nnx

            optimizer = nnx.Optimizer(model, optax.adam(args.lr, b1=args.beta1, b2=0.999), wrt=nnx.Param)
            """,
            title="Adam's betas from the script's flags",
        ),
        Example(
            """
            import torch.optim as optim
            from torch.optim.lr_scheduler import StepLR

            def main(model, train_loader, epochs):
                optimizer = optim.Adam(model.parameters(), lr=1e-3)
                scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
                for epoch in range(epochs):
                    for x, y in train_loader:
                        optimizer.zero_grad()
                        loss_fn(model(x), y).backward()
                        optimizer.step()
                    scheduler.step()
            """,
            """
            import optax
            import flax.nnx as nnx

            def main(model, train_loader, epochs):
                scheduler = optax.exponential_decay(1e-3, transition_steps=1, decay_rate=0.7, staircase=True)
                optimizer = nnx.Optimizer(model, optax.adam(lambda step: scheduler(step // len(train_loader))), wrt=nnx.Param)
                for epoch in range(epochs):
                    for x, y in train_loader:
                        optimizer.zero_grad()
                        loss_fn(model(x), y).backward()
                        optimizer.step()
                    scheduler.step()
            """,
            title="a per-epoch scheduler folded in as an optax schedule over updates",
        ),
        Example(
            """
            import torch

            def main(model, train_loader):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                scheduler = torch.optim.lr_scheduler.CyclicLR(optimizer, base_lr=0.01, max_lr=0.1, step_size_up=100)
                for x, y in train_loader:
                    train_step(x, y)
                    optimizer.step()
                    scheduler.step()
            """,
            """
            import optax
            import flax.nnx as nnx
            import jax.numpy as jnp

            def main(model, train_loader):
                scheduler = lambda step: 0.01 + (0.1 - 0.01) * jnp.where((1.0 + step / (100 + 100) - jnp.floor(1 + step / (100 + 100))) <= (100 / (100 + 100)), (1.0 + step / (100 + 100) - jnp.floor(1 + step / (100 + 100))) / (100 / (100 + 100)), ((1.0 + step / (100 + 100) - jnp.floor(1 + step / (100 + 100))) - 1) / ((100 / (100 + 100)) - 1))
                optimizer = nnx.Optimizer(model, optax.inject_hyperparams(optax.sgd, static_args=('nesterov',))(learning_rate=scheduler, momentum=lambda step: 0.9 - (0.9 - 0.8) * jnp.where((1.0 + step / (100 + 100) - jnp.floor(1 + step / (100 + 100))) <= (100 / (100 + 100)), (1.0 + step / (100 + 100) - jnp.floor(1 + step / (100 + 100))) / (100 / (100 + 100)), ((1.0 + step / (100 + 100) - jnp.floor(1 + step / (100 + 100))) - 1) / ((100 / (100 + 100)) - 1))), wrt=nnx.Param)
                for x, y in train_loader:
                    train_step(x, y)
                    optimizer.step()
                    scheduler.step()
            """,
            title="CyclicLR (per batch) cycling SGD's momentum: both are schedules of the update count",
        ),
        Example(
            """
            import torch

            optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20)
            """,
            """
            import torch

            optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20)  # porter: manual
            """,
            title="LBFGS (its closure runs several times per step): reported",
        ),
        Example(
            """
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1)
            """,
            """
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1)  # porter: manual
            """,
            title="no exact optax counterpart: marked for a manual port",
        ),
        Example(
            '''
            import math
            import torch


            class GluonAdam(torch.optim.Adam):
                """gluon.Trainer's "adam" as a torch optimizer (MXNet's epsilon placement)."""

                def step(self, closure=None):
                    return super().step(closure)


            def main(net, args):
                trainer = GluonAdam(net.parameters(), lr=args.lr, betas=(0.5, 0.999), weight_decay=args.wd)
            ''',
            '''
            import math
            import jax
            import optax
            import flax.nnx as nnx
            import jax.numpy as jnp


            def gluon_adam(learning_rate=0.001, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0):
                """gluon.Trainer's "adam" as an optax transformation. MXNet puts epsilon inside the bias
                correction: w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps) (optax.adam adds
                eps to the bias-corrected sqrt(v)); weight_decay is MXNet's wd, an L2 term added to the
                gradient before the moments. learning_rate: a number or an optax schedule of the count
                (the numbers may be arrays: optax.inject_hyperparams(gluon_adam) keeps them in the state)."""

                def init(params):
                    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
                    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros())

                def update(grads, state, params=None):
                    grads = jax.tree.map(lambda g, w: g + weight_decay * w, grads, params)
                    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
                    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
                    count = state.count + 1
                    t = count.astype(jnp.float32)
                    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
                    lr_t = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                    updates = jax.tree.map(lambda m, v: -lr_t * m / (jnp.sqrt(v) + eps), mu, nu)
                    return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

                return optax.GradientTransformation(init, update)


            def main(net, args):
                trainer = nnx.Optimizer(net, gluon_adam(args.lr, b1=0.5, b2=0.999, weight_decay=args.wd), wrt=nnx.Param)
            ''',
            title="the Gluon front end's GluonAdam (MXNet's epsilon placement): its optax form, gluon_adam",
        ),
        Example(
            """
            import torch


            def main(args, model, loader):
                optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
                for epoch in range(args.epochs):
                    if epoch in args.decay_epochs:
                        for param_group in optimizer.param_groups:
                            param_group["lr"] = param_group["lr"] * 0.1
            """,
            """
            import optax
            import flax.nnx as nnx


            def main(args, model, loader):
                optimizer = nnx.Optimizer(model, optax.chain(optax.add_decayed_weights(1e-4), optax.inject_hyperparams(optax.sgd)(args.lr, momentum=0.9)), wrt=nnx.Param)
                for epoch in range(args.epochs):
                    if epoch in args.decay_epochs:
                        for param_group in optimizer.param_groups:
                            param_group["lr"] = param_group["lr"] * 0.1
            """,
            title='a learning rate the script sets (param_groups): optax.inject_hyperparams',
        ),
        Example(
            """
            import torch
            import torch.nn as nn


            class Net(nn.Module):
                def configure_optimizers(self, lr):
                    return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1)


            def make_optimizer(net, lr):
                return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)


            def main(model, lr):
                opt = make_optimizer(model, lr)
                for g in opt.param_groups:
                    g["lr"] = lr / 10
            """,
            """
            import torch.nn as nn
            import optax
            import flax.nnx as nnx


            class Net(nn.Module):
                def configure_optimizers(self, lr):
                    return nnx.Optimizer(self, optax.adamw(lr, weight_decay=0.1), wrt=nnx.Param)


            def make_optimizer(net, lr):
                return nnx.Optimizer(net, optax.inject_hyperparams(optax.sgd)(lr, momentum=0.9), wrt=nnx.Param)


            def main(model, lr):
                opt = make_optimizer(model, lr)
                for g in opt.param_groups:
                    g["lr"] = lr / 10
            """,
            title="an optimizer returned by a method or a function (its caller sets the rate: inject_hyperparams)",
        ),
        Example(
            """
            import torch


            def configure_optimizers(model):
                return [torch.optim.SGD(model.parameters(), lr=0.1)], []
            """,
            """
            import torch


            def configure_optimizers(model):
                return [torch.optim.SGD(model.parameters(), lr=0.1)], []  # porter: manual
            """,
            title="an optimizer returned with other values (Lightning's lists): reported",
        ),
    ]
    valid = ["import optax\nfrom flax import nnx\noptimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)\n"]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        from porter.codemods.gluon import _script

        # the Gluon front end's GluonAdam (a torch.optim.Adam with MXNet's epsilon placement):
        # its optax form, once every construction of it ports
        if self.ctx.parent is not self.ctx.module or not _optax.is_gluon_adam_class(node, self.ctx):
            return
        calls = [p for p in _optax.plans(self.ctx) if p.qual == _optax.GLUON_ADAM]
        others = [n for n in astutil.walk(self.ctx.module, into_functions=True)
                  if isinstance(n, cst.Name) and n.value == "GluonAdam"]
        if len(others) != len(calls) + 1 or not calls:  # the calls and the class name
            return  # GluonAdam used otherwise than in `opt = GluonAdam(model.parameters(), ...)`
        for plan in calls:
            try:
                _optax.fold(self.ctx, plan)
            except ops.Manual:
                return
        new = _script.render("gluon_script_optim_jax.py.j2")
        self.report(node, "GluonAdam -> gluon_adam, an optax transformation with MXNet's Adam update",
                    Fix((Edit(node, cst.FlattenSentinel([new[0].with_changes(leading_lines=node.leading_lines)])),),
                        imports=("jax", "jax.numpy", "optax")))

    def visit_Call(self, node: cst.Call) -> None:
        qual = _optax.optimizer_qual(self.ctx, node.func)
        if qual not in _optax.OPTIMIZERS:
            reason = _optax.unported_reason(qual)
            if reason is not None:
                ops.report_manual(self, node, reason)
            return
        plan = next((p for p in _optax.plans(self.ctx) if p.call is node), None)
        display = qual.replace("torch.optim.", "optim.").replace(_optax.GLUON_ADAM, "GluonAdam")
        if plan is None:
            if any(isinstance(a, cst.Return) for a in self.ctx.ancestors):
                # `return [torch.optim.SGD(...)], [sched]`, `return opt_ctor(...), sched`
                ops.report_manual(self, node, f"{display} returned with other values: porter ports an optimizer "
                                              "assigned to a name or returned alone (`return torch.optim.X(...)`), "
                                              "which the training step then follows")
                return
            ops.report_manual(self, node, f"{display}: porter ports optimizers assigned to a name in a statement of "
                                          "their own or returned alone")
            return
        try:
            sched_text, opt_text, used = _optax.fold(self.ctx, plan)
        except ops.Manual as exc:
            ops.report_manual(self, node, f"{display}: {exc}")
            return
        new_opt = cst.parse_statement(opt_text)
        edits = []
        if sched_text is not None and plan.scheduler_after:
            # the scheduler reads the optimizer (ReduceLROnPlateau): the optimizer where it was,
            # the scheduler where it was
            edits.append(Edit(plan.scheduler_stmt, cst.parse_statement(sched_text).with_changes(
                leading_lines=plan.scheduler_stmt.leading_lines, trailing_whitespace=plan.scheduler_stmt.trailing_whitespace)))
        elif sched_text is not None and _between_free_of(plan):
            # code between the two (a LambdaLR's function, the numbers it reads) does not use the
            # optimizer: both go where the scheduler was, after what the schedule reads
            new_sched = cst.parse_statement(sched_text).with_changes(leading_lines=plan.scheduler_stmt.leading_lines)
            edits.append(Edit(plan.scheduler_stmt, cst.FlattenSentinel([new_sched, new_opt])))
            edits.append(Edit(plan.stmt, cst.RemoveFromParent()))
        elif sched_text is not None:
            new_sched = cst.parse_statement(sched_text).with_changes(leading_lines=plan.stmt.leading_lines)
            edits.append(Edit(plan.stmt, cst.FlattenSentinel([new_sched, new_opt])))
            edits.append(Edit(plan.scheduler_stmt, cst.RemoveFromParent()))
        for sub_stmt, _call in plan.sub_schedulers.values():  # a SequentialLR's parts: in its schedule now
            edits.append(Edit(sub_stmt, cst.RemoveFromParent()))
        from porter.codemods.gluon import _script

        helpers = [h for h in _optax.TORCH_TRANSFORMS if f"{h}(" in opt_text + (sched_text or "")
                   and not _script.defined_at_top(self.ctx, h)]
        if helpers and plan is _first_needing_helpers(self.ctx):
            # every helper the file's optimizers need, inserted once (by the first of them)
            names = sorted({h for p in _optax.plans(self.ctx) for h in _optax.TORCH_TRANSFORMS
                            if h in _helpers_of(self.ctx, p)} | set(helpers))
            edits.append(Edit(self.ctx.module, _script.insert_before_defs(_script.render("jax_torch_optim.py.j2", names=names))))
            used |= {"jax", "jax.numpy", "optax"} | ({"math"} if "torch_radam" in names else set())
        elif helpers:
            pass  # the first optimizer that needs them inserts them
        edits += _decay_group_edits(self.ctx, plan)
        if plan.lambda_edit is not None:
            edits.append(Edit(*plan.lambda_edit))
        elif sched_text is None or plan.scheduler_after:
            edits.append(Edit(plan.stmt, new_opt.with_changes(leading_lines=plan.stmt.leading_lines,
                                                              trailing_whitespace=plan.stmt.trailing_whitespace)))
        what = f"{display} -> nnx.Optimizer with optax" + (" (scheduler folded in as the learning-rate schedule)" if sched_text else "")
        # `import torch.optim as optim`, `from torch.optim.lr_scheduler import StepLR`: removed once unused
        removals = [("torch.optim", None), ("torch", "optim"), ("torch.optim.lr_scheduler", None),
                    ("torch.optim", "lr_scheduler")]
        subs = [self.ctx.qualname(c.func) for _s, c in plan.sub_schedulers.values()]
        for name in (self.ctx.qualname(plan.call.func), self.ctx.qualname(plan.scheduler_call.func) if plan.scheduler_call else None,
                     *subs):
            if name and "." in name:
                module, _, short = name.rpartition(".")
                removals.append((module, short))
        self.report(node, what, Fix(tuple(edits), imports=tuple(sorted(used)), remove_imports=tuple(removals)))


def _decay_group_edits(ctx, plan) -> list:
    """Parameter groups split by a condition (the optimizer's decay mask now): the
    ``named_parameters()`` they were built from become the model's (name, nnx.Param) pairs, so
    the lists still count (a report of each group's size), and the ``requires_grad`` filters go
    (the port trains every nnx.Param)."""
    groups = _optax.decay_groups(ctx, _optax.implementation_kwargs(plan.call, plan.block, plan.stmt) or plan.call,
                                 plan.block, plan.stmt)
    if groups is None:
        return []
    edits, done = [], set()
    filtered: dict[int, tuple] = {}
    for loop, cond in groups.grad_filters:
        filtered.setdefault(id(loop), (loop, []))[1].append(cond)
    sources = {id(c) for c in groups.named_sources}
    for loop, conds in filtered.values():
        it = _optax.named_arrays(ctx, groups.model, loop.iter) if id(loop.iter) in sources else loop.iter
        done.add(id(loop.iter))
        ifs = [c for c in loop.ifs if c not in conds]
        edits.append(Edit(loop, loop.with_changes(iter=it, ifs=ifs)))
    for call in groups.named_sources:
        if id(call) not in done:
            done.add(id(call))
            edits.append(Edit(call, _optax.named_arrays(ctx, groups.model, call)))
    return edits


def _helpers_of(ctx, plan) -> set:
    """The port's own transformations (torch_nadam, ...) the plan's optimizer needs."""
    try:
        sched, text, _ = _optax.fold(ctx, plan)
    except ops.Manual:
        return set()
    text += sched or ""
    return {h for h in _optax.TORCH_TRANSFORMS if f"{h}(" in text}


def _first_needing_helpers(ctx):
    for p in _optax.plans(ctx):
        if _helpers_of(ctx, p):
            return p
    return None


def _between_free_of(plan) -> bool:
    """Statements sit between the optimizer and its scheduler, and none of them mentions the
    optimizer's name."""
    body = list(plan.block.body)
    try:
        i, j = body.index(plan.stmt), body.index(plan.scheduler_stmt)
    except ValueError:
        return False
    if j <= i + 1:
        return False
    name = plan.target
    return not any(name in cst.Module([]).code_for_node(st) for st in body[i + 1:j])
