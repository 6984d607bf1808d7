"""The op table's generated docs, the tensor-method heuristic, and what the JX1/JX2 rules leave
for a manual port (rules run through the engine, as `porter migrate --to jax` runs them)."""
import textwrap

import pytest

from porter import engine, registry
from porter._layout import REPO, mapped_package

mapped_package("porter.codemods", "codemods")
from porter.codemods.jax import _ops_table as ops  # noqa: E402

MINE = tuple(r for r in registry.rules_for("jax") if r.code.startswith(("JX1", "JX2")))


def port(src: str):
    return engine.fix(textwrap.dedent(src), engine.Options(MINE))


def test_JX1_jax_ops_doc_is_current():
    text = (REPO / "docs" / "jax-ops.md").read_text(encoding="utf-8")
    assert text == ops.render_markdown(), "run `python -m porter.docs`"


def test_JX1_JX2_rule_docs_are_current():
    from porter import docs

    for rule in MINE:
        page = REPO / "docs" / "rules" / f"{rule.code}.md"
        assert page.is_file() and page.read_text(encoding="utf-8") == docs.rule_markdown(rule), f"{rule.code}: run `python -m porter.docs`"


def test_JX1_table_size_and_manual_entries_are_documented():
    doc = ops.render_markdown()
    ported = [o for o in ops.TABLE if not o.manual]
    assert len(ported) >= 150
    for o in ops.TABLE:
        assert f"`{o.torch_display}`" in doc


def test_JX102_shared_method_names_need_a_tensor():
    r = port(
        """
        import torch

        def words(line, table):
            return line.split(","), table.size(), line.strip().split()

        class Net(torch.nn.Module):
            def forward(self, x):
                h = torch.relu(x)
                return h.split(2, dim=1), x.size(0), h.sum(1).max(0)[0]
        """
    )
    assert 'line.split(",")' in r.source and "table.size()" in r.source and "line.strip().split()" in r.source
    assert "jnp.split(h, list(range(2, h.shape[1], 2)), axis=1)" in r.source
    assert "x.shape[0]" in r.source
    assert "jnp.max(jnp.sum(h, axis=1), axis=0)" in r.source


def test_JX102_module_functions_and_numpy_are_left_alone():
    r = port(
        """
        import numpy as np
        import torch

        def f(a, device):
            b = np.sum(a, axis=0).reshape(2, 3)
            return b, a.to(device), np.transpose(b)
        """
    )
    assert not r.changed


def test_JX102_tensor_only_names_on_any_receiver():
    r = port(
        """
        import torch

        def f(batch):
            return batch["x"].view(4, -1).unsqueeze(0).contiguous()
        """
    )
    assert 'jnp.expand_dims(batch["x"].reshape(4, -1), 0)' in r.source


def test_JX1_output_is_stable_and_chains_convert_in_one_go():
    src = textwrap.dedent(
        """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Block(nn.Module):
            def forward(self, x, mask):
                b, t, c = x.size()
                q = x.view(b, t, 2, c // 2).permute(0, 2, 1, 3).contiguous()
                att = torch.einsum("bhtc,bhsc->bhts", q, q) / q.size(-1) ** 0.5
                att = att.masked_fill(mask[:, None, None, :] == 0, float("-inf")).softmax(dim=-1)
                out = (att @ q).transpose(1, 2).reshape(b, t, c)
                return F.local_response_norm(out, 2) if False else F.gelu(out).clamp(min=-3.0, max=3.0)
        """
    )
    r = engine.fix(src, engine.Options(MINE))
    again = engine.fix(r.source, engine.Options(MINE))
    assert not again.changed
    body = r.source.split("def forward", 1)[1]
    assert ".view(" not in body and ".permute(" not in body and "torch.einsum" not in body and ".size(" not in body
    assert "F.local_response_norm" in body  # not in the table: left for a human (and the module rules)


def test_JX101_reported_calls_keep_their_code_and_get_a_marker():
    r = port(
        """
        import torch
        import torch.nn.functional as F

        def f(x, training):
            noise = torch.randn(3)
            y = F.dropout(x, 0.1, training=training)
            idx = torch.nonzero(x)
            return noise, y, idx
        """
    )
    assert r.source.count("# porter: manual") == 2
    assert "torch.randn(3)" in r.source and "torch.nonzero(x)" in r.source
    # F.dropout outside a module is torch's dropout (JX107), which has no key there: said where it is
    assert "torch_dropout(x, 0.1, training)" in r.source
    assert any(f.code == "JX107" and "no PRNG key" in f.message for f in r.remaining)
    reasons = " ".join(f.message for f in r.remaining)
    assert "PRNG key" in reasons and "static size" in reasons


