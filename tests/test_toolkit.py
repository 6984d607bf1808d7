"""The rule toolkit (porter/astutil.py) and the layers of codemods/: the helpers every rule
calls behave as documented, the explicit variants differ where they say, and no rule or
target helper defines its own copy again."""
from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest

from porter import astutil
from porter.astutil import NOT_LITERAL

REPO = Path(__file__).resolve().parent.parent


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def stmt(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text)


# ----------------------------------------------------------------------------------------
# code, literal
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["x.view(-1)", "f(a, *b, k=1)", "[i for i in range(3)]", "(a  +  b)"])
def test_code_is_the_node_as_written(text):
    assert astutil.code(expr(text)) == text


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("-2.5", -2.5), ("'same'", "same"), ("None", None), ("True", True), ("(1, -2)", (1, -2)),
    ("[1, 2]", [1, 2]), ("((1, 2), [3])", ((1, 2), [3])), ("+4", 4),
])
def test_literal_values(text, value):
    got = astutil.literal(expr(text))
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["x", "f(1)", "(1, *rest)", "-True", "-'a'", "[1, y]", "1 + 2", "{'a': 1}"])
def test_not_literals(text):
    assert astutil.literal(expr(text)) is NOT_LITERAL


def test_literal_of_nothing():
    assert astutil.literal(None) is NOT_LITERAL and astutil.python_literal(None) is NOT_LITERAL


def test_literal_variants_differ_where_they_say():
    # the Gluon reading: lists are tuples, a unary plus is not a literal
    assert astutil.literal(expr("[1, [2]]"), lists_as_tuples=True) == (1, (2,))
    assert astutil.literal(expr("+1"), unary_plus=False) is NOT_LITERAL
    assert astutil.literal(expr("-1"), unary_plus=False) == -1
    # the NNX reading: whatever ast.literal_eval reads
    assert astutil.python_literal(expr("{'a': (1, 2)}")) == {"a": (1, 2)}
    assert astutil.python_literal(expr("'a' 'b'")) == "ab"
    assert astutil.literal(expr("'a' 'b'")) is NOT_LITERAL
    assert astutil.python_literal(expr("f(1)")) is NOT_LITERAL


def test_the_target_helpers_share_one_not_literal():
    from codemods.gluon import _model
    from codemods.jax import _nnx, _ops_table

    assert _model.NOT_LITERAL is _nnx.NOT_LITERAL is _ops_table.NOT_LITERAL is NOT_LITERAL
    assert _model.literal(expr("[1, 2]")) == (1, 2) and _ops_table.literal(expr("[1, 2]")) == [1, 2]
    assert _model.literal(expr("+1")) is NOT_LITERAL and _ops_table.literal(expr("+1")) == 1
    assert _nnx.literal(expr("{1: 2}")) == {1: 2}


# ----------------------------------------------------------------------------------------
# arguments and parameters
# ----------------------------------------------------------------------------------------
def test_arg_lookup_by_keyword_or_position():
    call = expr("f(a, b, *rest, c=3)")
    assert astutil.code(astutil.arg(call, "c").value) == "3"
    assert astutil.code(astutil.arg(call, "x", 1).value) == "b"
    assert astutil.arg(call, "x", 2) is None and astutil.arg(call, "x") is None
    assert astutil.has_kwarg(call, "c") and not astutil.has_kwarg(call, "a")


def test_kwarg_is_written_without_spaces():
    call = expr("f(a)")
    new = call.with_changes(args=[*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(
        whitespace_after=cst.SimpleWhitespace(" "))), astutil.kwarg("rngs", cst.Name("rngs"))])
    assert astutil.code(new) == "f(a, rngs=rngs)"


def test_params_in_order_and_has_param():
    fn = stmt("def f(a, /, b, *args, c, **kw): pass")
    assert [p.name.value for p in astutil.params(fn.params)] == ["a", "b", "args", "c", "kw"]
    assert all(astutil.has_param(fn, n) for n in ("a", "b", "args", "c", "kw"))
    assert not astutil.has_param(fn, "d")
    assert not astutil.has_param(stmt("def g(*, x): pass"), "y")


# ----------------------------------------------------------------------------------------
# names read and bound
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, names", [
    ("y = f(x, k=z).attr", ["f", "x", "z"]),
    ("a.b = c", ["c", "a"]),
    ("a[i] += 1", ["a", "i"]),
    ("out = [g(v) for v in items if v]", ["g", "items"]),
    ("h = lambda t, s=d: t + u", ["d", "u"]),
])
def test_reads(text, names):
    assert astutil.reads(stmt(text)) == names


