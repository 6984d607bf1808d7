"""Property tests of the engine on generated programs (hypothesis + hypothesmith).

For every target (torch-xla, jax, and the Gluon front end's target torch) and for programs
that are plain (hypothesmith's grammar), spliced with torch / MXNet code, or torch / MXNet
expressions composed at random and put in the keyword contexts that leave no space before
them (``return(...)``, ``if(...)``, ``x in[...]``...):

- ``engine.check`` and ``engine.fix`` never raise anything but a one-line PorterError, and
  no rule fails (no internal-error finding: the engine would hide a rule's exception or a
  replacement LibCST refuses behind such a finding);
- the output of ``fix`` parses (LibCST and, when the input compiles, CPython);
- a second ``fix`` of the output changes nothing (a fixpoint);
- an input LibCST cannot reproduce byte for byte (LibCST 1.9's round-trip bugs) is told
  apart: ``runner.verify_output`` refuses it with porter's message.

Deterministic: derandomized, no example database, a bounded number of examples.
"""
from __future__ import annotations

import ast

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

hypothesmith = pytest.importorskip("hypothesmith")

from porter import engine, registry  # noqa: E402
from porter.runner import verify_output  # noqa: E402

TARGETS = registry.TARGETS  # torch-xla, jax, torch (the Gluon -> PyTorch front end)
OPTIONS = {t: engine.Options(registry.select(t)) for t in TARGETS}
UNSAFE = {t: engine.Options(registry.select(t), unsafe_fixes=True) for t in TARGETS}

FUZZ = settings(
    max_examples=25, deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck),
)

# Our own small fragments of GPU training code, to splice into generated programs.
SNIPPETS = [
    "import torch\nmodel = torch.nn.Linear(3, 4).cuda()\nxb = torch.randn(2, 3).cuda()\n"
    "loss = model(xb).sum()\nloss.backward()\nprint(loss.item())\n",
    "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
    "import numpy as np\nimport torch\nm = np.mean(torch.ones(3).cpu().numpy())\n",
    "import torch\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\nfor xb, yb in loader:\n"
    "    opt.zero_grad()\n    out = net(xb.cuda())\n"
    "    loss = torch.nn.functional.cross_entropy(out, yb.cuda())\n    loss.backward()\n    opt.step()\n",
    "import mxnet as mx\nfrom mxnet import gluon, nd, autograd\nnet = gluon.nn.Dense(10)\n"
    "net.initialize(ctx=mx.gpu())\nxb = nd.ones((2, 3), ctx=mx.gpu())\nwith autograd.record():\n"
    "    yb = net(xb)\nyb.backward()\n",
    "from mxnet import nd\nz = nd.relu(nd.dot(a, b)) + nd.mean(a)\n",
]

ATOMS = st.sampled_from([
    "x", "x.cuda()", "torch.device('cuda')", "np.mean(x)", "torch.cuda.is_available()",
    "nd.array([1, 2])", "mx.gpu()", "x.cuda(non_blocking=True)", "torch.randn(2).cuda()",
    "'cuda'", "nd.mean(x)", "x.asnumpy()", "torch.cuda.device_count()", "x.item()",
])


def _grow(inner):
    return st.one_of(
        inner.map(lambda s: f"({s})"),
        inner.map(lambda s: f"[{s}]"),
        inner.map(lambda s: f"-{s}"),
        inner.map(lambda s: f"(not {s})"),
        inner.map(lambda s: f"f({s})"),
        inner.map(lambda s: f"({s}).float()"),
        st.tuples(inner, inner).map(lambda p: f"{p[0]} + {p[1]}"),
        st.tuples(inner, inner).map(lambda p: f"{p[0]} if {p[1]} else x"),
    )


# half of them a bare atom: the replaced node right after the keyword's bracket
EXPRESSIONS = st.one_of(ATOMS, st.recursive(ATOMS, _grow, max_leaves=4))

# Keyword contexts with no space between the keyword and a bracketed expression.
CONTEXTS = [
    "return({e})", "yield({e})", "if({e}): pass", "while({e}): break", "assert({e})",
    "y = not({e})", "y = a in({e})", "y = a not in({e})", "y = a is({e})", "y = a and({e})",
    "y = a or({e})", "g = lambda:({e})", "raise({e})", "with({e}): pass", "for i in({e}): pass",
    "y = [i for i in({e})]", "y = 1 if({e})else 2", "y = ({e})if a else 2", "del[{e}][0]",
    "y = a if b else({e})", "print(*[{e}])", "elif_ = 0\n    if a: pass\n    elif({e}): pass",
]
PREAMBLE = "import torch\nimport numpy as np\nimport mxnet as mx\nfrom mxnet import nd\n\n\n"


def _compiles(text: str) -> bool:
    try:
        compile(text, "<fuzz>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _one_line(exc: engine.PorterError) -> None:
    message = str(exc)
    assert message and "\n" not in message and "\r" not in message, message


def total(source: str, target: str, unsafe: bool = False) -> None:
    """The properties of the module docstring for one program and one target."""
    options = (UNSAFE if unsafe else OPTIONS)[target]
    try:
        reproduced = cst.parse_module(source).code == source
    except Exception:
        reproduced = None  # LibCST cannot parse it: the engine must say so
    try:
        checked = engine.check(source, options)
    except engine.PorterError as exc:
        _one_line(exc)
    else:
        assert not [f.message for f in checked.findings if f.internal_error]
    try:
        result = engine.fix(source, options)
    except engine.PorterError as exc:
        _one_line(exc)
        return
    assert not [f.message for f in result.remaining if f.internal_error]
    assert reproduced is not None
    if reproduced is False:  # told apart before anything is written
        with pytest.raises(engine.PorterError, match="LibCST cannot reproduce"):
            verify_output(source, result.source)
        return
    if not result.changed:
        return
    cst.parse_module(result.source)
    if _compiles(source):
        assert _compiles(result.source), result.source
    verify_output(source, result.source)
    again = engine.fix(result.source, options)
    assert not again.changed, (source, result.source, again.source)


@FUZZ
@given(hypothesmith.from_grammar(), st.sampled_from(TARGETS))
def test_plain_generated_programs(source, target):
    total(source, target)


@FUZZ
@given(hypothesmith.from_grammar(), st.sampled_from(SNIPPETS), st.booleans(), st.sampled_from(TARGETS))
def test_generated_programs_with_torch_and_mxnet_spliced_in(source, snippet, before, target):
    if source and not source.endswith(("\n", "\r")):
        source += "\n"
    total(snippet + source if before else source + snippet, target)


@settings(FUZZ, max_examples=60)
@given(st.sampled_from(CONTEXTS), EXPRESSIONS, st.sampled_from(TARGETS), st.booleans())
def test_torch_and_mxnet_expressions_in_keyword_contexts(context, expression, target, unsafe):
    body = context.format(e=expression)
    head = "async def f(x, a, b):\n" if "await" in body else "def f(x, a, b):\n"
    total(PREAMBLE + head + "    " + body + "\n", target, unsafe)


@FUZZ
@given(EXPRESSIONS, st.sampled_from(TARGETS))
def test_awaited_expressions(expression, target):
    total(PREAMBLE + f"async def f(x, a, b):\n    return await({expression})\n", target)
