"""torch.optim optimizers and LR schedulers -> optax, with torch's semantics (rules JX201, JX202).

A torch optimizer holds its learning rate; a torch LR scheduler changes it each time
``scheduler.step()`` runs (usually once per epoch, for OneCycleLR once per batch). optax
takes the learning rate as a schedule: a function of the number of optimizer updates done.
So porter builds the optimizer and its scheduler together:

    scheduler = <the schedule, in scheduler steps>
    optimizer = nnx.Optimizer(model, optax.sgd(lambda step: scheduler(step // len(train_loader)), ...), wrt=nnx.Param)

where ``len(train_loader)`` (the optimizer updates per ``scheduler.step()``) is read from the
loops: the loop that calls ``scheduler.step()`` runs a loop over ``train_loader`` whose body
steps the optimizer (directly, or in a function of the file it calls with the loader). A
scheduler stepped in the same loop as the optimizer needs no division.

What differs is never guessed: torch options without an exact optax counterpart (SGD
dampening, Adam amsgrad, maximize, OneCycleLR's momentum cycling, LambdaLR, ...) are reported
(:class:`~codemods.jax._ops_table.Manual`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import FileContext
from porter.rules import module_fact

from . import _loop as lp
from ._ops_table import NOT_LITERAL, Bound, Manual, Sig, atom, bare, bind, code, literal


@dataclass(frozen=True)
class OptimizerSpec:
    sig: Sig
    default_lr: str


OPTIMIZERS = {
    "torch.optim.SGD": OptimizerSpec(Sig.parse("params, lr, momentum, dampening, weight_decay, nesterov, *, maximize, foreach, differentiable, fused"), "0.001"),
    "torch.optim.Adam": OptimizerSpec(Sig.parse("params, lr, betas, eps, weight_decay, amsgrad, *, foreach, maximize, capturable, differentiable, fused, decoupled_weight_decay"), "0.001"),
    "torch.optim.AdamW": OptimizerSpec(Sig.parse("params, lr, betas, eps, weight_decay, amsgrad, *, maximize, foreach, capturable, differentiable, fused"), "0.001"),
    "torch.optim.RMSprop": OptimizerSpec(Sig.parse("params, lr, alpha, eps, weight_decay, momentum, centered, capturable, foreach, maximize, differentiable"), "0.01"),
    "torch.optim.Adadelta": OptimizerSpec(Sig.parse("params, lr, rho, eps, weight_decay, foreach, *, capturable, maximize, differentiable"), "1.0"),
    "torch.optim.Adagrad": OptimizerSpec(Sig.parse("params, lr, lr_decay, weight_decay, initial_accumulator_value, eps, foreach, *, maximize, differentiable, fused"), "0.01"),
    "torch.optim.Adamax": OptimizerSpec(Sig.parse("params, lr, betas, eps, weight_decay, foreach, *, maximize, differentiable, capturable"), "0.002"),
    "torch.optim.NAdam": OptimizerSpec(Sig.parse("params, lr, betas, eps, weight_decay, momentum_decay, decoupled_weight_decay, *, foreach, maximize, capturable, differentiable"), "0.002"),
    "torch.optim.RAdam": OptimizerSpec(Sig.parse("params, lr, betas, eps, weight_decay, decoupled_weight_decay, *, foreach, maximize, capturable, differentiable"), "0.001"),
    "torch.optim.ASGD": OptimizerSpec(Sig.parse("params, lr, lambd, alpha, t0, weight_decay, foreach, maximize, differentiable, capturable"), "0.01"),
    "torch.optim.Rprop": OptimizerSpec(Sig.parse("params, lr, etas, step_sizes, *, capturable, foreach, maximize, differentiable"), "0.01"),
}
# torch.optim optimizers porter does not port, and why (JX201 reports them at the line)
UNPORTED = {
    "LBFGS": "torch.optim.LBFGS runs its closure up to max_iter (20) times per step(), keeps history_size (100) "
             "pairs and by default searches no line (line_search_fn=None: steps of lr, the first scaled by "
             "min(1, 1/|g|_1)); optax.lbfgs takes one gradient per update, keeps memory_size=10 and runs a zoom "
             "line search by default: not the same iterates. Write the loop with optax.lbfgs(memory_size=..., "
             "linesearch=...) and optax.value_and_grad_from_state by hand",
    "SparseAdam": "SparseAdam updates only the rows of sparse gradients; JAX gradients are dense (use optax.adam, "
                  "which also moves the rows a batch did not touch)",
}
# the port's own transformations for optimizers optax has no exact form of (templates/jax_torch_optim.py.j2)
TORCH_TRANSFORMS = ("torch_adagrad", "torch_nadam", "torch_radam", "torch_rprop", "TorchReduceLROnPlateau",
                    "TorchLRScheduler")
for _k in list(OPTIMIZERS):
    _short = _k.rsplit(".", 1)[1]
    OPTIMIZERS[f"torch.optim.{_short.lower()}.{_short}"] = OPTIMIZERS[_k]  # torch.optim.sgd.SGD
# the Gluon front end's Adam (templates/gluon_script_optim.py.j2: a torch.optim.Adam subclass
# emitted into the port, MXNet's epsilon placement): a name of the file, not an import
GLUON_ADAM = "porter.gluon.GluonAdam"
OPTIMIZERS[GLUON_ADAM] = OptimizerSpec(Sig.parse("params, lr, betas, eps, weight_decay"), "0.001")
_IGNORED = ("foreach", "fused", "differentiable", "capturable")


def is_gluon_adam_class(stmt: cst.CSTNode, ctx: FileContext) -> bool:
    """``class GluonAdam(torch.optim.Adam)`` at module level (the Gluon front end's)."""
    return (isinstance(stmt, cst.ClassDef) and stmt.name.value == "GluonAdam" and len(stmt.bases) == 1
            and ctx.qualname(stmt.bases[0].value) in ("torch.optim.Adam", "torch.optim.adam.Adam"))


def optimizer_qual(ctx: FileContext, func: cst.CSTNode) -> Optional[str]:
    """The qualified name of an optimizer class called as ``func``: torch.optim's through
    the imports, or GLUON_ADAM for the file's own GluonAdam."""
    qual = ctx.qualname(func)
    if qual is None and isinstance(func, cst.Name) and func.value == "GluonAdam":
        if any(is_gluon_adam_class(stmt, ctx) for stmt in ctx.module.body):
            return GLUON_ADAM
        if any(isinstance(stmt, cst.FunctionDef) and stmt.name.value == "gluon_adam" for stmt in ctx.module.body):
            return GLUON_ADAM  # the class is already replaced by its optax form (same pass)
    return qual

SCHEDULERS = {
    "StepLR": Sig.parse("optimizer, step_size, gamma, last_epoch, verbose"),
    "MultiStepLR": Sig.parse("optimizer, milestones, gamma, last_epoch, verbose"),
    "ExponentialLR": Sig.parse("optimizer, gamma, last_epoch, verbose"),
    "CosineAnnealingLR": Sig.parse("optimizer, T_max, eta_min, last_epoch, verbose"),
    "OneCycleLR": Sig.parse("optimizer, max_lr, total_steps, epochs, steps_per_epoch, pct_start, anneal_strategy, cycle_momentum, "
                            "base_momentum, max_momentum, div_factor, final_div_factor, three_phase, last_epoch, verbose"),
    "LambdaLR": Sig.parse("optimizer, lr_lambda, last_epoch, verbose"),
    "MultiplicativeLR": Sig.parse("optimizer, lr_lambda, last_epoch, verbose"),
    "LinearLR": Sig.parse("optimizer, start_factor, end_factor, total_iters, last_epoch, verbose"),
    "ConstantLR": Sig.parse("optimizer, factor, total_iters, last_epoch, verbose"),
    "PolynomialLR": Sig.parse("optimizer, total_iters, power, last_epoch, verbose"),
    "CosineAnnealingWarmRestarts": Sig.parse("optimizer, T_0, T_mult, eta_min, last_epoch, verbose"),
    "CyclicLR": Sig.parse("optimizer, base_lr, max_lr, step_size_up, step_size_down, mode, gamma, scale_fn, scale_mode, "
                          "cycle_momentum, base_momentum, max_momentum, last_epoch, verbose"),
    "SequentialLR": Sig.parse("optimizer, schedulers, milestones, last_epoch, verbose"),
}
SCHEDULER_PREFIX = "torch.optim.lr_scheduler."


def is_scheduler(qual: Optional[str]) -> bool:
    return bool(qual) and qual.startswith(SCHEDULER_PREFIX)


# --------------------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------------------
def unported_reason(qual: Optional[str]) -> Optional[str]:
    """Why the torch.optim optimizer class ``qual`` is not ported, or None when it is not one."""
    if not qual or not qual.startswith("torch.optim.") or qual in OPTIMIZERS or is_scheduler(qual):
        return None
    short = qual.rsplit(".", 1)[1]
    if short in UNPORTED:
        return UNPORTED[short]
    if short[:1].isupper() and short not in ("Optimizer",):
        return f"torch.optim.{short} has no optax counterpart porter knows"
    return None


def _flag(b: Bound, name: str, default=False):
    if not b.has(name):
        return default
    v = b.lit(name)
    if v is NOT_LITERAL:
        raise Manual(f"{name}= is not a literal")
    return v


def model_of(params: cst.CSTNode) -> str:
    """``model.parameters()`` (or ``list(model.parameters())``) -> "model"."""
    node = params
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "list" and len(node.args) == 1:
        node = node.args[0].value
    if isinstance(node, cst.Call) and astutil.method_name(node) == "parameters" and not node.args:
        return code(node.func.value)  # type: ignore[attr-defined]
    raise Manual("the parameters are not `model.parameters()`: parameter groups, filters and lists of tensors need "
                 "an optax.multi_transform / a wrt= filter written by hand")


def _adam_moments(b) -> list[str]:
    """Adam's `betas` and `eps` as optax keyword arguments (b1, b2, eps)."""
    parts = []
    if b.has("betas"):
        betas = b.node("betas")
        els = betas.elements if isinstance(betas, (cst.Tuple, cst.List)) else ()
        if len(els) == 2 and not any(isinstance(e, cst.StarredElement) for e in els):
            # (0.9, 0.999) or (args.beta1, 0.999): each element is its own argument
            parts += [f"b1={code(els[0].value)}", f"b2={code(els[1].value)}"]
        else:
            parts += [f"b1={atom(betas)}[0]", f"b2={atom(betas)}[1]"]
    if b.has("eps"):
        parts.append(f"eps={b['eps']}")
    return parts


def transformation(qual: str, b: Bound, lr: str, scheduled: bool = False, momentum: Optional[str] = None) -> str:
    """The optax transformation of a torch optimizer call, with ``lr`` as learning rate;
    ``momentum``: a schedule of SGD's momentum / Adam's beta1 (a scheduler that cycles it)."""
    for k in _IGNORED:
        b.args.pop(k, None)
    if _flag(b, "maximize"):
        raise Manual("maximize=True: negate the loss instead")
    O = b.optax
    kind = qual.rsplit(".", 1)[1]
    wd = b.get("weight_decay") if b.has("weight_decay") and b.lit("weight_decay") not in (0, 0.0) else None
    parts = [lr]
    if momentum is not None:
        return _cycled_momentum(kind, b, lr, momentum, wd)
    if kind == "SGD":
        if b.has("dampening") and b.lit("dampening") not in (0, 0.0):
            raise Manual("SGD dampening != 0 has no optax counterpart")
        if b.has("momentum") and b.lit("momentum") not in (0, 0.0):
            parts.append(f"momentum={b['momentum']}")
        if _flag(b, "nesterov"):
            parts.append("nesterov=True")
        tx = f"{O}.sgd({', '.join(parts)})"
    elif kind in ("Adam", "AdamW"):
        if _flag(b, "amsgrad"):
            raise Manual("amsgrad=True: torch keeps the maximum of the second moment, which optax.amsgrad does not match exactly")
        parts += _adam_moments(b)
        decoupled = kind == "AdamW" or _flag(b, "decoupled_weight_decay")
        if decoupled:
            parts.append(f"weight_decay={b.get('weight_decay', '0.01') if kind == 'AdamW' else wd or '0.0'}")
            return f"{O}.adamw({', '.join(parts)})"
        tx = f"{O}.adam({', '.join(parts)})"
    elif kind == "GluonAdam":
        parts += _adam_moments(b)
        if wd is not None:
            parts.append(f"weight_decay={wd}")  # MXNet's wd: coupled, inside the transformation
        return f"gluon_adam({', '.join(parts)})"
    elif kind == "RMSprop" and scheduled and b.has("momentum") and b.lit("momentum") not in (0, 0.0):
        # optax.rmsprop scales by the learning rate BEFORE its momentum trace; torch keeps the
        # momentum of unscaled steps and multiplies by the current learning rate after it. Equal
        # for a constant rate, not under a schedule: spell torch's order out.
        scale = "scale_by_stddev" if _flag(b, "centered") else "scale_by_rms"
        tx = (f"{O}.chain({O}.{scale}(decay={b.get('alpha', '0.99')}, eps={b.get('eps', '1e-08')}, eps_in_sqrt=False), "
              f"{O}.trace(decay={b['momentum']}), {O}.scale_by_learning_rate({lr}))")
    elif kind == "RMSprop":
        parts.append(f"decay={b.get('alpha', '0.99')}")
        parts.append(f"eps={b.get('eps', '1e-08')}")
        parts.append("eps_in_sqrt=False")
        if _flag(b, "centered"):
            parts.append("centered=True")
        if b.has("momentum") and b.lit("momentum") not in (0, 0.0):
            parts.append(f"momentum={b['momentum']}")
        tx = f"{O}.rmsprop({', '.join(parts)})"
    elif kind == "Adadelta":
        parts += [f"rho={b.get('rho', '0.9')}", f"eps={b.get('eps', '1e-06')}"]
        tx = f"{O}.adadelta({', '.join(parts)})"  # optax's update: torch's, eps inside both square roots
    elif kind == "Adamax":
        parts += _adam_moments(b)
        tx = f"{O}.adamax({', '.join(parts)})"  # max(b2 * u, |g| + eps), as torch
    elif kind == "Adagrad":
        # optax.adagrad adds eps inside the square root and starts the sum at 0.1: torch's own
        parts += [f"lr_decay={b['lr_decay']}"] if b.has("lr_decay") and b.lit("lr_decay") not in (0, 0.0) else []
        parts += [f"initial_accumulator_value={b['initial_accumulator_value']}"] \
            if b.has("initial_accumulator_value") and b.lit("initial_accumulator_value") not in (0, 0.0) else []
        parts += [f"eps={b['eps']}"] if b.has("eps") else []
        tx = f"torch_adagrad({', '.join(parts)})"
    elif kind in ("NAdam", "RAdam"):
        if _flag(b, "decoupled_weight_decay") and wd is not None:
            raise Manual("decoupled_weight_decay=True is not ported")
        parts += _adam_moments(b)
        if kind == "NAdam" and b.has("momentum_decay"):
            parts.append(f"momentum_decay={b['momentum_decay']}")
        tx = f"torch_{kind.lower()}({', '.join(parts)})"
    elif kind == "ASGD":
        if scheduled:
            raise Manual("ASGD under an LR scheduler: torch computes the next step size from the rate after the "
                         "scheduler's change, one step late; port by hand")
        lambd, alpha = b.get("lambd", "0.0001"), b.get("alpha", "0.75")
        # torch: eta_t = lr / (1 + lambd * lr * (t - 1)) ** alpha; w -= eta_t * (g + weight_decay * w + lambd * w)
        # (the averaged parameters `ax` only matter to code that reads optimizer.state)
        tx = f"{O}.sgd(lambda count: {atom(cst.parse_expression(lr))} / (1 + {atom(cst.parse_expression(lambd))} * {atom(cst.parse_expression(lr))} * count) ** {atom(cst.parse_expression(alpha))})"
        decay = lambd if wd is None else f"{atom(cst.parse_expression(lambd))} + {atom(cst.parse_expression(wd))}"
        return f"{O}.chain({O}.add_decayed_weights({decay}), {tx})"
    elif kind == "Rprop":
        if scheduled:
            raise Manual("Rprop under an LR scheduler: torch reads the rate once, as the initial step size")
        etas, sizes = b.lit("etas", (0.5, 1.2)), b.lit("step_sizes", (1e-06, 50))
        if not (isinstance(etas, (tuple, list)) and len(etas) == 2 and isinstance(sizes, (tuple, list)) and len(sizes) == 2):
            raise Manual("etas= / step_sizes= are not literal pairs")
        parts += [f"eta_minus={etas[0]!r}", f"eta_plus={etas[1]!r}", f"min_step_size={sizes[0]!r}", f"max_step_size={float(sizes[1])!r}"]
        tx = f"torch_rprop({', '.join(parts)})"
    else:  # pragma: no cover - OPTIMIZERS lists the kinds
        raise Manual(f"{kind} is not ported")
    if wd is not None:
        # torch's weight_decay for SGD/Adam/RMSprop is L2: added to the gradient before the update
        tx = f"{O}.chain({O}.add_decayed_weights({wd}), {tx})"
    return tx


def _cycled_momentum(kind: str, b: Bound, lr: str, momentum: str, wd: Optional[str]) -> str:
    """SGD / Adam / AdamW whose momentum (beta1) a scheduler cycles: optax.inject_hyperparams
    evaluates both schedules at the update count, as torch sets both before each step."""
    O = b.optax
    if kind == "SGD":
        if b.has("dampening") and b.lit("dampening") not in (0, 0.0):
            raise Manual("SGD dampening != 0 has no optax counterpart")
        nesterov = ", nesterov=True" if _flag(b, "nesterov") else ""
        tx = f"{O}.inject_hyperparams({O}.sgd, static_args=('nesterov',))(learning_rate={lr}, momentum={momentum}{nesterov})"
    elif kind in ("Adam", "AdamW"):
        if _flag(b, "amsgrad"):
            raise Manual("amsgrad=True: torch keeps the maximum of the second moment, which optax.amsgrad does not match exactly")
        rest = [p for p in _adam_moments(b) if not p.startswith("b1=")]
        decoupled = kind == "AdamW" or _flag(b, "decoupled_weight_decay")
        if decoupled:
            rest.append(f"weight_decay={b.get('weight_decay', '0.01') if kind == 'AdamW' else wd or '0.0'}")
        name = "adamw" if decoupled else "adam"
        tx = f"{O}.inject_hyperparams({O}.{name})(learning_rate={lr}, b1={momentum}{''.join(', ' + p for p in rest)})"
        if decoupled:
            return tx
    else:
        raise Manual(f"the scheduler cycles the momentum of {kind}, which porter does not port; pass cycle_momentum=False")
    if wd is not None:
        tx = f"{O}.chain({O}.add_decayed_weights({wd}), {tx})"
    return tx


# --------------------------------------------------------------------------------------
# Schedulers
# --------------------------------------------------------------------------------------
def schedule(kind: str, b: Bound, lr: str) -> tuple[str, bool]:
    """(the schedule expression, counted in scheduler steps; whether torch steps it per batch)."""
    O, j = b.optax, None
    if b.has("last_epoch") and b.lit("last_epoch") != -1:
        raise Manual("last_epoch= (resuming a schedule) is not ported")
    if kind == "StepLR":
        gamma = b.get("gamma", "0.1")
        return f"{O}.exponential_decay({lr}, transition_steps={b['step_size']}, decay_rate={gamma}, staircase=True)", False
    if kind == "ExponentialLR":
        return f"{O}.exponential_decay({lr}, transition_steps=1, decay_rate={b['gamma']})", False
    if kind == "MultiStepLR":
        gamma = b.get("gamma", "0.1")
        ms = b.lit("milestones")
        if isinstance(ms, (list, tuple)) and all(isinstance(m, int) for m in ms):
            if len(set(ms)) != len(ms):
                raise Manual("repeated milestones")
            scales = ", ".join(f"{m}: {gamma}" for m in ms)
            return f"{O}.piecewise_constant_schedule({lr}, {{{scales}}})", False
        return f"{O}.piecewise_constant_schedule({lr}, {{m: {gamma} for m in {b['milestones']}}})", False
    if kind == "CosineAnnealingLR":
        jnp = b.jnp
        t_max = b.atom("T_max")
        if b.has("eta_min") and b.lit("eta_min") not in (0, 0.0):
            eta = b.atom("eta_min")
            return f"lambda epoch: {eta} + ({lr} - {eta}) * (1 + {jnp}.cos({jnp}.pi * epoch / {t_max})) / 2", False
        return f"lambda epoch: {atom(cst.parse_expression(lr))} * (1 + {jnp}.cos({jnp}.pi * epoch / {t_max})) / 2", False
    if kind == "OneCycleLR":
        return f"lambda step: {_one_cycle(b, 'lr')}", True
    if kind == "LinearLR":
        jnp, lr_a = b.jnp, atom(cst.parse_expression(lr))
        start = b.atom("start_factor") if b.has("start_factor") else "(1.0 / 3)"
        end = b.atom("end_factor") if b.has("end_factor") else "1.0"
        total = b.atom("total_iters") if b.has("total_iters") else "5"
        return f"lambda epoch: {lr_a} * ({start} + ({end} - {start}) * {jnp}.minimum(epoch, {total}) / {total})", False
    if kind == "ConstantLR":
        jnp, lr_a = b.jnp, atom(cst.parse_expression(lr))
        factor = b.atom("factor") if b.has("factor") else "(1.0 / 3)"
        total = b.atom("total_iters") if b.has("total_iters") else "5"
        return f"lambda epoch: {lr_a} * {jnp}.where(epoch < {total}, {factor}, 1.0)", False
    if kind == "PolynomialLR":
        jnp, lr_a = b.jnp, atom(cst.parse_expression(lr))
        total = b.atom("total_iters") if b.has("total_iters") else "5"
        power = b.atom("power") if b.has("power") else "1.0"
        return f"lambda epoch: {lr_a} * (1.0 - {jnp}.minimum(epoch, {total}) / {total}) ** {power}", False
    if kind == "CosineAnnealingWarmRestarts":
        jnp, lr_a = b.jnp, atom(cst.parse_expression(lr))
        t0 = b.atom("T_0")
        mult = b.lit("T_mult", 1)
        if not isinstance(mult, int) or mult < 1:
            raise Manual("T_mult= is not a literal integer >= 1")
        eta = b.atom("eta_min") if b.has("eta_min") and b.lit("eta_min") not in (0, 0.0) else None
        if mult == 1:
            t_cur, t_i = f"(epoch % {t0})", t0
        else:
            # the restarts so far: the k with T_0 * (T_mult^k - 1) / (T_mult - 1) <= epoch (counted, not a log)
            n = f"{jnp}.sum(epoch >= {t0} * ({mult} ** {jnp}.arange(1.0, 40.0) - 1) // {mult - 1})"
            t_cur, t_i = f"(epoch - {t0} * ({mult} ** {n} - 1) // {mult - 1})", f"({t0} * {mult} ** {n})"
        cos = f"(1 + {jnp}.cos({jnp}.pi * {t_cur} / {t_i})) / 2"
        if eta is None:
            return f"lambda epoch: {lr_a} * {cos}", False
        return f"lambda epoch: {eta} + ({lr_a} - {eta}) * {cos}", False
    if kind == "CyclicLR":
        return f"lambda step: {_cyclic(b, 'lr')}", True
    if kind == "MultiplicativeLR":
        # torch multiplies the rate by f(epoch) at each step: lr * f(1) * ... * f(epoch); a
        # factor that does not depend on the epoch makes that lr * factor ** epoch
        f = b.node("lr_lambda")
        if isinstance(f, cst.Lambda) and len(f.params.params) == 1 and not f.params.kwonly_params \
                and f.params.star_arg in (cst.MaybeSentinel.DEFAULT, None) and f.params.star_kwarg is None:
            step_name = f.params.params[0].name.value
            if not any(isinstance(n, cst.Name) and n.value == step_name for n in astutil.walk(f.body, into_functions=True)):
                lr_a = atom(cst.parse_expression(lr))
                return f"lambda epoch: {lr_a} * {atom(f.body)} ** epoch", False
        raise Manual("MultiplicativeLR with a factor that depends on the epoch (or is not a lambda): the product of "
                     "its factors over the steps needs a hand port (optax.piecewise_constant_schedule for known steps)")
    raise Manual(f"{kind} is not ported (porter ports {', '.join(SCHEDULERS)})")


# the schedulers SequentialLR restarts exactly: torch calls `scheduler.step(0)` at a milestone,
# which sets the closed form at epoch 0 (the base rate); optax.join_schedules hands the next
# schedule `step - milestone`, the same restart
_RESTARTABLE = ("StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR", "ConstantLR", "PolynomialLR")


def _sequential(ctx: FileContext, p: "Plan", b: Bound, lr: str) -> str:
    """SequentialLR(optimizer, schedulers=[...], milestones=[...]) -> optax.join_schedules."""
    parts = b.node("schedulers")
    if not isinstance(parts, (cst.List, cst.Tuple)) or any(e.star for e in parts.elements if hasattr(e, "star")):
        raise Manual("SequentialLR's schedulers= is not a literal list")
    milestones = b.lit("milestones")
    if not (isinstance(milestones, (list, tuple)) and all(isinstance(m, int) and not isinstance(m, bool) for m in milestones)
            and list(milestones) == sorted(set(milestones)) and len(milestones) == len(parts.elements) - 1):
        raise Manual("SequentialLR's milestones= is not a literal increasing list of integers, one fewer than the schedulers")
    exprs = []
    for element in parts.elements:
        node = element.value
        if isinstance(node, cst.Name) and node.value in p.sub_schedulers:
            node = p.sub_schedulers[node.value][1]
        q = ctx.qualname(node.func) if isinstance(node, cst.Call) else None
        if not is_scheduler(q):
            raise Manual(f"SequentialLR's scheduler {code(element.value)} is not a scheduler built in this file")
        kind = q.rsplit(".", 1)[1]
        if kind not in _RESTARTABLE:
            raise Manual(f"SequentialLR restarts {kind} with step(0), which has no closed form to restart from: "
                         f"porter joins only {', '.join(_RESTARTABLE)}")
        first = astutil.arg(node, "optimizer", 0)
        if first is None or code(first.value) != p.target:
            raise Manual(f"SequentialLR's scheduler {code(element.value)} is built on another optimizer")
        sub = bind(node, SCHEDULERS[kind], ctx)
        expr, _per_batch = schedule(kind, sub, lr)
        b.used |= sub.used
        exprs.append(expr)
    return f"{b.optax}.join_schedules([{', '.join(exprs)}], [{', '.join(str(m) for m in milestones)}])"


def _one_cycle(b: Bound, what: str) -> str:
    """OneCycleLR's learning rate (``what`` "lr") or momentum ("momentum") at ``step``, torch's
    phases: warm-up to max_lr over pct_start * total_steps - 1 steps, annealing to
    max_lr / div_factor / final_div_factor at total_steps - 1 (three_phase: back to the initial
    rate at 2 * pct_start * total_steps - 2 first); the momentum runs opposite, max_momentum ->
    base_momentum -> max_momentum."""
    jnp = b.jnp
    if b.has("anneal_strategy") and b.lit("anneal_strategy") not in ("cos", "linear"):
        raise Manual("anneal_strategy= is not a literal 'cos' or 'linear'")
    linear = b.has("anneal_strategy") and b.lit("anneal_strategy") == "linear"
    three = _flag(b, "three_phase")
    if b.has("total_steps"):
        total = b.atom("total_steps")
    elif b.has("epochs") and b.has("steps_per_epoch"):
        total = f"({b.atom('epochs')} * {b.atom('steps_per_epoch')})"
    else:
        raise Manual("OneCycleLR needs total_steps= or epochs= and steps_per_epoch=")
    for name in ("max_lr", "base_momentum", "max_momentum"):
        if b.has(name) and isinstance(b.lit(name), (list, tuple)):
            raise Manual(f"{name}= per parameter group is not ported")
    pct = b.atom("pct_start") if b.has("pct_start") else "0.3"
    if what == "lr":
        hi = b.atom("max_lr")
        lo = f"{hi} / {b.atom('div_factor') if b.has('div_factor') else '25.0'}"
        low = f"{lo} / {b.atom('final_div_factor') if b.has('final_div_factor') else '1e4'}"
        values = [(lo, hi), (hi, lo), (lo, low)] if three else [(lo, hi), (hi, low)]
    else:
        m_lo = b.atom("base_momentum") if b.has("base_momentum") else "0.85"
        m_hi = b.atom("max_momentum") if b.has("max_momentum") else "0.95"
        values = [(m_hi, m_lo), (m_lo, m_hi), (m_hi, m_hi)] if three else [(m_hi, m_lo), (m_lo, m_hi)]
    ends = [f"({pct} * {total} - 1)", f"(2 * {pct} * {total} - 2)", f"({total} - 1)"] if three \
        else [f"({pct} * {total} - 1)", f"({total} - 1)"]

    def anneal(start: str, end: str, begin: str, stop: str) -> str:
        frac = f"(step - {begin}) / ({stop} - {begin})" if begin != "0" else f"step / {stop}"
        if linear:
            return f"({end} - {start}) * {frac} + {start}"
        return f"{end} + ({start} - {end}) / 2 * ({jnp}.cos({jnp}.pi * {frac}) + 1)"

    begins = ["0", *ends[:-1]]
    expr = anneal(*values[-1], begins[-1], ends[-1])
    for i in range(len(values) - 2, -1, -1):
        expr = f"{jnp}.where(step <= {ends[i]}, {anneal(*values[i], begins[i], ends[i])}, {expr})"
    return expr


def _cyclic(b: Bound, what: str) -> str:
    """CyclicLR's learning rate (``what`` "lr") or momentum ("momentum") at ``step`` (torch:
    triangular cycles of step_size_up + step_size_down steps between base_lr and max_lr,
    scaled by mode's function of the cycle, or exp_range's gamma ** step; the momentum runs
    from max_momentum down to base_momentum and back)."""
    jnp = b.jnp
    if b.has("scale_fn") and b.lit("scale_fn") is not None:
        raise Manual("CyclicLR scale_fn= (a function of the cycle) is not ported")
    mode = b.lit("mode", "triangular")
    if mode not in ("triangular", "triangular2", "exp_range"):
        raise Manual("CyclicLR mode= is not a literal 'triangular', 'triangular2' or 'exp_range'")
    if b.has("scale_mode") and b.lit("scale_mode") != ("iterations" if mode == "exp_range" else "cycle"):
        raise Manual("CyclicLR scale_mode= other than the mode's own is not ported")
    for name in ("base_lr", "max_lr", "base_momentum", "max_momentum"):
        if b.has(name) and isinstance(b.lit(name), (list, tuple)):
            raise Manual(f"{name}= per parameter group is not ported")
    up = b.atom("step_size_up") if b.has("step_size_up") else "2000"
    down = b.atom("step_size_down") if b.has("step_size_down") and b.lit("step_size_down") is not None else up
    total = f"({up} + {down})"
    cycle = f"{jnp}.floor(1 + step / {total})"
    x = f"(1.0 + step / {total} - {cycle})"
    ratio = f"({up} / {total})"
    scale = f"{jnp}.where({x} <= {ratio}, {x} / {ratio}, ({x} - 1) / ({ratio} - 1))"
    if mode == "triangular":
        fn = "1.0"
    elif mode == "triangular2":
        fn = f"1 / (2.0 ** ({cycle} - 1))"
    else:
        fn = f"{b.atom('gamma') if b.has('gamma') else '1.0'} ** step"
    times = "" if fn == "1.0" else f" * {fn}"
    if what == "lr":
        lo, hi = b.atom("base_lr"), b.atom("max_lr")
        return f"{lo} + ({hi} - {lo}) * {scale}{times}"
    m_lo = b.atom("base_momentum") if b.has("base_momentum") else "0.8"
    m_hi = b.atom("max_momentum") if b.has("max_momentum") else "0.9"
    return f"{m_hi} - ({m_hi} - {m_lo}) * {scale}{times}"


def momentum_schedule(kind: str, b: Bound) -> Optional[str]:
    """The momentum schedule (a lambda of the scheduler's steps) of a scheduler that cycles
    the optimizer's momentum (OneCycleLR, CyclicLR with cycle_momentum=True, torch's
    default), else None."""
    if kind not in ("OneCycleLR", "CyclicLR") or _flag(b, "cycle_momentum", True) is False:
        return None
    return f"lambda step: {_one_cycle(b, 'momentum') if kind == 'OneCycleLR' else _cyclic(b, 'momentum')}"


# --------------------------------------------------------------------------------------
# LambdaLR: the user's function of the step, made traceable
# --------------------------------------------------------------------------------------
_MATH = {"cos", "sin", "exp", "log", "sqrt", "tanh", "floor", "ceil", "log2", "log10", "pow"}


class _Traceable(cst.CSTTransformer):
    """Rewrites an expression of the step so that it also runs on a traced step count (optax
    calls a schedule inside the jitted update): ``min``/``max`` of two values ->
    ``jnp.minimum``/``jnp.maximum``, ``a if c else b`` -> ``jnp.where(c, a, b)``, ``math.f``
    -> ``jnp.f``. Raises Manual for what reads the step on the host (``int(step)``, ``and``/
    ``or``/``not`` on it) or anything else porter cannot judge (calls of other functions of
    the step)."""

    def __init__(self, ctx: FileContext, jnp: str, dependent: set[str]) -> None:
        super().__init__()
        self.ctx, self.jnp, self.dependent = ctx, jnp, dependent

    def _depends(self, node: cst.CSTNode) -> bool:
        return any(isinstance(n, cst.Name) and n.value in self.dependent for n in astutil.walk(node, into_functions=True))

    def leave_IfExp(self, original, updated):
        return cst.parse_expression(f"{self.jnp}.where(_c, _a, _b)").with_changes(args=[
            cst.Arg(updated.test, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(updated.body, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(updated.orelse)])

    def leave_BooleanOperation(self, original, updated):
        if self._depends(original):
            raise Manual("the LambdaLR function combines conditions on the step with and/or: optax evaluates the "
                         "schedule on a traced step; write it with jnp.logical_and / jnp.where")
        return updated

    def leave_UnaryOperation(self, original, updated):
        if isinstance(original.operator, cst.Not) and self._depends(original):
            raise Manual("the LambdaLR function uses `not` on the step: write it with jnp.logical_not")
        return updated

    def leave_Call(self, original, updated):
        f = original.func
        qual = self.ctx.qualname(f) or ""
        if isinstance(f, cst.Name) and f.value in ("min", "max") and f.value not in self.dependent:
            if len(original.args) != 2 or any(a.keyword or a.star for a in original.args):
                raise Manual(f"{f.value}() of other than two values in the LambdaLR function: write it with jnp by hand")
            new = "minimum" if f.value == "min" else "maximum"
            return updated.with_changes(func=cst.parse_expression(f"{self.jnp}.{new}"))
        if qual.startswith("math.") and qual[5:] in _MATH:
            return updated.with_changes(func=cst.parse_expression(f"{self.jnp}.{qual[5:]}"))
        if not self._depends(original):
            return updated  # computed from other values: runs as written
        if qual.startswith(("jax.", "optax.")) or (isinstance(f, cst.Name) and f.value in ("abs",)):
            return updated
        raise Manual(f"the LambdaLR function calls {code(f)}() on the step: optax evaluates the schedule on a traced "
                     "step count, where porter cannot tell whether that call works")


def _traceable_expr(node: cst.BaseExpression, ctx: FileContext, jnp: str, dependent: set[str]) -> cst.BaseExpression:
    return node.visit(_Traceable(ctx, jnp, dependent))


def _where(jnp: str, test, a, b, indent: str) -> cst.BaseExpression:
    """``jnp.where(test, a, b)``, one argument a line (the body of a def at ``indent``)."""
    inner = indent + "    "
    lines = [f"{jnp}.where("] + [f"{inner}{code(x)}," for x in (test, a, b)] + [f"{indent})"]
    return cst.parse_expression("\n".join(lines))


def _traceable_body(func: cst.FunctionDef, ctx: FileContext, jnp: str) -> cst.FunctionDef:
    """The def with its body as one ``return`` (plus the assignments before it): ``if c:
    return a`` ... ``return b`` -> ``return jnp.where(c, a, b)``."""
    step = func.params.params[0].name.value
    dependent = {step}
    indent = ""  # continuation lines in parentheses are indented relative to the statement
    kept: list[cst.BaseStatement] = []
    body = list(func.body.body)
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) \
            and isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        kept.append(body.pop(0))  # the docstring

    def chain(stmts: list) -> cst.BaseExpression:
        for i, st in enumerate(stmts):
            if isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1:
                small = st.body[0]
                if isinstance(small, cst.Return) and small.value is not None:
                    return _traceable_expr(small.value, ctx, jnp, dependent)
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                    value = _traceable_expr(small.value, ctx, jnp, dependent)
                    if any(isinstance(n, cst.Name) and n.value in dependent for n in astutil.walk(small.value, into_functions=True)):
                        dependent.add(small.targets[0].target.value)
                    kept.append(st.with_changes(body=[small.with_changes(value=value)]))
                    continue
            if isinstance(st, cst.If):
                then = list(st.body.body)
                if not (len(then) == 1 and isinstance(then[0], cst.SimpleStatementLine) and len(then[0].body) == 1
                        and isinstance(then[0].body[0], cst.Return) and then[0].body[0].value is not None):
                    raise Manual("the LambdaLR function has an `if` whose body is more than a `return`: write the "
                                 "schedule with jnp.where by hand")
                a = _traceable_expr(then[0].body[0].value, ctx, jnp, dependent)
                test = _traceable_expr(st.test, ctx, jnp, dependent)
                if st.orelse is None:
                    rest = chain(stmts[i + 1:])
                elif isinstance(st.orelse, cst.If):
                    rest = chain([st.orelse, *stmts[i + 1:]])
                else:
                    rest = chain([*st.orelse.body.body, *stmts[i + 1:]])
                return _where(jnp, test, a, rest, indent)
            raise Manual(f"the LambdaLR function has a statement porter does not make traceable ({code(st).strip().splitlines()[0]}): "
                         "write the schedule with jnp by hand")
        raise Manual("the LambdaLR function does not end in a `return`")

    result = chain(body)
    ret = cst.SimpleStatementLine([cst.Return(result)])
    return func.with_changes(body=func.body.with_changes(body=[*kept, ret]))


def lambda_schedule(ctx: FileContext, b: Bound, lr: str, where: cst.CSTNode) -> tuple[str, Optional[tuple]]:
    """LambdaLR(optimizer, f): the schedule ``lambda step: lr * f(step)`` (torch multiplies the
    optimizer's initial rate by f of the number of scheduler steps), and the edit that makes
    ``f`` traceable: (the def, its new version) when f is a function of the file, else None."""
    if b.has("last_epoch") and b.lit("last_epoch") != -1:
        raise Manual("last_epoch= (resuming a schedule) is not ported")
    f = b.node("lr_lambda")
    jnp = b.jnp
    lr_atom = atom(cst.parse_expression(lr))
    if isinstance(f, cst.Lambda):
        params = f.params.params
        if len(params) != 1 or f.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) or f.params.kwonly_params:
            raise Manual("the LambdaLR lambda does not take exactly the step")
        body = _traceable_expr(f.body, ctx, jnp, {params[0].name.value})
        return f"lambda {params[0].name.value}: {lr_atom} * {atom(body)}", None
    if isinstance(f, cst.Name):
        func = _local_def(ctx, f.value, where)
        if func is None:
            raise Manual(f"porter cannot see the definition of {f.value} (a def of the file, in the scheduler's scope)")
        if len(func.params.params) != 1 or func.params.kwonly_params or func.params.posonly_params \
                or func.params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) or func.params.star_kwarg is not None \
                or func.decorators:
            raise Manual(f"{f.value} does not take exactly the step")
        new = _traceable_body(func, ctx, jnp)
        return f"lambda step: {lr_atom} * {f.value}(step)", (func, new)
    raise Manual("the LambdaLR function is neither a lambda nor a def of the file")


