"""The engine's contract, with small rules defined here (independent of the shipped rules)."""
import libcst as cst
import pytest

from porter import edits, engine, lsp
from porter.context import FileContext
from porter.runner import Settings
from porter.rules import Edit, Fix, NeedsHuman, Rule, Safety, Severity


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
    out = engine.fix("import torch\ntorch.cuda.synchronize()\ntorch.cuda.synchronize()\ntorch.ones(1)\n",
                     opts(RenameCuda)).source
    assert out == ("import torch\nimport torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\nxm.wait_device_ops()\n"
                   "torch.ones(1)\n")
    own = "import torch\nimport torch_xla.core.xla_model as xmod\ntorch.cuda.synchronize()\ntorch.ones(1)\n"
    assert engine.fix(own, opts(RenameCuda)).source == (
        "import torch\nimport torch_xla.core.xla_model as xmod\nxmod.wait_device_ops()\ntorch.ones(1)\n")


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


def test_a_name_in_a_comment_or_docstring_is_no_use_and_a_string_annotation_is():
    tail = 'def f():\n    """Calls drop() as m does."""\n    return 1  # drop\n'
    assert engine.fix(f"from m import drop\ndrop()\n\n{tail}", opts(DropCalls)).source == tail  # no blank first line
    tail = 'def f(x: "drop"):\n    """drop"""\n    return x\n'
    assert engine.fix(f"from m import drop\ndrop()\n\n{tail}", opts(DropCalls)).source == f"from m import drop\n\n{tail}"


def test_removal_is_idempotent_and_composes_with_additions():
    src = '"""doc."""\nimport torch\nimport a.b as c\n\nc.drop()\ntorch.cuda.synchronize()\n'
    once = engine.fix(src, opts(DropCalls, RenameCuda))
    # `import torch` goes too: the port left it unused (engine.orphaned_imports)
    assert once.source == '"""doc."""\nimport torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\n'
    assert once.fixed == {"T006": 1, "T001": 1}
    again = engine.fix(once.source, opts(DropCalls, RenameCuda))
    assert not again.changed and again.source == once.source
    # apply_fixes directly: a removal whose import is not in the file changes nothing
    module = cst.parse_module("x = 1\n")
    assert engine.apply_fixes(module, [Fix((), remove_imports=(("a.b", None),))]).code == "x = 1\n"


def test_added_imports_after_docstring_and_future_imports():
    src = '"""doc."""\nfrom __future__ import annotations\nimport torch\ntorch.cuda.synchronize()\ntorch.ones(1)\n'
    assert engine.fix(src, opts(RenameCuda)).source == (
        '"""doc."""\nfrom __future__ import annotations\nimport torch\nimport torch_xla.core.xla_model as xm\n\n'
        'xm.wait_device_ops()\ntorch.ones(1)\n'
    )