@pytest.mark.parametrize("text, names", [
    ("a, (b, *c) = t", {"a", "b", "c"}),
    ("x.fill_(0)", {"x"}),
    ("m.w[0] = 1", {"m"}),
    ("for i, j in z:\n    k = 1\n", {"i", "j"}),
    ("if p:\n    loss = 1\nelse:\n    loss2 = 2\n", {"loss", "loss2"}),
    ("with open(f) as fh:\n    data = fh.read()\n", {"fh", "data"}),
    ("x.item()", set()),
])
def test_binds(text, names):
    assert astutil.binds(stmt(text)) == names


def test_function_locals():
    fn = stmt("def f(a, *b, c=1):\n    d = 1\n    for e in b:\n        g: int = 2\n"
              "    import os.path as osp, json\n    def inner(q):\n        r = q\n    with w() as (s, t):\n        pass\n")
    assert astutil.function_locals(fn) == {"a", "b", "c", "d", "e", "g", "osp", "json", "inner", "s", "t"}


# ----------------------------------------------------------------------------------------
# the # porter: manual marker
# ----------------------------------------------------------------------------------------
def test_manual_marker_on_a_line_and_a_header():
    plain = stmt("x = f(y)\n")
    marked = astutil.with_manual_comment(plain, "JX999", "why")
    assert astutil.code(marked) == "x = f(y)  # porter: manual (JX999): why\n"
    assert astutil.has_manual_marker(marked) and not astutil.has_manual_marker(plain)
    loop = stmt("for p in ps:\n    p.x = 1\n")
    marked_loop = astutil.with_manual_comment(loop)
    assert astutil.code(marked_loop).splitlines()[0] == "for p in ps:  # porter: manual"
    assert astutil.has_manual_marker(marked_loop)
    assert not astutil.has_manual_marker(marked_loop, header=False)
    assert astutil.code(astutil.with_manual_comment(stmt("pass\n").body[0])) == "pass"  # no line of its own


def test_manual_marker_after_a_comment_respaced_or_not():
    commented = stmt("x = 1 # note\n")
    assert astutil.code(astutil.with_manual_comment(commented)) == "x = 1  # note  # porter: manual\n"
    assert astutil.code(astutil.with_manual_comment(commented, respace=False)) == "x = 1 # note  # porter: manual\n"
    once = astutil.with_manual_comment(commented, once=True)
    assert astutil.with_manual_comment(once, once=True) is once
    assert astutil.code(astutil.with_manual_comment(once, "C1", "r")).count("porter: manual") == 2


def test_manual_marker_on_a_line_above():
    above = stmt("# porter: manual (JX301): not a step\nfor b in data:\n    pass\n")
    assert not astutil.has_manual_marker(above)
    assert astutil.has_manual_marker(above, leading_lines=True)


def test_manual_comment_is_an_edit_replacement():
    apply = astutil.manual_comment("JX012", "init")
    assert astutil.code(apply(stmt("w = g()\n"))) == "w = g()  # porter: manual (JX012): init\n"


# ----------------------------------------------------------------------------------------
# no copies of the toolkit in codemods/
# ----------------------------------------------------------------------------------------
TOOLKIT = {"code", "_code", "literal", "python_literal", "kwarg", "has_kwarg", "has_param", "reads", "binds",
           "function_locals", "has_manual_marker", "with_manual_comment", "manual_comment", "report_manual",
           "children", "_children", "target_names", "walk"}


def test_no_rule_or_helper_redefines_a_toolkit_function():
    found = []
    for path in sorted((REPO / "codemods").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in TOOLKIT:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} def {node.name}")
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NOT_LITERAL" for t in node.targets):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} NOT_LITERAL = ...")
    assert not found, "use porter.astutil's: " + "; ".join(found)


# ----------------------------------------------------------------------------------------
# import bindings (FileContext.add_import and the JAX program's module bindings)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, package, bindings", [
    ("import torch", None, [("torch", "torch", "torch", "torch")]),
    ("import os.path", None, [("os", "os", "os.path", "os.path")]),
    ("import torch.nn as tnn, numpy as np", None, [("tnn", "torch.nn", "torch.nn", "tnn"), ("np", "numpy", "numpy", "np")]),
    ("from torch.optim import SGD as S, Adam", None, [("S", "torch.optim.SGD", "torch.optim.SGD", "S"),
                                                      ("Adam", "torch.optim.Adam", "torch.optim.Adam", "Adam")]),
    ("from torch import *", None, []),
    ("from .models import Net", None, []),
    ("from .models import Net", "pkg.sub", [("Net", "pkg.sub.models.Net", "pkg.sub.models.Net", "Net")]),
    ("from .. import utils as u", "pkg.sub", [("u", "pkg.utils", "pkg.utils", "u")]),
])
def test_import_bindings(text, package, bindings):
    from porter.context import import_bindings

    node = cst.parse_statement(text).body[0]
    assert [tuple(b) for b in import_bindings(node, package)] == bindings


