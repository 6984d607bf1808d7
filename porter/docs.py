"""Rule documentation rendered from the rule classes (used by `porter explain` and docs/rules).

`python -m porter.docs` writes every generated document: docs/rules/, docs/tpu.md and the pages
the targets render from their own tables (registry.generated_docs: docs/jax-ops.md)."""
from __future__ import annotations

import jinja2

from porter._layout import templates_dir
from porter.rules import RuleInfo

_TEMPLATE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(templates_dir())), keep_trailing_newline=True, autoescape=False
)


def rule_markdown(rule) -> str:
    info = RuleInfo.of(rule)
    return _TEMPLATE.get_template("rule.md.j2").render(rule=info)


def catalogue_markdown(rules) -> str:
    return _TEMPLATE.get_template("rules_index.md.j2").render(rules=[RuleInfo.of(r) for r in rules])


def tpu_markdown() -> str:
    """docs/tpu.md: kits and the platform table, from porter.platforms (never typed by hand)."""
    from porter import platforms

    return _TEMPLATE.get_template("tpu.md.j2").render(table=platforms.version_table_markdown(), colab=platforms.COLAB)


def render_all() -> dict[str, str]:
    """Relative path under docs/rules -> text, for every rule and the index."""
    from porter import registry

    rules = registry.all_rules()
    pages = {f"{r.code}.md": rule_markdown(r) for r in rules}
    pages["index.md"] = catalogue_markdown(rules)
    return pages


def main() -> None:
    """Write docs/rules/ from the rule classes (run after adding or changing a rule)."""
    import sys

    from porter._layout import REPO

    out = REPO / "docs" / "rules"
    out.mkdir(parents=True, exist_ok=True)
    pages = render_all()
    for old in out.glob("*.md"):
        if old.name not in pages:
            old.unlink()
    for name, text in pages.items():
        (out / name).write_text(text, encoding="utf-8")
    (REPO / "docs" / "tpu.md").write_text(tpu_markdown(), encoding="utf-8")
    from porter import registry

    generated = registry.generated_docs()
    for name, render in generated.items():
        (REPO / "docs" / name).write_text(render(), encoding="utf-8")
    print(f"wrote {len(pages)} pages to {out}, docs/tpu.md and {', '.join(f'docs/{n}' for n in generated)}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
