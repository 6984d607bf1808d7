"""Data in Cloud Storage: the ``porter migrate --data gs://bucket/prefix`` rewrite's analysis,
shared by each target's data rule (codemods/<target>/dt00*_gcs_data_root.py).

A script's *dataset root* is the string default of a data-folder option
(``add_argument("--data-dir", default="./data")``: option names in :data:`ROOT_OPTIONS`) or a
string assigned to a data-folder name (``DATA_ROOT = "data/"``: :data:`ROOT_NAMES`). Every
expression built from it (``os.path.join(args.data_dir, "x.npy")``, an f-string, a name
assigned from one) is a *data path*. The loaders that read a data path through a file
object (:data:`FILE_READERS`: ``open``, ``np.load``, ``torch.load``, ``PIL.Image.open``,
``pandas.read_csv``...) are given ``fsspec.open(path, "rb").open()`` (``open`` becomes
``fsspec.open``), which reads ``gs://`` through gcsfs and local paths as before; the root then
becomes the bucket path. What needs a local folder (``np.memmap``, a torchvision dataset
with ``download=True``, ``ImageFolder``, ``os.listdir``, ``glob``, ``pathlib.Path``; and
writers given a data path: ``torch.save``, ``np.save``, ``open`` in a write mode) is
reported at its line, and the root is then left as it is: stage the data to local disk
(``gcloud storage cp -r`` / ``rsync``, as the TPU VM kit's stage.sh does).
"""
from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
from libcst.helpers import parse_template_expression

from porter.astutil import string_value, walk
from porter.context import dotted_name
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity, module_fact

ROOT_OPTIONS = frozenset({
    "data", "data_dir", "datadir", "data_root", "dataroot", "data_path", "datapath", "dataset",
    "dataset_dir", "dataset_root", "dataset_path", "root", "root_dir", "data_folder", "train_dir",
})
ROOT_NAMES = frozenset({
    "data_dir", "datadir", "data_root", "dataroot", "data_path", "dataset_dir", "dataset_root",
    "dataset_path", "root_dir", "data_folder",
})
FILE_READERS = frozenset({
    "builtins.open", "numpy.load", "numpy.loadtxt", "numpy.genfromtxt", "torch.load", "PIL.Image.open",
    "pandas.read_csv", "pandas.read_parquet", "pandas.read_json", "pandas.read_pickle", "json.load",
})
NEEDS_LOCAL = {
    "numpy.memmap": "np.memmap maps a local file into memory",
    "numpy.lib.format.open_memmap": "open_memmap maps a local file into memory",
    "os.listdir": "os.listdir lists a local folder",
    "os.scandir": "os.scandir lists a local folder",
    "os.walk": "os.walk walks a local folder",
    "os.path.exists": "os.path.exists looks at the local disk",
    "os.path.isfile": "os.path.isfile looks at the local disk",
    "os.path.isdir": "os.path.isdir looks at the local disk",
    "os.makedirs": "os.makedirs creates a local folder",
    "glob.glob": "glob.glob lists local files",
    "pathlib.Path": "pathlib.Path collapses gs:// into gs:/",
    "torchvision.datasets.ImageFolder": "ImageFolder lists a local folder",
    "torchvision.datasets.DatasetFolder": "DatasetFolder lists a local folder",
    # writers given a path open it with the builtin open(): a gs:// path fails there
    "torch.save": "torch.save writes a local file",
    "numpy.save": "np.save writes a local file",
    "numpy.savez": "np.savez writes a local file",
    "numpy.savez_compressed": "np.savez_compressed writes a local file",
    "numpy.savetxt": "np.savetxt writes a local file",
    "shutil.copy": "shutil.copy copies local files",
    "shutil.copytree": "shutil.copytree copies local folders",
}


def _open_mode(call: cst.Call) -> str:
    for i, arg in enumerate(call.args):
        if (arg.keyword is None and i == 1) or (arg.keyword is not None and arg.keyword.value == "mode"):
            return string_value(arg.value) or "?"
    return "r"



def _option_dest(call: cst.Call) -> Optional[str]:
    """argparse's dest of an ``add_argument`` call: ``dest=`` or the first long option."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dest":
            return string_value(arg.value)
    for arg in call.args:
        if arg.keyword is None:
            s = string_value(arg.value)
            if s and s.startswith("--"):
                return s[2:].replace("-", "_")
    return None


class DataFacts:
    """The module's dataset roots and data-path names (one walk, computed once per module)."""

    def __init__(self) -> None:
        self.roots: list[cst.SimpleString] = []  # the literals to rewrite
        self.attrs: set[str] = set()  # option dests: args.<dest> is a data path
        self.names: set[str] = set()  # names bound to data paths
        self.local_uses: list[tuple[cst.CSTNode, str]] = []  # (node, why) that need local files


