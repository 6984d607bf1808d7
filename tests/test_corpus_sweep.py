"""A slice of benchmarks/corpus_sweep.py: its checks on a few files of each real corpus.

For every corpus present on this machine (torch's own sources, torchvision, timm, the Gluon
model zoo in the MXNet venv, ../shared/corpus), a fixed sample of files is migrated with each
of the corpus's targets in both fix modes: no internal error, no unparsable output, no fixes
that do not converge, a second run changes nothing, and a file no fix touched stays
byte-identical. A corpus that is absent is skipped with the reason.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import corpus_sweep  # noqa: E402

SAMPLE = 2  # files per corpus, spread evenly over its sorted files (the benchmark: all of them)
CORPORA = {c.name: c for c in corpus_sweep.corpora()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPORA))
def test_sweep_slice(name):
    corpus = corpus_sweep.load(CORPORA[name], SAMPLE)
    if not corpus.files:
        pytest.skip(corpus.note or f"{name}: no Python files")
    bad = {}
    for target in corpus.targets:
        for mode in corpus_sweep.MODES:
            result = corpus_sweep.sweep_one(corpus.files, target, mode)
            assert result["files"] == len(corpus.files)
            for kind in ("internal", "unparsable", "nonconvergent", "nonidempotent", "changed_untouched"):
                if result[kind]:
                    bad[f"{target} {mode} {kind}"] = result["problems"][kind]
    assert not bad, bad


def test_classify_failures():
    from porter.runner import FileOutcome

    def kind(error: str) -> str:
        return corpus_sweep.classify(FileOutcome("f.py", "failed", error))

    assert kind("internal error at x.py:3: KeyError: 'a'") == "internal"
    assert kind("internal error: the fixes of JX001 produced code that does not parse (...)") == "unparsable"
    assert kind("internal error: the converted code does not compile (line 3: invalid syntax); file left unchanged") == "unparsable"
    assert kind("fixes did not converge after 8 passes (rules JX101); file left unchanged") == "nonconvergent"
    assert kind("syntax error at line 1, column 7: invalid syntax") == "refusal"


def test_sample_is_spread_and_stable():
    files = [Path(f"f{i:03}.py") for i in range(100)]
    picked = corpus_sweep.sample(list(reversed(files)), 10)
    assert picked == corpus_sweep.sample(files, 10)
    assert len(picked) == 10 and picked[0] == files[0] and picked[-1] == files[90]
    assert corpus_sweep.sample(files, None) == files
