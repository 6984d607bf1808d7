"""The incremental checker of `porter lsp` (porter.incremental) equals `porter check`.

Sequences of adversarial and random edits are applied to the fixtures' sources
(fixtures/torch_xla/*/train.py, fixtures/jax/*/train.py) and to the benchmark's document
(benchmarks/bench_lsp.build_document), for the targets "torch-xla" and "jax". After every
edit the incremental result is compared with a fresh ``engine.check`` of the whole new text:
the same findings (code, message, position, severity, fix safety, description, imports) in
the same order, the same syntax error for a text that does not parse, and the spliced module
equal to a fresh parse (``deep_equals``). At the end of each sequence every fix of the
incremental findings is applied and compared with the same fix from the fresh check.
Each test also checks that edits were really handled incrementally (not all by the full
fallback), so it cannot pass by never splicing.
"""
from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import libcst as cst
import pytest

from lanes import fixture_slice
from porter import engine, incremental
from porter.rules import Rule
from porter.runner import Settings

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_lsp  # noqa: E402

TORCH_XLA = sorted((REPO / "fixtures" / "torch_xla").glob("*/train.py"))
JAX = sorted((REPO / "fixtures" / "jax").glob("*/train.py"))
TARGETS = ("torch-xla", "jax")


def key(f):
    fix = f.fix
    return (f.code, f.message, f.position, f.severity,
            None if fix is None else (fix.safety, fix.description, fix.imports, fix.remove_imports))


class Checker:
    """A document checked incrementally, compared with engine.check after every edit."""

    def __init__(self, target: str, text: str) -> None:
        self.options = Settings(target).options()
        self.doc = incremental.Document(self.options.rules)
        self.text = ""
        self.edits = 0
        self.result = None
        self.apply(text)

    def apply(self, text: str) -> None:
        self.text = text
        self.edits += 1
        try:
            want = engine.check(text, self.options)
        except engine.PorterError as exc:
            with pytest.raises(engine.PorterError) as got:
                self.doc.check(text)
            assert str(got.value) == str(exc)
            self.result = None
            return
        got = self.doc.check(text)
        assert [key(f) for f in got.findings] == [key(f) for f in want.findings], self._where()
        assert got.module.deep_equals(want.module), self._where()
        assert got.module.code == text
        self.result = (got, want)

    def _where(self) -> str:
        return f"after edit {self.edits} (text of {len(self.text)} characters)"

    def compare_fixes(self) -> int:
        """Every fix of the last result applied, incremental against fresh: the same text."""
        if self.result is None:
            return 0
        got, want = self.result
        n = 0
        for g, w in zip(got.findings, want.findings):
            if g.fix is None:
                continue
            a = engine.apply_fixes(got.module, [g.fix]).code
            b = engine.apply_fixes(want.module, [w.fix]).code
            assert a == b, f"fix of {g.code} at {g.position}"
            n += 1
        return n


# --------------------------------------------------------------------------------------
# Edits
# --------------------------------------------------------------------------------------
def lines_of(text: str) -> list[str]:
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", text)


