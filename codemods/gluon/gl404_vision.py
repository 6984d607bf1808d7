from __future__ import annotations

from typing import Union

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _model
from . import _script as sc

_VISION = "mxnet.gluon.data.vision."
# Gluon dataset -> (torchvision dataset, Gluon's default root)
_DATASETS = {
    "MNIST": ("MNIST", "~/.mxnet/datasets/mnist"),
    "FashionMNIST": ("FashionMNIST", "~/.mxnet/datasets/fashion-mnist"),
    "CIFAR10": ("CIFAR10", "~/.mxnet/datasets/cifar10"),
    "CIFAR100": ("CIFAR100", "~/.mxnet/datasets/cifar100"),
}
# the datasets' signatures (mxnet 1.9.1), positional order
_SIGNATURE = ("root", "train", "transform")
_SIGNATURES = {"CIFAR100": ("root", "fine_label", "train", "transform")}
# Gluon transform -> torchvision transform (same arguments)
_TRANSFORMS = {
    "ToTensor": "ToTensor",
    "Normalize": "Normalize",
    "Compose": "Compose",
    "RandomFlipLeftRight": "RandomHorizontalFlip",
    "CenterCrop": "CenterCrop",
}


def _dataset(ctx, node) -> str | None:
    name = sc.call_name(ctx, node)
    if name and name.startswith(_VISION) and name[len(_VISION):].split(".")[-1] in _DATASETS:
        short = name[len(_VISION):]
        return short if "." not in short or short.startswith("datasets.") else None
    return None


