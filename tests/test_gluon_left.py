"""MXNet left in a Gluon port (GL901): every line of a migrated file that still holds MXNet has
a finding, one per line; a check of a Gluon file not ported yet leaves it to the other rules.
mx.image.imresize (GL406): the emitted gluon_imresize, in torch and in JAX, against MXNet's
OpenCV resize."""
from __future__ import annotations

import ast
import subprocess
import textwrap

import libcst as cst
import numpy as np
import pytest

from porter import engine, registry
from porter.rules import Finding, Position, Severity

import mxnethelp

# several spellings of MXNet code no rule translates (with code the rules do translate around it)
SOURCES = {
    "module-alias": """
        import mxnet as mx
        from mxnet import nd

        def load(buf, x):
            img = mx.image.imdecode(buf)
            y = nd.relu(x)
            return img, y
        """,
    "from-imports": """
        from mxnet import autograd, nd
        from mxnet.base import numeric_types
        from mxnet.gluon.data.vision import transforms

        def fill(x, value):
            if isinstance(value, numeric_types):
                return nd.ones_like(x) * value
            with autograd.pause():
                return transforms.RandomLighting(0.1)(x)
        """,
    "plain-and-submodule-imports": """
        import mxnet
        import mxnet.ndarray as F

        class Reader:
            def read(self, path: str) -> mxnet.nd.NDArray:
                rec = mxnet.recordio.MXRecordIO(path, "r")
                header, img = mxnet.recordio.unpack_img(rec.read())
                return F.contrib.box_nms(img)
        """,
    "function-level-import": """
        import torch

        def resize(src, w, h, interp):
            from mxnet.image.image import _get_interp_method as get_interp
            return get_interp(interp, (src.shape[0], src.shape[1], h, w))
        """,
}


def _port(src: str, target: str) -> engine.FixResult:
    return engine.fix(textwrap.dedent(src).lstrip("\n"), engine.Options(rules=registry.rules_for(target)))


def _mxnet_lines(text: str) -> set[int]:
    """Lines of ``text`` that hold MXNet: its imports, and reads of the names they bind."""
    tree = ast.parse(text)
    names, lines = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == "mxnet":
                    names.add(a.asname or a.name.split(".")[0])
                    lines.add(n.lineno)
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "mxnet" and not n.level:
            names.update(a.asname or a.name for a in n.names)
            lines.add(n.lineno)
    lines |= {n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in names}
    return lines


@pytest.mark.parametrize("target", ["torch", "jax"])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_line_left_holding_mxnet_has_one_finding(name, target):
    result = _port(SOURCES[name], target)
    text = result.source if result.changed else textwrap.dedent(SOURCES[name]).lstrip("\n")
    left = _mxnet_lines(text)
    assert left, text
    by_line: dict[int, list[Finding]] = {}
    for f in result.remaining:
        by_line.setdefault(f.position.line, []).append(f)
    for line in left:
        assert by_line.get(line), f"line {line} holds MXNet without a finding:\n{text}"
        gl901 = [f for f in by_line[line] if f.code == "GL901"]
        assert len(gl901) <= 1 and (not gl901 or len(by_line[line]) == 1), (line, by_line[line])
    assert any(f.code == "GL901" for f in result.remaining)


def test_import_names_the_uses_that_keep_it_and_a_check_of_an_unported_file_says_nothing():
    src = "import mxnet as mx\n\nimg = mx.image.imdecode(buf)\nrec = mx.recordio.unpack(s)\n"
    result = _port(src, "torch")
    assert not result.changed
    found = {f.position.line: f.message for f in result.remaining if f.code == "GL901"}
    assert set(found) == {1, 3, 4}
    assert "mx.image.imdecode, mx.recordio.unpack" in found[1] and "ModuleNotFoundError" in found[1]
    assert "mx.image.imdecode" in found[3]
    # a check of the same (not yet ported) file: the other rules speak, not GL901
    checked = engine.check(src, engine.Options(rules=registry.rules_for("torch")))
    assert not [f for f in checked.findings if f.code == "GL901"]
    # a check of the port (it imports torch) reports what stays
    ported = "import torch\n" + src
    checked = engine.check(ported, engine.Options(rules=registry.rules_for("torch")))
    assert sorted(f.position.line for f in checked.findings if f.code == "GL901") == [2, 4, 5]


def test_guarded_import_is_not_reported_but_its_uses_are():
    src = "import torch\ntry:\n    import mxnet as mx\nexcept ImportError:\n    mx = None\n\nimg = mx.image.imdecode(buf)\n"
    result = _port(src, "torch")
    assert [f.position.line for f in result.remaining if f.code == "GL901"] == [7]


def test_a_line_another_rule_reports_is_reported_once():
    # GL006 reports mx.nd.array of a value it cannot see and leaves it
    src = "import mxnet as mx\nimport torch\n\nx = mx.nd.array(values)\n"
    result = _port(src, "torch")
    on_4 = [f.code for f in result.remaining if f.position.line == 4]
    assert len(on_4) == 1 and on_4 != ["GL901"], result.remaining


def _f(code, line, end=None, yields=False):
    return Finding(code, "m", cst.Name("x"), Severity.ERROR, position=Position(line, 0, end or line, 1), yields=yields)