@pytest.mark.parametrize(
    "src,reason",
    [
        ("import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         "scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [a, b], milestones=[5])\n"
         "for x in loader:\n    optimizer.step()\n    scheduler.step()\n", "SequentialLR"),
        ("import torch\noptimizer = torch.optim.Adam([{'params': a.parameters()}, {'params': b.parameters(), 'lr': 1e-4}])\n",
         "parameter groups"),
        ("import torch\noptimizer = torch.optim.Adam(model.parameters(), amsgrad=True)\n", "amsgrad"),
        ("import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
         "scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.9 ** e)\nrun(optimizer, scheduler)\n",
         "how many optimizer updates"),
        ("import torch\noptimizer = torch.optim.LBFGS(model.parameters())\n", "optax.lbfgs"),
        ("import torch\noptimizer = torch.optim.SparseAdam(model.parameters())\n", "SparseAdam"),
    ],
)
def test_JX201_optimizers_optax_cannot_match_are_reported(src, reason):
    r = engine.fix(src, engine.Options(MINE))
    assert "nnx.Optimizer" not in r.source and "# porter: manual" in r.source
    assert any(reason in f.message for f in r.remaining), [f.message for f in r.remaining]


def test_JX201_scheduler_stepped_in_a_function_of_the_file_gets_its_loader_length():
    r = port(
        """
        import torch
        from torch.optim.lr_scheduler import CosineAnnealingLR

        def train(model, device, loader, optimizer, epoch):
            for batch_idx, (data, target) in enumerate(loader):
                optimizer.zero_grad()
                optimizer.step()

        def main(model, device, epochs):
            train_loader = make_loader()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scheduler = CosineAnnealingLR(optimizer, T_max=epochs)
            for epoch in range(1, epochs + 1):
                train(model, device, train_loader, optimizer, epoch)
                scheduler.step()
        """
    )
    assert "optax.sgd(lambda step: scheduler(step // len(train_loader)))" in r.source
    assert "scheduler = lambda epoch: 0.1 * (1 + jnp.cos(jnp.pi * epoch / epochs)) / 2" in r.source


def test_JX151_loss_module_in_a_model_class_and_a_call_with_target_probabilities():
    r = port(
        """
        import torch.nn as nn
        import torch.nn.functional as F

        class Distill(nn.Module):
            def __init__(self):
                super().__init__()
                self.ce = nn.CrossEntropyLoss(label_smoothing=0.1)

            def forward(self, student, teacher):
                return F.cross_entropy(student, teacher.softmax(dim=1))
        """
    )
    assert "self.ce = lambda input, target: " in r.source
    assert "optax.softmax_cross_entropy(student, jax.nn.softmax(teacher, axis=1), axis=1).mean()" in r.source


def test_JX102_numpy_pandas_and_set_methods_are_not_tensor_methods():
    r = port(
        """
        import numpy as np
        import torch

        def prepare(arr, frame, seen, x):
            a = arr.clip(0, 1).view(np.float32)
            idx = arr.nonzero()
            seen.add(x)
            return a, idx, frame.median(), frame.sub(1), arr.diagonal(), arr.where(arr > 0)
        """
    )
    assert not r.changed, r.source
    assert not r.remaining


def test_numpy_arrays_keep_their_methods_and_torch_tensors_are_ported():
    from porter import engine, registry

    src = (
        "import numpy as np\nimport torch\n\n"
        "def make():\n"
        "    a = np.arange(12).reshape(3, 4)\n"
        "    b = a.view(np.int32)\n"
        "    t = torch.zeros(3, 4)\n"
        "    return a.max(1), b, t.max(1), t.view(12)\n"
    )
    out = engine.fix(src, engine.Options(registry.select("jax"), unsafe_fixes=True)).source
    assert "b = a.view(np.int32)" in out and "return a.max(1), b," in out
    assert "(jnp.max(t, axis=1), jnp.argmax(t, axis=1)), t.reshape(12)" in out


def test_functional_import_goes_when_no_use_is_left():
    from porter import engine, registry

    keep = "import torch\nimport torch.nn.functional as F\n\ndef f(x):\n    return F.relu(x), F.gumbel_softmax(x)\n"
    gone = "import torch\nimport torch.nn.functional as F\n\ndef f(x):\n    return F.relu(x)\n"
    options = engine.Options(registry.select("jax"), unsafe_fixes=True)
    assert "import torch.nn.functional as F" not in engine.fix(gone, options).source
    assert "import torch.nn.functional as F" in engine.fix(keep, options).source


def test_call_of_an_nnx_module_keeps_jnp_methods():
    """In an NNX module's __call__ the arrays are jnp's: `h.max(1)` is numpy's max over axis 1,
    `x.repeat(r, axis=0)` numpy's repeat; they are not torch's and stay as written."""
    from porter import engine, registry

    src = (
        "import torch\nfrom flax import nnx\n\n"
        "class Head(nnx.Module):\n"
        "    def __init__(self, *, rngs):\n"
        "        self.fc = nnx.Linear(4, 3, rngs=rngs)\n\n"
        "    def __call__(self, x, reps):\n"
        "        h = self.fc(x)\n"
        "        return h.max(1), x.repeat(reps, axis=0), h.sum(1)\n"
    )
    out = engine.fix(src, engine.Options(registry.select("jax"), unsafe_fixes=True)).source
    assert "return h.max(1), x.repeat(reps, axis=0), h.sum(1)" in out