def _local_def(ctx: FileContext, name: str, where: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The def of ``name`` in the block holding ``where`` (a statement), else at module level."""
    for block in _blocks(ctx.module):
        body = list(block.body)
        if any(s is where for s in body):
            for s in body:
                if isinstance(s, cst.FunctionDef) and s.name.value == name:
                    return s
    for s in ctx.module.body:
        if isinstance(s, cst.FunctionDef) and s.name.value == name:
            return s
    return None


# --------------------------------------------------------------------------------------
# The file's optimizers and their schedulers
# --------------------------------------------------------------------------------------
@dataclass
class Plan:
    stmt: cst.SimpleStatementLine  # the optimizer's statement
    call: cst.Call
    qual: str
    target: str  # the optimizer's name (`optimizer`, `self.opt`)
    block: Optional[cst.CSTNode]  # the statements' block
    scheduler_stmt: Optional[cst.SimpleStatementLine] = None
    scheduler_call: Optional[cst.Call] = None
    scheduler_target: Optional[str] = None
    scheduler_error: Optional[str] = None  # why the scheduler cannot be folded in
    lambda_edit: Optional[tuple] = None  # LambdaLR: (the user's def, its traceable version)
    scheduler_after: bool = False  # the scheduler's statement reads the optimizer (ReduceLROnPlateau)
    # SequentialLR's schedulers built in statements of their own: name -> (statement, call)
    sub_schedulers: dict = field(default_factory=dict)
    returned: bool = False  # `return torch.optim.X(...)`: the function's caller names it (target "")


def _assign_of(stmt: cst.CSTNode) -> Optional[tuple[str, cst.Call]]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        a = stmt.body[0]
        if len(a.targets) == 1 and isinstance(a.value, cst.Call):
            return code(a.targets[0].target), a.value
    return None


def _return_of(stmt: cst.CSTNode) -> Optional[cst.Call]:
    """``return <call>``, a statement of its own: the call."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Return) \
            and isinstance(stmt.body[0].value, cst.Call):
        return stmt.body[0].value
    return None


def _blocks(node: cst.CSTNode):
    """Every statement block (a module body, an indented block) under ``node``."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, (cst.Module, cst.IndentedBlock)):
            yield cur
        if isinstance(cur, (cst.BaseExpression,)):
            continue
        stack.extend(astutil.children(cur))


def plans(ctx: FileContext) -> list[Plan]:
    key = ("optax.plans",)
    if key in ctx.cache:
        return ctx.cache[key]
    out: list[Plan] = []
    for block in _blocks(ctx.module):
        body = list(block.body)
        for i, stmt in enumerate(body):
            got = _assign_of(stmt)
            returned = _return_of(stmt)
            if returned is not None:
                # `return torch.optim.AdamW(groups, ...)` (a configure_optimizers method, a
                # make_optimizer function): the optimizer has no name here, so no scheduler
                # of this block is its own and its caller names it
                got = ("", returned)
            if not got:
                continue
            target, call = got
            qual = optimizer_qual(ctx, call.func) or ""
            if qual not in OPTIMIZERS:
                continue
            plan = Plan(stmt, call, qual, target, block, returned=returned is not None)
            out.append(plan)
    # schedulers: attach each to its optimizer (same block, after it)
    found: dict[int, list] = {}
    for block in _blocks(ctx.module):
        for stmt in block.body:
            got = _assign_of(stmt)
            if not got:
                continue
            target, call = got
            qual = ctx.qualname(call.func) or ""
            if not is_scheduler(qual):
                continue
            first = astutil.arg(call, "optimizer", 0)
            owner = [p for p in out if first is not None and not p.returned and code(first.value) == p.target]
            if owner:
                found.setdefault(id(owner[0]), []).append((stmt, call, target, block, qual))
    for p in out:
        scheds = sorted(found.get(id(p), []), key=lambda o: list(o[3].body).index(o[0]))
        if not scheds:
            continue
        stmt, call, target, block, qual = scheds[-1]
        others = scheds[:-1]
        if others and not (qual.endswith(".SequentialLR") and {o[2] for o in others} <= set(_sequence_names(call))):
            stmt, call, target, block, qual = scheds[0]
            p.scheduler_error = "two schedulers on one optimizer (chained schedulers) are not ported"
        elif others:  # SequentialLR over schedulers built before it: they are its parts
            p.sub_schedulers = {o[2]: (o[0], o[1]) for o in others}
        p.scheduler_stmt, p.scheduler_call, p.scheduler_target = stmt, call, target
        if any(o[3] is not p.block for o in scheds) or any(
                list(block.body).index(o[0]) < list(block.body).index(p.stmt) for o in scheds if o[3] is block):
            p.scheduler_error = "the scheduler is built in another block than its optimizer"
    ctx.cache[key] = out
    return out


def _sequence_names(call: cst.Call) -> list[str]:
    """The names in SequentialLR's literal `schedulers=` list (inline constructors excluded)."""
    arg = astutil.arg(call, "schedulers", 1)
    if arg is None or not isinstance(arg.value, (cst.List, cst.Tuple)):
        return []
    return [e.value.value for e in arg.value.elements if isinstance(e.value, cst.Name)]


def scheduler_plan(ctx: FileContext, call: cst.Call) -> Optional[Plan]:
    """The plan whose scheduler ``call`` is, or is a part of (a SequentialLR's scheduler,
    inline or built in a statement of its own)."""
    for p in plans(ctx):
        if p.scheduler_call is call or any(c is call for _s, c in p.sub_schedulers.values()):
            return p
        if p.scheduler_call is not None and (ctx.qualname(p.scheduler_call.func) or "").endswith(".SequentialLR"):
            parts = astutil.arg(p.scheduler_call, "schedulers", 1)
            if parts is not None and isinstance(parts.value, (cst.List, cst.Tuple)) and any(
                    e.value is call for e in parts.value.elements):
                return p
    return None


def updates_per_step(ctx: FileContext, sched_target: str, optimizer_target: str) -> Optional[str]:
    """How many optimizer updates happen per ``scheduler.step()``: "1" when the scheduler is
    stepped in the loop that steps the optimizer, ``len(<loader>)`` when it is stepped in an
    outer loop around a loop over the loader (possibly in a function of the file it calls);
    None when porter cannot tell (also when the scheduler is never stepped)."""
    functions = {s.name.value: s for s in astutil.walk(ctx.module, into_functions=True) if isinstance(s, cst.FunctionDef)}
    optimizers = {optimizer_target} | {attr for _cls, attr in stored_by_constructors(ctx, optimizer_target)}
    answers = set()
    for loop, call in _sched_steps(ctx, sched_target):
        if loop is None:
            return None
        if _steps_optimizer(loop.body, optimizers):
            answers.add("1")
            continue
        found = None
        for inner in astutil.walk(loop.body, into_functions=False):
            if isinstance(inner, cst.For) and inner is not loop and _steps_optimizer(inner.body, optimizers):
                found = _length_of(inner.iter)
                break
            if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value in functions:
                fn = functions[inner.func.value]
                loader = _loader_in_function(fn, inner, optimizer_target)
                if loader is not None:
                    found = loader
                    break
        if found is None:
            return None
        answers.add(found)
    if len(answers) != 1:
        return None
    return answers.pop()


def _visible_at(ctx: FileContext, stmt: cst.CSTNode, length: str) -> bool:
    """The name that ``length`` (``len(train_loader)``, ``len(self.loader)``) reads is bound
    where ``stmt`` runs: a local or parameter of its function, a name of the module, or a name
    no function binds (an attribute of ``self`` only when the function assigns it)."""
    expr = cst.parse_expression(length)
    root = astutil.root_name(expr.args[0].value) if isinstance(expr, cst.Call) and expr.args else None
    if root is None:
        return False
    fn = next((f for f in astutil.walk(ctx.module, into_functions=True) if isinstance(f, cst.FunctionDef)
               and any(n is stmt for n in astutil.walk(f.body))), None)
    if root == "self":
        attr = code(expr.args[0].value)  # type: ignore[union-attr]
        return fn is not None and any(isinstance(n, cst.Assign) and any(code(t.target) == attr for t in n.targets)
                                      for n in astutil.walk(fn.body))
    if fn is not None and (root in astutil.function_locals(fn) or astutil.has_param(fn, root)):
        return True
    if root in astutil.top_level_names(ctx.module) or any(
            root in astutil.binds(s) for s in ctx.module.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))):
        return True
    # a name only another function binds (`def fit(self, loader)`) is not in scope here; one that
    # nothing in the file binds is the module's (a star import, a name the harness provides)
    return not any(isinstance(f, cst.FunctionDef) and f is not fn and (
        astutil.has_param(f, root) or root in astutil.function_locals(f))
        for f in astutil.walk(ctx.module, into_functions=True))


