"""Classes of crash found by benchmarks/corpus_sweep.py on real code, each with its own code.

Every case is migrated with the named target in both fix modes; the migrate must not raise
(an exception inside a rule is porter's bug), its output must compile, and a second run on the
output must change nothing.
"""
from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from porter import astutil, edits, engine
from porter.runner import Settings, verify_output


def migrate(source: str, target: str, unsafe: bool) -> engine.FixResult:
    options = Settings(target=target, unsafe_fixes=unsafe).options()
    result = engine.fix(source, options, "case.py")
    if result.changed:
        verify_output(source, result.source)
        ast.parse(result.source)
        again = engine.fix(result.source, options, "case.py")
        assert not again.changed, f"a second run changes the output:\n{result.source}"
    return result


# --------------------------------------------------------------------------------------
# Gluon BatchNorm whose input rank only the enclosing block shows: the rank was decided again
# when the fix was applied, outside the block, from the whole file (Manual escaped the rule).
# --------------------------------------------------------------------------------------
BATCHNORM_CASES = {
    "attribute, other block dense": """
        from mxnet import gluon
        from mxnet.gluon import nn


        class Norm(gluon.HybridBlock):
            def __init__(self, channels, **kwargs):
                super(Norm, self).__init__(**kwargs)
                self.conv = nn.Conv2D(channels, 3, padding=1)
                self.bn = nn.BatchNorm()

            def hybrid_forward(self, F, x):
                return self.conv(F.relu(self.bn(x)))


        class Head(gluon.HybridBlock):
            def __init__(self, **kwargs):
                super(Head, self).__init__(**kwargs)
                self.fc = nn.Dense(10)

            def hybrid_forward(self, F, x):
                return self.fc(x)
        """,
    "momentum, 3-d block beside a 1-d one": """
        import mxnet as mx
        from mxnet import gluon


        class Volume(gluon.Block):
            def __init__(self):
                super().__init__()
                self.norm = gluon.nn.BatchNorm(momentum=0.8, epsilon=1e-3)
                self.conv = gluon.nn.Conv3D(4, 3)

            def forward(self, x):
                return self.conv(self.norm(x))


        class Signal(gluon.Block):
            def __init__(self):
                super().__init__()
                self.conv = gluon.nn.Conv1D(4, 3)

            def forward(self, x):
                return self.conv(x)
        """,
    "helper function": """
        from mxnet.gluon import nn


        def pre_act(channels):
            bn = nn.BatchNorm()
            conv = nn.Conv2D(channels, 3)
            return bn, conv


        def classifier():
            return nn.Dense(10)
        """,
}


@pytest.mark.parametrize("target", ["torch", "jax"])
@pytest.mark.parametrize("case", sorted(BATCHNORM_CASES))
def test_batchnorm_rank_from_the_enclosing_block(case, target):
    source = textwrap.dedent(BATCHNORM_CASES[case]).lstrip()
    for unsafe in (False, True):
        result = migrate(source, target, unsafe)
        assert result.changed
        if target == "torch":
            assert "BatchNorm()" not in result.source and "BatchNorm(momentum" not in result.source
            assert "BatchNorm1d" not in result.source  # the block's own convolution decides


# --------------------------------------------------------------------------------------
# Code written from the text of nodes that spanned lines inside brackets (a method chain
# broken over lines, a comment inside a call): the text did not parse alone.
# --------------------------------------------------------------------------------------
MULTILINE_CASES = {
    "receiver broken before the dot": """
        import torch


        def gather_rows(x, idx):
            out = (x
                   .index_select(0, idx.to(dtype=torch.int64)).reshape(-1))
            return out
        """,
    "comment inside the arguments": """
        import torch
        import torch.nn.functional as F


        def pooled(features):
            return F.relu(torch.cat([f.mean(dim=(2, 3))  # per level
                                     for f in features], dim=1)
                          .flatten(1))
        """,
    "comment after the receiver": """
        import torch


        def scaled(t):
            return (t  # input
                    .float()
                    .softmax(dim=-1)) * 2
        """,
    "argument over lines, call moved out of brackets": """
        import torch


        def total(a, b):
            s = torch.add(a,
                          (b
                           .sum(dim=0)))
            return s
        """,
}


@pytest.mark.parametrize("case", sorted(MULTILINE_CASES))
def test_multiline_node_text(case):
    source = textwrap.dedent(MULTILINE_CASES[case]).lstrip()
    for unsafe in (False, True):
        result = migrate(source, "jax", unsafe)
        assert result.changed


