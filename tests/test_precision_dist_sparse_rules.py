"""Checks of the TX6xx / TX7xx / TX9xx rules beyond their examples: how fixes of one family
work together, edge cases of statement removal, and the numerical claims their "Fix safety"
sections make (measured with eager PyTorch on the CPU)."""
import textwrap

import pytest

from porter import engine, registry


def fix(source: str, prefixes, unsafe=False):
    rules = registry.select("torch-xla", tuple(prefixes))
    return engine.fix(textwrap.dedent(source).lstrip("\n"), engine.Options(rules, unsafe_fixes=unsafe))


# --------------------------------------------------------------------------------------
# Sparse embeddings and SparseAdam change together
# --------------------------------------------------------------------------------------
SPARSE_PAIR = """
import torch
import torch.nn as nn

emb = nn.Embedding(100, 8, sparse=True)
opt = torch.optim.SparseAdam(emb.parameters(), lr=0.01)
"""


def test_sparse_pair_safe_mode_changes_nothing_and_reports_both():
    result = fix(SPARSE_PAIR, ["TX9"])
    assert not result.changed
    assert sorted(f.code for f in result.remaining) == ["TX901", "TX902"]


def test_sparse_pair_unsafe_mode_changes_both():
    result = fix(SPARSE_PAIR, ["TX9"], unsafe=True)
    assert "nn.Embedding(100, 8, sparse=False)" in result.source
    assert "torch.optim.Adam(emb.parameters(), lr=0.01)" in result.source
    assert not result.remaining


def test_sparse_embedding_without_sparse_adam_is_a_safe_fix():
    result = fix("import torch.nn as nn\nemb = nn.EmbeddingBag(10, 4, sparse=True)\n", ["TX9"])
    assert result.source == "import torch.nn as nn\nemb = nn.EmbeddingBag(10, 4, sparse=False)\n"


# --------------------------------------------------------------------------------------
# GradScaler removal: statements go without leaving empty blocks or dangling semicolons
# --------------------------------------------------------------------------------------
def test_grad_scaler_removal_keeps_blocks_valid():
    result = fix(
        """
        from torch.cuda.amp import GradScaler

        def make():
            scaler = GradScaler()

        def train(opt, a, b, amp):
            scaler = GradScaler()
            if amp: scaler.update()
            scaler.step(opt); scaler.update()
            if amp: scaler.unscale_(opt); scaler.update()
            loss = scaler.scale(a + b)
            scaler.scale(loss).backward()
        """,
        ["TX602"],
    )
    assert result.source == textwrap.dedent(
        """\
        import torch_xla.core.xla_model as xm

        def make():
            pass

        def train(opt, a, b, amp):
            if amp: pass
            xm.optimizer_step(opt)
            if amp: pass
            loss = a + b
            loss.backward()
        """
    )


def test_grad_scaler_followed_by_scope_not_by_spelling():
    src = """
    import torch

    def train(opt):
        scaler = torch.cuda.amp.GradScaler()
        scaler.step(opt)

    def other(scaler, opt):
        scaler.step(opt)
    """
    result = fix(src, ["TX602"])
    assert "    xm.optimizer_step(opt)\n\ndef other(scaler, opt):\n    scaler.step(opt)\n" in result.source
    assert "GradScaler()" not in result.source


def test_grad_scaler_reassigned_is_only_reported():
    result = fix("import torch\nscaler = torch.cuda.amp.GradScaler()\nscaler = None\n", ["TX602"])
    assert not result.changed
    assert [f.code for f in result.remaining] == ["TX602"]


def test_the_precision_family_ports_an_amp_step_in_one_go():
    result = fix(
        """
        import torch
        from torch.cuda.amp import GradScaler, autocast

        scaler = GradScaler()
        for x, y in loader:
            with autocast():
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        """,
        ["TX6"],
    )
    assert result.source == textwrap.dedent(
        """\
        import torch
        import torch_xla.core.xla_model as xm

        for x, y in loader:
            with torch.autocast('xla', dtype=torch.bfloat16):
                loss = model(x, y)
            loss.backward()
            xm.optimizer_step(optimizer)
        """
    )


# --------------------------------------------------------------------------------------
# The numbers behind the "Fix safety" sections (eager PyTorch, CPU)
# --------------------------------------------------------------------------------------
def _train_embedding(sparse: bool, make_opt, steps=6):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    emb = nn.Embedding(20, 4, sparse=sparse)
    opt = make_opt(emb.parameters())
    # batches touch rows 0..9 at first, then only 0..4: rows 5..9 are absent later
    batches = [torch.arange(0, 10), torch.arange(0, 10)] + [torch.arange(0, 5)] * (steps - 2)
    for ids in batches:
        opt.zero_grad()
        emb(ids).pow(2).sum().backward()
        opt.step()
    return emb.weight.detach().clone()


@pytest.mark.parametrize(
    "name,make_opt",
    [
        ("sgd", lambda p: __import__("torch").optim.SGD(p, lr=0.1)),
        ("sgd-momentum", lambda p: __import__("torch").optim.SGD(p, lr=0.1, momentum=0.9)),
        ("adagrad", lambda p: __import__("torch").optim.Adagrad(p, lr=0.1)),
    ],
)
def test_dense_embedding_gradient_gives_the_same_update(name, make_opt):
    import torch

    sparse = _train_embedding(True, make_opt)
    dense = _train_embedding(False, make_opt)
    assert torch.allclose(sparse, dense, atol=1e-6), name


def test_sparse_adam_and_adam_differ_on_rows_absent_from_the_batch():
    import torch

    lazy = _train_embedding(True, lambda p: torch.optim.SparseAdam(list(p), lr=0.1))
    dense = _train_embedding(False, lambda p: torch.optim.Adam(p, lr=0.1))
    # rows 0..4 are in every batch: the same Adam update in both
    assert torch.allclose(lazy[:5], dense[:5], atol=1e-6)
    # rows 5..9 left the batch after step 2: SparseAdam froze them, Adam kept moving them
    assert (lazy[5:10] - dense[5:10]).abs().max() > 1e-2
    # rows 10..19 never appeared: zero moments, neither moves them
    assert torch.equal(lazy[10:], dense[10:])


def test_enabled_grad_scaler_gives_the_unscaled_update():
    """The claim of TX602: without float16 overflow, scaling by a power of two and
    unscaling before the step leaves the update as it is."""
    import torch
    import torch.nn as nn

    def train(use_scaler: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
        x, y = torch.randn(16, 6), torch.randn(16, 1)
        for _ in range(5):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(train(True), train(False)):
        assert torch.equal(a, b)