def _sched_steps(ctx: FileContext, target: str) -> list:
    """(innermost loop or None, call) for every ``<target>.step()`` of the module, and for every
    ``self.<attr>.step()`` in the methods of a class of the file whose constructor is given
    ``target`` and keeps it as ``self.<attr>`` (a trainer built with the scheduler)."""
    steps = module_fact(ctx, _step_calls)
    found = list(steps.get(target, []))
    for cls, attr in stored_by_constructors(ctx, target):
        inside = {id(n) for n in astutil.walk(cls, into_functions=True)}
        found += [(loop, call) for loop, call in steps.get(attr, []) if id(call) in inside]
    return found


def stored_by_constructors(ctx: FileContext, target: str) -> list:
    """(class, ``self.<attr>``) for each class of the file that a call passes the name
    ``target`` to (``Trainer(model, optimizer, scheduler)``, ``Trainer(sched=scheduler)``) and
    whose ``__init__`` keeps that parameter as ``self.<attr> = <parameter>``."""
    return [(cls, attr) for text, cls, attr in lp.constructor_stores(ctx) if text == target]


def stored_name(ctx: FileContext, attr: str) -> Optional[str]:
    """The name that ``attr`` (``self.scheduler``, read in a method of the class being visited)
    holds: the one name every constructor call of that class passes for the parameter its
    ``__init__`` keeps there (see stored_by_constructors); None otherwise."""
    cls = ctx.enclosing(cst.ClassDef)
    if cls is None:
        return None
    names = {text for text, c, a in lp.constructor_stores(ctx) if c is cls and a == attr}
    name = names.pop() if len(names) == 1 else None
    return name if name is not None and name.isidentifier() else None