def nl(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def line_start(text: str, i: int) -> int:
    return sum(len(x) for x in lines_of(text)[:i])


def find_line(text: str, pattern: str, nth: int = 0) -> int:
    hits = [i for i, line in enumerate(lines_of(text)) if re.search(pattern, line)]
    return hits[min(nth, len(hits) - 1)] if hits else -1


def body_start(text: str, nth: int) -> int:
    """The first line of the body of the ``nth`` top-level function (clamped), or -1."""
    ls = lines_of(text)
    hits = [i + 1 for i, line in enumerate(ls[:-1]) if line.startswith("def ") and line.rstrip().endswith(":")
            and ls[i + 1].startswith("    ") and not ls[i + 1].startswith("     ")]
    return hits[min(nth, len(hits) - 1)] if hits else -1


def insert_line(text: str, i: int, line: str) -> str:
    at = line_start(text, i)
    return text[:at] + line + nl(text) + text[at:]


def replace_line(text: str, i: int, line: str) -> str:
    ls = lines_of(text)
    end = ls[i][len(ls[i].rstrip("\r\n")):]
    ls[i] = line + end
    return "".join(ls)


def delete_lines(text: str, i: int, n: int = 1) -> str:
    ls = lines_of(text)
    del ls[i:i + n]
    return "".join(ls)


def adversarial(text: str):
    """(name, function of the text) edits, each applied to the result of the one before."""
    e = nl(text)

    def inside_function(t):  # a statement inside the body of a function in the middle
        i = body_start(t, len(lines_of(t)) // 80)
        return insert_line(t, i, "    extra_value = 1") if i >= 0 else t

    def edit_in_function(t):
        i = find_line(t, r"^    \S", nth=len(lines_of(t)) // 60)
        return replace_line(t, i, lines_of(t)[i].rstrip("\r\n") + "  # changed") if i >= 0 else t

    def add_import(t):
        i = find_line(t, r"^import |^from ")
        return insert_line(t, i + 1, "import os.path as osp") if i >= 0 else t

    def remove_import(t):
        i = find_line(t, r"^import |^from ", nth=1)
        return delete_lines(t, i) if i >= 0 else t

    def change_alias(t):  # the name the other statements use for torch
        i = find_line(t, r"^import torch$")
        return replace_line(t, i, "import torch as th") if i >= 0 else t

    def restore_alias(t):
        i = find_line(t, r"^import torch as th$")
        return replace_line(t, i, "import torch") if i >= 0 else t

    def shadow_alias_late(t):  # a rebinding at the end: FileContext reads every top-level import
        return t + ("" if t.endswith(("\n", "\r")) else e) + "import numpy as torch" + e

    def unshadow(t):
        return t.replace("import numpy as torch" + e, "")

    def nested_import(t):  # an import inside a function changes the names after it
        i = find_line(t, r"^def ")
        return insert_line(t, i + 1, "    import torch_xla.core.xla_model as xm") if i >= 0 else t

    def add_decorator(t):
        i = find_line(t, r"^def ", nth=1)
        return insert_line(t, i, "@torch.no_grad()") if i >= 0 else t

    def decorator_alone(t):  # a decorator cut from its function: does not parse
        i = find_line(t, r"^@torch.no_grad\(\)")
        return insert_line(t, i, "@staticmethod" + e + "x = 1") if i >= 0 else t

    def undo_decorator_alone(t):
        return t.replace("@staticmethod" + e + "x = 1" + e, "")

    def split_statement(t):
        i = find_line(t, r"^    \w+ = .*$", nth=3)
        if i < 0:
            return t
        line = lines_of(t)[i].rstrip("\r\n")
        return replace_line(t, i, line + "; another = 2")

    def join_statements(t):  # two top-level statements on one line
        i = find_line(t, r"^[A-Za-z_]\w* = ")
        return replace_line(t, i, lines_of(t)[i].rstrip("\r\n") + "; joined = 3") if i >= 0 else t

    def syntax_error(t):
        i = body_start(t, len(lines_of(t)) // 50)
        return insert_line(t, i, "    x = (1,") if i >= 0 else t

    def fix_syntax_error(t):
        return t.replace("    x = (1," + e, "    x = (1,)" + e)

    def else_after_function(t):  # `else:` joins nothing: the full parse reports it
        i = find_line(t, r"^def ", nth=2)
        return insert_line(t, i, "else:" + e + "    pass") if i >= 0 else t

    def undo_else(t):
        return t.replace("else:" + e + "    pass" + e, "")

    def if_else_split(t):  # an if at top level, then an else added after it: joins
        t = t + ("" if t.endswith(("\n", "\r")) else e) + "if torch.cuda.is_available():" + e + "    dev = 'cuda'" + e
        return t

    def add_else(t):
        return t + "else:" + e + "    dev = 'cpu'" + e

    def comment_between(t):  # comments before a function: its leading lines
        i = find_line(t, r"^def ", nth=1)
        return insert_line(t, i, "# about the next function") if i >= 0 else t

    def indented_comment_after_function(t):  # belongs to the function's block, not the next statement
        i = find_line(t, r"^def ", nth=2)
        return insert_line(t, i, "        # a trailing comment of the block above") if i >= 0 else t

    def dedent_that_comment(t):
        return t.replace("        # a trailing comment of the block above", "# a trailing comment of the block above")

    def non_ascii(t):
        i = body_start(t, len(lines_of(t)) // 40)
        return insert_line(t, i, '    größe = "🙂🙂"; y = torch.zeros(2).cuda()') if i >= 0 else t

    def suppression(t):
        i = find_line(t, r"\.cuda\(\)|\.to\(")
        return replace_line(t, i, lines_of(t)[i].rstrip("\r\n") + "  # porter: ignore") if i >= 0 else t

    def delete_function(t):
        i = find_line(t, r"^def ", nth=1)
        if i < 0:
            return t
        ls = lines_of(t)
        j = i + 1
        while j < len(ls) and (ls[j].startswith((" ", "\t")) or not ls[j].strip()):
            j += 1
        return delete_lines(t, i, j - i)

    def duplicate_function(t):
        i = find_line(t, r"^def ")
        if i < 0:
            return t
        ls = lines_of(t)
        j = i + 1
        while j < len(ls) and (ls[j].startswith((" ", "\t")) or not ls[j].strip()):
            j += 1
        copy = "".join(ls[i:j]).replace("def ", "def copy_of_", 1)
        return t + ("" if t.endswith(("\n", "\r")) else e) + e + copy

    def no_trailing_newline(t):
        return t.rstrip("\r\n")

    def trailing_comment_eof(t):
        return t + e + "# the end" + e

    def edit_first_lines(t):
        return "# first line" + e + t

    def tab_indented_function(t):  # another indentation than the module's
        return t + ("" if t.endswith(("\n", "\r")) else e) + "def tabbed():" + e + "\treturn torch.zeros(1).cuda()" + e

    def line_continuation(t):
        i = find_line(t, r"^[A-Za-z_]\w* = ", nth=1)
        return insert_line(t, i, "total = 1 + \\" + e + "    2") if i >= 0 else t

    return [
        ("inside_function", inside_function), ("edit_in_function", edit_in_function),
        ("add_import", add_import), ("remove_import", remove_import),
        ("change_alias", change_alias), ("restore_alias", restore_alias),
        ("shadow_alias_late", shadow_alias_late), ("unshadow", unshadow), ("nested_import", nested_import),
        ("add_decorator", add_decorator), ("decorator_alone", decorator_alone), ("undo_decorator_alone", undo_decorator_alone),
        ("split_statement", split_statement), ("join_statements", join_statements),
        ("syntax_error", syntax_error), ("fix_syntax_error", fix_syntax_error),
        ("else_after_function", else_after_function), ("undo_else", undo_else),
        ("if_else_split", if_else_split), ("add_else", add_else),
        ("comment_between", comment_between), ("indented_comment_after_function", indented_comment_after_function),
        ("dedent_that_comment", dedent_that_comment), ("non_ascii", non_ascii), ("suppression", suppression),
        ("delete_function", delete_function), ("duplicate_function", duplicate_function),
        ("no_trailing_newline", no_trailing_newline), ("trailing_comment_eof", trailing_comment_eof),
        ("tab_indented_function", tab_indented_function), ("line_continuation", line_continuation),
        ("edit_first_lines", edit_first_lines),
    ]


BREAKING = {"decorator_alone", "syntax_error", "else_after_function"}  # meant not to parse

SNIPPETS = [
    "\n", "    ", "#", "# note\n", "x", "(", ")", ":", "else:\n", "\n    y = 2\n", "@dec\n", "import os\n",
    "import torch as t\n", "'''", '"', "\\\n", "\n\n", ".cuda()", "torch.device('cuda')", "optimizer.step()",
    "for b in loader:\n    loss.item()\n", "def f():\n    return 1\n", "é", "🙂", "\r\n", "\t", "pass", "    # c\n",
]


def random_edit(rng: random.Random, text: str) -> str:
    kind = rng.random()
    if kind < 0.45:
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(SNIPPETS) + text[at:]
    if kind < 0.7 and text:
        at = rng.randrange(len(text))
        return text[:at] + text[at + rng.randrange(1, 40):]
    ls = lines_of(text)
    if len(ls) < 2:
        return text + "x = 1\n"
    i, j = rng.randrange(len(ls)), rng.randrange(len(ls))
    if kind < 0.85:
        ls[i] = ls[j]  # a line replaced by another line of the file
    else:
        ls.insert(i, ls[j])  # a line copied elsewhere
    return "".join(ls)


def run_sequence(target: str, text: str, seed: int, n_random: int, crlf: bool = False) -> Checker:
    if crlf:
        text = text.replace("\r\n", "\n").replace("\n", "\r\n")
    checker = Checker(target, text)
    for name, edit in adversarial(checker.text):
        before = checker.text
        new = edit(before)
        if new != before:
            checker.apply(new)
            if checker.result is None and name not in BREAKING:
                checker.apply(before)  # an edit that broke this file by accident: undone
    rng = random.Random(seed)
    for _ in range(n_random):
        checker.apply(random_edit(rng, checker.text))
        if checker.result is None and rng.random() < 0.5:  # back to a parsing text now and then
            checker.apply(text)
    return checker


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------
def test_edits_inside_a_function_are_spliced():
    """The common case: an edit inside one function parses that statement alone, and the
    rules declared local are not run on the others."""
    text = (REPO / "fixtures" / "torch_xla" / "mnist_cnn" / "train.py").read_text(encoding="utf-8")
    checker = Checker("torch-xla", text)
    i = find_line(text, r"^    \S", nth=len(lines_of(text)) // 60)
    checker.apply(insert_line(text, i, "    z = torch.zeros(3) + 1"))
    got, _ = checker.result
    assert got.reparsed is not None and got.reparsed <= 3
    assert got.statements_run <= 3 and got.rules_local > 0
    assert checker.doc.stats["incremental"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_adversarial_and_random_edits_mnist(target):
    source = TORCH_XLA[0] if target == "torch-xla" else JAX[0]
    checker = run_sequence(target, source.read_text(encoding="utf-8"), seed=1, n_random=8)
    assert checker.doc.stats["incremental"] >= 10, checker.doc.stats
    assert checker.compare_fixes() >= 0


@pytest.mark.slow
@pytest.mark.parametrize("target,source", [("torch-xla", p) for p in fixture_slice(TORCH_XLA, 8, offset=1)]
                         + [("jax", p) for p in fixture_slice(JAX, 9, offset=3)],
                         ids=lambda v: f"{v.parent.parent.name}/{v.parent.name}" if isinstance(v, Path) else v)
def test_every_fixture(source, target):
    """Adversarial edits then random ones (12 on LF text, 4 on CRLF text), each fixture with
    the rules of the target it is written for (the MNIST test above crosses them); the suite
    runs every eighth torch-xla fixture and one JAX fixture (tests/lanes.py; 10-30 s each,
    every edit also checked in full)."""
    for crlf in (False, True):
        checker = run_sequence(target, source.read_text(encoding="utf-8"), seed=len(source.parent.name) * 31 + crlf,
                               n_random=4 if crlf else 12, crlf=crlf)
        assert checker.doc.stats["incremental"] >= 10, checker.doc.stats
        checker.compare_fixes()


@pytest.mark.slow
@pytest.mark.parametrize("target,lines", [("torch-xla", 300), ("jax", 100)])
def test_bench_document(target, lines):
    """The benchmark's document (several fixtures joined, their names made unique), built at
    300 lines (100 for the JAX target, whose rules take about 20 s to check 3,000 lines; every
    edit is checked in full too): the adversarial edits and 10 random ones (37 s and 31 s on 2
    loaded cores at 500 and 150 lines)."""
    checker = run_sequence(target, bench_lsp.build_document(lines), seed=7, n_random=10)
    assert checker.doc.stats["incremental"] >= 10, checker.doc.stats
    checker.compare_fixes()


def test_local_rules_are_verified():
    """A rule declared local is checked, not trusted: one that reads the module is run with
    the module at the statements where it does, on every version (a name defined in another
    statement changes its findings there), and per statement elsewhere; one that keeps state
    from one statement to the next is run over the whole file."""
    from porter.rules import Rule, Severity

    class ReadsModule(Rule):
        code = "ZZ901"
        name = "reads-module"
        target = "torch-xla"
        summary = "names defined anywhere in the file"
        severity = Severity.INFO
        needs_text = ()
        local = True

        def visit_Call(self, node: cst.Call) -> None:
            defined = {s.name.value for s in self.ctx.module.body if isinstance(s, cst.FunctionDef)}
            if isinstance(node.func, cst.Name) and node.func.value not in defined:
                self.report(node, f"{node.func.value} is not defined in this file")

    class KeepsState(Rule):
        code = "ZZ902"
        name = "keeps-state"
        target = "torch-xla"
        summary = "counts calls across the file"
        severity = Severity.INFO
        needs_text = ()
        local = True

        def __init__(self, ctx) -> None:
            super().__init__(ctx)
            self.seen = 0

        def visit_Call(self, node: cst.Call) -> None:
            self.seen += 1
            if self.seen == 3:
                self.report(node, "third call of the file")

    text = "import torch\n\n\ndef a():\n    g()\n\n\ndef b():\n    h()\n\n\ndef c():\n    a()\n\n\nx = 1\n"
    options = engine.Options((ReadsModule, KeepsState))
    doc = incremental.Document(options.rules)
    steps = [text, text.replace("def b():", "def g():"), text.replace("    a()", "    a()\n    b()"),
             text.replace("def a():\n    g()\n", "def a():\n    pass\n"), text.replace("x = 1", "x = f()")]
    for t in steps:
        got = doc.check(t)
        want = engine.check(t, options)
        assert [key(f) for f in got.findings] == [key(f) for f in want.findings]
        assert got.rules_local == 1 and got.rules_module_wide == 1
    assert doc.stats["incremental"] == 4
    assert [f.message for f in got.findings if f.code == "ZZ901"] == [
        "g is not defined in this file", "h is not defined in this file", "f is not defined in this file"]


def test_a_failing_rule_fails_as_in_engine_check():
    """A rule that raises on some statement: the incremental check raises what
    engine.check raises, and checks normally again once the statement is gone."""
    from porter.rules import Rule, Severity

    class Boom(Rule):
        code = "ZZ903"
        name = "boom"
        target = "torch-xla"
        summary = "fails on boom()"
        severity = Severity.INFO
        needs_text = ()
        local = True

        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Name):
                if node.func.value == "boom":
                    raise ValueError("boom")
                self.report(node, f"call of {node.func.value}")

    options = engine.Options((Boom,))
    doc = incremental.Document(options.rules)
    base = "import torch\n\n\ndef a():\n    f()\n\n\ndef b():\n    g()\n"
    for t in (base, base.replace("    g()", "    boom()"), base.replace("    g()", "    h()")):
        try:
            want = engine.check(t, options)
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                doc.check(t)
            continue
        assert [key(f) for f in doc.check(t).findings] == [key(f) for f in want.findings]


# --------------------------------------------------------------------------------------
# Module facts: findings reused per statement while the facts they read are unchanged
# --------------------------------------------------------------------------------------
FACTS_DOCUMENT = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler


# (SparseAdam named in this comment: TX902's text pre-filter matches before the edits too)
class AverageMeter:
    def __init__(self):
        self.sum = 0

    def update(self, val, n=1):
        self.sum += val * n


class Progress:
    def display(self, i):
        print(i)


def build(dataset):
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    return loader


def train(model, opt, loader, device):
    losses = AverageMeter()
    progress = Progress()
    total = 0.0
    for i, (x, y) in enumerate(loader):
        x = x.to(device)
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.update(loss.item(), x.size(0))
        total += loss.item()
        progress.display(i)
    return total


def evaluate(net, data, device):
    with torch.no_grad():
        for x, y in data:
            out = net(x.to(device))
            mask = out > 0
            print(out[mask].sum())


def main():
    model = nn.Linear(4, 4)
    emb = nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = build(None)
    train(model, opt, data, "cuda")
    evaluate(model, data, "cuda")
'''

# Each edit changes, in one statement, a module fact that findings in OTHER statements
# depend on (and back): (name, old text, new text, codes whose findings must change).
FACT_EDITS = [
    ("set_epoch called in main: TX305 in build goes", "    data = build(None)\n",
     "    data = build(None)\n    data.sampler.set_epoch(0)\n", {"TX305"}),
    ("the meter class's update no longer arithmetic: TX406 in train", "        self.sum += val * n\n",
     "        self.sum = str(val)\n", {"TX406"}),
    ("Progress.display no longer prints: TX402 in train", "        print(i)\n", "        return i\n", {"TX402"}),
    ("a top-level function named like the evaluated model: TX202 in evaluate", "def main():\n",
     "def net(x):\n    return x\n\n\ndef main():\n", {"TX202"}),
    ("SparseAdam referenced in another statement: TX901's fix in main becomes unsafe", "def build(dataset):\n",
     "SPARSE = torch.optim.SparseAdam\n\n\ndef build(dataset):\n", {"TX901"}),
    ("the model wrapped in DistributedDataParallel in main: TX201 in train", "    opt = torch.optim.SGD(",
     "    model = torch.nn.parallel.DistributedDataParallel(model)\n    opt = torch.optim.SGD(", {"TX201"}),
    ("main's data bound to a DataLoader: evaluate's loop over it (through the call's argument)",
     "    data = build(None)\n", "    data = DataLoader(None)\n", {"TX301", "TX202"}),
    ("an import inside a function (the imports differ along the file: facts read module-wide)",
     "def evaluate(net, data, device):\n", "def evaluate(net, data, device):\n    import numpy as np\n", set()),
]


def _codes_at(checked) -> list:
    return [(f.code, f.message, f.position.line if f.position else None, f.fix.safety if f.fix else None)
            for f in checked.findings]


def test_module_facts_changed_in_another_statement():
    """Adversarial edits for what porter.incremental caches per statement: each changes a
    module fact (the training-loop index, the module's classes and functions, SparseAdam or
    DistributedDataParallel use) in one statement, and findings in other statements change
    with it. After every edit, and after undoing it, the result equals engine.check; the
    rules reading the facts run per statement (not module-wide) and the statements whose
    lookups still answer the same are not checked again."""
    checker = Checker("torch-xla", FACTS_DOCUMENT)
    base = checker.result[0]
    fact_rules = {"TX201", "TX202", "TX301", "TX305", "TX401", "TX402", "TX406", "TX501", "TX901"}
    local_codes = {r.code for r in checker.options.rules if getattr(r, "local", False)}
    assert fact_rules <= local_codes
    for name, old, new, codes in FACT_EDITS:
        assert FACTS_DOCUMENT.count(old) == 1, name
        before = checker.text
        checker.apply(before.replace(old, new))
        got = checker.result[0]
        assert got.reparsed is not None, name  # spliced, not parsed again in full
        changed = {c for c in codes
                   if [x for x in _codes_at(got) if x[0] == c] != [x for x in _codes_at(base) if x[0] == c]}
        assert changed == codes, (name, changed)
        same_rules = engine.applicable_rules(checker.options.rules, before) == engine.applicable_rules(checker.options.rules, checker.text)
        if codes and same_rules:  # the fact readers ran per statement, and not every statement ran again
            assert got.rules_module_wide < got.rules_local, name
            assert got.statements_run < len(got.module.body), (name, got.statements_run)
        checker.apply(before)  # and back
        assert _codes_at(checker.result[0]) == _codes_at(base), name
    # a plain edit inside a function: that statement alone is checked again, every other
    # statement's findings (and the lookups they made in the facts) are reused
    fresh = Checker("torch-xla", FACTS_DOCUMENT)
    fresh.apply(FACTS_DOCUMENT.replace("    total = 0.0\n", "    total = 0.0\n    seen = 0\n"))
    assert fresh.result[0].statements_run == 1
    assert fresh.result[0].rules_module_wide < fresh.result[0].rules_local


def test_document_gate_is_read_from_the_text_a_run_began_with():
    """Rule.needs_document (a front end's rules run on documents of their framework only):
    engine.check and the incremental checker read it from the text checked; engine.fix from
    the text the migrate began with, for every pass, so a rule acting on text another rule
    wrote in an earlier pass still runs after the word is gone."""
    from porter.rules import Fix, Rule, Severity

    class DropImport(Rule):
        code = "ZZ911"
        name = "drop-import"
        target = "torch"
        summary = "import mxnet -> import torch"
        severity = Severity.INFO
        needs_text = ("mxnet",)
        needs_document = ("mxnet",)
        local = True

        def visit_Import(self, node: cst.Import) -> None:
            if any(a.name.value == "mxnet" for a in node.names if isinstance(a.name, cst.Name)):
                self.report(node, "mxnet import", Fix((self.replace(node, cst.parse_statement("import torch").body[0]),)))

    class Rename(Rule):
        code = "ZZ912"
        name = "rename"
        target = "torch"
        summary = "old_api() -> new_api(), once the import is torch's"
        severity = Severity.INFO
        needs_text = ("old_api",)
        needs_document = ("mxnet",)
        local = True

        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Name) and node.func.value == "old_api" and self.ctx.qualname(cst.Name("torch")):
                self.report(node, "old_api", Fix((self.replace(node.func, cst.Name("new_api")),)))

    options = engine.Options((DropImport, Rename))
    gluon = "import mxnet\n\n\ndef f():\n    return old_api()\n"
    plain = "import torch\n\n\ndef f():\n    return old_api()\n"
    # check: the gate reads the text checked (the plain file: neither rule)
    assert [f.code for f in engine.check(gluon, options).findings] == ["ZZ911"]
    assert engine.check(plain, options).findings == []
    # fix: pass 1 replaces the import (the word is gone), pass 2 still runs ZZ912
    fixed = engine.fix(gluon, options)
    assert fixed.source == "import torch\n\n\ndef f():\n    return new_api()\n" and fixed.fixed == {"ZZ911": 1, "ZZ912": 1}
    assert not engine.fix(plain, options).changed
    # the incremental checker: as engine.check, while the word comes and goes
    doc = incremental.Document(options.rules)
    for text in (gluon, plain, plain.replace("return", "x = 1\n    return"), gluon, gluon.replace("import mxnet", "import mxnet  # kept")):
        assert [key(f) for f in doc.check(text).findings] == [key(f) for f in engine.check(text, options).findings]


def test_statement_facts_follow_a_change_of_their_pre_fact():
    """The training-loop index is built statement by statement (porter.rules.StatementFact)
    on the optimizer classes of the module: an edit of one class's base (another statement)
    changes what the index says of a binding in main and, through the call, TX201's finding
    in train; undone, it goes. Each step equals engine.check."""
    text = (FACTS_DOCUMENT
            .replace("    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", "    opt = Stepper(model.parameters(), lr=0.1)\n")
            .replace("class Progress:", "class Stepper(object):\n    pass\n\n\nclass Progress:")
            .replace("opt.", "stepper.").replace("opt,", "stepper,").replace("opt = ", "stepper = "))
    checker = Checker("torch-xla", text)
    tx201 = [f for f in checker.result[0].findings if f.code == "TX201"]
    checker.apply(text.replace("class Stepper(object):", "class Stepper(torch.optim.SGD):"))
    got = checker.result[0]
    assert got.reparsed is not None and got.statements_run < len(got.module.body)
    assert len([f for f in got.findings if f.code == "TX201"]) == len(tx201) + 1
    checker.apply(text)
    assert [f for f in checker.result[0].findings if f.code == "TX201"] == [] == tx201


JAX_FACTS_DOCUMENT = '''import jax
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


class Child(Base):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        if self.training:
            x = x * 2
        return self.fc(self.drop(x))


def make_data():
    x = torch.randn(64, 4)
    y = torch.randint(0, 2, (64,))
    return x, y


def noise():
    return torch.randn(3, 4)


def main():
    x, y = make_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = Child()
    return loader, model


def scale(t):
    return t.float()


def train(model, device, loader):
    for x in loader:
        model(x)


@jax.jit
def step(x):
    return x


def run(loader, model):
    total = 0.0
    for x in loader:
        loss = step(x)
        total += loss.item()
    out = scale(torch.zeros(4))
    train(model, "cpu", loader)
    return total, out


def load_torch_state_dict(model, state):
    return model


def restore(model, weights):
    model.load_state_dict(weights)
'''

# (name, old text, new text, the codes whose findings change, the rule that reads the fact
# and must stay per statement). Each edit is in one statement and changes findings in another.
JAX_FACT_EDITS = [
    # _nnx.module_classes: Child is a module class through Base; JX006 (Child's self.training)
    ("module classes", "class Base(nn.Module):", "class Base(object):", {"JX006"}, "JX006"),
    # _ops_table._data_facts: make_data feeds a TensorDataset in main, so its torch.randn /
    # torch.randint stay torch (data pipeline); without the loader JX101 reports them
    ("data pipeline", "    loader = DataLoader(TensorDataset(x, y), batch_size=8)\n", "    loader = None\n",
     {"JX101"}, "JX101"),
    # jx101._seeds_numpy: np.random.seed in main turns noise()'s torch.randn into numpy's draw
    ("numpy seeded", "    x, y = make_data()\n", "    np.random.seed(0)\n    x, y = make_data()\n", {"JX101"}, "JX101"),
    # _ops_table._call_site_tensors_of: run() gives scale() a tensor, so t.float() is a
    # tensor method (JX102); given an int, it is not (and the torch.zeros of run() goes, JX101)
    ("call-site tensors", "    out = scale(torch.zeros(4))\n", "    out = scale(3)\n", {"JX101", "JX102"}, "JX102"),
    # jx308's function uses: every call of train() passes the device by position, so the
    # parameter and the arguments go (JX308, reported on train); a *args call keeps them
    ("function uses", '    train(model, "cpu", loader)\n', "    train(model, *loader)\n", {"JX308"}, "JX308"),
    # jx309's jitted functions: step() is jitted, so `total += loss.item()` in run() reads
    # the device every step (JX309); without the decorator it is not a step's result
    ("jitted functions", "@jax.jit\ndef step(x):", "def step(x):", {"JX309"}, "JX309"),
    # jx307's converter: the module defines load_torch_state_dict, so restore()'s
    # load_state_dict(weights) goes through it (JX307); renamed, it is not reported
    ("converter", "def load_torch_state_dict(model, state):", "def load_other(model, state):", {"JX307"}, "JX307"),
]


def _stays_local(checker, code: str) -> bool:
    """Whether the rule ``code`` ran per statement on every statement of the last version."""
    rule = next(r for r in checker.options.rules if r.code == code)
    return all(rule in got and got[rule] is not None
               for s in checker.doc.last.stmts for got in [next(reversed(s.results.values()))])


def test_jax_module_facts_changed_in_another_statement():
    """The JAX rules' module facts (the module classes, the data pipeline, numpy seeding): an
    edit in one statement changes the findings of another through the fact; each step, and
    the undo, equals engine.check, the reading rule stays per statement, and a plain edit
    inside a function checks that statement alone."""
    checker = Checker("jax", JAX_FACTS_DOCUMENT)
    base = checker.result[0]
    watched = {"JX006", "JX101", "JX102", "JX307", "JX308", "JX309"}
    for name, old, new, codes, reader in JAX_FACT_EDITS:
        assert JAX_FACTS_DOCUMENT.count(old) == 1, name
        rule = next(r for r in checker.options.rules if r.code == reader)
        assert getattr(rule, "local", False), reader
        before = checker.text
        checker.apply(before.replace(old, new))
        got = checker.result[0]
        assert got.reparsed is not None, name
        changed = {c for c in watched  # lines aside: an inserted line moves the findings below it
                   if [x[:2] + x[3:] for x in _codes_at(got) if x[0] == c] != [x[:2] + x[3:] for x in _codes_at(base) if x[0] == c]}
        assert changed == codes, (name, changed)
        edited_line = before[:before.index(old)].count("\n") + 1
        moved = [x for x in _codes_at(got) if x[0] in codes] + [x for x in _codes_at(base) if x[0] in codes]
        assert any(x[2] is not None and abs(x[2] - edited_line) > 3 for x in moved), name  # another statement
        assert _stays_local(checker, reader), name
        assert got.statements_run < len(got.module.body), (name, got.statements_run)
        checker.apply(before)
        assert _codes_at(checker.result[0]) == _codes_at(base), name
        assert _stays_local(checker, reader), name
    fresh = Checker("jax", JAX_FACTS_DOCUMENT)
    fresh.apply(JAX_FACTS_DOCUMENT.replace("    return torch.randn(3, 4)\n", "    z = 1\n    return torch.randn(3, 4)\n"))
    assert fresh.result[0].statements_run == 1


class _OnTheModule(Rule):
    """Test rule: one finding on the module node (as a rule reporting for the whole file does)."""

    code, name, target, summary, needs_text = "T095", "t-module", "test", "x", ()

    def visit_Module(self, node):
        self.report(node, "the file")


@pytest.mark.parametrize("text", [
    "import os\n\ndef f():\n    return 1\n\nx = 2\n",
    "import os\n\ndef f():\n    return 1\n\nx = 2",
    "import os\r\n\r\ndef f():\r\n    return 1\r\n\r\nx = 2\r\n# tail\r\n",
    "import os\rimport sys\r\r\rdef f():\r    return 1\r\rx = 2",
    "import os\n\ndef f():\n    return 1\n\nx = 2\n\n\n",
])
def test_the_module_nodes_range_without_its_codegen(text):
    """After a spliced edit, a finding on the module node has the range engine.check gives it
    (computed from the text, not from a codegen of the module)."""
    doc = incremental.Document([_OnTheModule])
    doc.check(text)
    edited = text.replace("return 1", "return 10")
    got = doc.check(edited)
    if "\r" not in text.replace("\r\n", ""):
        assert got.reparsed is not None  # spliced (a file of lone CRs is parsed again: LibCST drops its last one)
    want = engine.check(edited, engine.Options((_OnTheModule,)))
    assert [f.position for f in got.findings] == [f.position for f in want.findings]


MODULE_DATA_DOCUMENT = '''import torch
from torch.utils.data import DataLoader, TensorDataset


def make():
    return torch.randn(8, 4)


def labels(n):
    return torch.randint(0, 2, (n,))


x = make()
y = labels(8)
loader = DataLoader(TensorDataset(x, y), batch_size=2)
'''


@pytest.mark.parametrize("old, new", [
    ("TensorDataset(x, y)", "TensorDataset(y)"),  # a name the loader reads: make() leaves the pipeline
    ("loader = DataLoader(TensorDataset(x, y), batch_size=2)\n", "loader = None\n"),  # no loader at all
    ("y = labels(8)\n", "y = torch.ones(8)\n"),  # the assignment of a name it reads: labels() leaves it
    ("x = make()\n", "x = torch.randn(8, 4)\n"),  # nothing of the file feeds x: make() leaves it
])
def test_jax_data_pipeline_across_module_level_statements(old, new):
    """The data pipeline fact at module level is one scope over many top-level statements
    (the loader in one, the assignments of the names it reads in others, the functions they
    call in others again): an edit in one changes the JX101 findings in another, and the
    undo gives them back, equal to engine.check each time."""
    checker = Checker("jax", MODULE_DATA_DOCUMENT)
    base = [x for x in _codes_at(checker.result[0]) if x[0] == "JX101"]
    checker.apply(MODULE_DATA_DOCUMENT.replace(old, new))
    assert checker.result[0].reparsed is not None
    assert [x for x in _codes_at(checker.result[0]) if x[0] == "JX101"] != base
    checker.apply(MODULE_DATA_DOCUMENT)
    assert [x for x in _codes_at(checker.result[0]) if x[0] == "JX101"] == base
