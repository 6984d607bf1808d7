"""The torch.optim optimizers and LR schedulers JX201 ports beyond SGD/Adam/AdamW/RMSprop
(tests/test_jax_ops_run.py has those): each case is a training script run in torch and, ported,
in JAX on the same problem; the parameters before each of the 20 updates are compared (1e-5
relative). Options are spelled out and left at torch's defaults in turn, with weight decay,
schedulers stepped per epoch and per batch, and schedulers that cycle the momentum."""
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # ~50 small trainings in torch and JAX

from optimhelp import assert_same_traces, jax_trace, torch_trace, training_script  # noqa: E402
from porter import engine, registry  # noqa: E402

JAX_RULES = tuple(registry.rules_for("jax"))
P = "model.parameters()"
S = "torch.optim.lr_scheduler"

OPTIMIZERS = {
    "adadelta": f"torch.optim.Adadelta({P})",
    "adadelta_opts": f"torch.optim.Adadelta({P}, lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.01)",
    "adagrad": f"torch.optim.Adagrad({P}, lr=0.1)",
    "adagrad_opts": f"torch.optim.Adagrad({P}, lr=0.1, lr_decay=0.05, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6)",
    "adamax": f"torch.optim.Adamax({P})",
    "adamax_opts": f"torch.optim.Adamax({P}, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01)",
    "nadam": f"torch.optim.NAdam({P})",
    "nadam_opts": f"torch.optim.NAdam({P}, lr=0.01, betas=(0.85, 0.99), eps=1e-6, weight_decay=0.01, momentum_decay=0.01)",
    "radam": f"torch.optim.RAdam({P}, lr=0.01)",  # rectified from the 6th step on
    "radam_opts": f"torch.optim.RAdam({P}, lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)",
    "asgd": f"torch.optim.ASGD({P}, lr=0.05)",
    "asgd_opts": f"torch.optim.ASGD({P}, lr=0.05, lambd=0.01, alpha=0.5, weight_decay=0.01)",
    "rprop": f"torch.optim.Rprop({P}, lr=0.01)",
    "rprop_opts": f"torch.optim.Rprop({P}, lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-5, 0.05))",
    # for the schedulers
    "sgd": f"torch.optim.SGD({P}, lr=0.1)",
    "sgd_momentum": f"torch.optim.SGD({P}, lr=0.05, momentum=0.9)",
    "sgd_nesterov_wd": f"torch.optim.SGD({P}, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)",
    "adam": f"torch.optim.Adam({P}, lr=0.01, weight_decay=0.01)",
    "adamw": f"torch.optim.AdamW({P}, lr=0.01, betas=(0.9, 0.99))",
}
SCHEDULERS = {  # name: (constructor, stepped per "epoch" / "batch" / epoch around a "function")
    "none": (None, None),
    "step": (f"{S}.StepLR(optimizer, step_size=2, gamma=0.5)", "epoch"),
    "linear": (f"{S}.LinearLR(optimizer, start_factor=0.25, total_iters=3)", "epoch"),
    "linear_default_batch": (f"{S}.LinearLR(optimizer)", "batch"),
    "linear_down": (f"{S}.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=15)", "batch"),
    "constant": (f"{S}.ConstantLR(optimizer, factor=0.5, total_iters=2)", "epoch"),
    "constant_default_batch": (f"{S}.ConstantLR(optimizer)", "batch"),
    "polynomial": (f"{S}.PolynomialLR(optimizer, total_iters=3, power=2.0)", "epoch"),
    "polynomial_default_batch": (f"{S}.PolynomialLR(optimizer, total_iters=12)", "batch"),
    "warm_restarts": (f"{S}.CosineAnnealingWarmRestarts(optimizer, T_0=2)", "epoch"),
    "warm_restarts_mult": (f"{S}.CosineAnnealingWarmRestarts(optimizer, T_0=1, T_mult=2, eta_min=0.001)", "batch"),
    "warm_restarts_function": (f"{S}.CosineAnnealingWarmRestarts(optimizer, 3, 1, 0.01)", "function"),
    "cosine_global_function": (f"{S}.CosineAnnealingLR(optimizer, T_max=3)", "global"),
    "cyclic": (f"{S}.CyclicLR(optimizer, base_lr=0.01, max_lr=0.1, step_size_up=3, cycle_momentum=False)", "batch"),
    "cyclic_momentum_tri2": (f"{S}.CyclicLR(optimizer, 0.01, 0.1, step_size_up=2, step_size_down=3, mode='triangular2')", "batch"),
    "cyclic_momentum_exp": (f"{S}.CyclicLR(optimizer, 0.005, 0.05, step_size_up=4, mode='exp_range', gamma=0.9, "
                            "base_momentum=0.7, max_momentum=0.95)", "batch"),
    "onecycle_momentum": (f"{S}.OneCycleLR(optimizer, max_lr=0.05, total_steps=20)", "batch"),
    "multiplicative": (f"{S}.MultiplicativeLR(optimizer, lr_lambda=lambda epoch: 0.8)", "epoch"),
    "multiplicative_batch": (f"{S}.MultiplicativeLR(optimizer, lambda step: 0.95)", "batch"),
    "onecycle_epochs": (f"{S}.OneCycleLR(optimizer, max_lr=0.05, epochs=EPOCHS, steps_per_epoch=len(train_loader), "
                        "pct_start=0.25, div_factor=10.0, final_div_factor=100.0)", "batch"),
    "onecycle_linear_three": (f"{S}.OneCycleLR(optimizer, 0.1, total_steps=20, anneal_strategy='linear', three_phase=True, "
                              "base_momentum=0.8, max_momentum=0.9)", "batch"),
    "onecycle_cos_three_plain": (f"{S}.OneCycleLR(optimizer, 0.1, total_steps=20, three_phase=True, cycle_momentum=False)", "batch"),
    # SequentialLR: its schedulers inline or built before it, two or three of them
    "sequential_inline": (f"{S}.SequentialLR(optimizer, [{S}.LinearLR(optimizer, start_factor=0.25, total_iters=2), "
                          f"{S}.ExponentialLR(optimizer, gamma=0.7)], milestones=[2])", "epoch"),
    "sequential_named_batch": (f"warmup = {S}.LinearLR(optimizer, start_factor=0.1, total_iters=4)\n"
                               f"decay = {S}.CosineAnnealingLR(optimizer, T_max=12, eta_min=0.001)\n"
                               f"{S}.SequentialLR(optimizer, schedulers=[warmup, decay], milestones=[5])", "batch"),
    "sequential_three": (f"first = {S}.ConstantLR(optimizer, factor=0.5, total_iters=1)\n"
                         f"{S}.SequentialLR(optimizer, [first, {S}.MultiStepLR(optimizer, milestones=[1], gamma=0.5), "
                         f"{S}.PolynomialLR(optimizer, total_iters=2, power=2.0)], [1, 2])", "epoch"),
}
PAIRS = [(o, "none") for o in OPTIMIZERS if o not in ("sgd", "sgd_momentum", "sgd_nesterov_wd", "adam", "adamw")]
PAIRS += [("adadelta_opts", "step"), ("adagrad_opts", "step"), ("adamax", "step"), ("nadam_opts", "step"), ("radam", "step"),
          ("nadam", "onecycle_cos_three_plain"), ("radam_opts", "linear_default_batch"), ("adagrad", "warm_restarts")]
