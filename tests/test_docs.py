"""The rule docs in docs/rules are generated from the rule classes and must not be stale."""
from porter import docs
from porter._layout import REPO


def test_rule_docs_are_current():
    pages = docs.render_all()
    folder = REPO / "docs" / "rules"
    stale = [name for name, text in pages.items() if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != text]
    extra = [p.name for p in folder.glob("*.md") if p.name not in pages]
    assert not stale and not extra, f"run `python -m porter.docs` (stale: {stale}, extra: {extra})"


def test_tpu_doc_is_current():
    assert (REPO / "docs" / "tpu.md").read_text(encoding="utf-8") == docs.tpu_markdown(), "run `python -m porter.docs`"


def test_generated_target_docs_are_current():
    """The pages a target renders from its tables (docs/jax-ops.md) come from the same command."""
    from porter import registry

    generated = registry.generated_docs()
    assert "jax-ops.md" in generated
    stale = [name for name, render in generated.items() if (REPO / "docs" / name).read_text(encoding="utf-8") != render()]
    assert not stale, f"run `python -m porter.docs` (stale: {stale})"


def test_explain_prints_examples():
    from porter import registry

    rule = registry.find("TX201")
    text = docs.rule_markdown(rule)
    assert "xm.optimizer_step(optimizer)" in text and "## Why" in text
