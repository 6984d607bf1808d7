"""Rule documentation rendered from the rule classes (used by `porter explain` and docs/rules)."""
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
