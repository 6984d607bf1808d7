"""porter.edits: a fix as minimal text edits gives, byte for byte, what the tree's fix gives
(``apply_fixes`` of that fix alone), whichever way the edits are found; and
porter._libcst_compat, the one module that reaches into LibCST's internals, is checked
against the LibCST version installed and locked."""
from __future__ import annotations

import re
from pathlib import Path

import libcst as cst
import pytest

from porter import _libcst_compat, edits, engine
from porter.context import FileContext
from porter.rules import Edit, Fix, Rule

REPO = Path(__file__).resolve().parent.parent


# -- LibCST's internals: one module, one version -----------------------------------------------
def test_libcst_internals_are_checked_against_the_locked_and_installed_version():
    locked = re.search(r"^libcst==(\S+)", (REPO / "requirements.lock").read_text(encoding="utf-8"), re.M)
    assert locked, "requirements.lock pins no libcst"
    checked = _libcst_compat.CHECKED_VERSION
    assert locked.group(1) == checked, (
        f"requirements.lock pins libcst {locked.group(1)}, porter/_libcst_compat.py was checked against {checked}: "
        "read its functions against the new LibCST's sources, run tests/test_engine.py and tests/test_incremental.py, "
        "then change CHECKED_VERSION")
    installed = _libcst_compat.installed_version()
    assert installed == checked, (
        f"LibCST {installed} is installed, porter/_libcst_compat.py was checked against {checked} "
        "(requirements.lock): install the locked version, or check the module against this one")


_PRIVATE = re.compile(r"^\s*(?:from|import)\s+libcst\.(?:_\w*|metadata\.position_provider)\b", re.M)


def test_no_other_module_imports_libcst_internals():
    offenders = []
    for folder in ("porter", "codemods"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "_libcst_compat.py" and path.parent.name == "porter":
                continue
            for m in _PRIVATE.finditer(path.read_text(encoding="utf-8")):
                offenders.append(f"{path.relative_to(REPO)}: {m.group(0).strip()}")
    assert not offenders, "import LibCST's internals through porter/_libcst_compat.py: " + "; ".join(offenders)


def test_compat_positions_are_positionproviders():
    from libcst.metadata import MetadataWrapper, PositionProvider

    src = "import os\r\n\r\nclass A:\r\n    def f(self, x):  # c\r\n        return [x,\r\n                1]\r\n"
    module = cst.parse_module(src)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    want = wrapper.resolve(PositionProvider)
    assert _libcst_compat.node_positions(module) == dict(want)
    assert _libcst_compat.code_of(module, module.body) == src


# -- the one API: the tree's fix and its text edits agree ---------------------------------------
class Rewrites(Rule):
    """Test rule: ``old(...)`` -> ``new(...)`` (a callable replacement), the string 'a' -> a name
    (a node), ``print(...)`` statements removed, ``loop()`` statements become two statements,
    ``need(...)`` -> ``np.need(...)`` needing ``import numpy as np``."""

    code, name, target, summary, needs_text = "T090", "t-rewrites", "test", "x", ()

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, cst.Name) and func.value == "old":
            self.report(node, "old", Fix((Edit(func, lambda n: n.with_changes(value="new")),)))
        elif isinstance(func, cst.Name) and func.value == "need":
            self.report(node, "need", Fix((Edit(func, cst.Attribute(cst.Name("np"), cst.Name("need"))),),
                                          imports=("numpy",)))

    def visit_SimpleString(self, node):
        if node.value == "'a'":
            self.report(node, "a", Fix((Edit(node, cst.Name("value")),)))

    def visit_SimpleStatementLine(self, node):
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr) or not isinstance(node.body[0].value, cst.Call):
            return
        func = node.body[0].value.func
        if isinstance(func, cst.Name) and func.value == "print":
            self.report(node, "print", Fix((Edit(node, cst.RemoveFromParent()),)))
        elif isinstance(func, cst.Name) and func.value == "loop":
            twice = cst.FlattenSentinel([node, cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Name("step")))])])
            self.report(node, "loop", Fix((Edit(node, twice),)))


