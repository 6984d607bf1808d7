from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

_VISION = "mxnet.gluon.data.vision."
# Gluon dataset -> (torchvision dataset, Gluon's default root)
_DATASETS = {
    "MNIST": ("MNIST", "~/.mxnet/datasets/mnist"),
    "FashionMNIST": ("FashionMNIST", "~/.mxnet/datasets/fashion-mnist"),
    "CIFAR10": ("CIFAR10", "~/.mxnet/datasets/cifar10"),
    "CIFAR100": ("CIFAR100", "~/.mxnet/datasets/cifar100"),
}
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

    Reported: a dataset used without `transform_first` (Gluon yields HWC uint8 arrays,
    torchvision PIL images: the port has to say which it wants), `CIFAR100(fine_label=False)`,
    `transform=` (Gluon's takes `(data, label)`), and other transforms.

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

            raw = gluon.data.vision.CIFAR10(train=False)
            """,
            None,
            title="without transform_first: reported",
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
                self.report(node, f"{sc.code(node.func)} without transform_first: Gluon yields HWC uint8 arrays, "
                            "torchvision PIL images; write the torchvision dataset with the transform you need")
            return
        if astutil.method_name(node) == "transform_first" and _dataset(self.ctx, node.func.value) is not None:
            self._dataset_with_transform(node)

    def _dataset_with_transform(self, node: cst.Call) -> None:
        ds_call = node.func.value
        short = _dataset(self.ctx, ds_call).split(".")[-1]
        torch_name, root_default = _DATASETS[short]
        for a in ds_call.args:
            if a.keyword is None or a.keyword.value not in ("root", "train", "fine_label"):
                self.report(node, f"{sc.code(ds_call.func)} with arguments porter does not translate: write the torchvision dataset by hand")
                return
        fine = astutil.arg(ds_call, "fine_label")
        if short == "CIFAR100" and (fine is None or sc.code(fine.value) != "True"):
            self.report(node, "CIFAR100 with coarse labels (Gluon's default): torchvision's CIFAR100 has fine labels only")
            return
        if len(node.args) != 1 or node.args[0].keyword is not None:
            self.report(node, "transform_first(fn, lazy=...): translate by hand")
            return
        tv = self.ctx.module_alias("torchvision")

        def build(u: cst.Call) -> cst.Call:
            ds = u.func.value
            root = astutil.arg(ds, "root")
            train = astutil.arg(ds, "train")
            args = [cst.Arg(root.value if root is not None else cst.SimpleString(f'"{root_default}"'))]
            if train is not None:
                args.append(sc.kwarg("train", train.value))
            args.append(sc.kwarg("download", cst.Name("True")))
            args.append(sc.kwarg("transform", u.args[0].value))
            return cst.Call(sc.expr(f"{tv}.datasets.{torch_name}"), args)

        self.report(node, f"{sc.code(ds_call.func)}(...).transform_first(T) -> torchvision.datasets.{torch_name}(..., transform=T)",
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