@pytest.mark.parametrize("text", [
    "x\n   .view(-1)",
    "f(a)  # note\n .sum()",
    "a.b\r\n .c",
])
def test_parse_expression_keeps_multiline_text_in_parentheses(text):
    node = astutil.parse_expression(text)
    assert node.lpar, "multi-line text comes back parenthesized"
    # valid wherever an expression can stand: alone on a line, as an operand, as an argument
    for template in ("y = {}\n", "y = 1 + {}\n", "g({})\n"):
        code = template.format(cst.Module([]).code_for_node(node))
        ast.parse(code)
        cst.parse_module(code)


def test_parse_expression_leaves_one_line_text_alone():
    assert cst.Module([]).code_for_node(astutil.parse_expression("a + b")) == "a + b"
    with pytest.raises(cst.ParserSyntaxError):
        astutil.parse_expression("a +")


# --------------------------------------------------------------------------------------
# engine.remove_imports skips LibCST's scope analysis for an import whose name is certainly
# read; its result must be the scope analysis's in every case.
# --------------------------------------------------------------------------------------
REMOVAL_CASES = [
    "import torch.nn.functional as F\n\ndef f(x):\n    return F.relu(x)\n",
    "import torch.nn.functional as F\n\ndef f(x):\n    return x\n",
    "import torch.nn.functional as F\n\ndef f(x, F):\n    return F.relu(x)\n",
    "import torch.nn.functional as F\n\nclass M:\n    F = 1\n    def g(self, x):\n        return F.relu(x) + self.F\n",
    "import torch.nn.functional as F\nF = None\n\ndef f(x):\n    return F.relu(x)\n",
    "import torch.nn.functional as F\n\ndef f(x):\n    import torch.nn.functional as F\n    return x\n\ndef g(x):\n    return F.relu(x)\n",
    "from torch.nn import functional\n\nact = lambda x: functional.relu(x)\n",
    "import torch.nn.functional as F\n\ndef outer(x):\n    F = object()\n    def inner():\n        return F.relu(x)\n    return inner\n",
    "import torch.nn.functional as F\n\ndef f(x):\n    global F\n    return F.relu(x)\n",
    "import torch.nn.functional as F\n\ndef F():\n    pass\n\ndef g(x):\n    return F.relu(x)\n",
    "import torch.nn.functional as F\ny = F.relu\n",
    "import torch.nn.functional as F\n\ndef f(xs):\n    return [F.relu(F) for F in xs]\n",
]


@pytest.mark.parametrize("source", REMOVAL_CASES)
def test_remove_imports_agrees_with_the_scope_analysis(source):
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    module = cst.parse_module(source)
    removals = [("torch.nn.functional", None), ("torch.nn", "functional")]
    items = [("torch.nn.functional", None, "F"), ("torch.nn", "functional", None)]
    expected = RemoveImportsVisitor(CodemodContext(), items).transform_module(module).code
    assert engine.remove_imports(module, removals).code == expected


# the same with other top-level statements around (the scope analysis then runs on the
# statements that mention the names only): exports, string annotations, comments, partial
# from-imports, dotted imports, nested imports
REMOVAL_CASES_AROUND = [
    '"""doc."""\nimport os\nimport torch.nn.functional as F\n# a comment\nx = 1\n\n\ndef f(y):\n    return y\n\n\nz = os.path\n',
    "import torch.nn.functional as F\n__all__ = ['F', 'g']\n\ndef g():\n    pass\n",
    "import torch.nn.functional as F\n\ndef g(x: 'F.Tensor'):\n    pass\n",
    "from torch.nn import functional, Module\n\nclass M(Module):\n    pass\n\nv = 2\n",
    "from torch.nn import (\n    Module,  # the base\n    functional,  # ops\n)\n\nclass M(Module):\n    pass\n",
    "import torch.nn.functional\nimport torch\n\nt = torch.zeros(1)\n\ndef f():\n    return 1\n",
    "import os\n\nif os.name:\n    import torch.nn.functional as F\nelse:\n    F = None\n\nq = 3\n",
    "import torch.nn.functional as F\n\n\ndef f(x):\n    return x\n\n\ndef g(x):\n    return x\n\n\nclass K:\n    pass\n",
    # the name only inside other words (a statement that does not mention it), then as a word
    "import torch.nn.functional as F\nFLAG = False\n\ndef Fx(F_):\n    return F_ or Fé\n\nclass FF:\n    pass\n",
    "import torch.nn.functional as F\nFLAG = False\n\ndef f(x):\n    return f'{F.relu(x)}'\n",
    "import torch.nn.functional as F\nok = False\n\ndef f(x):\n    return g(F=x)\n",
    "import torch.nn.functional as F\nok = False\n\ndef f(x):\n    return x.F\n",
    "import torch.nn.functional as F\nok = False\n\ndef f(x):\n    return(F)\n",
    "import torch.nn.functional as F\nok = False\n\ndef f(x):\n    return[F.relu]\n",
]