def test_drop_yielding_keeps_a_yielding_finding_only_on_a_line_of_its_own():
    kept = engine.drop_yielding([_f("GL201", 3), _f("GL101", 10, 20), _f("GL901", 3, yields=True),
                                 _f("GL901", 12, yields=True), _f("GL901", 20, yields=True), _f("GL901", 5, yields=True)])
    assert [(f.code, f.position.line) for f in kept] == [("GL201", 3), ("GL101", 10), ("GL901", 12), ("GL901", 5)]


# ------------------------------------------------------------------------------------------
# GL406: the emitted resize against MXNet's (OpenCV's)
# ------------------------------------------------------------------------------------------
_MX_RESIZE = """
import sys
import numpy as np
import mxnet as mx
rng = np.random.default_rng(0)
out = {}
for dt in ("uint8", "float32"):
    for H, W, C in ((7, 9, 3),):
        x = rng.integers(0, 256, (H, W, C)).astype(dt) if dt == "uint8" else (rng.random((H, W, C)) * 255).astype(dt)
        for w, h in ((13, 11), (4, 3), (W // 2, H // 2)):  # enlarged, shrunk (fractional), halved
            for interp in (0, 1, 2):
                key = f"{dt}-{H}-{W}-{C}-{w}-{h}-{interp}"
                out[key + "-in"] = x
                out[key + "-out"] = mx.image.imresize(mx.nd.array(x, dtype=dt), w, h, interp=interp).asnumpy()
np.savez(sys.argv[1], **out)
"""


@pytest.mark.mxnet
@pytest.mark.jax
def test_gluon_imresize_matches_mxnet_in_torch_and_jax(tmp_path):
    import jax.numpy as jnp
    import torch

    from porter.codemods.gluon import _model
    from porter.codemods.jax import _nnx

    script = tmp_path / "resize.py"
    script.write_text(_MX_RESIZE)
    subprocess.run([mxnethelp.mxnet_python(), str(script), str(tmp_path / "mx.npz")], check=True, timeout=300,
                   capture_output=True)
    data = np.load(tmp_path / "mx.npz")
    t_env: dict = {"torch": torch}
    exec(cst.Module(_model.render(["gluon_imresize"], "torch", "torch.nn")).code, t_env)
    j_env: dict = {"jnp": jnp}
    exec(cst.Module(list(_nnx.render("gluon_jax_layers.py.j2", names={"gluon_imresize"}))).code, j_env)
    modes = {"0": "nearest", "1": "bilinear", "2": "bicubic"}
    for key in (k[:-3] for k in data.files if k.endswith("-in")):
        dt, _, _, _, w, h, interp = key.split("-")
        ref = data[key + "-out"].astype(np.float64)
        ports = [t_env["gluon_imresize"](torch.from_numpy(data[key + "-in"]), int(w), int(h), modes[interp])]
        if w == "13":  # the JAX form on one size per mode and dtype (each call compiles)
            ports.append(j_env["gluon_imresize"](jnp.asarray(data[key + "-in"]), int(w), int(h), modes[interp]))
        for y in ports:
            got = np.asarray(y)
            assert got.dtype == np.dtype(dt) and got.shape == ref.shape, key
            diff = np.abs(got.astype(np.float64) - ref).max()
            # nearest exact; uint8: OpenCV's fixed point within 1; float32: its rounding
            limit = 0.0 if interp == "0" else 1.0 if dt == "uint8" else 1e-3
            assert diff <= limit, (key, diff)


def test_a_local_name_shadowing_an_mxnet_import_is_not_mxnet():
    src = textwrap.dedent("""\
        import torch
        from mxnet import init
        from mxnet.gluon.nn import BatchNorm

        def initialize(module, init=None):
            init = init or torch.nn.init.zeros_
            return init(module.weight)

        def block(channels, norm_layer=BatchNorm):
            from mxnet.image.image import _get_interp_method as get_interp
            return norm_layer(channels), get_interp(1)
        """)
    checked = engine.check(src, engine.Options(rules=registry.rules_for("torch")))
    lines = {f.position.line: f.message for f in checked.findings if f.code == "GL901"}
    assert sorted(lines) == [2, 3, 9, 10, 11], lines  # not 5-7: `init` is the function's own
    assert "still used by BatchNorm" in lines[3]


def test_the_f_of_a_hybrid_forward_that_stays_is_mxnet():
    src = textwrap.dedent("""\
        from mxnet import gluon

        class Up(gluon.HybridBlock):
            def hybrid_forward(self, F, x):
                y = F.contrib.BilinearResize2D(x, height=4, width=4)
                return self.resize(F, y)

            def resize(self, F, y):
                return y
        """)
    result = _port(src, "torch")
    lines = {f.position.line: f for f in result.remaining}
    text = result.source.splitlines()
    f_line = next(i for i, t in enumerate(text, 1) if "self.resize(F, y)" in t)
    assert lines[f_line].code == "GL901" and lines[f_line].message.startswith("F (mxnet.ndarray)")
    assert not [f for f in result.remaining if f.code == "GL901" and "resize(self, F" in text[f.position.line - 1]]