class GluonVisionData(Rule):
    """
    ## What it does
    Translates Gluon's vision datasets, with the transform applied to their images, into
    torchvision's:

    | Gluon | PyTorch |
    | --- | --- |
    | `gluon.data.vision.MNIST(train=t).transform_first(T)` | `torchvision.datasets.MNIST("~/.mxnet/datasets/mnist", train=t, download=True, transform=T)` |
    | `FashionMNIST`, `CIFAR10`, `CIFAR100` | the torchvision dataset of the same name (CIFAR100: fine labels) |
    | `transforms.ToTensor()`, `Normalize(mean, std)`, `Compose([...])`, `CenterCrop(size)` | the torchvision transform of the same name |
    | `transforms.RandomFlipLeftRight()` | `torchvision.transforms.RandomHorizontalFlip()` |
    | `transforms.Resize(s)` (an int) | `torchvision.transforms.Resize((s, s))` (Gluon resizes to a square, torchvision's int is the shorter side) |

    Gluon downloads a missing dataset, hence `download=True`; the root is Gluon's default
    unless the call names one. `transform_first(T)` applies `T` to the image only, which is
    torchvision's `transform=`; Gluon's `ToTensor` on an HWC uint8 image and torchvision's
    on the PIL image give the same CHW float in [0, 1].

    A dataset used without `transform_first(T)` (as it is, or with `transform(fn)`, or
    bound to a name) becomes `GluonVisionDataset(torchvision.datasets.X(...))`, an emitted
    wrapper that yields what Gluon's dataset yields, the image as an HWC uint8 tensor (a grey
    image with its channel axis) and the label as a NumPy int32, and has Gluon's Dataset API:
    `transform(fn)` calls `fn(image, label)`, `transform_first(fn)` `fn(image)` (GL203
    translates the array methods `fn` calls on the image).

    Reported: `CIFAR100(fine_label=False)`, `transform=` (Gluon's takes `(data, label)`), and
    other transforms.

    ## Why
    The torch-xla and JAX rules (and porter's verifier, which serves these torchvision
    datasets synthetically offline) work on torchvision datasets.

    ## Fix safety
    Safe: the same images and labels, transformed alike.
    """

    code = "GL404"
    name = "gluon-vision-data"
    target = "torch"
    summary = "gluon.data.vision datasets + transform_first(T) and transforms -> torchvision"
    severity = Severity.ERROR
    needs_text = ("vision",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import gluon
            from mxnet.gluon.data.vision import transforms

            transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(0.13, 0.31)])
            train_set = gluon.data.vision.MNIST(train=True).transform_first(transform)
            """,
            """
            from mxnet.gluon.data.vision import transforms
            import torchvision
            import torchvision.transforms

            transform = torchvision.transforms.Compose([torchvision.transforms.ToTensor(), torchvision.transforms.Normalize(0.13, 0.31)])
            train_set = torchvision.datasets.MNIST("~/.mxnet/datasets/mnist", train=True, download=True, transform=transform)
            """,
        ),
        Example(
            """
            from mxnet import gluon

            def scale(data, label):
                return data.astype("float32") / 255, label

            test = gluon.data.vision.CIFAR10("./data", False).transform(scale)
            """,
            """
            import torch
            import torchvision


            class GluonVisionDataset(torch.utils.data.Dataset):
                \"\"\"A torchvision dataset read as Gluon's vision datasets (MNIST, CIFAR10...) are read: each
                sample is the image as an HWC uint8 tensor (a grey image with its channel axis) and the
                label as a NumPy int32. Gluon's Dataset API: transform(fn) gives a dataset of fn(*sample)
                (fn(sample) for a sample that is not a tuple), transform_first(fn) of the sample with
                fn(image) for its image.\"\"\"

                def __init__(self, dataset, fn=None, first=False):
                    self.dataset = dataset  # a torchvision dataset, or (with fn) a GluonVisionDataset
                    self.fn = fn
                    self.first = first

                def __len__(self):
                    return len(self.dataset)

                def __getitem__(self, idx):
                    import numpy

                    sample = self.dataset[idx]
                    if self.fn is None:
                        image, label = sample
                        image = torch.from_numpy(numpy.array(image, dtype=numpy.uint8))
                        return (image[..., None] if image.dim() == 2 else image), numpy.int32(label)
                    if self.first:
                        return (self.fn(sample[0]), *sample[1:])
                    return self.fn(*sample) if isinstance(sample, tuple) else self.fn(sample)

                def transform(self, fn, lazy=True):
                    return GluonVisionDataset(self, fn)

                def transform_first(self, fn, lazy=True):
                    return GluonVisionDataset(self, fn, first=True)


            def scale(data, label):
                return data.astype("float32") / 255, label

            test = GluonVisionDataset(torchvision.datasets.CIFAR10("./data", train=False, download=True)).transform(scale)
            """,
            title="without transform_first: Gluon's samples and Dataset API",
        ),
    ]
    valid = ["import torchvision\nds = torchvision.datasets.MNIST('data', download=True)\n"]

    def visit_Call(self, node: cst.Call) -> None:
        name = sc.call_name(self.ctx, node)
        if name and name.startswith(_VISION + "transforms."):
            self._transform(node, name[len(_VISION + "transforms."):])
            return
        if _dataset(self.ctx, node) is not None:
            parent = self.ctx.parent
            grand = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
            if not (isinstance(parent, cst.Attribute) and parent.attr.value == "transform_first" and isinstance(grand, cst.Call)):
                self._raw_dataset(node)
            return
        if astutil.method_name(node) == "transform_first" and _dataset(self.ctx, node.func.value) is not None:
            self._dataset_with_transform(node)

    def _torchvision(self, ds_call: cst.Call) -> Union[str, cst.Call]:
        """The torchvision dataset (root, train=, download=True) for the Gluon dataset
        ``ds_call``, or why there is none."""
        short = _dataset(self.ctx, ds_call).split(".")[-1]
        torch_name, root_default = _DATASETS[short]
        bound = _model.bind(ds_call, _SIGNATURES.get(short, _SIGNATURE))
        if bound.unknown or "transform" in bound.args:
            return (f"{sc.code(ds_call.func)} with arguments porter does not translate (transform= takes (data, label) "
                    "in Gluon): write the torchvision dataset by hand")
        fine = bound.args.get("fine_label")
        if short == "CIFAR100" and (fine is None or sc.code(fine) != "True"):
            return "CIFAR100 with coarse labels (Gluon's default): torchvision's CIFAR100 has fine labels only"
        root = bound.args.get("root")
        args = [cst.Arg(root if root is not None else cst.SimpleString(f'"{root_default}"'))]
        if "train" in bound.args:
            args.append(sc.kwarg("train", bound.args["train"]))
        args.append(sc.kwarg("download", cst.Name("True")))
        return cst.Call(sc.expr(f"{self.ctx.module_alias('torchvision')}.datasets.{torch_name}"), args)

    def _raw_dataset(self, node: cst.Call) -> None:
        """A dataset read as Gluon yields it (HWC uint8 images, NumPy int32 labels), with the
        Dataset API's transform(fn) / transform_first(fn): the emitted GluonVisionDataset."""
        tv_call = self._torchvision(node)
        if isinstance(tv_call, str):
            self.report(node, tv_call)
            return
        edit, _ = _model.helpers_edit(self.ctx, ["GluonVisionDataset"])  # it needs torch alone
        self.report(node, f"{sc.code(node.func)}(...) -> GluonVisionDataset({sc.code(tv_call.func)}(...)): Gluon's "
                    "samples (HWC uint8 images, int32 labels) and its Dataset API",
                    Fix((self.replace(node, lambda u: cst.Call(cst.Name("GluonVisionDataset"), [
                        cst.Arg(self._torchvision(u))])), edit), imports=("torch", "torchvision")))

    def _dataset_with_transform(self, node: cst.Call) -> None:
        tv_call = self._torchvision(node.func.value)
        if isinstance(tv_call, str):
            self.report(node, tv_call)
            return
        if len(node.args) != 1 or node.args[0].keyword is not None:
            self.report(node, "transform_first(fn, lazy=...): translate by hand")
            return
        torch_name = sc.code(tv_call.func).split(".")[-1]

        def build(u: cst.Call) -> cst.Call:
            made = self._torchvision(u.func.value)
            return made.with_changes(args=[*made.args, sc.kwarg("transform", u.args[0].value)])

        self.report(node, f"{sc.code(node.func.value.func)}(...).transform_first(T) -> torchvision.datasets.{torch_name}(..., transform=T)",
                    Fix((self.replace(node, build),), imports=("torchvision",)))

    def _transform(self, node: cst.Call, short: str) -> None:
        tvt = self.ctx.module_alias("torchvision.transforms")
        if short == "Resize":
            size = astutil.arg(node, "size", 0)
            if len(node.args) != 1 or size is None or not isinstance(size.value, (cst.Integer, cst.Name, cst.Attribute)):
                self.report(node, "transforms.Resize with keep_ratio/interpolation or a tuple: translate by hand")
                return

            def build_resize(u: cst.Call) -> cst.Call:
                s = u.args[0].value
                return cst.Call(sc.expr(f"{tvt}.Resize"), [cst.Arg(cst.Tuple([cst.Element(s), cst.Element(s)]))])

            self.report(node, "transforms.Resize(s) -> torchvision.transforms.Resize((s, s))",
                        Fix((self.replace(node, build_resize),), imports=("torchvision.transforms",)))
            return
        if short not in _TRANSFORMS:
            self.report(node, f"transforms.{short}: no torchvision translation in porter; write it by hand")
            return
        self.report(node, f"transforms.{short} -> torchvision.transforms.{_TRANSFORMS[short]}",
                    Fix((self.replace(node, lambda u: u.with_changes(func=sc.expr(f"{tvt}.{_TRANSFORMS[short]}"))),),
                        imports=("torchvision.transforms",)))