@pytest.mark.parametrize("src,want", [
    # the port's rewrite took the last use: the import goes
    ("import torch\ntorch.cuda.synchronize()\n", "import torch_xla.core.xla_model as xm\n\nxm.wait_device_ops()\n"),
    # one the user had unused stays as it was
    ("import os\nimport sys\nimport torch\n\nos.getcwd()\ntorch.cuda.synchronize()\n",
     "import os\nimport sys\nimport torch_xla.core.xla_model as xm\n\nos.getcwd()\nxm.wait_device_ops()\n"),
    # still read elsewhere (a function, an f-string, a string annotation): stays
    ("import torch\n\ndef f():\n    return torch.ones(1)\ntorch.cuda.synchronize()\n",
     "import torch\nimport torch_xla.core.xla_model as xm\n\ndef f():\n    return torch.ones(1)\nxm.wait_device_ops()\n"),
    ("import torch\nprint(f'{torch.__version__}')\ntorch.cuda.synchronize()\n",
     "import torch\nimport torch_xla.core.xla_model as xm\n\nprint(f'{torch.__version__}')\nxm.wait_device_ops()\n"),
    ("import torch\ndef f(x: 'torch.Tensor'): ...\ntorch.cuda.synchronize()\n",
     "import torch\nimport torch_xla.core.xla_model as xm\n\ndef f(x: 'torch.Tensor'): ...\nxm.wait_device_ops()\n"),
    # an import named only in a comment or a docstring after the port: it goes
    ("import torch as T\n# T is torch\nT.cuda.synchronize()\n",
     "import torch_xla.core.xla_model as xm\n\n# T is torch\nxm.wait_device_ops()\n"),
    # ... or in the words of a message (a help string, an f-string's text outside its fields,
    # bytes): no string annotation, no __all__ entry
    ("import torch\np.add_argument('--sync', help='calls torch.cuda.synchronize')\n"
     "raise KeyError(f'no torch here: {key!r}', b'torch')\ntorch.cuda.synchronize()\n",
     "import torch_xla.core.xla_model as xm\n\np.add_argument('--sync', help='calls torch.cuda.synchronize')\n"
     "raise KeyError(f'no torch here: {key!r}', b'torch')\nxm.wait_device_ops()\n"),
    # an f-string's field reads, wherever the f-string stands (alone on its line too; in a
    # format spec too)
    ("import torch\nf'{torch.cuda}'\nf'{x:>{torch.w}}'\ntorch.cuda.synchronize()\n",
     "import torch\nimport torch_xla.core.xla_model as xm\n\nf'{torch.cuda}'\nf'{x:>{torch.w}}'\nxm.wait_device_ops()\n"),
])
def test_an_import_the_port_left_unused_goes(src, want):
    once = engine.fix(src, opts(RenameCuda))
    assert once.source == want
    assert not engine.fix(once.source, opts(RenameCuda)).changed


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


# -- a replacement keeps what the code around it relies on ----------------------------------
# Keyword contexts with no space before a bracketed expression (legal Python); the shipped
# rules of every target rewrite the expressions below with nodes that have no parentheses.
KEYWORD_CONTEXTS = [
    "return({e})", "yield({e})", "if({e}): pass", "while({e}): break", "assert({e})",
    "y = not({e})", "y = a in({e})", "y = a not in({e})", "y = a is({e})", "y = a is not({e})",
    "y = a and({e})", "y = a or({e})", "g = lambda:({e})", "raise({e})", "with({e}): pass",
    "for i in({e}): pass", "y = [i for i in({e})]", "y = 1 if({e})else 2", "y = ({e})if a else 2",
    "y = a if b else({e})", "if a: pass\n    elif({e}): pass", "y = {{k: v for k, v in({e})}}",
]
KEYWORD_EXPRESSIONS = [
    ("torch-xla", "torch.device('cuda')"), ("torch-xla", "x.cuda()"),
    ("jax", "torch.zeros(3)"), ("jax", "x.cuda()"),
    ("torch", "mx.gpu()"), ("torch", "nd.array([1, 2])"), ("torch", "x.asnumpy()"), ("torch", "nd.mean(x)"),
    ("torch-xla", "nd.relu(x)"), ("jax", "mx.nd.zeros((2, 3))"),
]
KEYWORD_PREAMBLE = "import torch\nimport numpy as np\n\n\n"
GLUON_PREAMBLE = "import mxnet as mx\nfrom mxnet import nd\n\n\n"