def _step_calls(ctx: FileContext) -> dict:
    """Every ``X.step()`` call of the module by the code of ``X``: [(innermost loop or None,
    call)], in file order (one walk, however many optimizers and schedulers ask)."""
    out: dict[str, list] = {}

    def visit(node: cst.CSTNode, loop: Optional[cst.CSTNode]) -> None:
        if isinstance(node, cst.Call) and astutil.method_name(node) == "step":
            out.setdefault(code(node.func.value), []).append((loop, node))  # type: ignore[attr-defined]
        if isinstance(node, (cst.For, cst.While)):
            loop = node
        if isinstance(node, cst.FunctionDef) and loop is not None:
            loop = None
        for child in astutil.children(node):
            visit(child, loop)

    visit(ctx.module, None)
    return out


def _walk_same_loop(node: cst.CSTNode):
    """Nodes under ``node``, not entering nested loops or functions."""
    stack = list(astutil.children(node))
    while stack:
        cur = stack.pop()
        yield cur
        if isinstance(cur, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        stack.extend(astutil.children(cur))


def _steps_optimizer(body: cst.CSTNode, optimizers) -> bool:
    """The body (outside nested loops) steps an optimizer: ``opt.step()`` or ``scaler.step(opt)``
    (``optimizers``: the optimizer's name, or a set of the names it goes by)."""
    names = {optimizers} if isinstance(optimizers, str) else set(optimizers)
    for n in _walk_same_loop(body):
        if isinstance(n, cst.Call) and astutil.method_name(n) == "step":
            recv = code(n.func.value)  # type: ignore[attr-defined]
            if recv in names or "opt" in recv.rsplit(".", 1)[-1].lower():
                return True
            if n.args and code(n.args[0].value) in names:
                return True
    return False


def _loop_bodies(node: cst.CSTNode):
    for n in astutil.walk(node):
        if isinstance(n, cst.For):
            yield n


def _length_of(iterable: cst.CSTNode) -> Optional[str]:
    node = iterable
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("enumerate", "tqdm", "iter") and node.args:
        node = node.args[0].value
    if isinstance(node, (cst.Name, cst.Attribute)):
        return f"len({code(node)})"
    return None


def _loader_in_function(fn: cst.FunctionDef, call: cst.Call, optimizer_target: str) -> Optional[str]:
    """The call runs ``fn``, whose loop over one of its parameters steps an optimizer: the
    length of the argument the call passes for that parameter."""
    params = [p.name.value for p in fn.params.params]
    for loop in _loop_bodies(fn.body):
        if not _steps_optimizer(loop.body, optimizer_target):
            continue
        it = loop.iter
        while isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("enumerate", "tqdm") and it.args:
            it = it.args[0].value
        if isinstance(it, cst.Name) and it.value in params:
            idx = params.index(it.value)
            a = astutil.arg(call, it.value, idx)
            if a is not None and isinstance(a.value, (cst.Name, cst.Attribute)):
                return f"len({code(a.value)})"
        elif isinstance(it, (cst.Name, cst.Attribute)) and _root(it) not in params and _root(it) not in _locals(fn):
            return f"len({code(it)})"  # a loader of the module (`for x, y in trainloader:` in `def train(epoch)`)
        return None
    return None


def _root(node: cst.CSTNode) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _locals(fn: cst.FunctionDef) -> set:
    """Names the function binds by assignment or as loop targets (not its globals)."""
    out = set()
    for n in astutil.walk(fn.body):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                out |= {x.value for x in astutil.walk(t.target) if isinstance(x, cst.Name)}
        elif isinstance(n, (cst.For, cst.AugAssign, cst.AnnAssign)):
            out |= {x.value for x in astutil.walk(n.target) if isinstance(x, cst.Name)}
    return out


def fold(ctx: FileContext, p: Plan):
    """(scheduler statement text or None, optimizer statement text, modules) for a plan, or
    raises Manual with the reason the pair cannot be ported."""
    from ._ops_table import DROPPED  # noqa: F401  (bind drops placement arguments)

    first = astutil.arg(p.call, "params", 0)
    if first is None:
        raise Manual("the optimizer's parameters are not given")
    call = implementation_kwargs(p.call, p.block, p.stmt) or p.call
    groups = None
    try:
        model = model_of(first.value)
    except Manual:
        groups = decay_groups(ctx, call, p.block, p.stmt)
        if groups is None:
            raise
        model = groups.model
    spec = OPTIMIZERS[p.qual]
    b = bind(call, spec.sig, ctx)
    if groups is not None:
        if b.has("weight_decay"):
            raise Manual("weight_decay= both per parameter group and for the optimizer")
        if not p.returned and one_group_lr_written(ctx, p.target):
            raise Manual(f"the script sets the learning rate of one parameter group ({p.target}.param_groups[i]['lr'] = v) "
                         "and the port has one rate for both groups: set every group's rate "
                         f"(for g in {p.target}.param_groups: g['lr'] = v) if that is what is meant")
        if p.qual.endswith(".AdamW") or _flag(b, "decoupled_weight_decay"):
            b.args["weight_decay"] = groups.weight_decay
    lr = b["lr"] if b.has("lr") else spec.default_lr
    sched_text = None
    lr_arg = lr
    m_sched = m_arg = found = None
    used: set[str] = set()
    if p.scheduler_stmt is not None:
        if p.scheduler_error:
            raise Manual(p.scheduler_error)
        sq = ctx.qualname(p.scheduler_call.func) or ""
        kind = sq.rsplit(".", 1)[1]
        if kind == "ReduceLROnPlateau":
            return _plateau(ctx, p, b, lr, used)
        if kind not in SCHEDULERS:
            raise Manual(f"{kind} is not ported (porter ports {', '.join(SCHEDULERS)})")
        sb = bind(p.scheduler_call, SCHEDULERS[kind], ctx)
        if kind == "LambdaLR":
            expr, p.lambda_edit = lambda_schedule(ctx, sb, lr, p.scheduler_stmt)
        elif kind == "SequentialLR":
            expr = _sequential(ctx, p, sb, lr)
        else:
            expr, _per_batch = schedule(kind, sb, lr)
            m_sched = momentum_schedule(kind, sb)
        used |= sb.used
        if any(call.args for _loop, call in _sched_steps(ctx, p.scheduler_target)):
            raise Manual(f"{p.scheduler_target}.step(...) is given the epoch (or a metric): the schedule would follow "
                         "that value, not the update count")
        found = updates_per_step(ctx, p.scheduler_target, p.target)
        if found is not None and found != "1" and not _visible_at(ctx, p.stmt, found):
            # the loader is the method's or the function's that trains (`def fit(self, loader)`),
            # not in scope where the optimizer is built (`__init__`): counted as unknown
            found = None
        if found is None and kind not in ("LambdaLR", "SequentialLR") and m_sched is None:
            # stepped where porter cannot count the updates between two steps (a function
            # given the scheduler, a step under a phase's condition): the port's host-side
            # scheduler sets the rate at each step() as torch's does
            return _stepped_by_the_script(ctx, p, b, expr, used | sb.used)
        factor = found or "1"  # None: reported below, once the optimizer's own reasons are
        sched_text = f"{p.scheduler_target} = {expr}"
        lr_arg = p.scheduler_target if factor == "1" else f"lambda step: {p.scheduler_target}(step // {factor})"
        if m_sched is not None:
            m_arg = m_sched if factor == "1" else f"lambda step: ({m_sched})(step // {factor})"
    tx = transformation(p.qual, b, lr_arg, scheduled=sched_text is not None, momentum=m_arg)
    if groups is not None:
        tx = _masked_decay(ctx, b, tx, groups)
        used.add("jax")
    if sched_text is not None and found is None:
        raise Manual(f"porter cannot tell how many optimizer updates run per {p.scheduler_target}.step() "
                     "(optax counts updates): build the schedule by hand")
    used |= b.used
    maker = returned_optimizer_fn(ctx, p)
    if sched_text is None and ((not p.returned and lr_written(ctx, p.target)) or (
            maker is not None and (rate_set_by_callers(ctx, maker) or _rate_set_by_callers_here(ctx, maker)))):
        tx = inject_learning_rate(tx, ctx.module_alias("optax"))
        used.add("optax")
    nnx = ctx.module_alias("flax.nnx")
    used.add("flax.nnx")
    lhs = "return " if p.returned else f"{p.target} = "
    return sched_text, f"{lhs}{nnx}.Optimizer({model}, {tx}, wrt={nnx}.Param)", used


_PLATEAU = Sig.parse("optimizer, mode, factor, patience, threshold, threshold_mode, cooldown, min_lr, eps, verbose")


def _plateau(ctx: FileContext, p: Plan, b: Bound, lr: str, used: set):
    """ReduceLROnPlateau: the optimizer keeps its rate in optax.inject_hyperparams state and the
    scheduler becomes the port's host-side TorchReduceLROnPlateau on it (templates/
    jax_torch_optim.py.j2), built after the optimizer; ``scheduler.step(metric)`` stays."""
    sb = bind(p.scheduler_call, _PLATEAU, ctx)
    if sb.has("min_lr") and isinstance(sb.lit("min_lr"), (list, tuple)):
        raise Manual("min_lr= per parameter group is not ported")
    sb.args.pop("verbose", None)
    for _loop, call in _sched_steps(ctx, p.scheduler_target):
        if len(call.args) != 1 or call.args[0].keyword is not None:
            raise Manual(f"{p.scheduler_target}.step() is not given the metric alone")
    tx = inject_learning_rate(transformation(p.qual, b, lr), b.optax)
    used |= b.used | {"optax"}
    args = [p.target] + [f"{k}={bare(v)}" for k, v in sb.args.items() if k != "optimizer"]
    p.scheduler_after = True
    nnx = ctx.module_alias("flax.nnx")
    used.add("flax.nnx")
    return (f"{p.scheduler_target} = TorchReduceLROnPlateau({', '.join(args)})",
            f"{p.target} = {nnx}.Optimizer({model_of(astutil.arg(p.call, 'params', 0).value)}, {tx}, wrt={nnx}.Param)", used)


def _stepped_by_the_script(ctx: FileContext, p: Plan, b: Bound, expr: str, used: set):
    """A scheduler whose steps porter cannot relate to the optimizer's updates: the optimizer
    keeps its rate in optax.inject_hyperparams state and the scheduler becomes the port's
    host-side TorchLRScheduler on it with the schedule in scheduler steps (templates/
    jax_torch_optim.py.j2), built after the optimizer; ``scheduler.step()`` stays."""
    # the rate changes between updates: the optimizer's update in torch's order under a schedule
    tx = inject_learning_rate(transformation(p.qual, b, b["lr"] if b.has("lr") else OPTIMIZERS[p.qual].default_lr,
                                             scheduled=True), b.optax)
    used |= b.used | {"optax"}
    p.scheduler_after = True
    nnx = ctx.module_alias("flax.nnx")
    used.add("flax.nnx")
    return (f"{p.scheduler_target} = TorchLRScheduler({p.target}, {expr})",
            f"{p.target} = {nnx}.Optimizer({model_of(astutil.arg(p.call, 'params', 0).value)}, {tx}, wrt={nnx}.Param)", used)


def folded_schedules(ctx: FileContext) -> frozenset:
    """Names assigned an optax schedule (an ``optax.*`` call or a lambda) that an
    ``nnx.Optimizer(...)`` construction of the file reads."""
    key = ("optax.folded",)
    if key in ctx.cache:
        return ctx.cache[key]
    candidates: set[str] = set()
    readers: set[str] = set()
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Assign) and len(n.targets) == 1:
            v = n.value
            if isinstance(v, cst.Lambda) or (isinstance(v, cst.Call) and (ctx.qualname(v.func) or "").startswith("optax.")):
                candidates.add(code(n.targets[0].target))
        if isinstance(n, cst.Call) and (ctx.qualname(n.func) or "") == "flax.nnx.Optimizer":
            for m in astutil.walk(n, into_functions=True):
                if isinstance(m, (cst.Name, cst.Attribute)):
                    readers.add(code(m))
    ctx.cache[key] = frozenset(candidates & readers)
    return ctx.cache[key]