# ----------------------------------------------------------------------------------------
# the worked examples of docs/contributing.md run as rules
# ----------------------------------------------------------------------------------------
def _contributing_rules():
    import re
    import textwrap

    from porter.rules import Rule

    text = (REPO / "docs" / "contributing.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        first = block.splitlines()[0]
        m = re.match(r"# codemods/(\w+)/(\w+)\.py$", first)
        assert m, f"a rule example starts with its path: {first!r}"
        target, stem = m.groups()
        namespace = {"__name__": f"codemods.{target}.{stem}", "__package__": f"codemods.{target}"}
        exec(compile(textwrap.dedent(block), f"docs/contributing.md:{stem}", "exec"), namespace)
        rules = [v for v in namespace.values() if isinstance(v, type) and issubclass(v, Rule) and v is not Rule]
        assert len(rules) == 1, stem
        out.append(rules[0])
    return out


def test_contributing_examples_are_rules_that_pass_their_examples():
    from porter import engine, registry

    rules = _contributing_rules()
    assert {r.target for r in rules} == {"torch-xla", "jax", "torch"}  # one per target directory
    taken = {r.code for r in registry.all_rules()}
    for rule in rules:
        assert rule.code not in taken, f"{rule.code} is a real rule's code"
        doc = rule.doc()
        assert all(h in doc for h in ("## What it does", "## Why", "## Fix safety")), rule.code
        for example in rule.examples:
            ex = example.dedented()
            only = engine.Options((rule,), unsafe_fixes=ex.unsafe)
            assert any(f.code == rule.code for f in engine.check(ex.before, only).findings), rule.code
            result = engine.fix(ex.before, only)
            assert result.source == (ex.after if ex.after is not None else ex.before), rule.code
            again = engine.fix(result.source, only)
            assert not again.changed
        for snippet in rule.valid:
            assert not [f for f in engine.check(snippet, engine.Options((rule,))).findings if f.code == rule.code]


# ----------------------------------------------------------------------------------------
# FileContext.qualname: a function's own name shadows an import of the same name
# ----------------------------------------------------------------------------------------
SHADOWING = {
    "parameter": "def batchify(data, bsz):\n    return data.size(0)\n",
    "assignment": "def load():\n    data = make()\n    return data.size(0)\n",
    "unpacking": "def load(pair):\n    first, (data, *rest) = pair\n    return data.size(0)\n",
    "loop variable": "def total(items):\n    for data in items:\n        print(data.size(0))\n",
    "with target": "def read(path):\n    with open(path) as data:\n        return data.size(0)\n",
    "lambda parameter": "sizes = map(lambda data: data.size(0), items)\n",
    "nested function reading the parameter": "def outer(data):\n    def inner():\n        return data.size(0)\n    return inner\n",
}


def _resolved(source: str, attribute: str) -> list:
    """ctx.qualname of each ``attribute`` read in SOURCE, asked as a rule visiting it would
    (the ancestors down to the node)."""
    from porter.context import FileContext

    module = cst.parse_module(source)
    ctx = FileContext(module)
    found = []

    def visit(node, path):
        path = [*path, node]
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            ctx.add_import(node)  # as the engine's walk does
        if isinstance(node, cst.Attribute) and astutil.code(node) == attribute:
            ctx.ancestors = path
            found.append(ctx.qualname(node))
        for child in node.children:
            visit(child, path)

    visit(module, [])
    return found


@pytest.mark.parametrize("spelling", list(SHADOWING))
def test_a_functions_own_name_is_not_the_import(spelling):
    inside, outside = _resolved("import data\n\n" + SHADOWING[spelling] + "\ndata.size(1)\n", "data.size")
    assert inside is None
    assert outside == "data.size"  # the module-level read is the import


@pytest.mark.parametrize("source", [
    "import data\n\ndef reset():\n    global data\n    data = data.reload()\n",
    "import data\n\ndef keep(self):\n    self.data, other = data.reload(), 1\n",
    "def reset():\n    import data\n    return data.reload()\n",
], ids=["global", "import in the function", "an attribute of the same name"])
def test_a_global_declaration_or_an_import_in_the_function_reads_the_import(source):
    assert _resolved(source, "data.reload") == ["data.reload"]


def test_a_tensor_parameter_named_like_a_program_module_is_ported_as_a_tensor():
    # word_language_model's shape: `import data` (the program's corpus module) beside
    # `def batchify(data, bsz)`: data.size / .narrow are tensor methods there
    from porter import engine, registry

    source = ("import torch\nimport data\n\n\ndef batchify(data, bsz):\n    n = data.size(0) // bsz\n"
              "    return data.narrow(0, 0, n * bsz).view(bsz, -1).t().contiguous()\n")
    result = engine.fix(source, engine.Options(tuple(registry.rules_for("jax"))), "main.py")
    body = result.source[result.source.index("def batchify"):]
    assert "data.size(" not in body and "data.narrow(" not in body and ".view(" not in body, body
    assert "data.shape[0]" in body, body