# `import torch.nn as nn` in a port whose statements read nnx.* (a longer name that holds it)
REMOVAL_CASES_NN = [
    "import torch.nn as nn\nfrom flax import nnx\n\nclass M(nnx.Module):\n    pass\n",
    "import torch.nn as nn\nfrom flax import nnx\n\nclass M(nnx.Module):\n    act = nn.ReLU\n",
    "import torch.nn as nn\nfrom flax import nnx\nnn_layers = [nnx.Linear]\n\ndef f():\n    return 'nn.Module'\n",
    "import torch.nn as nn\nfrom flax import nnx\nx = nnx.Linear\n\ndef f(m: 'nn.Module'):\n    pass\n",
    "import torch.nn as nn\nfrom flax import nnx\nx = nnx.Linear\n__all__ = ['nn']\n",
]


@pytest.mark.parametrize("source", REMOVAL_CASES_NN)
def test_remove_imports_of_a_name_inside_longer_names_agrees_with_the_whole_module(source):
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    module = cst.parse_module(source + "\n\ndef tail():\n    return 0\n")
    items = [("torch.nn", None, "nn")]
    expected = RemoveImportsVisitor(CodemodContext(), items).transform_module(module).code
    assert edits._remove_in_statements(module, items).code == expected


@pytest.mark.parametrize("source", REMOVAL_CASES + REMOVAL_CASES_AROUND)
def test_remove_imports_with_other_statements_agrees_with_the_whole_module(source):
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    module = cst.parse_module(source + "\n\ndef tail():\n    return 0\n\n\nw = [1, 2]\n")
    items = [("torch.nn.functional", None, "F"), ("torch.nn", "functional", None), ("torch.nn.functional", None, None)]
    expected = RemoveImportsVisitor(CodemodContext(), items).transform_module(module).code
    assert edits._remove_in_statements(module, items).code == expected


# --------------------------------------------------------------------------------------
# A replacement that binds looser than the code around it: JX002 writes `nn.Identity` as
# `lambda x: x`, which was pasted bare into `norm_layer or nn.Identity` (timm's
# efficientformer_v2.py): `norm_layer or lambda x: x` does not parse.
# --------------------------------------------------------------------------------------
LOOSE_CASES = {
    "or operand": "norm_layer = norm_layer or nn.Identity()",
    "comparison": "self.same = nn.Identity() == norm_layer",
    "conditional's branch": "self.norm = nn.Identity() if flag else nn.BatchNorm2d(4)",
    "conditional's else": "self.norm = nn.BatchNorm2d(4) if flag else nn.Identity()",
    "and, then or": "self.drop = flag and nn.Identity() or nn.Dropout(0.1)",
    "not": "self.empty = not nn.Identity()",
}


@pytest.mark.parametrize("case", sorted(LOOSE_CASES))
@pytest.mark.parametrize("unsafe", [False, True])
def test_a_looser_replacement_is_parenthesized(case, unsafe):
    source = textwrap.dedent(f"""\
        import torch.nn as nn


        class Block(nn.Module):
            def __init__(self, norm_layer=None, act_layer=None, flag=True):
                super().__init__()
                {LOOSE_CASES[case]}

            def forward(self, x):
                return x
        """)
    result = migrate(source, "jax", unsafe)
    assert result.changed
    assert "lambda x: x" in result.source
    # the lambda is one operand: inside parentheses of its own, or the whole else branch
    line = next(ln for ln in result.source.splitlines() if "lambda x: x" in ln)
    assert "(lambda x: x)" in line or line.rstrip().endswith("else lambda x: x"), line


def test_binds_looser_by_position():
    lam = cst.parse_expression("lambda x: x")
    expr = cst.parse_expression("a if b else c")
    assert engine.binds_looser(lam, expr.test, expr) and engine.binds_looser(lam, expr.body, expr)
    assert not engine.binds_looser(lam, expr.orelse, expr)
    call = cst.parse_expression("f(a)")
    assert engine.binds_looser(lam, call.func, call)
    assert not engine.binds_looser(lam, call.args[0].value, call.args[0])
    assert not engine.binds_looser(cst.parse_expression("g(x)"), call.func, call)