def nnx_optimizers(ctx: FileContext) -> frozenset:
    """Names the file assigns an ``nnx.Optimizer(...)``."""
    key = ("optax.nnx_optimizers",)
    if key not in ctx.cache:
        ctx.cache[key] = frozenset(
            code(n.targets[0].target)
            for n in astutil.walk(ctx.module, into_functions=True)
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call)
            and (ctx.qualname(n.value.func) or "") == "flax.nnx.Optimizer"
        )
    return ctx.cache[key]


def folded_optimizer(ctx: FileContext, schedule: str):
    """(optimizer name, its block, updates per scheduler step) of the ``nnx.Optimizer(...)``
    assignment whose transformation reads the schedule ``schedule`` (JX201's output:
    ``optax.adamw(scheduler, ...)`` -> "1"; ``lambda step: scheduler(step // len(loader))``
    -> "len(loader)"), else None."""
    for block in _blocks(ctx.module):
        for stmt in block.body:
            got = _assign_of(stmt)
            if not got or (ctx.qualname(got[1].func) or "") != "flax.nnx.Optimizer":
                continue
            target, call = got
            factor = None
            for n in astutil.walk(call, into_functions=True):
                if isinstance(n, cst.Arg) and isinstance(n.value, cst.Name) and n.value.value == schedule:
                    factor = "1"
                elif isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == schedule \
                        and len(n.args) == 1 and isinstance(n.args[0].value, cst.BinaryOperation) \
                        and isinstance(n.args[0].value.operator, cst.FloorDivide):
                    factor = code(n.args[0].value.right)
            if factor is not None:
                return target, block, factor
    return None