PAIRS += [("sgd", s) for s in ("linear", "linear_default_batch", "linear_down", "constant", "constant_default_batch", "polynomial",
                               "polynomial_default_batch", "warm_restarts", "warm_restarts_mult", "cyclic",
                               "onecycle_cos_three_plain")]
PAIRS += [("sgd", "multiplicative"), ("adam", "multiplicative_batch")]
PAIRS += [("sgd", "sequential_inline"), ("adam", "sequential_named_batch"), ("sgd_momentum", "sequential_three")]
PAIRS += [("sgd_momentum", "warm_restarts_function"), ("sgd_nesterov_wd", "cosine_global_function"), ("sgd_momentum", "cyclic_momentum_tri2"),
          ("sgd_nesterov_wd", "onecycle_linear_three"), ("sgd_momentum", "onecycle_momentum"), ("sgd", "onecycle_epochs"),
          ("adam", "onecycle_momentum"), ("adam", "cyclic_momentum_exp"), ("adamw", "onecycle_momentum"),
          ("adamw", "onecycle_linear_three")]


def _port(src: str):
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    assert "nnx.Optimizer(model" in result.source, result.source
    assert not [f for f in result.remaining if f.code.startswith("JX2")], result.remaining
    head = result.source.split("\nfor epoch", 1)[0]
    assert "= torch.optim" not in head and "lr_scheduler" not in head, head
    assert "scheduler.step" not in result.source, result.source
    return head


@pytest.mark.parametrize("opt,sched", [pytest.param(o, s, id=f"JX201-{o}-{s}") for o, s in PAIRS])
def test_optimizer_and_scheduler(opt, sched):
    src = training_script(OPTIMIZERS[opt], *SCHEDULERS[sched])
    head = _port(src)
    assert_same_traces(torch_trace(src), jax_trace(head))


def test_every_case_is_run():
    assert {o for o, _ in PAIRS} == set(OPTIMIZERS)
    assert {s for _, s in PAIRS} == set(SCHEDULERS)


