"""The zoo's cache key: what a model's result depends on (the port's written modules of its
closure, the code that runs and judges it, the settings), and nothing else."""
from __future__ import annotations

from pathlib import Path

from porter.packages import ModulePort, PackagePort
from porter.zoo.model import cache_key, port_digest, runner_fingerprint


def _port(tmp_path: Path, texts: dict[str, str], imports: dict[str, list[str]]) -> PackagePort:
    modules = {}
    for name, text in texts.items():
        out = tmp_path / (name.replace(".", "/") + ".py")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        modules[name] = ModulePort(name, out, out, "ported", [], None, f"src-{name}", imports.get(name, []))
    return PackagePort("zoo", tmp_path, "torch-xla", modules)


def test_port_digest_follows_the_written_closure_only(tmp_path):
    texts = {"zoo.a": "import zoo.b\n", "zoo.b": "X = 1\n", "zoo.c": "Y = 2\n"}
    port = _port(tmp_path, texts, {"zoo.a": ["zoo.b"]})
    before = {m: port_digest(port, m) for m in texts}
    assert len(set(before.values())) == 3
    # the same bytes written again (a rule change that leaves these modules as they were)
    port.modules["zoo.b"].output.write_text("X = 1\n")
    assert port_digest(port, "zoo.a") == before["zoo.a"]
    # a module outside a's closure changes: a's key does not
    port.modules["zoo.c"].output.write_text("Y = 3\n")
    assert port_digest(port, "zoo.a") == before["zoo.a"]
    assert port_digest(port, "zoo.c") != before["zoo.c"]
    # a module a imports is written differently: a's key changes, as does b's
    port.modules["zoo.b"].output.write_text("X = 2\n")
    assert port_digest(port, "zoo.a") != before["zoo.a"]
    assert port_digest(port, "zoo.b") != before["zoo.b"]
    # a module that could not be ported (copied as is) is not the same as a ported one
    port.modules["zoo.b"].output.write_text("X = 1\n")
    port.modules["zoo.b"].status = "failed"
    assert port_digest(port, "zoo.a") != before["zoo.a"]


def test_cache_key_depends_on_the_settings_and_the_runner():
    fp = runner_fingerprint()
    assert len(fp) == 64 and fp == runner_fingerprint()
    base = cache_key("d", {"steps": 3}, fp)
    assert base == cache_key("d", {"steps": 3}, fp)
    assert base != cache_key("d", {"steps": 2}, fp)
    assert base != cache_key("e", {"steps": 3}, fp)
    assert base != cache_key("d", {"steps": 3}, "0" * 64)
    assert base == cache_key("d", {"steps": 3})  # the fingerprint of this porter by default