# --------------------------------------------------------------------------------------
# A learning rate the script sets (Gluon's trainer.set_learning_rate, GL305's
# `for param_group in optimizer.param_groups: param_group["lr"] = v`)
# --------------------------------------------------------------------------------------
def _lr_subscript(node: cst.CSTNode, name: Optional[str] = None) -> bool:
    """``g["lr"]`` (``g`` named ``name`` when given)."""
    return (isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index)
            and code(node.slice[0].slice.value) in ('"lr"', "'lr'")
            and (name is None or code(node.value) == name))


def lr_set_loop(stmt: cst.CSTNode, target: str) -> Optional[cst.BaseExpression]:
    """``for g in target.param_groups: g["lr"] = v`` (one statement) -> ``v``."""
    if not (isinstance(stmt, cst.For) and isinstance(stmt.target, cst.Name) and code(stmt.iter) == f"{target}.param_groups"
            and isinstance(stmt.body, cst.IndentedBlock) and len(stmt.body.body) == 1 and stmt.orelse is None):
        return None
    line = stmt.body.body[0]
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return None
    assign = line.body[0]
    if len(assign.targets) != 1 or not _lr_subscript(assign.targets[0].target, stmt.target.value):
        return None
    return assign.value


def lr_group_write(node: cst.CSTNode, target: str) -> bool:
    """``target.param_groups[i]["lr"] = v`` (or ``... *= v``): a statement writing one group's rate."""
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        lhs = node.targets[0].target
    elif isinstance(node, cst.AugAssign):
        lhs = node.target
    else:
        return False
    return (_lr_subscript(lhs) and isinstance(lhs.value, cst.Subscript)
            and code(lhs.value.value) == f"{target}.param_groups")


