"""Tests generated from every rule's own examples (the same examples the docs show).

For each example: the rule reports on `before`; applying fixes gives `after` byte for byte;
a second run on `after` changes nothing and reports nothing fixable from this rule; an unsafe
fix is not applied without --unsafe-fixes. Each `valid` snippet gives no finding.
"""
import libcst as cst
import pytest

from porter import engine, registry

RULES = registry.all_rules()
EXAMPLES = [
    pytest.param(rule, i, id=f"{rule.code}-{i}")
    for rule in RULES
    for i in range(len(rule.examples))
]
VALID = [pytest.param(rule, i, id=f"{rule.code}-valid-{i}") for rule in RULES for i in range(len(rule.valid))]


def test_every_rule_has_examples_and_docs():
    assert RULES, "no rules discovered"
    for rule in RULES:
        assert rule.examples, f"{rule.code} has no examples"
        doc = rule.doc()
        for heading in ("## What it does", "## Why"):
            assert heading in doc, f"{rule.code} doc lacks {heading!r}"
        if any(e.after is not None for e in rule.examples):
            assert "## Fix safety" in doc, f"{rule.code} has fixes but no 'Fix safety' section"


@pytest.mark.parametrize("rule,i", EXAMPLES)
def test_example(rule, i):
    ex = rule.examples[i].dedented()
    only = engine.Options((rule,), unsafe_fixes=ex.unsafe)
    found = engine.check(ex.before, only).findings
    assert any(f.code == rule.code for f in found), f"{rule.code} reported nothing on its example"
    result = engine.fix(ex.before, only)
    if ex.after is None:
        assert not result.changed, "a report-only example must not be changed"
        assert any(f.code == rule.code for f in result.remaining)
        return
    assert result.source == ex.after
    cst.parse_module(result.source)
    again = engine.fix(result.source, only)
    assert not again.changed and again.source == result.source
    assert not [f for f in again.remaining if f.code == rule.code and f.fixable]
    if ex.unsafe:
        safe_only = engine.fix(ex.before, engine.Options((rule,), unsafe_fixes=False))
        assert safe_only.source != ex.after, "an unsafe fix was applied without --unsafe-fixes"


@pytest.mark.parametrize("rule,i", VALID)
def test_valid(rule, i):
    import textwrap

    src = textwrap.dedent(rule.valid[i])
    found = engine.check(src, engine.Options((rule,))).findings
    assert not [f for f in found if f.code == rule.code]