SOURCES = {
    "one line": "x = old(1) + old(2)\ny = 'a'\n",
    "nested blocks": "def f():\n    for i in r:\n        if i:\n            print(i)\n            z = old(i)\n    return 'a'\n",
    "flatten in a block": "class A:\n    def f(self):\n        loop()\n\n\n        return 1\n",
    "import after docstring": '"""Doc."""\nimport os\n\n# a comment\ndef f():\n    return need(1)\n',
    "import into no head": "def f():\n    return need(1)\n",
    "import with numpy there": "import numpy as np\n\ndef f():\n    return need(1)\n",
    "strict head": "__strict__ = True\nimport os\nx = need(2)\n",
    "crlf": "import os\r\n\r\ndef f():\r\n    x = old(1)\r\n    print(x)\r\n    return need('a')\r\n",
    # (LibCST drops a lone-CR file's last line break: the text edits keep it, the tree's code not)
    "lone cr": "x = old(1)\rdef f():\r    return 'a'",
    "no trailing newline": "def f():\n    return old(1)",
    "multi-line call": "x = old(\n    1,\n    'a',\n)\nif x:\n    loop()\n",
    "decorated": "@old(1)\ndef f():\n    pass\n\n@dec\nclass C:\n    x = 'a'\n",
    "comments and blank lines": "# head\n\nimport os  # os\n\n\n# before f\ndef f():  # f\n    # inside\n    return old(  # c\n        1)\n",
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_fix_as_text_edits_equals_the_trees_fix(name):
    src = SOURCES[name]
    module = engine.parse(src)
    assert module.code == src
    findings = engine.run_rules(module, [Rewrites])
    assert findings
    engine.attach_positions(module, findings)
    editor = edits.FixEditor(src, module)
    for f in findings:
        want = edits.apply_fixes(module, [f.fix], FileContext(module)).code
        got = editor.edits(f.fix)
        assert edits.apply_text_edits(src, got) == want, (name, f.message)
        assert got == edits.joined(got)  # in order, never overlapping
        assert editor.edits(f.fix) is got  # kept


def test_the_incremental_positions_give_the_same_edits():
    from porter import incremental

    src = SOURCES["comments and blank lines"] + SOURCES["nested blocks"]
    doc = incremental.Document([Rewrites])
    doc.check(src)
    new = src.replace("return 'a'", "return 'a' + 'a'")
    checked = doc.check(new)
    assert checked.reparsed is not None  # spliced, not parsed again
    editor = edits.FixEditor(new, checked.module, checked.positions, checked.statement_starts)
    for f in checked.findings:
        want = edits.apply_fixes(checked.module, [f.fix], FileContext(checked.module)).code
        assert edits.apply_text_edits(new, editor.edits(f.fix)) == want


def test_a_fix_that_removes_imports_goes_through_the_whole_module():
    src = "import os\nimport sys\n\nx = os.getcwd()\n"
    module = engine.parse(src)
    target = module.body[2].body[0].value
    fix = Fix((Edit(target, cst.Integer("1")),), remove_imports=(("os", None),))
    editor = edits.FixEditor(src, module)
    assert editor.needs_whole_module(fix) and editor.known(fix) is None
    assert edits.apply_text_edits(src, editor.edits(fix)) == "import sys\n\nx = 1\n"
    assert editor.known(fix) is not None


def test_a_failing_replacement_raises_fix_failed():
    src = "x = old(1)\n"
    module = engine.parse(src)

    def boom(node):
        raise ValueError("no")

    fix = Fix((Edit(module.body[0].body[0].value.func, boom),))
    with pytest.raises(edits.FixFailed):
        edits.FixEditor(src, module).edits(fix)


def test_text_edits_are_minimal_and_round_trip():
    old, new = "a = 1\r\nb = 2\r\nc = 3\r\n", "a = 1\r\nb = 22\r\nc = 3\r\nd = 4\r\n"
    got = edits.text_edits(old, new)
    assert got == [edits.TextEdit((1, 5), (1, 5), "2"), edits.TextEdit((3, 0), (3, 0), "d = 4\r\n")]
    assert edits.apply_text_edits(old, got) == new
    assert edits.text_edits(old, old) == []
    assert edits.split_lines("a\x0c\u2028b\r\nc\rd") == ["a\x0c\u2028b\r\n", "c\r", "d"]


def test_joined_merges_touching_edits_and_refuses_overlaps():
    a, b = edits.TextEdit((0, 0), (0, 0), "x"), edits.TextEdit((0, 0), (0, 3), "y")
    assert edits.joined([b, a]) == [edits.TextEdit((0, 0), (0, 3), "xy")]
    with pytest.raises(ValueError):
        edits.joined([edits.TextEdit((0, 0), (0, 4), ""), edits.TextEdit((0, 2), (0, 5), "")])


def test_the_engine_applies_fixes_through_porter_edits():
    assert engine.apply_fixes is edits.apply_fixes and engine.add_imports is edits.add_imports
    assert engine.remove_imports is edits.remove_imports and engine.keep_boundary is edits.keep_boundary
