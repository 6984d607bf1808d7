"""`porter zoo --image-size N`: which image each model is verified at (porter.zoo.discover's
smaller-image policy), on models of our own that take any size, only their own size, need more
pixels than N, or compute their widths with tensors in the constructor (not on the meta
device), and on real torchvision builders. Eager torch only (no XLA): the fast lane."""
from __future__ import annotations

import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from porter.zoo import discover  # noqa: E402

MODELS = '''
import torch
from torch import nn


class AnySize(nn.Module):  # global pooling: any image of 8+ pixels
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.body(x), 1), 1))


class OwnSizeOnly(nn.Module):  # a fixed patch grid, as a ViT's
    def __init__(self, image_size=96):
        super().__init__()
        self.image_size = image_size
        self.proj = nn.Conv2d(3, 4, 16, stride=16)

    def forward(self, x):
        torch._assert(x.shape[-1] == self.image_size, f"expected {self.image_size} pixels")
        return self.proj(x).flatten(1)


class NeedsPixels(nn.Module):  # unpadded convolutions: 100+ pixels
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(*[nn.Conv2d(3 if i == 0 else 4, 4, 7, stride=2) for i in range(4)])

    def forward(self, x):
        return self.convs(x).mean((2, 3))


class TensorWidths(nn.Module):  # the constructor reads tensor values: cannot be built on meta
    def __init__(self):
        super().__init__()
        width = int(torch.tensor([2.0, 3.0]).prod().item())
        self.conv = nn.Conv2d(3, width, 3, padding=1)

    def forward(self, x):
        return self.conv(x).amax((2, 3))


def aux_in_training():  # a factory; an auxiliary head that only runs in training needs 64+
    class Aux(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = AnySize()
            self.aux = nn.Conv2d(3, 2, 5, stride=8)

        def forward(self, x):
            out = self.main(x)
            if self.training:
                a = self.aux(x)
                return out, nn.functional.conv2d(a, torch.ones(2, 2, 5, 5)).flatten(1)
            return out
    return Aux()
'''


@pytest.fixture(scope="module")
def zoo_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgzoo")
    (root / "imgzoo_models.py").write_text(textwrap.dedent(MODELS))
    sys.path.insert(0, str(root))
    yield "imgzoo_models"
    sys.path.remove(str(root))
    sys.modules.pop("imgzoo_models", None)


def entry(module, expr, spec):
    return {"name": expr, "module": module, "expr": expr, "framework": "torch", "inputs": [spec]}


@pytest.mark.parametrize("expr, own, size, used", [
    ("AnySize()", 224, 32, 32),  # the smallest asked for
    ("AnySize()", 224, 64, 64),
    ("OwnSizeOnly()", 96, 32, None),  # 32, 64 fail: its own 96
    ("OwnSizeOnly(image_size=64)", 224, 32, 64),  # 64 is its size, below the metadata's
    ("NeedsPixels()", 224, 32, 128),  # 32, 64 too small: 128
    ("TensorWidths()", 224, 16, 16),  # its parameters put on the meta device as registered
    ("aux_in_training()", 299, 16, 64),  # the training-mode forward decides
])
def test_smallest_image_the_model_runs_on(zoo_models, expr, own, size, used):
    e = entry(zoo_models, expr, f"float32[2,3,{own},{own}]")
    discover._smaller_image(e, size)
    if used is None:
        assert e["inputs"] == [f"float32[2,3,{own},{own}]"] and "image_size" not in e
    else:
        assert e["inputs"] == [f"float32[2,3,{used},{used}]"]
        assert e["image_size"] == {"own": own, "used": used}


def test_a_constructor_that_computes_with_tensors_gets_meta_weights(zoo_models):
    model = discover._built_for_probe(entry(zoo_models, "TensorWidths()", "float32[2,3,32,32]"))
    assert model.conv.out_channels == 6 and model.conv.weight.device.type == "meta"
    assert torch.nn.Module.register_parameter.__name__ == "register_parameter"  # restored


@pytest.mark.parametrize("spec", [
    "float32[2,16]",  # not an image
    "float32[2,3,32,48]",  # not square: kept as given
    "float32[2,3,32,32]",  # already no larger than N
])
def test_other_inputs_are_kept(zoo_models, spec):
    e = entry(zoo_models, "AnySize()", spec)
    discover._smaller_image(e, 32)
    assert e["inputs"] == [spec] and "image_size" not in e


def test_two_inputs_and_mxnet_models_are_kept(zoo_models):
    e = dict(entry(zoo_models, "AnySize()", "float32[2,3,224,224]"), framework="mxnet")
    discover._smaller_image(e, 64)
    assert e["inputs"] == ["float32[2,3,224,224]"]
    e = entry(zoo_models, "AnySize()", "float32[2,3,224,224]")
    e["inputs"].append("float32[2,3,224,224]")
    discover._smaller_image(e, 64)
    assert e["inputs"] == ["float32[2,3,224,224]"] * 2


@pytest.mark.slow  # torchvision's builders (regnet's built for real): about a minute under load
def test_discovery_request_applies_it_to_torchvision(tmp_path):
    pytest.importorskip("torchvision")
    out = tmp_path / "found.json"
    found = discover.discover({"package": "torchvision.models", "models": [], "inputs": [], "out": str(out),
                               "select": ["resnet18", "inception_v3", "vit_b_32", "regnet_x_400mf"],
                               "image_size": 64})
    by = {m["name"]: m["inputs"] for m in found["models"]}
    assert by == {"resnet18": ["float32[2,3,64,64]"],  # global pooling
                  "regnet_x_400mf": ["float32[2,3,64,64]"],  # widths computed with tensors
                  "inception_v3": ["float32[2,3,299,299]"],  # its auxiliary head needs the full size in training
                  "vit_b_32": ["float32[2,3,224,224]"]}  # a fixed patch grid
    again = discover.discover({"package": "torchvision.models", "models": [], "inputs": ["float32[2,3,32,32]"],
                               "out": str(out), "select": ["resnet18"], "image_size": 64})
    assert again["models"][0]["inputs"] == ["float32[2,3,32,32]"]  # --input wins