@pytest.mark.parametrize("target,expr", KEYWORD_EXPRESSIONS)
def test_replacements_after_a_keyword_keep_their_parentheses(target, expr):
    """`return(torch.device('cuda'))` and the like, in 22 keyword contexts, with the real rules
    of each target (the Gluon front end too): every fix applies, the output compiles, and a
    second run changes nothing; `porter check`'s fix of each finding (the editor's quick-fix
    path, ``engine.apply_fixes``) gives code that compiles too."""
    from porter import registry

    options = engine.Options(registry.select(target))
    preamble = GLUON_PREAMBLE if ("mx." in expr or "nd." in expr or "asnumpy" in expr) else KEYWORD_PREAMBLE
    for context in KEYWORD_CONTEXTS:
        src = preamble + "def f(x, a, b):\n    " + context.format(e=expr) + "\n"
        result = engine.fix(src, options)
        assert not [f.message for f in result.remaining if f.internal_error], (context, expr)
        assert result.changed and expr not in result.source, (context, result.source)
        compile(result.source, "<port>", "exec")
        assert not engine.fix(result.source, options).changed
        checked = engine.check(src, options)
        for finding in checked.findings:
            if finding.fix is not None:
                compile(engine.apply_fixes(checked.module, [finding.fix]).code, "<fix preview>", "exec")
        an = lsp.analyze(src, Settings(target), "k.py")
        for finding in an.findings:
            if finding.fix is not None:  # the editor's quick-fix: text changes of this fix alone
                compile(_apply_text_changes(src, lsp.fix_changes(an, finding)), "<quick-fix>", "exec")


def _apply_text_changes(text: str, changes) -> str:
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    for c in sorted(changes, key=lambda c: (c.start, c.end), reverse=True):
        a, b = starts[c.start[0]] + c.start[1], starts[c.end[0]] + c.end[1]
        text = text[:a] + c.text + text[b:]
    return text


class WordFor(Rule):
    """Test rule: the string 'a' and the call boom() become the name `value`."""

    code, name, target, summary, needs_text = "T010", "t-word", "test", "x", ()

    def visit_SimpleString(self, node):
        if node.value == "'a'":
            self.report(node, "a", Fix((Edit(node, cst.Name("value")),)))

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "boom":
            self.report(node, "boom", Fix((Edit(node, lambda n: cst.Name("value")),)))


@pytest.mark.parametrize("before,after", [
    ("return('a')\n", "return('a')\n".replace("'a'", "value")),
    ("return'a'\n", "return(value)\n"),
    ("y = 'a'if c else'a'\n", "y = (value)if c else(value)\n"),
    ("y = x in'a'\n", "y = x in(value)\n"),
    ("y = ['a', 'a']\n", "y = [value, value]\n"),
    ("y = 'a' + 'a'\n", "y = value + value\n"),
    ("y = {'a':'a'}\n", "y = {value:value}\n"),
    ("y = f('a')\n", "y = f(value)\n"),
    ("y = (boom())\n", "y = (value)\n"),
    ("y = boom()\n", "y = value\n"),
    ("if(boom()):\n    pass\n", "if(value):\n    pass\n"),
    ("assert(((boom())))\n", "assert(((value)))\n"),
    ("y = not'a'\n", "y = not(value)\n"),
])
def test_parentheses_kept_and_added_only_where_the_code_needs_them(before, after):
    src = "def f(x, c):\n    " + before.replace("\n", "\n    ").rstrip(" ")
    want = "def f(x, c):\n    " + after.replace("\n", "\n    ").rstrip(" ")
    assert engine.fix(src, opts(WordFor)).source == want


# -- a rule that fails is that rule's bug; the others' fixes still apply ----------------------
class CrashesOnVisit(Rule):
    code, name, target, summary, needs_text = "T020", "t-crash", "test", "x", ()

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "crash":
            raise ValueError("no way\nat all")
        self.report(node, "seen")  # reported before the crash: dropped with the rule's findings


class CrashesInFix(Rule):
    code, name, target, summary, needs_text = "T021", "t-crash-fix", "test", "x", ()

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "later":
            self.report(node, "later", Fix((Edit(node, lambda n: {}["missing"]),)))


class RefusedByLibCST(Rule):
    """A replacement LibCST refuses when the parent is rebuilt (no space after `return`)."""

    code, name, target, summary, needs_text = "T022", "t-refused", "test", "x", ()

    def visit_Return(self, node):
        self.report(node, "ret", Fix((Edit(node, lambda n: n.with_changes(whitespace_after_return=cst.SimpleWhitespace(""))),)))


