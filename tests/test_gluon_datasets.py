"""Gluon scripts that read gluon.data.vision datasets as Gluon yields them (HWC uint8 NDArrays,
int32 labels) and work on them with NDArray methods: the class of MXNet's own examples (an MNIST
MLP whose dataset's transform(fn) flattens and scales each image, a DCGAN's transform with
mx.nd.transpose and astype, accuracy as (argmax == label).mean()).

Before GL203 and GL404's GluonVisionDataset, such a port kept `data.astype(np.float32)`,
`x.flatten()`, `x.sum(axis=1, keepdims=True)`, `x.size` and a boolean `(a == b).mean()` with no
finding, and GL404 refused the dataset ("without transform_first"). Three scripts of this repo
(tests/data/gluon_datasets: a function given to transform(), a lambda given to transform() with
the batch read as a list, a dataset bound to a name and given transform_first(fn) of its own)
port with nothing left, their ports run on torch_xla (PJRT_DEVICE=CPU) in default mode, and
their losses match the originals' in real MXNet 1.9.1 step by step; the MXNet side's vision
datasets read the synthetic samples the port's torchvision datasets read
(porter.verify.datasets.gluon_vision_arrays)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

from lanes import fixture_slice
from porter import engine, registry
from porter.verify.datasets import gluon_vision_arrays

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "gluon_datasets"
SCRIPTS = ("bound_dataset.py", "mlp_transform.py", "cnn_transform_lambda.py")


def _port(text: str, target: str = "torch-xla") -> str:
    result = engine.fix(text, engine.Options(registry.select(target)))
    return result.source if result.changed else text


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    out = tmp_path_factory.mktemp("ported")
    subprocess.run([sys.executable, "-m", "porter", "migrate", str(DATA), "--to", "torch-xla", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_ports_keep_no_mxnet_and_no_ndarray_method(ports, name):
    text = (ports / name).read_text()
    cst.parse_module(text)
    assert "import mxnet" not in text and "from mxnet" not in text
    own = text.split("parser = argparse.ArgumentParser()")[1]  # the script's code (the helpers come before)
    for left in (".astype(\"float32\")", ".astype(np.float32)", "porter: manual", ".flatten()",
                 "as_in_context", "transpose((2, 0, 1))"):
        assert left not in own, (name, left)
    assert "GluonVisionDataset(torchvision.datasets." in text


def test_each_spelling_ports_as_gluon_reads_it(ports):
    bound = (ports / "bound_dataset.py").read_text()
    assert "return torch.permute(image, (2, 0, 1)).to(torch.float32) / 255" in bound
    assert "train_set = train_set.transform_first(to_chw)" in bound
    assert "(torch.argmax(scores, dim=1).to(scores.dtype) == labels.to(torch.float32)).float().mean()" in bound
    mlp = (ports / "mlp_transform.py").read_text()
    assert "data = data.reshape((-1,)).to(torch.float32) / 255" in mlp
    lam = (ports / "cnn_transform_lambda.py").read_text()
    assert "lambda img, lbl: (torch.permute(img.to(torch.float32), (2, 0, 1)) / 128.0 - 1, lbl)" in lam
    assert "return self.out(torch.flatten(x, 1))" in lam
    # the lazy layers take their shapes on the CPU before the move, at module level too (GL307)
    for text in (bound, mlp, lam):
        assert "Gluon's deferred shapes" in text


def test_receivers_the_code_does_not_show_to_be_arrays_are_left():
    source = textwrap.dedent("""
        import numpy as np
        import mxnet as mx
        from mxnet import nd

        def scale(values):
            return values.astype('float32').flatten()

        table = np.zeros((3, 4)).astype('float32')
        rows = table.sum(axis=1, keepdims=True)
        host = nd.ones((2, 3)).asnumpy()
        host = host.astype('float64').transpose((1, 0))
        marked = scale(host).expand_dims(axis=0)
        """)
    out = _port(source, "torch")
    assert "return values.astype('float32').flatten()" in out
    assert "table = np.zeros((3, 4)).astype('float32')" in out
    assert "rows = table.sum(axis=1, keepdims=True)" in out
    assert "host = host.astype('float64').transpose((1, 0))" in out
    # a method only MXNet arrays have: translated whatever the receiver
    assert "marked = torch.unsqueeze(scale(host), 0)" in out


def test_second_run_is_a_fixpoint(ports):
    for name in SCRIPTS:
        text = (ports / name).read_text()
        assert _port(text) == text


def test_gluon_vision_arrays_are_the_torchvision_stand_ins_samples():
    """The MXNet side's MNIST/CIFAR10 data is the port's torchvision stand-in's, in Gluon's layout."""
    from porter.verify import datasets

    datasets.install(64, seed=3)
    try:
        import torchvision

        mnist = torchvision.datasets.MNIST("unused", train=True, download=True)
        cifar = torchvision.datasets.CIFAR10("unused", train=False, download=True)
        images, labels = gluon_vision_arrays("MNIST", True, 64, 3)
        assert images.shape == (64, 28, 28, 1) and images.dtype == np.uint8 and labels.dtype == np.int32
        np.testing.assert_array_equal(images[..., 0], mnist.data.numpy())
        np.testing.assert_array_equal(labels, mnist.targets.numpy())
        images, labels = gluon_vision_arrays("CIFAR10", False, 64, 3)
        np.testing.assert_array_equal(images, cifar.data)
        np.testing.assert_array_equal(labels, np.asarray(cifar.targets))
    finally:
        datasets.uninstall()


@pytest.mark.parametrize("name", fixture_slice(SCRIPTS, 3))
def test_port_trains_on_xla_with_the_originals_losses(ports, name, mxnet_python):
    """porter verify --script: the original in real MXNet 1.9.1, the default-mode port on
    torch_xla; 3 steps, losses equal within float32 rounding, XLA executions every step."""
    env = {**os.environ, "PORTER_MXNET_PYTHON": mxnet_python}
    result = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(DATA / name), str(ports / name),
                             "--steps", "3", "--format", "json"], capture_output=True, text=True, env=env, timeout=600)
    import json

    report = json.loads(result.stdout)
    assert report["status"] == "passed", (report.get("summary"), result.stderr[-2000:])
    assert len(report["steps"]) == 3


JAX_SCRIPTS = fixture_slice(SCRIPTS, 3)  # a Gluon script's JAX port takes 20-30 s on 2 cores


@pytest.fixture(scope="module")
def jax_ports(tmp_path_factory):
    source, out = tmp_path_factory.mktemp("jax-originals"), tmp_path_factory.mktemp("ported-jax")
    for name in {"bound_dataset.py", *JAX_SCRIPTS}:
        (source / name).write_text((DATA / name).read_text())
    subprocess.run([sys.executable, "-m", "porter", "migrate", str(source), "--to", "jax", "--unsafe-fixes", "--out",
                    str(out)], check=True, capture_output=True, text=True)
    return out


def test_jax_ports_keep_the_input_pipeline_torch(jax_ports):
    """The function a dataset is given stays torch code (the input pipeline is torch's
    DataLoader), also where the dataset is bound first and transformed in a later assignment;
    the batch read on the host after the step is NumPy, its torch methods translated."""
    bound = (jax_ports / "bound_dataset.py").read_text()
    assert "return torch.permute(image, (2, 0, 1)).to(torch.float32) / 255" in bound
    assert "labels.astype(jnp.float32)" in bound and "labels.to(torch.float32)" not in bound
    assert "images, labels = images.numpy(), labels.numpy()" in bound or "images = images.numpy()" in bound


@pytest.mark.parametrize("name", JAX_SCRIPTS)
def test_jax_port_trains_with_the_originals_losses(jax_ports, name, mxnet_python):
    env = {**os.environ, "PORTER_MXNET_PYTHON": mxnet_python}
    result = subprocess.run([sys.executable, "-m", "porter", "verify", "--script", str(DATA / name),
                             str(jax_ports / name), "--steps", "3", "--format", "json"],
                            capture_output=True, text=True, env=env, timeout=600)
    import json

    report = json.loads(result.stdout)
    assert report["status"] == "passed", (report.get("summary"), result.stderr[-2000:])
