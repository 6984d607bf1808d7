"""Files past porter's limits fail alone, with one clear line, and the batch goes on.

- the pre-check (``engine.precheck``): deep bracket nesting and long operator chains are
  refused from the tokens, before LibCST's parser (which overflows its stack on ~2,000
  brackets and takes cubic time on long chains) sees them;
- just under the limits every target runs without a RecursionError;
- per-file budgets (``--time-limit``, ``--memory-limit``, ``[tool.porter]``): each file runs
  in a worker process, killed past its time, its address space capped;
- a worker that dies (a real native crash: LibCST's parser on 5,000 nested brackets, the
  pre-check lifted) fails its one file with the signal; the other files are processed.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from clihelp import TRAIN, cli, run_porter, write
from porter import engine, registry, runner

TARGETS = registry.TARGETS
GOOD = "import torch\nx = torch.randn(3).cuda()\n"


def nested(n: int, kind: str) -> str:
    if kind == "parens":
        return "x = " + "(" * n + "1" + ")" * n + "\n"
    if kind == "lists":
        return "x = " + "[" * n + "1" + "]" * n + "\n"
    if kind == "dicts":
        return "x = " + "{1: " * n + "1" + "}" * n + "\n"
    if kind == "calls":
        return "x = " + "f(" * n + "1" + ")" * n + "\n"
    if kind == "mixed lines":  # one bracket a line, in a function
        opens = "".join("([{"[i % 3] + "\n" for i in range(n))
        closes = "".join(")]}"[i % 3] + "\n" for i in reversed(range(n)))
        return "def g():\n    return " + opens + "1" + closes
    raise ValueError(kind)


def chain(n: int, kind: str) -> str:
    if kind == "plus":
        return "x = " + " + ".join(["a"] * (n + 1)) + "\n"
    if kind == "and":
        return "x = " + " and ".join(["a"] * (n + 1)) + "\n"
    if kind == "mixed ops":
        ops = ["*", "-", "//", "|", "@", "<<"]
        return "x = a" + "".join(f" {ops[i % len(ops)]} b{i}" for i in range(n)) + "\n"
    if kind == "attributes":
        return "x = a" + ".b" * n + "\n"
    if kind == "unary":
        return "x = " + "-" * n + "a\n"
    if kind == "continued":  # one term a line, inside brackets
        return "x = (\n" + "".join(f"    a{i} +\n" for i in range(n)) + "    a\n)\n"
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["parens", "lists", "dicts", "calls", "mixed lines"])
def test_deep_nesting_refused_before_the_parser(kind):
    src = "import torch\n\n" + nested(2000, kind)
    t = time.perf_counter()
    with pytest.raises(engine.PorterError) as err:
        engine.check(src, engine.Options(registry.select("torch-xla")))
    assert time.perf_counter() - t < 2
    message = str(err.value)
    assert "\n" not in message and f"limit of {engine.MAX_NESTING}" in message and "brackets nested" in message
    assert message.startswith("line 3:") or message.startswith("line 4:") or kind == "mixed lines"


@pytest.mark.parametrize("kind", ["plus", "and", "mixed ops", "attributes", "unary", "continued"])
@pytest.mark.parametrize("n", [500, 20000])
def test_long_chains_refused_quickly(kind, n):
    src = "import torch\n" + chain(n, kind)
    t = time.perf_counter()
    with pytest.raises(engine.PorterError) as err:
        engine.fix(src, engine.Options(registry.select("jax")))
    assert time.perf_counter() - t < 3  # LibCST alone: 20k terms take over 20 minutes
    message = str(err.value)
    assert f"limit of {engine.MAX_CHAIN}" in message and "operators" in message and "internal error" not in message


def test_limits_name_the_line():
    src = "import torch\n\n\ndef f(a):\n    y = 1\n    return " + "(" * 150 + "a" + ")" * 150 + "\n"
    with pytest.raises(engine.PorterError, match=r"^line 6: brackets nested 150 deep"):
        engine.check(src, engine.Options(registry.select("torch-xla")))


def test_strings_and_comments_are_not_counted():
    src = GOOD + "s = '" + "(" * 5000 + "'\n# " + "+ " * 5000 + "\nt = '''" + "[" * 3000 + "'''\n"
    engine.precheck(src)
    assert engine.check(src, engine.Options(registry.select("torch-xla"))).findings


JUST_UNDER = {
    "nested calls": "f(" * (engine.MAX_NESTING - 1) + "x.cuda()" + ")" * (engine.MAX_NESTING - 1),
    "nested lists": "[" * (engine.MAX_NESTING - 1) + "x.cuda()" + "]" * (engine.MAX_NESTING - 1),
    "nested parens and a chain": "(" * (engine.MAX_NESTING - 2) + " + ".join(["-x.cuda().float()"] * 25) + ")" * (engine.MAX_NESTING - 2),
    "plus chain": " + ".join(["x.cuda()"] * (engine.MAX_CHAIN // 2)),
    "attribute chain": "x.cuda()" + ".float()" * (engine.MAX_CHAIN - 2),
}


@pytest.mark.parametrize("target", TARGETS)
def test_just_under_the_limits_every_target_runs(target):
    """No RecursionError (the tree of a long chain is as deep as the chain) below the limits."""
    options = engine.Options(registry.select(target))
    for name, expr in JUST_UNDER.items():
        src = "import torch\nimport mxnet as mx\nimport numpy as np\n\n\ndef f(x):\n    return " + expr + "\n"
        engine.precheck(src)
        engine.check(src, options)
        try:
            result = engine.fix(src, options)
        except engine.PorterError as exc:  # a rule's own limit (a fix that does not converge) is fine
            assert "RecursionError" not in str(exc) and "internal error" not in str(exc), (name, exc)
        else:
            assert not [f for f in result.remaining if f.internal_error], name


def test_recursion_in_a_rule_is_a_limit_of_the_file_not_an_internal_error():
    """A rule helper that recurses along the tree (as a real one may) on a tree deeper than
    Python allows: the file fails with a one-line limit message."""
    import libcst as cst

    from porter.rules import Rule

    def depth(node):
        return 1 + max((depth(c) for c in node.children), default=0)

    class Deep(Rule):
        code, name, target, summary, needs_text = "ZZ701", "deep", "test", "depth", ()

        def visit_Module(self, node):
            self.report(node, f"depth {depth(node)}")

    src = "x = " + "-" * 95 + "a\n"
    assert engine.check(src, engine.Options((Deep,))).findings  # fine within the limits
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        for run in (engine.check, engine.fix):
            with pytest.raises(engine.PorterError, match="too deeply nested for porter"):
                run(src, engine.Options((Deep,)))
    finally:
        sys.setrecursionlimit(old)
    assert isinstance(cst.parse_module(src), cst.Module)


# -- the command line: budgets and dead workers -----------------------------------------------
def _batch(root: Path, bad: dict[str, str]) -> Path:
    b = root / "batch"
    write(b / "good.py", GOOD)
    write(b / "train.py", TRAIN)
    for name, text in bad.items():
        write(b / name, text)
    return b


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_deep_and_long_files_fail_alone_on_the_command_line(tmp_path, jobs):
    _batch(tmp_path, {"deep.py": nested(2000, "parens"), "long.py": chain(20000, "plus")})
    for command in ("check", "migrate"):
        r = run_porter(command, "batch", "--jobs", jobs, cwd=tmp_path, timeout=120)
        assert r.code == 1, r.err
        errors = sorted(r.error_lines)
        assert len(errors) == 2, r.err
        assert errors[0].startswith("batch/deep.py: error: line 1: brackets nested 2000 deep")
        assert errors[1].startswith("batch/long.py: error: line 1: a chain of 20000 operators")
        assert "good.py" in (r.out + r.err) and "train.py" in (r.out + r.err)


def _big(lines: int) -> str:
    return "import torch\n" + "x = torch.randn(3).cuda()\n" * lines


@pytest.mark.slow
def test_time_and_memory_budgets(tmp_path):
    """A large generated file (fast to write) over a low budget fails alone; the others pass."""
    _batch(tmp_path, {"big.py": _big(60000)})
    r = run_porter("check", "batch", "--time-limit", "1", cwd=tmp_path, timeout=120)
    assert r.code == 1
    assert r.error_lines == [
        "batch/big.py: error: over the time limit of 1 s of CPU time for one file (--time-limit); file left unchanged"]
    assert "batch/good.py:2:5: TX102" in r.out and "batch/train.py:" in r.out
    r = run_porter("migrate", "batch", "--memory-limit", "100", "--jobs", "2", cwd=tmp_path, timeout=120)
    assert r.code == 1
    assert len(r.error_lines) == 1 and r.error_lines[0].startswith("batch/big.py: error: ")
    assert "memory limit of 100 MB" in r.error_lines[0], r.err
    assert "memory allocation" not in r.err  # the native runtime's own words stay in the worker
    assert "+++ b/batch/good.py" in r.out


def test_budgets_from_pyproject_and_flags(tmp_path):
    from porter.cli import _settings

    b = _batch(tmp_path, {})
    assert (_settings([b], None, [], [], None).time_limit, _settings([b], None, [], [], None).memory_mb) == (
        runner.DEFAULT_TIME_LIMIT, runner.DEFAULT_MEMORY_MB)
    write(tmp_path / "pyproject.toml", '[tool.porter]\ntime-limit = 1.5\nmemory-limit = 0\n')
    s = _settings([b], None, [], [], None)
    assert (s.time_limit, s.memory_mb) == (1.5, 0)
    s = _settings([b], None, [], [], None, 7, 300)  # the flags win
    assert (s.time_limit, s.memory_mb) == (7, 300)
    assert not runner.Settings(time_limit=0, memory_mb=0).limited  # then: in the calling process
    for bad, words in (('time-limit = "soon"', "time-limit must be a number of seconds"),
                       ("memory-limit = 1.5", "memory-limit must be a whole number of MB"),
                       ("memory-limit = -1", "memory-limit must be")):
        write(tmp_path / "pyproject.toml", f"[tool.porter]\n{bad}\n")
        r = cli("check", "batch", cwd=tmp_path)
        assert r.code == 2 and words in r.err, r.err


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_dead_worker_fails_its_file_only(tmp_path, monkeypatch, jobs):
    """LibCST's native parser really overflowing its stack (the pre-check lifted for this
    test: the workers are forked from this process): the file is reported with the signal,
    every other file is processed."""
    monkeypatch.setattr(engine, "MAX_NESTING", 10**6)
    b = _batch(tmp_path, {"deep.py": nested(5000, "parens"), "zz.py": GOOD})
    outcomes = {o.path: o for o in runner.run("check", [b], runner.Settings(), jobs=jobs)}
    dead = outcomes[runner.display(b / "deep.py")]
    assert dead.status == "failed" and "SIGSEGV" in dead.error and "worker process died on this file" in dead.error
    for name in ("good.py", "train.py", "zz.py"):
        o = outcomes[runner.display(b / name)]
        assert o.status == "unchanged" and o.findings, name


def test_the_editors_incremental_check_applies_the_limits_to_an_edit():
    """`porter lsp` parses only the statements an edit changed (porter.incremental): an edit
    that nests 3,000 brackets is refused there too (LibCST's parser would take the server
    down), and the next version is checked as usual."""
    from porter import incremental

    doc = incremental.Document(registry.select("torch-xla"))
    text = "import torch\n\n\ndef f(x):\n    return x.cuda()\n\n\ndef g():\n    return 1\n"
    assert len(doc.check(text).findings) == 1
    with pytest.raises(engine.PorterError, match="^line 9: brackets nested 3000 deep"):
        doc.check(text.replace("return 1", "return " + "(" * 3000 + "1" + ")" * 3000))
    assert len(doc.check(text).findings) == 1