class BadNode(Rule):
    code, name, target, summary, needs_text = "T023", "t-bad-node", "test", "x", ()

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "crash":
            cst.Name("not a name")  # LibCST's validation raises inside this rule


def test_a_crashing_rule_is_reported_and_the_other_fixes_apply():
    src = "import torch\nf(1)\ncrash()\ntorch.cuda.synchronize()\n"
    for run in ("check", "fix"):
        if run == "check":
            findings = engine.check(src, opts(CrashesOnVisit, RenameCuda)).findings
        else:
            result = engine.fix(src, opts(CrashesOnVisit, RenameCuda))
            assert "xm.wait_device_ops()" in result.source and result.fixed == {"T001": 1}
            findings = result.remaining
        crash = [f for f in findings if f.code == "T020"]
        assert len(crash) == 1 and crash[0].internal_error and crash[0].severity is Severity.ERROR
        message = crash[0].message
        assert "internal error in rule T020" in message and "ValueError: no way at all" in message
        assert "test_engine.py:" in message and "\n" not in message
        assert crash[0].position.line == 3  # (for fix: the line in the text the rule failed on)


def test_libcst_errors_raised_in_a_rule_name_the_rule_not_libcst():
    (crash,) = engine.check("crash()\n", opts(BadNode)).findings
    assert crash.internal_error and "CSTValidationError" in crash.message
    assert "(tests/test_engine.py:" in crash.message or "(test_engine.py:" in crash.message.replace("tests/", "")
    assert "libcst" not in crash.message


@pytest.mark.parametrize("bad", [CrashesInFix, RefusedByLibCST])
def test_a_fix_that_fails_is_left_out_and_reported(bad):
    src = "import torch\n\n\ndef g():\n    later()\n    torch.cuda.synchronize()\n    return 1\n"
    result = engine.fix(src, opts(bad, RenameCuda))
    assert "xm.wait_device_ops()" in result.source and result.fixed == {"T001": 1}
    assert "later()" in result.source and "return 1" in result.source
    (crash,) = [f for f in result.remaining if f.code == bad.code]
    assert crash.internal_error and f"internal error in rule {bad.code} while fixing this code" in crash.message
    assert crash.position is not None and crash.position.line in (5, 7)


class NeedsAPerson(Rule):
    code, name, target, summary, needs_text = "T024", "t-manual", "test", "x", ()

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "hard":
            raise NeedsHuman("hard() has no port; write it by hand")
        if isinstance(node.func, cst.Name) and node.func.value == "maybe":
            def rewrite(n):
                raise NeedsHuman("maybe() turned out not to be portable")
            self.report(node, "maybe", Fix((Edit(node, rewrite),)))


def test_needs_human_becomes_a_finding_at_the_node():
    src = "import torch\nhard(1)\nmaybe(2)\ntorch.cuda.synchronize()\n"
    findings = engine.check(src, opts(NeedsAPerson, RenameCuda)).findings
    assert [(f.code, f.position.line, f.message) for f in findings if f.code == "T024"] == [
        ("T024", 2, "hard() has no port; write it by hand"), ("T024", 3, "maybe")]
    result = engine.fix(src, opts(NeedsAPerson, RenameCuda))
    assert "xm.wait_device_ops()" in result.source and "maybe(2)" in result.source
    left = {(f.code, f.message) for f in result.remaining}
    assert ("T024", "hard() has no port; write it by hand") in left
    assert ("T024", "maybe() turned out not to be portable") in left
    assert not [f for f in result.remaining if f.internal_error]


def test_unparsable_output_names_the_rule_and_the_line():
    src = "import torch\ntorch.cuda.synchronize()\nx = 1\nboom\n"
    with pytest.raises(engine.PorterError) as err:
        engine.fix(src, opts(BreaksSyntax, RenameCuda))
    message = str(err.value)
    assert "the fix of T005 at line 4 produced code that does not parse" in message and "T001" not in message
    assert "\n" not in message


