"""Porter's own rendered helpers are skipped by the engine's walk (porter.emitted): only time is
saved. Every fixture's port (torch and Gluon fixtures to JAX, torch fixtures to torch-xla; both modes), and the port ported again, come out the
same, with the same findings, whether the helpers are walked or not."""
from __future__ import annotations

import pytest

from porter import emitted, engine, registry
from porter.fixtures import fixtures, gluon_fixtures

from lanes import fixture_slice

# every sixth case per run of the suite (each takes 2-10 s), all with PORTER_TEST_EVERY_FIXTURE=1
CASES = fixture_slice([("jax", fx) for fx in fixtures("jax")] + [("torch-xla", fx) for fx in fixtures("torch-xla")] + [
    ("jax", fx) for fx in gluon_fixtures("jax")], 6)


def _port(source: str, target: str, unsafe: bool) -> tuple[str, list]:
    result = engine.fix(source, engine.Options(registry.select(target), unsafe_fixes=unsafe))
    return result.source, sorted((f.code, f.message, str(f.position)) for f in result.remaining)


@pytest.mark.parametrize("target,fx", CASES, ids=[f"{t}-{fx.name}" for t, fx in CASES])
def test_skipping_the_helpers_changes_nothing(target, fx):
    source = fx.original.read_text(encoding="utf-8")
    for unsafe in (False, True):
        skipped = _port(source, target, unsafe)  # (renders the helpers: they are recorded)
        again = _port(skipped[0], target, unsafe)
        before = emitted.set_enabled(False)
        try:
            walked = _port(source, target, unsafe)
            walked_again = _port(walked[0], target, unsafe)
        finally:
            emitted.set_enabled(before)
        assert skipped == walked, (target, fx.name, unsafe)
        assert again == walked_again, (target, fx.name, unsafe)


def test_a_helper_changed_after_insertion_is_walked():
    source = "import torch.nn as nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n" \
             "        self.c = nn.Conv2d(1, 2, 3)\n"
    port = engine.fix(source, engine.Options(registry.select("jax"))).source
    module = __import__("libcst").parse_module(port)
    ids = emitted.emitted_ids(module)
    names = {s.name.value for s in module.body if id(s) in ids}
    assert {"TorchConv2d", "load_torch_state_dict"} <= names and "M" not in names
    changed = __import__("libcst").parse_module(port.replace("feature_group_count=groups", "feature_group_count=1"))
    assert "TorchConv2d" not in {s.name.value for s in changed.body if id(s) in emitted.emitted_ids(changed)}
