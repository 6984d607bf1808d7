"""GL201 on MXNet operators outside its table: every spelling of an `mx.nd` / `mx.np` /
`mx.sym` operator porter does not translate gets a finding at its line and a `# porter: manual`
mark (a port never keeps an MXNet call silently), while the calls other rules translate (array
factories, random numbers, waitall) are left to them. `nd.SoftmaxActivation` itself is in the
table (checked against MXNet in tests/test_gluon_ops.py with the table's other entries)."""
from __future__ import annotations

import pytest

from porter import engine, registry

TORCH = engine.Options(registry.select("torch"))


def _gl201_lines(source: str) -> list[int]:
    return sorted(f.position.line for f in engine.check(source, TORCH).findings if f.code == "GL201")


@pytest.mark.parametrize("source", [
    "import mxnet as mx\ny = mx.nd.topk(x, k=3)\n",
    "from mxnet import nd\ny = nd.L2Normalization(x)\n",
    "from mxnet import ndarray\ny = ndarray.smooth_l1(x, scalar=1.0)\n",
    "import mxnet.ndarray as F2\ny = F2.LRN(x)\n",
    "import mxnet as mx\ny = mx.np.some_unported_op(x)\n",
    "import mxnet as mx\ny = mx.sym.ROIPooling(x, rois, (7, 7), 1.0)\n",
    "from mxnet import nd\ny = nd.contrib.box_nms(x)\n",
    "import mxnet as mx\ny = mx.nd.linalg.gemm2(a, b)\n",
    "from mxnet.ndarray import contrib\ny = contrib.box_iou(a, b)\n",
])
def test_unported_operator_is_reported_at_its_line(source):
    assert _gl201_lines(source) == [2]
    out = engine.fix(source, TORCH).source
    assert out.splitlines()[1].endswith("# porter: manual"), out


def test_each_unported_call_of_a_script_is_reported():
    source = (
        "import mxnet as mx\n"
        "from mxnet import nd\n"
        "\n"
        "def step(outputs, label):\n"
        "    probs = [nd.SoftmaxActivation(o) for o in outputs]\n"  # in the table: translated
        "    top = nd.topk(probs[0], k=2)\n"
        "    return mx.nd.argsort(top), nd.relu(top)\n"  # argsort reported, relu translated
    )
    assert _gl201_lines(source) == [5, 6, 7, 7]  # the translated ones are findings with fixes
    result = engine.fix(source, TORCH)
    lines = result.source.splitlines()
    assert "    probs = [torch.softmax(o, dim=-1) for o in outputs]" in lines
    assert "    top = nd.topk(probs[0], k=2)  # porter: manual" in lines
    assert "    return mx.nd.argsort(top), torch.relu(top)  # porter: manual" in lines
    assert len([f for f in result.remaining if f.code == "GL201"]) == 2


@pytest.mark.parametrize("source", [
    "import mxnet as mx\nx = mx.nd.zeros((2, 3))\n",
    "import mxnet as mx\nx = mx.nd.array([1, 2])\n",
    "from mxnet import nd\nx = nd.random.normal(0, 1, shape=(2,))\n",
    "from mxnet import nd\nx = nd.random_uniform(0, 1, shape=(2,))\n",
    "import mxnet as mx\nmx.nd.waitall()\n",
    "import mxnet as mx\nok = isinstance(x, mx.nd.NDArray)\n",
])
def test_calls_other_rules_translate_are_not_reported_by_gl201(source):
    assert _gl201_lines(source) == []


def test_softmax_activation_modes():
    source = ("from mxnet import nd\n"
              "a = nd.SoftmaxActivation(x)\n"
              "b = nd.SoftmaxActivation(x, mode='channel')\n"
              "c = nd.SoftmaxActivation(data=x, mode=m)\n")
    out = engine.fix(source, TORCH).source.splitlines()
    assert "a = torch.softmax(x, dim=-1)" in out and "b = torch.softmax(x, dim=1)" in out
    assert "c = nd.SoftmaxActivation(data=x, mode=m)  # porter: manual" in out  # a mode computed at run time