def _collect(module: cst.Module, facts: DataFacts) -> list[tuple[list[str], cst.BaseExpression]]:
    """The roots and root options into ``facts``; the other assignments to names, to follow."""
    assigns: list[tuple[list[str], cst.BaseExpression]] = []
    for node in walk(module, into_functions=True):
        kind = type(node)
        if kind is cst.Call:
            func = node.func
            if type(func) is cst.Attribute and func.attr.value == "add_argument":
                dest = _option_dest(node)
                if dest in ROOT_OPTIONS:
                    for arg in node.args:
                        if arg.keyword is not None and arg.keyword.value == "default":
                            s = string_value(arg.value)
                            if s is not None and not s.startswith("gs://"):
                                facts.roots.append(arg.value)
                                facts.attrs.add(dest)
        elif kind is cst.Assign:
            names = [t.target.value for t in node.targets if type(t.target) is cst.Name]
            if not names:
                continue
            s = string_value(node.value)
            if s is not None and any(n.lower() in ROOT_NAMES for n in names) and not s.startswith("gs://"):
                facts.roots.append(node.value)
                facts.names.update(names)
            else:
                assigns.append((names, node.value))
    return assigns


def _read_names(node: cst.CSTNode) -> tuple[set[str], set[str]]:
    """The names an expression reads (attribute names included) and the attributes it reads of a
    name (``args.<attr>``)."""
    names: set[str] = set()
    attrs: set[str] = set()
    for n in walk(node, into_functions=True):
        kind = type(n)
        if kind is cst.Name:
            names.add(n.value)
        elif kind is cst.Attribute and type(n.value) is cst.Name:
            attrs.add(n.attr.value)
    return names, attrs


def mentions(facts: DataFacts, node: cst.CSTNode) -> bool:
    """Whether the expression reads a data path (a root name, args.<root option>, or a name
    assigned from one)."""
    names, attrs = _read_names(node)
    return not names.isdisjoint(facts.names) or not attrs.isdisjoint(facts.attrs)


def data_facts(ctx) -> DataFacts:
    facts = DataFacts()
    collected = _collect(ctx.module, facts)
    if not facts.roots:
        return facts  # no data path to follow
    assigns = [(names, _read_names(value)) for names, value in collected]
    changed = True
    while changed:  # names assigned from data paths, to a fixpoint
        changed = False
        for names, (read, attrs) in assigns:
            if not set(names) <= facts.names and (not read.isdisjoint(facts.names) or not attrs.isdisjoint(facts.attrs)):
                facts.names.update(names)
                changed = True
    return facts


def _first_path(call: cst.Call) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in ("file", "fname", "f", "fp", "filepath_or_buffer", "path", "root"):
            return arg
    return None


