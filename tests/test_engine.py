"""The engine's contract, with small rules defined here (independent of the shipped rules)."""
import libcst as cst
import pytest

from porter import engine
from porter.context import FileContext
from porter.rules import Edit, Fix, Rule, Safety, Severity


class RenameCuda(Rule):
    """## What it does\nx\n## Why\ny\n## Fix safety\nz"""

    code = "T001"
    name = "t-rename"
    target = "test"
    summary = "torch.cuda.synchronize() -> xm.wait_device_ops()"
    needs_text = ("torch",)

    def visit_Call(self, node):
        if self.ctx.qualname(node.func) == "torch.cuda.synchronize":
            xm = self.ctx.module_alias("torch_xla.core.xla_model")
            self.report(node, "sync", Fix((Edit(node, cst.parse_expression(f"{xm}.wait_device_ops()")),),
                                          imports=("torch_xla.core.xla_model",)))


class AppendMarker(Rule):
    code = "T002"
    name = "t-append"
    target = "test"
    summary = "append a marker call to every for loop"
    needs_text = ()

    def visit_For(self, node):
        last = node.body.body[-1]
        if isinstance(last, cst.SimpleStatementLine) and "marker" in cst.Module([]).code_for_node(last):
            return
        self.report(node, "no marker", Fix((Edit(node, lambda n: n.with_changes(
            body=n.body.with_changes(body=[*n.body.body, cst.parse_statement("marker()")]))),)))


class Unsafe(Rule):
    code = "T003"
    name = "t-unsafe"
    target = "test"
    summary = "unsafe rename of f()"
    needs_text = ()

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "f":
            self.report(node, "f", Fix((Edit(node.func, cst.Name("g")),), safety=Safety.UNSAFE))


class NeverConverges(Rule):
    code = "T004"
    name = "t-loop"
    target = "test"
    summary = "wraps every call in another call, forever"
    needs_text = ()

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "h":
            self.report(node, "h", Fix((Edit(node, cst.Call(cst.Name("h"), [cst.Arg(node)])),)))


class BreaksSyntax(Rule):
    code = "T005"
    name = "t-bad"
    target = "test"
    summary = "produces code that does not parse"
    needs_text = ()

    def visit_Name(self, node):
        if node.value == "boom":
            self.report(node, "boom", Fix((Edit(node, cst.Name("lambda")),)))


def opts(*rules, unsafe=False):
    return engine.Options(tuple(rules), unsafe)


def test_names_resolve_through_imports_not_spelling():
    src = "import torch as t\nfrom torch import cuda\nt.cuda.synchronize()\ncuda.synchronize()\ntorch.cuda.synchronize()\n"
    found = engine.check(src, opts(RenameCuda)).findings
    # the third call spells torch but `torch` is not bound in this file
    assert [f.position.line for f in found] == [3, 4]


def test_imports_added_once_and_existing_alias_reused():
    out = engine.fix("import torch\ntorch.cuda.synchronize()\ntorch.cuda.synchronize()\n", opts(RenameCuda)).source
    assert out == "import torch\nimport torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\nxm.wait_device_ops()\n"
    own = "import torch\nimport torch_xla.core.xla_model as xmod\ntorch.cuda.synchronize()\n"
    assert engine.fix(own, opts(RenameCuda)).source == "import torch\nimport torch_xla.core.xla_model as xmod\nxmod.wait_device_ops()\n"


def test_callable_edits_compose_with_inner_edits():
    src = "import torch\nfor i in x:\n    torch.cuda.synchronize()\n"
    result = engine.fix(src, opts(RenameCuda, AppendMarker))
    assert result.source.endswith("for i in x:\n    xm.wait_device_ops()\n    marker()\n")
    assert result.fixed == {"T001": 1, "T002": 1}
    assert engine.fix(result.source, opts(RenameCuda, AppendMarker)).changed is False


def test_unsafe_fixes_only_on_request():
    assert engine.fix("f()\n", opts(Unsafe)).changed is False
    assert engine.fix("f()\n", opts(Unsafe, unsafe=True)).source == "g()\n"
    left = engine.fix("f()\n", opts(Unsafe)).remaining
    assert [f.code for f in left] == ["T003"] and left[0].fix.safety is Safety.UNSAFE