@pytest.mark.parametrize("line", ["return'a'", "y = x in'a'", "y = 'a'if c else'a'", "y = not'a'", "y = f('a')"])
def test_quick_fix_text_edits_add_the_same_parentheses(line):
    """The editor's one-line quick-fix (text edits of the replacement, porter.edits.FixEditor)
    judges the characters around the target on its line as the engine does."""
    src = f"def f(x, c):\n    {line}\n"
    module = engine.parse(src)
    findings = engine.run_rules(module, [WordFor])
    engine.attach_positions(module, findings)
    editor = edits.FixEditor(src, module)
    want = engine.fix(src, opts(WordFor)).source
    text = src
    for finding in sorted(findings, key=lambda f: (f.position.line, f.position.column), reverse=True):
        text = _apply_text_changes(text, editor.edits(finding.fix))
    assert text == want


def test_an_if_the_fixes_emptied_goes_and_the_users_own_stays():
    """edits.without_emptied_ifs: `if flag: pass` a port left (its fixes removed the block's
    statements) goes at settle time, with its `elif`/`else` arms where the fixes emptied them
    all, and a block it empties gets `pass`; one the original had, one with a comment, an arm
    with code, or a test that calls something stays."""
    import libcst as cst

    from porter.edits import without_emptied_ifs

    before = cst.parse_module(
        "if kept:\n    pass\n"
        "if distributed:\n    model = wrap(model)\n"
        "def f():\n    if flag:\n        setup()\n"
        "if probe():\n    setup()\n"
        "if noted:  # the user's\n    setup()\n"
        "if a:\n    setup()\nelse:\n    other()\n"
        "if accel:\n    device = pick()\nelif mps:\n    device = mps()\nelse:\n    device = cpu()\n"
        "if b:\n    setup()\nelif probe():\n    other()\n")
    after = cst.parse_module(
        "if kept:\n    pass\n"
        "if distributed:\n    pass\n"
        "def f():\n    if flag:\n        pass\n"
        "if probe():\n    pass\n"
        "if noted:  # the user's\n    pass\n"
        "if a:\n    pass\nelse:\n    other()\n"
        "if accel:\n    pass\nelif mps:\n    pass\nelse:\n    pass\n"
        "if b:\n    pass\nelif probe():\n    pass\n")
    assert without_emptied_ifs(before, after).code == (
        "if kept:\n    pass\n"
        "def f():\n    pass\n"
        "if probe():\n    pass\n"
        "if noted:  # the user's\n    pass\n"
        "if a:\n    pass\nelse:\n    other()\n"
        "if b:\n    pass\nelif probe():\n    pass\n")


def test_a_line_a_rule_marked_for_a_person_stays_reported():
    """A `# porter: manual (CODE): reason` mark a rule wrote (on the line, or on a comment line
    above the statement) is a finding of that rule at the statement until the mark is removed,
    when the rule does not report the line again itself; a finding already there is not doubled."""
    from porter.engine import marked_findings
    from porter.rules import Finding, Position, Severity

    class Marker:
        code, severity = "JX012", Severity.ERROR

    text = ("x = 1\n"
            "init(m.weight)  # porter: manual (JX012): draws numbers without rngs\n"
            "    # porter: manual (JX012): a loop left as it is\n"
            "    for a in b:\n"
            "        pass\n"
            "y = 2  # porter: manual (ZZ999): a rule that is not selected\n"
            "z = 3  # porter: manual\n")
    found = marked_findings(text, [], [Marker])
    assert [(f.code, f.position.line, f.position.column) for f in found] == [("JX012", 2, 0), ("JX012", 4, 4)]
    assert found[0].message.startswith("draws numbers without rngs")
    reported = Finding("JX012", "already", None, Severity.ERROR, None, Position(2, 0, 2, 5))
    assert [f.position.line for f in marked_findings(text, [reported], [Marker])] == [4]