class GcsDataRule(Rule):
    """The data rule of a target: configured with the bucket path by ``--data`` (see
    :meth:`configured`); without it, it reports and fixes nothing."""

    data_url: ClassVar[Optional[str]] = None
    default_enabled = False
    needs_text = ()
    severity = Severity.WARNING

    @classmethod
    def configured(cls, url: str) -> type["GcsDataRule"]:
        return type(cls.__name__, (cls,), {"data_url": url, "__module__": cls.__module__, "__doc__": cls.__doc__})

    def _facts(self) -> DataFacts:
        return module_fact(self.ctx, data_facts)

    def _local_uses(self) -> list[tuple[cst.Call, str]]:
        facts = self._facts()
        key = ("gcs_local_uses", id(facts))
        cached = self.ctx.cache.get(key)
        if cached is None:
            cached = []
            ctx = self.ctx

            class _V(cst.CSTVisitor):
                def visit_Call(self, node: cst.Call) -> None:
                    name = ctx.qualname(node.func)
                    why = NEEDS_LOCAL.get(name or "")
                    if why is None and name and name.startswith("torchvision.datasets.") and any(
                            a.keyword is not None and a.keyword.value == "download" and not (
                                isinstance(a.value, cst.Name) and a.value.value == "False") for a in node.args):
                        why = f"{name.rsplit('.', 1)[-1]}(download=True) downloads into a local folder"
                    if why is None and name and name.startswith("torchvision.datasets."):
                        why = f"{name.rsplit('.', 1)[-1]} reads a local folder"
                    if why is None and name == "builtins.open" and not set(_open_mode(node)) <= set("rbt"):
                        why = f"open(..., {_open_mode(node)!r}) writes a file that must be closed to reach the bucket"
                    if why and any(mentions(facts, a.value) for a in node.args):
                        cached.append((node, why))

            ctx.module.visit(_V())
            self.ctx.cache[key] = cached
        return cached

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        facts = self._facts()
        if not any(node is r for r in facts.roots):
            return
        if self.data_url is None:
            self.report(node, "dataset root: `porter migrate --data gs://BUCKET/PREFIX --unsafe-fixes` reads it from Cloud Storage")
            return
        local = self._local_uses()
        if local:
            lines = ", ".join(sorted({f"{why}" for _, why in local}))
            self.report(node, f"dataset root left local: the script also needs local files ({lines}); stage "
                              f"{self.data_url} to local disk (gcloud storage cp -r {self.data_url} DIR) and point the root there")
            return
        quote = node.quote if node.quote in ('"', "'") and node.quote not in self.data_url and "\\" not in self.data_url else None
        new = node.with_changes(value=f"{quote}{self.data_url}{quote}" if quote else repr(self.data_url))
        self.report(node, f"dataset root -> {self.data_url} (read through fsspec/gcsfs)",
                    Fix((Edit(node, new),), Safety.UNSAFE, description=f"read the data from {self.data_url}"))

    def visit_Call(self, node: cst.Call) -> None:
        facts = self._facts()
        if not facts.roots:
            return
        name = self.ctx.qualname(node.func)
        local = self._local_uses()
        if any(use is node for use, _ in local):
            for use, why in local:
                if use is node:
                    self.report(node, f"{why}, not through fsspec: a gs:// path fails there; keep the data on local "
                                      "disk (stage it: gcloud storage cp -r / rsync, the TPU VM kit's stage.sh)")
            return
        if name not in FILE_READERS or self.data_url is None:
            return
        arg = _first_path(node)
        if arg is None or not mentions(facts, arg.value) or self._local_uses():
            return
        fsspec = self.ctx.module_alias("fsspec")
        if name == "builtins.open":
            args = list(node.args)
            has_mode = len([a for a in args if a.keyword is None]) > 1 or any(
                a.keyword is not None and a.keyword.value == "mode" for a in args)
            if not has_mode:  # fsspec.open's default mode is "rb"; open()'s is "r"
                args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                args.append(cst.Arg(cst.SimpleString('"r"')))
            new = node.with_changes(func=cst.parse_expression(f"{fsspec}.open"), args=args)
            if not isinstance(self.ctx.parent, cst.WithItem):
                new = cst.Call(func=cst.Attribute(new, cst.Name("open")))
            self.report(node, "open() of a data path -> fsspec.open() (reads gs:// through gcsfs)",
                        Fix((Edit(node, new),), Safety.UNSAFE, imports=("fsspec",)))
            return
        if _already_wrapped(arg.value):
            return
        wrapped = parse_template_expression(f'{fsspec}.open({{path}}, "rb").open()', path=arg.value)
        short = (dotted_name(node.func) or name)
        self.report(node, f"{short}() of a data path reads it through fsspec.open(..., 'rb') (gs:// through gcsfs)",
                    Fix((Edit(arg, arg.with_changes(value=wrapped)),), Safety.UNSAFE, imports=("fsspec",)))


def _already_wrapped(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "open"
            and isinstance(node.func.value, cst.Call))


# The text, examples and valid inputs of every target's data rule (the rule is the same on each).
DOC = """
    ## What it does
    With `porter migrate --data gs://BUCKET/PREFIX` (opt-in; off otherwise): finds the
    script's dataset root (the string default of a `--data` / `--data-dir` / `--root`...
    option, or a string assigned to `DATA_DIR` / `data_root`...), makes the loaders that read
    paths built from it read through `fsspec.open(path, "rb").open()` (`open()` becomes
    `fsspec.open()`): `np.load`, `torch.load`, `PIL.Image.open`, `pandas.read_csv`...; and
    sets the root to the bucket path. Reports, at their line, the uses that need a local
    folder (`np.memmap`, torchvision datasets with `download=True`, `ImageFolder`,
    `os.listdir`, `glob`, `pathlib.Path`) and the writers given a data path (`torch.save`,
    `np.save`, `open()` in a write mode); the root is then left local (stage the data).

    ## Why
    On a TPU VM or in Colab the data lives in Cloud Storage. fsspec with gcsfs reads `gs://`
    paths as file objects (and local paths as before); memory maps, folder listings and
    downloads need files on the local disk.

    ## Fix safety
    Unsafe: the script then reads (and may write) the bucket instead of the local folder.
    Applied with `--data` and `--unsafe-fixes`; without `--data` the root is only reported.
    """

EXAMPLES = [
    Example(
        """
        import argparse
        import numpy as np

        parser = argparse.ArgumentParser()
        parser.add_argument("--data-dir", default="./data")
        args = parser.parse_args()
        x = np.load(args.data_dir + "/x.npy")
        """,
        None,
        title="without --data: the root is reported",
    ),
]

VALID = [
    "import numpy as np\nx = np.load('x.npy')\n",
    "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', default='0.1')\n",
]