def test_suppression_comments():
    src = "import torch\ntorch.cuda.synchronize()  # porter: ignore[T001]\ntorch.cuda.synchronize()  # porter: ignore\ntorch.cuda.synchronize()  # porter: ignore[T999]\n"
    assert [f.position.line for f in engine.check(src, opts(RenameCuda)).findings] == [4]
    out = engine.fix(src, opts(RenameCuda)).source
    assert out.count("torch.cuda.synchronize()") == 2 and out.count("wait_device_ops") == 1


def test_suppression_counts_lines_as_python_does():
    # U+2028 inside a string is not a line break for Python (nor for LibCST's positions)
    src = 'import torch\nx = "a\u2028b"\ntorch.cuda.synchronize()  # porter: ignore[T001]\n'
    assert engine.check(src, opts(RenameCuda)).findings == []


def test_fixes_that_never_converge_fail_the_file():
    with pytest.raises(engine.PorterError, match="did not converge"):
        engine.fix("h()\n", opts(NeverConverges))


def test_fix_producing_invalid_code_fails_the_file():
    with pytest.raises(engine.PorterError, match="does not parse"):
        engine.fix("boom\n", opts(BreaksSyntax))


def test_untouched_source_is_returned_identically():
    src = "# nothing here\r\nx = 1\r\n"
    result = engine.fix(src, opts(RenameCuda, Unsafe))
    assert not result.changed and result.source == src


def test_crlf_kept_in_inserted_statements():
    src = "import torch\r\nfor i in x:\r\n    torch.cuda.synchronize()\r\n"
    out = engine.fix(src, opts(RenameCuda, AppendMarker)).source
    assert "\n" not in out.replace("\r\n", "")


@pytest.mark.parametrize("src,needle", [
    ("print 'hello'\n", "Python 2"),
    ("def f(:\n", "syntax error at line 1"),
    ("x = (\n", "syntax error"),
])
def test_parse_errors_are_one_line(src, needle):
    with pytest.raises(engine.PorterError) as info:
        engine.check(src, opts(RenameCuda))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_prefilter_skips_rules():
    assert engine.applicable_rules([RenameCuda, Unsafe], "x = 1") == [Unsafe]


def test_ancestors_available_during_visit():
    seen = []

    class Probe(Rule):
        code = "T006"
        name = "t-probe"
        target = "test"
        summary = "records the parent of every call"
        needs_text = ()

        def visit_Call(self, node):
            seen.append(type(self.ctx.parent).__name__)

    engine.check("f(g())\n", opts(Probe))
    assert seen == ["Expr", "Arg"]


# Import removals ---------------------------------------------------------------------------
class DropCalls(Rule):
    """Removes `<x>.drop()` / `drop()` statement lines; the imports they used may go."""

    code = "T006"
    name = "t-drop"
    target = "test"
    summary = "remove drop() calls and the imports they leave unused"
    needs_text = ()
    removals = (("a.b", None), ("a", "b"), ("m", "drop"))

    def visit_SimpleStatementLine(self, node):
        small = node.body[0]
        if (len(node.body) == 1 and isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                and (self.ctx.qualname(small.value.func) or "").endswith(".drop")):
            self.report(node, "drop", Fix((Edit(node, cst.RemoveFromParent()),), remove_imports=self.removals,
                                          safety=Safety.UNSAFE if "unsafe" in self.ctx.module.code else Safety.SAFE))


def test_removed_import_kept_while_used_elsewhere():
    src = "import a.b as c\nc.drop()\nc.keep()\n"
    assert engine.fix(src, opts(DropCalls)).source == "import a.b as c\nc.keep()\n"
    src = "from a import b\n\ndef f():\n    b.drop()\n\ndef g():\n    return b.other\n"
    assert engine.fix(src, opts(DropCalls)).source == "from a import b\n\ndef f():\n    pass\n\ndef g():\n    return b.other\n"


