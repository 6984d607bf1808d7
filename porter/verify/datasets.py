"""Offline stand-ins for torchvision's file-backed datasets, for traced script runs.

A training script verified with ``porter verify --script`` runs unmodified; when it builds
``torchvision.datasets.MNIST(root, download=True, transform=...)`` it would read files under
``root`` or download them. Under the trace harness (``install()``), these classes are
replaced, as soon as ``torchvision.datasets`` is imported, by subclasses that make
deterministic synthetic data of the same form instead:

==================================  ==========================================================
MNIST, FashionMNIST, KMNIST, EMNIST  ``data`` uint8 tensor [N, 28, 28], ``targets`` int64 tensor;
                                    items are PIL 'L' 28x28 images (EMNIST letters: labels 1-26)
CIFAR10, CIFAR100                   ``data`` uint8 array [N, 32, 32, 3], ``targets`` list of int;
                                    PIL 'RGB' 32x32
SVHN                                ``data`` uint8 array [N, 3, 32, 32], ``labels`` int64 array
STL10                               ``data`` uint8 array [N, 3, 96, 96], ``labels`` (unlabeled: -1)
ImageFolder, ImageNet               ``samples``/``targets``/``classes``; PIL 'RGB' images of
                                    ``image_size`` (default 224x224) from a synthetic loader
DatasetFolder                       as ImageFolder when its loader is torchvision's image
                                    loader; with a loader of the script's own, the real class
                                    (reading local files) if ``root`` exists, else an error
==================================  ==========================================================

Items go through the real class's ``__getitem__`` (the substitutes only replace the
constructor), so the script's transforms see exactly what the real dataset gives. The real
class names, ``classes``, label ranges, ``train``/``split`` and ``root`` are kept; ``root`` need
not exist and ``download=True`` does nothing. Torchvision's download helpers
(``download_url``, ``download_and_extract_archive``, Google Drive) raise a clear error instead
of reaching the network, for every other dataset.

Each dataset has N samples (``size``; default 256 per requested optimizer step, so that
K steps of batches up to 256 fit in one epoch), drawn from a numpy generator seeded by
(seed, class name, split): both sides of a verification get identical data, and drawing it
consumes nothing from torch's or numpy's global random streams. Each class has a fixed random
prototype image and a sample is that prototype blended with noise, so a model can learn.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import zlib
from typing import Any, Callable, Optional

import numpy as np

__all__ = ["install", "uninstall", "notes", "DEFAULT_PER_STEP", "DEFAULT_SIZE"]

DEFAULT_PER_STEP = 256  # samples per requested optimizer step
DEFAULT_SIZE = 2048  # when no step count is known
DEFAULT_IMAGE_SIZE = (224, 224)  # ImageFolder / ImageNet images, (height, width)

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


class _Settings:
    size: Optional[int] = None
    seed: int = 0
    image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE
    announce: bool = True


_settings = _Settings()
_notes: list[str] = []
_finder: Optional["_PatchOnImport"] = None
_patched: dict[tuple[Any, str], Any] = {}  # (module, attribute) -> the original value


def notes() -> list[str]:
    """What was substituted in this process, one line each, in order."""
    return list(_notes)


def _note(text: str) -> None:
    if text in _notes:
        return
    _notes.append(text)
    if _settings.announce:
        # straight to the real stderr: the trace harness counts the script's own output
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"porter: {text}\n")
        stream.flush()


def default_size(steps: Optional[int]) -> int:
    """Samples per synthetic dataset when none is asked for: DEFAULT_PER_STEP per optimizer step
    of the run (both sides of a verification read the same), DEFAULT_SIZE when no step count."""
    return steps * DEFAULT_PER_STEP if steps else DEFAULT_SIZE


def _size() -> int:
    return _settings.size if _settings.size is not None else DEFAULT_SIZE


def _rng(name: str, split: str) -> np.random.Generator:
    return np.random.default_rng([_settings.seed, zlib.crc32(name.encode()), zlib.crc32(split.encode())])


def _images(name: str, split: str, n: int, shape: tuple[int, ...], n_classes: int, label_offset: int = 0,
            unlabeled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """N uint8 images of SHAPE and their int64 labels in [offset, offset + n_classes) (or -1
    when unlabeled): each class's fixed prototype blended with per-sample noise."""
    rng = _rng(name, split)
    prototypes = rng.integers(0, 256, size=(max(n_classes, 1), *shape), dtype=np.uint8)
    labels = rng.integers(0, max(n_classes, 1), size=n, dtype=np.int64)
    noise = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    images = ((prototypes[labels].astype(np.uint16) * 3 + noise) // 4).astype(np.uint8)
    if unlabeled:
        return images, np.full(n, -1, dtype=np.int64)
    return images, labels + label_offset


# Gluon's vision datasets (mxnet.gluon.data.vision) -> (the torchvision class whose synthetic
# data they get, image shape, classes)
GLUON_VISION = {"MNIST": ("MNIST", (28, 28), 10), "FashionMNIST": ("FashionMNIST", (28, 28), 10),
                "CIFAR10": ("CIFAR10", (32, 32, 3), 10), "CIFAR100": ("CIFAR100", (32, 32, 3), 100)}


def gluon_vision_arrays(name: str, train: bool, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The data of Gluon's vision dataset NAME (MNIST, FashionMNIST, CIFAR10, CIFAR100 with fine
    labels) under an MXNet original's trace: the synthetic samples the torchvision dataset of
    the same name gets on the port's side (same seed, split and size), in Gluon's layout:
    HWC uint8 images and int32 labels. NumPy only (the MXNet venv has no torch)."""
    torch_name, shape, classes = GLUON_VISION[name]
    images, labels = _images(torch_name, f"train={train}", size, shape, classes)
    if images.ndim == 3:
        images = images[..., None]
    return images, labels.astype(np.int32)


def _describe(cls_name: str, split: str, n: int, what: str) -> None:
    _note(f"torchvision.datasets.{cls_name}({split}) replaced by {n} synthetic samples ({what}); "
          "nothing read or downloaded")


def _vision_init(self: Any, root: Any, transform: Any, target_transform: Any, transforms: Any = None) -> None:
    from torchvision.datasets.vision import VisionDataset

    VisionDataset.__init__(self, root, transforms=transforms, transform=transform, target_transform=target_transform)


# --- the substitutes: the real classes, constructed from synthetic data ----------------------


def _mnist_family(real: type) -> type:
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False, **kwargs):
        split = kwargs.pop("split", None)
        if kwargs:
            raise TypeError(f"{real.__name__}() got unexpected keyword arguments {sorted(kwargs)}")
        _vision_init(self, root, transform, target_transform)
        self.train = train
        offset = 0
        if real.__name__ == "EMNIST" or split is not None:
            if split not in real.splits:
                raise ValueError(f"Unknown value '{split}' for argument split. Valid values are {real.splits}.")
            self.split = split
            self.classes = list(real.classes_split_dict[split])
            if split == "letters":  # real EMNIST letters: labels 1..26, classes[0] is 'N/A'
                offset = 1
        n_classes = len(self.classes) - offset
        part = f"train={train}" + (f", split={split!r}" if split is not None else "")
        n = _size()
        images, labels = _images(real.__name__, part, n, (28, 28), n_classes, offset)
        import torch

        self.data = torch.from_numpy(images)
        self.targets = torch.from_numpy(labels)
        _describe(real.__name__, part, n, f"PIL 'L' 28x28, labels {offset}-{offset + n_classes - 1}")

    return type(real.__name__, (real,), {"__init__": __init__, "__module__": real.__module__,
                                         "__doc__": f"Synthetic stand-in for {real.__name__} (porter verify)."})


def _cifar(real: type, classes: list[str]) -> type:
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        _vision_init(self, root, transform, target_transform)
        self.train = train
        n = _size()
        images, labels = _images(real.__name__, f"train={train}", n, (32, 32, 3), len(classes))
        self.data = images
        self.targets = labels.tolist()
        self.classes = list(classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        _describe(real.__name__, f"train={train}", n, f"PIL 'RGB' 32x32, labels 0-{len(classes) - 1}")

    return type(real.__name__, (real,), {"__init__": __init__, "__module__": real.__module__,
                                         "__doc__": f"Synthetic stand-in for {real.__name__} (porter verify)."})


def _svhn(real: type) -> type:
    def __init__(self, root, split="train", transform=None, target_transform=None, download=False):
        if split not in real.split_list:
            raise ValueError(f"Unknown value '{split}' for argument split. Valid values are {tuple(real.split_list)}.")
        _vision_init(self, root, transform, target_transform)
        self.split = split
        n = _size()
        self.data, self.labels = _images("SVHN", split, n, (3, 32, 32), 10)
        _describe("SVHN", f"split={split!r}", n, "PIL 'RGB' 32x32, labels 0-9")

    return type("SVHN", (real,), {"__init__": __init__, "__module__": real.__module__,
                                  "__doc__": "Synthetic stand-in for SVHN (porter verify)."})


def _fake_data(real: type) -> type:
    """FakeData with the same samples, drawn from a generator of its own: torchvision's
    ``__getitem__`` seeds the global generator with the index and restores its state after,
    which races with the script's own draws when a loader thread reads the dataset (a port's
    MpDeviceLoader does): the script's noise then differs run to run."""
    import torch
    from torchvision import transforms

    def __getitem__(self, index):
        if index >= len(self):
            raise IndexError(f"{self.__class__.__name__} index out of range")
        generator = torch.Generator().manual_seed(index + self.random_offset)
        img = torch.randn(*self.image_size, generator=generator)
        target = torch.randint(0, self.num_classes, size=(1,), dtype=torch.long, generator=generator)[0]
        img = transforms.ToPILImage()(img)
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target.item()

    return type("FakeData", (real,), {"__getitem__": __getitem__, "__module__": real.__module__,
                                      "__doc__": real.__doc__})