def _writes_lr(body: cst.CSTNode, target: str, one_group: bool = False) -> bool:
    """``body`` sets the rate of optimizer ``target`` (``one_group``: of one group by index)."""
    return any((not one_group and isinstance(n, cst.For) and lr_set_loop(n, target) is not None)
               or lr_group_write(n, target) for n in astutil.walk(body, into_functions=True))


def one_group_lr_written(ctx: FileContext, target: str) -> bool:
    """The file sets the rate of one parameter group of ``target`` (``target.param_groups[0]["lr"]
    = v``, itself or through a function of the file it is given to)."""
    if _writes_lr(ctx.module, target, one_group=True):
        return True
    fns = {n.name.value: n for n in ctx.module.body if isinstance(n, cst.FunctionDef)}
    setters = lr_setters(ctx)
    return any(_writes_lr(fns[c.func.value].body, setters[c.func.value][1], one_group=True)
               for c in setter_calls(ctx, target))


def lr_setters(ctx: FileContext) -> dict:
    """Module-level functions of the file that set the rate of an optimizer they are given
    (``def set_lr(opt, lr): for g in opt.param_groups: g["lr"] = lr``): name -> (the
    parameter's index, its name)."""
    key = ("optax.lr_setters",)
    if key not in ctx.cache:
        out = {}
        for stmt in ctx.module.body:
            if isinstance(stmt, cst.FunctionDef):
                for i, q in enumerate(stmt.params.params):
                    if _writes_lr(stmt.body, q.name.value):
                        out[stmt.name.value] = (i, q.name.value)
                        break
        ctx.cache[key] = out
    return ctx.cache[key]


def setter_calls(ctx: FileContext, target: str) -> list:
    """Calls of :func:`lr_setters` functions given optimizer ``target``."""
    setters = lr_setters(ctx)
    out = []
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in setters:
            i, name = setters[n.func.value]
            arg = astutil.arg(n, name, i)
            if arg is not None and code(arg.value) == target:
                out.append(n)
    return out


def lr_written(ctx: FileContext, target: str) -> bool:
    """The file sets the learning rate of optimizer ``target`` through its param_groups: a loop
    ``for g in target.param_groups: g["lr"] = v``, ``target.param_groups[0]["lr"] = v``, or a
    call of a function of the file that does either to the optimizer it is given."""
    key = ("optax.lr_written", target)
    if key not in ctx.cache:
        ctx.cache[key] = _writes_lr(ctx.module, target) or bool(setter_calls(ctx, target))
    return ctx.cache[key]


def _siblings(ctx: FileContext) -> list:
    """The parsed .py files next to the file (the program's other files; at most 64)."""
    from pathlib import Path

    from ._program import _parse

    if not ctx.path or ctx.path.startswith("<") or not Path(ctx.path).is_file():
        return []
    here = Path(ctx.path).resolve()
    files = sorted(f for f in here.parent.glob("*.py") if f.resolve() != here)[:64]
    return [m for m in (_parse(f) for f in files) if m is not None]


def _callee(call: cst.Call) -> str:
    f = call.func
    return f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""


def rate_set_by_callers(ctx: FileContext, fn: str) -> bool:
    """Another file next to this one assigns the result of a call of ``fn`` (``optimizer =
    model.configure_optimizers(...)``) and sets its rate in a loop over its param_groups
    (nanoGPT's train.py)."""
    key = ("optax.rate_set_by_callers", fn)
    if key not in ctx.cache:
        found = False
        for module in _siblings(ctx):
            for n in astutil.walk(module, into_functions=True):
                if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call) \
                        and _callee(n.value) == fn:
                    name = code(n.targets[0].target)
                    if any(isinstance(x, cst.For) and lr_set_loop(x, name) is not None
                           for x in astutil.walk(module, into_functions=True)):
                        found = True
        ctx.cache[key] = found
    return ctx.cache[key]


def returned_optimizer_fn(ctx: FileContext, p) -> Optional[str]:
    """The name of the function (or method) whose body builds plan ``p``'s optimizer and
    returns it (``return optimizer``, ``return torch.optim.AdamW(...)``), else None."""
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.FunctionDef) and n.body is p.block:
            if p.returned or any(isinstance(r, cst.Return) and r.value is not None and code(r.value) == p.target
                                 for r in astutil.walk(n.body)):
                return n.name.value
    return None


def _rate_set_by_callers_here(ctx: FileContext, fn: str) -> bool:
    """This file assigns the result of a call of ``fn`` (``optimizer = make_optimizer(model)``)
    and sets the rate of that optimizer through its param_groups."""
    return any(isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call)
               and _callee(n.value) == fn and lr_written(ctx, code(n.targets[0].target))
               for n in astutil.walk(ctx.module, into_functions=True))


def built_by_sibling(ctx: FileContext, fn: str) -> Optional[str]:
    """For ``fn`` a function (or method) of this file or of another file next to it that builds
    and returns a torch.optim AdamW (ported: its optax transformation alone, no chain) or an
    nnx.Optimizer of optax.inject_hyperparams(...)(...), named or returned alone: where the
    port keeps its hyperparameters (``opt_state``, ``opt_state[i]`` in a chain), else None."""
    for module in [ctx.module, *_siblings(ctx)]:
        for n in astutil.walk(module, into_functions=True):
            if not (isinstance(n, cst.FunctionDef) and n.name.value == fn):
                continue
            returns = [r.value for r in astutil.walk(n.body) if isinstance(r, cst.Return) and r.value is not None]
            returned = {code(r) for r in returns}
            built = [r for r in returns if isinstance(r, cst.Call)]
            built += [a.value for a in astutil.walk(n.body) if isinstance(a, cst.Assign) and len(a.targets) == 1
                      and code(a.targets[0].target) in returned and isinstance(a.value, cst.Call)]
            for value in built:
                func = code(value.func)
                if module is not ctx.module and func.rsplit(".", 1)[-1] == "AdamW" and "optim" in func:
                    return "opt_state"
                if func.endswith("Optimizer") and len(value.args) > 1:
                    tx = value.args[1].value
                    path = "opt_state"
                    if isinstance(tx, cst.Call) and code(tx.func).endswith("chain") and tx.args:
                        path, tx = f"opt_state[{len(tx.args) - 1}]", tx.args[-1].value
                    if isinstance(tx, cst.Call) and isinstance(tx.func, cst.Call) \
                            and code(tx.func.func).endswith("inject_hyperparams"):
                        return path
    return None


def inject_learning_rate(tx: str, optax_name: str) -> str:
    """``optax.sgd(lr, ...)`` -> ``optax.inject_hyperparams(optax.sgd)(lr, ...)`` (in a chain:
    its last transformation), so that the rate is an array of the optimizer's state the
    script can set between steps without a new compilation."""
    expr = cst.parse_expression(tx)
    core = expr
    if isinstance(expr, cst.Call) and code(expr.func) == f"{optax_name}.chain" and expr.args:
        core = expr.args[-1].value
    if not isinstance(core, cst.Call):
        raise Manual("the learning rate the script sets is not the first argument of an optax transformation")
    inject = [cst.Arg(core.func)]
    static = [a.keyword.value for a in core.args if a.keyword is not None and isinstance(a.value, cst.Lambda)]
    if static:  # a callable that is no schedule (adamw's decay mask): inject_hyperparams would call it with the count
        inject = cst.parse_expression(f"f(x, static_args={tuple(static)!r})").args
        inject = [cst.Arg(core.func, comma=inject[0].comma), inject[1]]
    new_core = core.with_changes(func=cst.Call(cst.parse_expression(f"{optax_name}.inject_hyperparams"), inject))
    if core is expr:
        return code(new_core)
    return code(expr.with_changes(args=[*expr.args[:-1], expr.args[-1].with_changes(value=new_core)]))


def hyperparams_path(ctx: FileContext, call: cst.Call) -> Optional[str]:
    """For ``nnx.Optimizer(model, tx, ...)`` whose transformation is (or ends a chain with)
    ``optax.inject_hyperparams(...)(...)``: ``opt_state`` / ``opt_state[i]``, where its
    hyperparameters are; else None."""
    if len(call.args) < 2:
        return None
    tx = call.args[1].value
    path = "opt_state"
    if isinstance(tx, cst.Call) and (ctx.qualname(tx.func) or "") == "optax.chain" and tx.args:
        path = f"opt_state[{len(tx.args) - 1}]"
        tx = tx.args[-1].value
    if isinstance(tx, cst.Call) and isinstance(tx.func, cst.Call) and (ctx.qualname(tx.func.func) or "") == "optax.inject_hyperparams":
        return path
    return None


# --------------------------------------------------------------------------------------
# Parameter groups that differ only in weight decay, split by a predicate of the parameter
# (nanoGPT's configure_optimizers: matrices decay, biases and norms do not)
# --------------------------------------------------------------------------------------
@dataclass
class DecayGroups:
    model: str  # the model whose parameters the groups split
    weight_decay: cst.BaseExpression  # the decaying group's weight_decay
    handle: str  # the predicate's parameter name
    predicate: cst.BaseExpression  # true for the parameters that decay
    named_sources: list  # the `M.named_parameters()` / `M.parameters()` calls the groups are built from
    grad_filters: list  # (CompFor, CompIf) pairs asking `p.requires_grad`


