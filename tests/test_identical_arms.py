"""Arms a port made the same code go (engine: porter.edits.without_identical_arms): the CUDA
branch and the CPU branch of a choice both became `.to(device)`, so `if c: X else: X` is `X`,
`elif c: Y else: Y` is `else: Y` and `e if c else e` is `e`; never where the test calls something,
where a comment sits on the dropped arm, or where the original's arms were already the same."""
from __future__ import annotations

import textwrap

import pytest

from porter import engine, registry

DEFAULT = engine.Options(tuple(registry.rules_for("torch-xla")))

HEAD = "import torch\nimport torch.nn as nn\n\ndevice = torch.device('cuda' if args.cuda else 'cpu')\nmodel = nn.Linear(4, 1)\n"


def port(body: str) -> str:
    return engine.fix(HEAD + textwrap.dedent(body), DEFAULT).source.split("model = nn.Linear(4, 1)\n", 1)[1]


@pytest.mark.parametrize("body,want", [
    # an elif whose block became the else block's
    ("""
     if args.multi_gpu:
         model = nn.DataParallel(model).cuda()
     elif args.cuda:
         model = model.cuda()
     else:
         model = model.to(device)
     """, "if args.multi_gpu:\n    model = nn.DataParallel(model).to(device)\nelse:\n    model = model.to(device)\n"),
    # every arm the same: the block alone
    ("""
     if args.cuda:
         model = model.cuda()
         x = x.cuda()
     else:
         model = model.to(device)
         x = x.to(device)
     """, "model = model.to(device)\nx = x.to(device)\n"),
    # a conditional expression
    ("x = x.cuda() if args.cuda else x.to(device)\n", "x = x.to(device)\n"),
    ("y = (x.cuda() if use_gpu else x.to(device)).float()\n", "y = (x.to(device)).float()\n"),
])
def test_arms_the_port_made_the_same_go(body, want):
    assert port(body).lstrip("\n") == want


@pytest.mark.parametrize("body", [
    # the test calls something: it stays evaluated
    "x = x.cuda() if check(args) else x.to(device)\n",
    # a comment on the arm that would go
    "\nif args.cuda:  # the GPU path\n    x = x.cuda()\nelse:\n    x = x.to(device)\n",
    # the user's own identical arms
    "\nif args.fast:\n    x = x.to(device)\nelse:\n    x = x.to(device)\n",
    "z = 1 if args.fast else 1\n",
])
def test_other_arms_stay(body):
    out = port(body)
    assert ("if " in out) and ("else" in out), out


def test_the_result_is_a_fixpoint():
    src = HEAD + "if args.multi_gpu:\n    model = nn.DataParallel(model).cuda()\nelif args.cuda:\n    model = model.cuda()\n" \
                 "else:\n    model = model.to(device)\nx = x.cuda() if args.cuda else x.to(device)\n"
    once = engine.fix(src, DEFAULT).source
    assert engine.fix(once, DEFAULT).source == once