def test_unused_import_removed_in_both_forms():
    src = "import os\nimport a.b as c\n\nc.drop()\nprint(os.sep)\n"
    assert engine.fix(src, opts(DropCalls)).source == "import os\nprint(os.sep)\n"
    src = "from a import z, b\nfrom m import drop\nb.drop()\ndrop()\nz()\n"
    assert engine.fix(src, opts(DropCalls)).source == "from a import z\nz()\n"
    # the alias is read from the file: `from a import b as bee`, `import a.b` without alias
    src = "from a import b as bee\nimport a.b\nbee.drop()\na.b.drop()\nx = 1\n"
    assert engine.fix(src, opts(DropCalls)).source == "x = 1\n"


def test_only_requested_and_applied_removals():
    # an unused import nobody asked about stays; so does one named in a fix that is not applied
    src = "import os\nimport a.b as c\nc.drop()\n"
    assert engine.fix(src, opts(DropCalls)).source == "import os\n"
    unsafe = "import a.b as c\nc.drop()  # unsafe\n"
    assert engine.fix(unsafe, opts(DropCalls)).source == unsafe
    assert engine.fix(unsafe, opts(DropCalls, unsafe=True)).source.strip() == ""
    # __all__ counts as a use
    src = "from m import drop\n__all__ = ['drop']\ndrop()\n"
    assert engine.fix(src, opts(DropCalls)).source == "from m import drop\n__all__ = ['drop']\n"


def test_removal_is_idempotent_and_composes_with_additions():
    src = '"""doc."""\nimport torch\nimport a.b as c\n\nc.drop()\ntorch.cuda.synchronize()\n'
    once = engine.fix(src, opts(DropCalls, RenameCuda))
    assert once.source == '"""doc."""\nimport torch\nimport torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\n'
    assert once.fixed == {"T006": 1, "T001": 1}
    again = engine.fix(once.source, opts(DropCalls, RenameCuda))
    assert not again.changed and again.source == once.source
    # apply_fixes directly: a removal whose import is not in the file changes nothing
    module = cst.parse_module("x = 1\n")
    assert engine.apply_fixes(module, [Fix((), remove_imports=(("a.b", None),))]).code == "x = 1\n"


def test_added_imports_after_docstring_and_future_imports():
    src = '"""doc."""\nfrom __future__ import annotations\nimport torch\ntorch.cuda.synchronize()\n'
    assert engine.fix(src, opts(RenameCuda)).source == (
        '"""doc."""\nfrom __future__ import annotations\nimport torch\nimport torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\n'
    )


@pytest.mark.parametrize("src", [
    "", "import os\n", '"""d"""\n', '"""d"""\nx = 1\n', "__strict__ = True\nimport a\n# c\nx = 1\n",
    "# top\n\nimport os\n\n\n# comment\nclass A:\n    def f(self):\n        return 1\n",
    "import os; import sys\nx = 1\n", "'''d'''\r\nimport os\r\nx = 1\r\n", "x = 1\nimport os\n",
    "from __future__ import annotations\n\ndef f():\n    import os\n",
])
def test_add_imports_matches_add_imports_visitor_on_the_whole_module(src):
    # add_imports runs AddImportsVisitor on the module's head only; the text must be what the
    # visitor gives on the whole module
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor, ImportItem

    module = cst.parse_module(src)
    mods = ["torch_xla", "torch_xla.core.xla_model", "os"]
    ctx = FileContext(module)
    items = [ImportItem(m, None, "xm") if m == "torch_xla.core.xla_model" else ImportItem(m)
             for m in mods if m not in ctx.module_names]
    want = module.visit(AddImportsVisitor(CodemodContext(), items)).code
    assert engine.add_imports(module, mods, ctx).code == want


def test_node_positions_agree_with_libcst_position_provider():
    from libcst.metadata import MetadataWrapper, PositionProvider

    src = "import torch\r\n\r\nclass A:\r\n    def f(self, x):  # é\r\n        return torch.cuda.synchronize(x) + 'ü' \\\r\n            + 1\r\n"
    module = cst.parse_module(src)
    ours = engine.node_positions(module)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    assert len(ours) == len(theirs) and all(ours[n] == theirs[n] for n in theirs)