_COMPLEMENT = {cst.GreaterThanEqual: cst.LessThan, cst.LessThan: cst.GreaterThanEqual, cst.GreaterThan: cst.LessThanEqual,
               cst.LessThanEqual: cst.GreaterThan, cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}


class _Assigns(dict):
    """``name = value`` statements of a block before a statement: name -> the last value;
    ``before(name, value)``: the value the name had when ``value`` was computed (``d = {... for
    ... in d.items() if ...}`` reads the previous ``d``)."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list] = {}

    def bind(self, name: str, value: cst.BaseExpression) -> None:
        self[name] = value
        self.history.setdefault(name, []).append(value)

    def before(self, name: str, value: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
        values = self.history.get(name, [])
        if value is not None and any(v is value for v in values):
            i = next(i for i, v in enumerate(values) if v is value)
            return values[i - 1] if i else None
        return values[-1] if values else None


def _assigns_before(block: cst.CSTNode, stmt: cst.CSTNode) -> _Assigns:
    out = _Assigns()
    for s in getattr(block, "body", ()):
        if s is stmt:
            break
        if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign) \
                and len(s.body[0].targets) == 1 and isinstance(s.body[0].targets[0].target, cst.Name):
            out.bind(s.body[0].targets[0].target.value, s.body[0].value)
    return out


def implementation_kwargs(call: cst.Call, block: cst.CSTNode, stmt: cst.CSTNode) -> Optional[cst.Call]:
    """``call`` without a ``**extra`` whose dict holds only implementation switches (``extra_args
    = dict(fused=True) if use_fused else dict()``): the call as bind() can read it, or None."""
    starred = [a for a in call.args if a.star == "**"]
    if not starred:
        return call
    assigns = _assigns_before(block, stmt)
    for a in starred:
        value = assigns.get(a.value.value) if isinstance(a.value, cst.Name) else None
        if value is None:
            return None
        keys: list = []
        for n in astutil.walk(value, into_functions=True):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "dict":
                if any(x.keyword is None for x in n.args):
                    return None
                keys += [x.keyword.value for x in n.args]
            elif isinstance(n, cst.Dict):
                for el in n.elements:
                    key = literal(el.key) if isinstance(el, cst.DictElement) else NOT_LITERAL
                    if not isinstance(key, str):
                        return None
                    keys.append(key)
        if not set(keys) <= set(_IGNORED):
            return None
        if not any(isinstance(n, (cst.Call, cst.Dict)) for n in astutil.walk(value)):
            return None
    args = [a for a in call.args if a.star != "**"]
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)


def decay_groups(ctx: FileContext, call: cst.Call, block: cst.CSTNode, stmt: cst.CSTNode) -> Optional[DecayGroups]:
    """``torch.optim.X([{'params': decay, 'weight_decay': wd}, {'params': nodecay, 'weight_decay': 0.0}], ...)``
    (the list inline or a name bound before), each group's list a comprehension over the model's
    parameters (``[p for n, p in param_dict.items() if p.dim() >= 2]`` over ``param_dict = {pn: p for
    pn, p in self.named_parameters()}``, possibly filtered on ``p.requires_grad``; or ``[p for p in
    model.parameters() if ...]``) whose conditions are each other's negation and read only the
    parameter: the groups, or None."""
    first = astutil.arg(call, "params", 0)
    if first is None:
        return None
    assigns = _assigns_before(block, stmt)
    groups = first.value
    if isinstance(groups, cst.Name):
        groups = assigns.get(groups.value)
    if not isinstance(groups, (cst.List, cst.Tuple)) or len(groups.elements) != 2:
        return None
    parsed = []
    for el in groups.elements:
        d = el.value
        if isinstance(d, cst.Call) and isinstance(d.func, cst.Name) and d.func.value == "dict" \
                and all(a.keyword is not None for a in d.args):
            entries = {a.keyword.value: a.value for a in d.args}  # dict(params=..., weight_decay=...)
        elif isinstance(d, cst.Dict) and all(isinstance(e, cst.DictElement) for e in d.elements):
            entries = {literal(e.key): e.value for e in d.elements}
        else:
            return None
        if set(entries) != {"params", "weight_decay"}:
            return None
        comp = entries["params"]
        if isinstance(comp, cst.Name):
            comp = assigns.get(comp.value)
        if not isinstance(comp, cst.ListComp) or comp.for_in.inner_for_in is not None:
            return None
        parsed.append((comp, entries["weight_decay"]))
    zero = [i for i, (_c, wd) in enumerate(parsed) if literal(wd) in (0, 0.0)]
    if len(zero) != 1:
        return None
    decay, still = parsed[1 - zero[0]], parsed[zero[0]]
    sides = []
    for comp, _wd in (decay, still):
        got = _group_source(comp, assigns)
        if got is None:
            return None
        sides.append(got)
    (model, handle, pred, sources, filters), (model2, handle2, pred2, sources2, filters2) = sides
    if model != model2 or not _negations(pred, handle, pred2, handle2):
        return None
    return DecayGroups(model, decay[1], handle, pred, sources + sources2, filters + filters2)


def _group_source(comp: cst.ListComp, assigns: dict):
    """(model, the element's name, its condition, named_parameters() calls, requires_grad filters)
    of ``[p for ... in <the model's parameters> if cond]``, or None."""
    loop = comp.for_in
    if not isinstance(comp.elt, cst.Name) or len(loop.ifs) != 1:
        return None
    handle = comp.elt.value
    names = astutil.target_names(loop.target)
    if isinstance(loop.target, cst.Tuple):
        if len(loop.target.elements) != 2 or code(loop.target.elements[1].value) != handle:
            return None
    elif code(loop.target) != handle:
        return None
    pred = loop.ifs[0].test
    read = {n.value for n in astutil.walk(pred, into_functions=True) if isinstance(n, cst.Name)}
    if read & (set(names) - {handle}):
        return None  # the condition reads the torch name: not ported
    found = _parameter_source(loop.iter, assigns, tuple_target=isinstance(loop.target, cst.Tuple), depth=0)
    if found is None:
        return None
    model, sources, filters = found
    return model, handle, pred, sources, filters


def _parameter_source(it: cst.BaseExpression, assigns: _Assigns, tuple_target: bool, depth: int, inside=None):
    """``model.parameters()``, ``model.named_parameters()``, or ``d.items()`` of a dict built from
    one by a comprehension (itself perhaps over another such dict, filtered on ``requires_grad``)."""
    if depth > 3 or not isinstance(it, cst.Call) or it.args:
        return None
    method = astutil.method_name(it)
    if method == "parameters" and not tuple_target:
        return code(it.func.value), [it], []
    if method == "named_parameters" and tuple_target:
        return code(it.func.value), [it], []
    if method == "items" and tuple_target and isinstance(it.func.value, cst.Name):
        d = assigns.before(it.func.value.value, inside)
        if not (isinstance(d, cst.DictComp) and d.for_in.inner_for_in is None and isinstance(d.for_in.target, cst.Tuple)
                and len(d.for_in.target.elements) == 2 and code(d.key) == code(d.for_in.target.elements[0].value)
                and code(d.value) == code(d.for_in.target.elements[1].value)):
            return None
        value = code(d.value)
        filters = []
        for c in d.for_in.ifs:
            if isinstance(c.test, cst.Attribute) and code(c.test.value) == value and c.test.attr.value == "requires_grad":
                filters.append((d.for_in, c))
            else:
                return None
        inner = _parameter_source(d.for_in.iter, assigns, True, depth + 1, inside=d)
        if inner is None:
            return None
        return inner[0], inner[1], inner[2] + filters
    return None


def _masked_decay(ctx: FileContext, b: Bound, tx: str, groups: DecayGroups) -> str:
    """The transformation with the groups' weight decay applied where the decaying group's
    condition holds: ``mask=`` of optax.adamw (decoupled), else torch's coupled decay as
    ``optax.masked(optax.add_decayed_weights(wd), mask)`` chained before the update."""
    jax, O = ctx.module_alias("jax"), b.optax
    mask = f"lambda params: {jax}.tree.map(lambda {groups.handle}: {code(groups.predicate)}, params)"
    if tx.startswith(f"{O}.adamw(") and tx.endswith(")"):
        return f"{tx[:-1]}, mask={mask})"
    return f"{O}.chain({O}.masked({O}.add_decayed_weights({code(groups.weight_decay)}), {mask}), {tx})"


def decay_group_parts(ctx: FileContext) -> dict:
    """id of each ``M.named_parameters()`` call and ``requires_grad`` filter the file's decay
    groups (:func:`decay_groups`) are built from -> the model's name (JX201 rewrites them
    with its optimizer; JX090 leaves them alone)."""
    key = ("optax.decay_group_parts",)
    if key in ctx.cache:
        return ctx.cache[key]
    out: dict[int, str] = {}
    for p in plans(ctx):
        call = implementation_kwargs(p.call, p.block, p.stmt) or p.call
        g = decay_groups(ctx, call, p.block, p.stmt)
        if g is not None:
            out.update({id(c): g.model for c in g.named_sources})
            out.update({id(f): g.model for _loop, f in g.grad_filters})
    ctx.cache[key] = out
    return out


def named_arrays(ctx: FileContext, model: str, source: Optional[cst.Call] = None) -> cst.BaseExpression:
    """(name, nnx.Param) pairs of the model's parameters for ``model.named_parameters()``: the
    names are NNX paths (``h.0.attn.c_attn.kernel``); the arrays alone for ``model.parameters()``."""
    nnx = ctx.module_alias("flax.nnx")
    if source is not None and astutil.method_name(source) == "parameters":
        return cst.parse_expression(f"{ctx.module_alias('jax')}.tree.leaves({nnx}.state({model}, {nnx}.Param))")
    return cst.parse_expression(f"(('.'.join(map(str, k)), v) for k, v in {nnx}.to_flat_state({nnx}.state({model}, {nnx}.Param)))")


def _negations(a: cst.BaseExpression, ha: str, b: cst.BaseExpression, hb: str) -> bool:
    """``a`` (over ``ha``) and ``b`` (over ``hb``) are each other's negation."""
    if ha != hb:
        return False
    ta, tb = code(a), code(b)
    for x, y in ((a, b), (b, a)):
        if isinstance(x, cst.UnaryOperation) and isinstance(x.operator, cst.Not) and code(x.expression) in (code(y), f"({code(y)})"):
            return True
    if isinstance(a, cst.Comparison) and isinstance(b, cst.Comparison) and len(a.comparisons) == len(b.comparisons) == 1:
        oa, ob = a.comparisons[0], b.comparisons[0]
        return code(a.left) == code(b.left) and code(oa.comparator) == code(ob.comparator) \
            and _COMPLEMENT.get(type(oa.operator)) is type(ob.operator)
    return ta == f"not {tb}" or tb == f"not {ta}"