def _stl10(real: type) -> type:
    def __init__(self, root, split="train", folds=None, transform=None, target_transform=None, download=False):
        if split not in real.splits:
            raise ValueError(f"Unknown value '{split}' for argument split. Valid values are {real.splits}.")
        _vision_init(self, root, transform, target_transform)
        self.split = split
        self.folds = folds
        n = _size()
        self.data, self.labels = _images("STL10", split, n, (3, 96, 96), 10, unlabeled=split == "unlabeled")
        if split == "train+unlabeled":
            self.labels[n // 2:] = -1
        self.classes = list(STL10_CLASSES)
        labels = {"unlabeled": "no labels (-1)", "train+unlabeled": "labels 0-9, the second half -1 (unlabeled)"}
        _describe("STL10", f"split={split!r}", n, "PIL 'RGB' 96x96, " + labels.get(split, "labels 0-9"))

    return type("STL10", (real,), {"__init__": __init__, "__module__": real.__module__,
                                   "__doc__": "Synthetic stand-in for STL10 (porter verify)."})


class _ImageLoader:
    """Loads a synthetic sample's 'path' (``<root>/<class>/porter_synthetic_<dataset>_<index>.png``)
    as a deterministic PIL 'RGB' image: the class prototype blended with the sample's noise."""

    def __init__(self, name: str, split: str, n_classes: int, size: tuple[int, int]) -> None:
        self.name, self.split, self.n_classes, self.size = name, split, n_classes, size

    def __call__(self, path: str) -> Any:
        from PIL import Image

        target, index = (int(x) for x in os.path.splitext(os.path.basename(path))[0].split("_")[-2:])
        h, w = self.size
        proto = _rng(self.name, f"{self.split}/class{target}").integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        noise = _rng(self.name, f"{self.split}/sample{index}").integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        return Image.fromarray(((proto.astype(np.uint16) * 3 + noise) // 4).astype(np.uint8), mode="RGB")


def _folder_samples(self: Any, name: str, split: str, classes: list[str]) -> None:
    n = _size()
    labels = _rng(name, split).integers(0, len(classes), size=n, dtype=np.int64).tolist()
    root = str(self.root)
    self.classes = list(classes)
    self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
    self.samples = [(os.path.join(root, classes[t], f"porter_synthetic_{t}_{i}.png"), t) for i, t in enumerate(labels)]
    self.targets = labels
    self.imgs = self.samples
    self.loader = _ImageLoader(name, split, len(classes), _settings.image_size)


def _class_names(root: Any) -> list[str]:
    """The class folders of ROOT when it exists (as the real class would find them), else
    ten synthetic names."""
    try:
        names = sorted(e.name for e in os.scandir(os.path.expanduser(str(root))) if e.is_dir())
    except OSError:
        names = []
    return names or [f"class_{i}" for i in range(10)]


def _image_folder(real: type) -> type:
    def __init__(self, root, transform=None, target_transform=None, loader=None, is_valid_file=None, allow_empty=False):
        _vision_init(self, root, transform, target_transform)
        self.extensions = None
        _folder_samples(self, "ImageFolder", str(root), _class_names(root))
        h, w = _settings.image_size
        own = "" if loader is None or getattr(loader, "__module__", "").startswith("torchvision.") else \
            "; the script's loader is not called"
        _describe("ImageFolder", repr(str(root)), len(self.samples),
                  f"PIL 'RGB' {w}x{h}, {len(self.classes)} classes{own}")

    return type("ImageFolder", (real,), {"__init__": __init__, "__module__": real.__module__,
                                         "__doc__": "Synthetic stand-in for ImageFolder (porter verify)."})


def _dataset_folder(real: type, image_loaders: tuple) -> type:
    def __new__(cls, root, loader=None, *args, **kwargs):
        if loader is not None and loader not in image_loaders:
            if os.path.isdir(os.path.expanduser(str(root))):
                _note(f"torchvision.datasets.DatasetFolder({str(root)!r}) with the script's own loader reads the "
                      "local files (not substituted)")
                return real(root, loader, *args, **kwargs)
            raise RuntimeError(
                f"porter verify: DatasetFolder({str(root)!r}) uses the script's own loader "
                f"({getattr(loader, '__name__', loader)!r}) and the folder does not exist; synthetic data can only "
                "stand in for image folders (torchvision's image loader). Make the folder available locally.")
        return super(substitute, cls).__new__(cls)

    def __init__(self, root, loader=None, extensions=None, transform=None, target_transform=None,
                 is_valid_file=None, allow_empty=False):
        _vision_init(self, root, transform, target_transform)
        self.extensions = extensions
        _folder_samples(self, "DatasetFolder", str(root), _class_names(root))
        h, w = _settings.image_size
        _describe("DatasetFolder", repr(str(root)), len(self.samples), f"PIL 'RGB' {w}x{h}, {len(self.classes)} classes")

    substitute = type("DatasetFolder", (real,), {"__new__": __new__, "__init__": __init__, "__module__": real.__module__,
                                                 "__doc__": "Synthetic stand-in for DatasetFolder (porter verify)."})
    return substitute


def _imagenet(real: type) -> type:
    def __init__(self, root, split="train", **kwargs):
        if split not in ("train", "val"):
            raise ValueError(f"Unknown value '{split}' for argument split. Valid values are ('train', 'val').")
        transform, target_transform = kwargs.pop("transform", None), kwargs.pop("target_transform", None)
        kwargs.pop("loader", None), kwargs.pop("is_valid_file", None), kwargs.pop("allow_empty", None)
        if kwargs:
            raise TypeError(f"ImageNet() got unexpected keyword arguments {sorted(kwargs)}")
        _vision_init(self, os.path.expanduser(str(root)), transform, target_transform)
        self.split = split
        wnids = [f"n{i:08d}" for i in range(1000)]  # synthetic WordNet ids, one per class
        _folder_samples(self, "ImageNet", split, wnids)
        self.wnids = self.classes
        self.wnid_to_idx = self.class_to_idx
        self.classes = [(f"synthetic class {i}",) for i in range(1000)]
        self.class_to_idx = {c: i for i, names in enumerate(self.classes) for c in names}
        h, w = _settings.image_size
        _describe("ImageNet", f"split={split!r}", len(self.samples), f"PIL 'RGB' {w}x{h}, labels 0-999")

    return type("ImageNet", (real,), {"__init__": __init__, "__module__": real.__module__,
                                      "__doc__": "Synthetic stand-in for ImageNet (porter verify)."})


def _offline(name: str) -> Callable:
    def refuse(*args: Any, **kwargs: Any) -> None:
        what = next((str(a) for a in args if isinstance(a, str)), "")
        raise RuntimeError(f"porter verify runs offline: torchvision's {name}({what!r}) would download; this dataset "
                           "has no synthetic stand-in. Make its files available locally (download=False).")

    refuse.__name__ = name
    return refuse


_DOWNLOADERS = ("download_url", "download_and_extract_archive", "download_file_from_google_drive", "_urlretrieve")


def _set(module: Any, name: str, value: Any) -> None:
    key = (module, name)
    if key not in _patched:
        _patched[key] = getattr(module, name)
    setattr(module, name, value)


def _patch(package: Any) -> None:
    """Replace the dataset classes in ``torchvision.datasets`` and in the submodules that
    define them, and the download helpers wherever they were imported."""
    from torchvision.datasets import cifar, fakedata, folder, imagenet, mnist, stl10, svhn, utils

    def real(module: Any, name: str) -> Any:
        return _patched.get((module, name), getattr(module, name))

    subs = {
        (mnist, "MNIST"): _mnist_family(real(mnist, "MNIST")),
        (mnist, "FashionMNIST"): _mnist_family(real(mnist, "FashionMNIST")),
        (mnist, "KMNIST"): _mnist_family(real(mnist, "KMNIST")),
        (mnist, "EMNIST"): _mnist_family(real(mnist, "EMNIST")),
        (cifar, "CIFAR10"): _cifar(real(cifar, "CIFAR10"), CIFAR10_CLASSES),
        (cifar, "CIFAR100"): _cifar(real(cifar, "CIFAR100"), CIFAR100_CLASSES),
        (svhn, "SVHN"): _svhn(real(svhn, "SVHN")),
        (stl10, "STL10"): _stl10(real(stl10, "STL10")),
        (folder, "ImageFolder"): _image_folder(real(folder, "ImageFolder")),
        (folder, "DatasetFolder"): _dataset_folder(real(folder, "DatasetFolder"),
                                                   (folder.default_loader, folder.pil_loader, folder.accimage_loader)),
        (imagenet, "ImageNet"): _imagenet(real(imagenet, "ImageNet")),
        (fakedata, "FakeData"): _fake_data(real(fakedata, "FakeData")),
    }
    for (module, name), substitute in subs.items():
        _set(module, name, substitute)
        _set(package, name, substitute)
    originals = {name: real(utils, name) for name in _DOWNLOADERS}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("torchvision.datasets"):
            continue
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                _set(module, name, _offline(name.lstrip("_")))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``torchvision.datasets`` right after it is first imported (the script may import
    torchvision at any point, or never: then it is never imported here either)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torchvision.datasets":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


def install(size: Optional[int] = None, seed: int = 0, image_size: Optional[tuple[int, int]] = None,
            announce: bool = True) -> None:
    """Substitute synthetic data for torchvision's file-backed datasets in this process, now if
    ``torchvision.datasets`` is already imported, else as soon as it is. ``size``: samples per
    dataset (default ``DEFAULT_SIZE``)."""
    global _finder
    if size is not None and size < 1:
        raise ValueError("the synthetic dataset size must be at least 1")
    _settings.size = size
    _settings.seed = seed
    _settings.image_size = image_size or DEFAULT_IMAGE_SIZE
    _settings.announce = announce
    module = sys.modules.get("torchvision.datasets")
    if module is not None:
        _patch(module)
    elif _finder is None:
        _finder = _PatchOnImport()
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Put the real classes and helpers back (tests)."""
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
    for (module, name), value in reversed(list(_patched.items())):
        setattr(module, name, value)
    _patched.clear()
    _notes.clear()