@pytest.mark.parametrize("ctor,words", [
    pytest.param(f"torch.optim.LBFGS({P}, lr=1)", "closure", id="LBFGS"),
    pytest.param(f"torch.optim.SparseAdam({P})", "sparse", id="SparseAdam"),
    pytest.param(f"torch.optim.Rprop({P}, lr=0.01)", "Rprop under an LR scheduler", id="Rprop-scheduled"),
    pytest.param(f"torch.optim.RMSprop({P}, lr=0.01, momentum=0.9)", "cycles the momentum of RMSprop", id="RMSprop-cycled"),
])
def test_unported_optimizer_is_reported_at_its_line(ctor, words):
    sched = {"Rprop": f"{S}.StepLR(optimizer, 2)", "RMSprop": f"{S}.OneCycleLR(optimizer, max_lr=0.1, total_steps=20)"}.get(
        ctor.split("(")[0].rsplit(".", 1)[1])
    src = training_script(ctor, sched, "batch" if sched else None)
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    found = [f for f in result.remaining if f.code == "JX201"]
    assert found and words in found[0].message, result.remaining
    line = result.source.splitlines()[found[0].position.line - 1]
    assert line.startswith("optimizer = torch.optim.") and "# porter: manual" in line, line


def test_scheduler_stepped_with_an_argument_is_not_folded():
    src = training_script(f"torch.optim.SGD({P}, lr=0.1)", f"{S}.CosineAnnealingWarmRestarts(optimizer, T_0=2)", "epoch",
                          step_arg="epoch + 1")
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    assert "scheduler.step(epoch + 1)" in result.source
    assert any(f.code == "JX201" and "given the epoch" in f.message for f in result.remaining), result.remaining


# ReduceLROnPlateau: the port's host-side TorchReduceLROnPlateau, stepped once per epoch with
# a metric (here a fixed series, so that both sides see the same values)
PLATEAU = {
    "min_rel": ("patience=0, factor=0.5", [1.0, 1.0, 0.9, 0.95]),
    "defaults_patience": ("patience=1", [1.0, 1.1, 1.2, 1.3]),
    "max_abs_cooldown": ("'max', factor=0.3, patience=0, threshold=0.05, threshold_mode='abs', cooldown=1", [0.5, 0.52, 0.53, 0.54]),
    "min_lr": ("factor=0.1, patience=0, min_lr=0.02", [3.0, 3.0, 3.0, 3.0]),
}


@pytest.mark.parametrize("opt", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("case", list(PLATEAU), ids=[f"JX201-plateau-{c}" for c in PLATEAU])
def test_reduce_lr_on_plateau(case, opt):
    args, metrics = PLATEAU[case]
    src = training_script(OPTIMIZERS[opt], f"{S}.ReduceLROnPlateau(optimizer, {args})", "epoch", step_arg="METRICS[epoch]")
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    assert not [f for f in result.remaining if f.code.startswith("JX2")], result.remaining
    assert "inject_hyperparams" in result.source and "scheduler = TorchReduceLROnPlateau(optimizer, " in result.source
    assert "scheduler.step(METRICS[epoch])" in result.source
    head = result.source.split("\nfor epoch", 1)[0]
    extra = {"METRICS": metrics}
    trace_j = jax_trace(head, per_epoch=lambda ns, epoch: ns["scheduler"].step(metrics[epoch]), extra=extra)
    assert_same_traces(torch_trace(src, extra=extra), trace_j)


@pytest.mark.parametrize("factor", ["lambda epoch: 0.9 ** epoch", "lambda epoch: 0.5 if epoch > 2 else 1.0", "factor_of"])
def test_multiplicative_lr_of_the_epoch_is_reported(factor):
    """MultiplicativeLR is ported where its factor is a constant (lr * factor ** epoch); a factor
    of the epoch (a product over the steps) or a named function is reported at the optimizer."""
    src = training_script(OPTIMIZERS["sgd"], f"{S}.MultiplicativeLR(optimizer, {factor})", "epoch")
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    found = [f for f in result.remaining if f.code == "JX201" and "MultiplicativeLR" in f.message]
    assert found, result.remaining


@pytest.mark.parametrize("parts,words", [
    (f"[{S}.LambdaLR(optimizer, lambda e: 0.5), {S}.StepLR(optimizer, 1)]", "restarts LambdaLR with step(0)"),
    (f"[{S}.StepLR(other, 1), {S}.StepLR(optimizer, 1)]", "built on another optimizer"),
])
def test_sequential_lr_that_cannot_be_joined_is_reported(parts, words):
    src = training_script(f"torch.optim.SGD({P}, lr=0.1)", f"{S}.SequentialLR(optimizer, {parts}, milestones=[2])", "epoch")
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    messages = [f.message for f in result.remaining if f.code in ("JX201", "JX202")]
    assert any(words in m for m in messages), messages
    assert "lr_scheduler.SequentialLR(" in result.source


def test_chained_schedulers_are_reported():
    src = training_script(f"torch.optim.SGD({P}, lr=0.1)", f"a = {S}.StepLR(optimizer, 1)\n{S}.ExponentialLR(optimizer, 0.9)",
                          "epoch")
    result = engine.fix(src, engine.Options(JAX_RULES, unsafe_fixes=True))
    assert any("two schedulers on one optimizer" in f.message for f in result.remaining), result.remaining
