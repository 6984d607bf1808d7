"""benchmarks/torchvision_jax.py's bookkeeping: a partial run keeps the rows it did not measure,
and the copied package imports itself, not torchvision, where a model file imports it absolutely."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("torchvision_jax_bench", ROOT / "benchmarks" / "torchvision_jax.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _row(name, status, **extra):
    return {"builder": name, "status": status, **extra}


def test_partial_run_replaces_only_what_it_measured():
    previous = [_row("alexnet", "verified", seconds=40), _row("densenet121", "port-incomplete"),
                _row("swin_t", "not-run"), _row("vgg11", "timeout")]
    # selected: densenet121 (measured), swin_t (not reached before the deadline), vit_b_16 (new, not reached)
    results = {"densenet121": _row("densenet121", "verified", seconds=300),
               "swin_t": _row("swin_t", "not-run"), "vit_b_16": _row("vit_b_16", "not-run")}
    merged = bench.merged_rows(previous, results, done={"densenet121"})
    assert [r["builder"] for r in merged] == ["alexnet", "densenet121", "swin_t", "vgg11", "vit_b_16"]
    by = {r["builder"]: r for r in merged}
    assert by["densenet121"] == _row("densenet121", "verified", seconds=300)
    assert by["alexnet"] == _row("alexnet", "verified", seconds=40) and by["vgg11"]["status"] == "timeout"
    # a selected builder not reached keeps its earlier result
    previous[2] = _row("swin_t", "mismatch", seconds=9)
    assert bench.merged_rows(previous, results, done={"densenet121"})[2] == _row("swin_t", "mismatch", seconds=9)


def test_absolute_imports_of_the_package_point_at_the_copy(tmp_path):
    pkg = tmp_path / "tvport"
    for rel in ("ops/misc.py", "ops/__init__.py", "utils.py", "models/_api.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("", encoding="utf-8")
    text = ("from torchvision.ops.misc import Conv2dNormActivation\nfrom torchvision.ops import StochasticDepth\n"
            "from torchvision.utils import _log_api_usage_once\nfrom torchvision.models._api import Weights\n"
            "from torchvision.io import read_image\nimport torchvision\n")
    out = re.sub(r"^from torchvision((?:\.\w+)+) import", lambda m: bench._own(m, pkg), text, flags=re.M)
    assert out.splitlines() == [
        "from ..ops.misc import Conv2dNormActivation",
        "from torchvision.ops import StochasticDepth",  # a package whose copied __init__ is empty
        "from ..utils import _log_api_usage_once",
        "from ._api import Weights",
        "from torchvision.io import read_image",  # not in the copy
        "import torchvision",
    ]
