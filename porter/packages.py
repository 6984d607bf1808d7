"""Porting a package (a model zoo) so that the port imports under the package's own name.

``port_package(source, target, out)`` takes a package folder, a plain folder of modules, or an
importable name (``"torchvision.models"``, ``"timm"``, ``"mxnet.gluon.model_zoo"``), and writes
under ``out/`` a tree that, with ``out/`` first on ``sys.path``, imports as the original does:

- the selected modules, the ``__init__`` chain of their parent packages, and every module of
  the same package they import (relative or absolute, at any depth: the import closure);
- modules of other installed packages that are torch model code (they define ``torch.nn``
  module subclasses or use ``torch.nn.functional``): such a package is then ported along with
  its own import closure (once ``out/<pkg>/`` exists it shadows the installed one, so
  everything imported from it must be there too). Frameworks (``torch``, ``mxnet``,
  ``numpy``...), the standard library and packages without model code stay imported from the
  environment;
- a selection inside a framework (``mxnet.gluon.model_zoo``) is rooted at its own folder
  (``import model_zoo.vision``): its relative imports that leave the folder are written as
  absolute imports of the framework, which the rules then port like any other;
- the data files beside the modules (json, txt, native extensions): copied as they are.

Imports are read from LibCST trees (``libcst.helpers.get_absolute_module_from_package_for_import``
for relative ones) and resolved to files with ``importlib`` finders, without importing
anything: a package of another environment (mxnet in porter's MXNet venv) is resolved on that
interpreter's ``sys.path``. Each module goes through porter's engine (the target's rules, the
same checks before writing as ``porter migrate``) and is written atomically. A module porter
cannot port is copied as it is, with status "failed" and the reason; the rest go on.

Incremental: ``out/.porter-package.json`` records each module's digest, its imports, status and
findings; a second call with the same inputs (same sources, target, fix mode and porter
rules) parses and writes nothing for a module whose source digest and written output are
unchanged. Findings restored from that record carry their position, not a LibCST node
(``Finding.node`` is None).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import json
import multiprocessing
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import libcst as cst
from libcst.helpers import get_absolute_module_from_package_for_import
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from porter import astutil, engine, program, registry
from porter.rules import Finding, Position, Severity
from porter.runner import Settings, UsageError, verify_output
from porter.verify.mxnet_env import MXNetEnvError, mxnet_python
from porter.sources import SKIP_DIRS, copy_atomic, find_spec, iter_python_files, read_source, write_atomic

MANIFEST = ".porter-package.json"
MANIFEST_VERSION = 1
# Packages that are frameworks or array libraries: never ported, always imported from the
# environment (a selection inside one is rooted at its own folder, see module docstring).
FRAMEWORKS = frozenset({
    "torch", "torch_xla", "torchgen", "functorch", "jax", "jaxlib", "flax", "optax", "numpy",
    "scipy", "mxnet", "tensorflow", "keras", "triton",
})
STATUSES = ("ported", "unchanged", "failed")


@dataclass
class ModulePort:
    """One module of the result."""

    name: str  # dotted module name, e.g. "torchvision.models.resnet"
    source: Path  # the original file
    output: Path  # where it was written under out/
    status: str  # "ported" | "unchanged" | "failed" (copied as is; error says why)
    findings: list  # the engine's Finding objects left in the port (manual ones included)
    error: Optional[str]
    digest: str  # sha256 of the original's bytes
    imports: list[str] = field(default_factory=list)  # modules of the port it imports directly
    selected: bool = True  # in the folder asked for (False: followed from an import)
    reused: bool = False  # nothing rewritten: the record of a previous call was still valid


@dataclass
class PackagePort:
    name: str  # the top-level import name ("torchvision", "timm", "mymodels")
    root: Path  # out/: with out/ first on sys.path, `import <name>.<sub>` gives the port
    target: str  # "torch-xla" | "jax"
    modules: dict[str, ModulePort]
    unsafe: bool = True
    selected: str = ""  # the dotted name of the folder or module asked for
    followed: list[str] = field(default_factory=list)  # modules ported along, outside the selection
    external: list[str] = field(default_factory=list)  # other packages ported along (model code)
    data_files: list[Path] = field(default_factory=list)  # non-Python files copied (under out/)
    unresolved: list[str] = field(default_factory=list)  # imports of the package with no file found

    def closure(self, module: str) -> list[str]:
        """The modules of the port that ``module`` imports, transitively (itself included), sorted."""
        if module not in self.modules:
            raise KeyError(f"{module} is not a module of this port")
        seen = {module}
        stack = [module]
        while stack:
            for dep in self.modules[stack.pop()].imports:
                if dep in self.modules and dep not in seen:
                    seen.add(dep)
                    stack.append(dep)
        return sorted(seen)

    def digest(self, module: str) -> str:
        """One sha256 over the digests of ``closure(module)`` (and the target and fix mode): a
        cache key for everything a model uses."""
        h = hashlib.sha256(f"{self.target}\0{int(self.unsafe)}\0".encode())
        for name in self.closure(module):
            h.update(f"{name}\0{self.modules[name].digest}\0".encode())
        return h.hexdigest()

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for m in self.modules.values():
            out[m.status] += 1
        return out


# --------------------------------------------------------------------------------------
# Finding modules
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Environment:
    """Where modules are looked up: this interpreter (``python`` None) or another one's sys.path."""

    path: tuple[str, ...]
    python: Optional[str] = None

    def find(self, name: str) -> Optional[importlib.machinery.ModuleSpec]:
        """The spec of ``name`` without importing it or its parents (None: not found)."""
        return find_spec(name, None if self.python is None else self.path)


def this_environment() -> Environment:
    return Environment(tuple(sys.path))


def mxnet_environment() -> Optional[Environment]:
    """The MXNet venv's sys.path (asked of its python), or None when it is not built."""
    try:
        python = mxnet_python()
    except MXNetEnvError:
        return None
    return _environment_of(python)


@functools.lru_cache(maxsize=None)
def _environment_of(python: str) -> Optional[Environment]:
    try:
        proc = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, timeout=60, check=True)
        return Environment(tuple(json.loads(proc.stdout)), python)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


@dataclass(frozen=True)
class _Layout:
    """How module names map to files for one package: ``root`` is the sys.path entry holding
    the top-level folder ``prefix`` names (files of ``prefix.x.y`` are under root/prefix/x/y)."""

    top: str  # the top-level name of the port
    root: Path  # folder that holds the top-level package folder
    origin: str = ""  # the original dotted prefix of ``top`` (a framework's subpackage), else ""

    def file(self, name: str) -> Optional[Path]:
        parts = name.split(".")
        if parts[0] != self.top:
            return None
        base = self.root.joinpath(*parts)
        init = base / "__init__.py"
        if init.is_file():
            return init
        mod = base.with_suffix(".py")
        return mod if mod.is_file() else None


def _module_name(root: Path, file: Path) -> str:
    rel = file.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _spec_folder(spec: importlib.machinery.ModuleSpec) -> Optional[Path]:
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        return Path(locations[0]) if locations else None
    return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None


def resolve_source(source: Union[str, Path], env: Optional[Environment] = None) -> tuple[Path, str, Environment]:
    """(folder or file, its dotted name, the environment its imports resolve in)."""
    env = env or this_environment()
    as_path = Path(source)
    if isinstance(source, Path) or as_path.exists() or os.sep in str(source):
        if not as_path.exists():
            raise UsageError(f"{source}: no such file or folder")
        p = Path(os.path.abspath(as_path))
        if p.is_file() and p.suffix != ".py":
            raise UsageError(f"{source}: not a Python module or a folder")
        folder = p if p.is_dir() else p.parent
        top = folder
        while (top.parent / "__init__.py").is_file() and (top / "__init__.py").is_file():
            top = top.parent
        root = top.parent
        return p, _module_name(root, p) if p.is_file() else ".".join(p.relative_to(root).parts), env
    name = str(source)
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"{name!r} is neither a folder nor an importable module name")
    spec = env.find(name)
    if spec is None and env.python is None:
        # MXNet/Gluon packages (mxnet, gluoncv...) live in the MXNet venv (numpy 1.23.5)
        mx = mxnet_environment()
        if mx is not None:
            spec = mx.find(name)
            if spec is not None:
                env = mx
        elif name.split(".")[0] in ("mxnet", "gluoncv"):
            raise UsageError(f"{name} is not importable here and the MXNet venv is not built (scripts/bootstrap-mxnet)")
    if spec is None:
        raise UsageError(f"cannot find the package {name!r} (not importable in this environment, nor in the MXNet venv)")
    found = _spec_folder(spec)
    if found is None:
        raise UsageError(f"{name} is not Python source (origin {spec.origin}); nothing to port")
    return found, name, env


# --------------------------------------------------------------------------------------
# Reading imports and model code
# --------------------------------------------------------------------------------------
def _dotted(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def imported_names(module: cst.Module, name: str, is_package: bool) -> tuple[set[str], set[str]]:
    """The absolute module names a module imports (anywhere in it), and the candidates
    ``from X import n`` adds (``X.n``, a module when such a file exists)."""
    package = name if is_package else name.rpartition(".")[0]
    modules: set[str] = set()
    candidates: set[str] = set()

    class Imports(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                modules.add(_dotted(alias.name))

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            base = get_absolute_module_from_package_for_import(package or None, node)
            if not base:  # (a relative import beyond the top-level package)
                return
            modules.add(base)
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    candidates.add(f"{base}.{_dotted(alias.name)}")

    module.visit(Imports())
    return modules, candidates


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


class _ModelCode(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def _names(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if any(n.startswith("torch.nn.") for arg in node.bases for n in self._names(arg.value)):
            self.found = True

    def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
        if any(n.startswith("torch.nn.functional") for n in self._names(node)):
            self.found = True
        return not self.found

    def visit_Name(self, node: cst.Name) -> None:
        if any(n.startswith("torch.nn.functional") for n in self._names(node)):
            self.found = True


def is_model_code(module: cst.Module) -> bool:
    """Whether a module defines a class on a ``torch.nn`` base or uses ``torch.nn.functional``."""
    visitor = _ModelCode()
    MetadataWrapper(module, unsafe_skip_copy=True).visit(visitor)
    return visitor.found


class _AbsoluteOutside(cst.CSTTransformer):
    """Relative imports that leave ``inside`` (a framework's subpackage rooted on its own) ->
    absolute imports of the framework; the others renamed from ``origin`` to the port's name
    are left relative (they work unchanged)."""

    def __init__(self, package: str, inside: str) -> None:
        self.package = package
        self.inside = inside

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        if not updated.relative:
            return updated
        base = get_absolute_module_from_package_for_import(self.package or None, original)
        if not base or base == self.inside or base.startswith(self.inside + "."):
            return updated
        return updated.with_changes(relative=(), module=cst.parse_expression(base))


# --------------------------------------------------------------------------------------
# Porting one module
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Task:
    name: str
    source: Path
    output: Path
    target: str
    unsafe: bool
    absolute_outside: str = ""  # the original dotted package of a framework subpackage
    original_name: str = ""  # the module's name in the original package
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    facts: Optional[program.ProgramFacts] = None  # what the rules know of the other modules


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _port_one(task: _Task) -> tuple[str, str, list, Optional[str], str]:
    """(status, digest, findings, error, sha256 of what was written)."""
    try:
        raw = task.source.read_bytes()
    except OSError as exc:
        return "failed", "", [], f"cannot read: {exc.strerror or exc}", ""
    digest = _sha(raw)
    try:
        src = read_source(task.source)
        text = src.text
        if task.absolute_outside:
            package = task.original_name if task.source.name == "__init__.py" else task.original_name.rpartition(".")[0]
            text = engine.parse(text).visit(_AbsoluteOutside(package, task.absolute_outside)).code
        options = engine.Options(registry.select(task.target, task.select, task.ignore), task.unsafe)
        with program.facts(task.facts):
            result = engine.fix(text, options, str(task.source))
        new = result.source if result.changed else text
        if new != src.text:
            verify_output(src.text, new)
            data = src.encode(new)
            write_atomic(task.output, data, src.mode, follow_symlinks=False)
            return "ported", digest, result.remaining, None, _sha(data)
        copy_atomic(task.source, task.output)
        return "unchanged", digest, result.remaining, None, digest
    except engine.PorterError as exc:
        error = str(exc)
    except MemoryError:
        error = "out of memory"
    except OSError as exc:
        error = f"cannot write {task.output}: {exc.strerror or exc}"
    except Exception as exc:  # a bug in porter: this module fails alone
        error = f"internal error (a bug in porter): {engine.describe_exception(exc)}"
    try:
        copy_atomic(task.source, task.output)
    except (OSError, engine.PorterError) as exc:
        error += f"; and it could not be copied: {exc}"
    return "failed", digest, [], error, digest


def _port_one_detached(task: _Task):
    """For a worker process: findings without their LibCST nodes (plain data to send back)."""
    status, digest, findings, error, written = _port_one(task)
    return status, digest, [_detached(f) for f in findings], error, written


def _detached(f: Finding) -> Finding:
    return Finding(f.code, f.message, None, f.severity, None, f.position, f.internal_error)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# The record of a previous call
# --------------------------------------------------------------------------------------
def porter_fingerprint() -> str:
    """sha256 of porter's own sources and rules: a port recorded under another is redone.
    The code that runs ports rather than writes them (``porter.verify``, ``porter.zoo``) is
    not in it: an edit there keeps the ports."""
    from porter._layout import mapped_package

    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    folders = [here, Path(mapped_package("porter.codemods", "codemods").__path__[0])]
    for folder in folders:
        for f in sorted(folder.rglob("*.py")):
            if "__pycache__" in f.parts or (folder == here and f.relative_to(here).parts[0] in ("verify", "zoo")):
                continue
            h.update(str(f.relative_to(folder)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _finding_record(f: Finding) -> dict:
    pos = f.position
    return {"code": f.code, "message": f.message, "severity": f.severity.value,
            "position": [pos.line, pos.column, pos.end_line, pos.end_column] if pos else None,
            "internal_error": f.internal_error}


def _finding_of(record: dict) -> Finding:
    pos = record.get("position")
    return Finding(record["code"], record["message"], None, Severity(record["severity"]), None,  # type: ignore[arg-type]
                   Position(*pos) if pos else None, bool(record.get("internal_error")))


def _load_manifest(out: Path, key: dict) -> tuple[dict, dict]:
    try:
        data = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(data, dict) or data.get("key") != key:
        return {}, {}
    modules, checked = data.get("modules"), data.get("checked")
    return (modules if isinstance(modules, dict) else {}), (checked if isinstance(checked, dict) else {})


def _file_sha(path: Path) -> Optional[str]:
    try:
        return _sha(path.read_bytes())
    except OSError:
        return None


# --------------------------------------------------------------------------------------
# The package
# --------------------------------------------------------------------------------------
def port_package(
    source: Union[str, Path],
    target: str,
    out: Path,
    *,
    unsafe: bool = True,
    include: Optional[list[str]] = None,
    jobs: int = 1,
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    whole_folder: bool = True,
    overlay: bool = False,
) -> PackagePort:
    """Port ``source`` (a folder, or an importable package or module name) and everything it
    needs from itself and from other packages' model code to ``target`` under ``out``.

    ``include``: more modules to port along (dotted names, of the package or of another
    installed one), with their import closure. ``select``/``ignore``: rule codes, prefixes or
    names, as ``porter migrate --select/--ignore``. ``whole_folder`` False: a package selects
    its ``__init__`` alone (with its import closure), not every module of its folder
    (``porter migrate --with``: the modules a script uses, given as ``include``). ``overlay``:
    only torch model code is ported (the selection, ``include``, and the model code they import,
    outside the host-side subpackages of :data:`HOST_SUBPACKAGES`); the package ``__init__``
    files on the way are the originals, made to fall through to the installed package for
    every module the port does not hold (:func:`overlay_init`), and no data file is copied: the
    installed package keeps serving its datasets, transforms and native code. Raises
    :class:`UsageError` for a source that cannot be found, an unknown target, or an ``out``
    that overlaps the sources.
    """
    if target not in registry.TARGETS:
        raise UsageError(f"unknown target {target!r}; known: {', '.join(registry.TARGETS)}")
    select, ignore = tuple(select), tuple(ignore)
    Settings(target, select, ignore).validate()  # unknown codes; a broken rule module fails here
    path, selected, env = resolve_source(source)
    out = Path(os.path.abspath(out))
    top = selected.split(".")[0]
    folder = path if path.is_dir() else path.parent
    root = path.parents[len(selected.split(".")) - 1]
    inside = ""
    if top in FRAMEWORKS and path.is_dir() and "." in selected:
        # a framework's subpackage: rooted at its own folder, the framework stays installed
        inside = selected
        root = folder.parent
        top = folder.name
    layouts = {top: _Layout(top, root, inside)}
    _check_out(out, [layouts[top].root / top if path.is_dir() or "." in selected else path])

    def local_name(name: str) -> str:  # original dotted name -> the port's
        if inside and (name == inside or name.startswith(inside + ".")):
            return top + name[len(inside):]
        return name

    sel_name = local_name(selected)
    if path.is_dir() and whole_folder:
        files, _errors = iter_python_files([path])
        start = [_module_name(root, f) for f in files if f.suffix == ".py" and f.is_file()]
    else:
        start = [sel_name]
    selection = set(start)
    key = {"version": MANIFEST_VERSION, "target": target, "unsafe": unsafe, "select": list(select),
           "ignore": list(ignore), "porter": porter_fingerprint(), **({"overlay": True} if overlay else {})}
    previous, checked_before = _load_manifest(out, key)
    checked: dict[str, list] = {}  # other packages' modules: name -> [digest, model code]

    # The closure: module name -> (file, imports), by a walk over the imports
    found: dict[str, tuple[Path, str]] = {}  # name -> (file, the layout's top)
    imports: dict[str, list[str]] = {}
    unresolved: set[str] = set()
    external_tops: set[str] = set()
    queue = sorted(selection)  # (add() brings in their parent packages)
    model_code: dict[str, bool] = {}
    rejected: dict[str, list[str]] = {}  # modules of other packages not ported (yet), by package

    def layout_for(name: str) -> Optional[_Layout]:
        first = name.split(".")[0]
        if first in layouts:
            return layouts[first]
        if first in FRAMEWORKS or first in sys.stdlib_module_names or first == "porter":
            return None
        spec = env.find(first)
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = _spec_folder(spec)
        if folder is None or not (folder / "__init__.py").is_file():
            return None
        return _Layout(first, folder.parent)

    def is_model(name: str) -> bool:
        """Whether the module ``name`` (of a package porter can find) is torch model code."""
        layout = layout_for(name)
        file = layout.file(name) if layout is not None else None
        if file is None:
            return False
        if name not in model_code:
            digest = _file_sha(file) or ""
            known = checked_before.get(name)
            if isinstance(known, list) and len(known) == 2 and known[0] == digest:
                model_code[name] = bool(known[1])
            else:
                try:
                    text = read_source(file).text
                    # pre-filter: a file that never names torch defines no torch module
                    model_code[name] = "torch" in text and is_model_code(engine.parse(text))
                except (engine.PorterError, RecursionError, MemoryError):
                    model_code[name] = False
            checked[name] = [digest, model_code[name]]
        return model_code[name]

    def wants(name: str) -> bool:
        """A module of another package: ported when it is torch model code."""
        first = name.split(".")[0]
        if first in external_tops:
            return True
        layout = layout_for(name)
        if layout is None or layout.file(name) is None:
            return False
        if is_model(name):
            layouts[first] = layout
            external_tops.add(first)
            # out/<first>/ now shadows the installed package: what was imported from it before
            # it was known to hold model code must be there too
            for earlier in rejected.pop(first, []):
                add(earlier)
            return True
        rejected.setdefault(first, []).append(name)
        return False

    forced = {local_name(x) for x in include or ()}
    inits: set[str] = set()  # overlay: package __init__ files kept as the originals (overlay_init)

    def add(name: str, parent: bool = False) -> bool:
        if name in found:
            return True
        first = name.split(".")[0]
        if first != top and first not in external_tops and not wants(name):
            return False
        if overlay and not parent and name not in forced and (_host_side(name) or not is_model(name)):
            return False  # the installed package's module serves the port
        layout = layouts[first]
        file = layout.file(name)
        if file is None:
            return False
        found[name] = (file, first)
        for above in _with_parents(name)[:-1]:
            add(above, parent=True)  # importing it runs its parent packages' __init__ first
        if overlay and parent and name not in forced and not is_model(name):
            inits.add(name)
            return True  # its imports are the installed package's business
        queue.append(name)
        return True

    pending = list(queue)
    queue.clear()
    for name in pending:
        # overlay: a selected package is the way to its modules, its __init__ the original's
        file = layouts[top].file(name)
        add(name, parent=overlay and file is not None and file.name == "__init__.py")
    for extra in include or ():  # asked for: ported along whether or not it is model code
        extra = local_name(extra)
        first = extra.split(".")[0]
        layout = layouts.get(first) or layout_for(extra)
        if layout is None or layout.file(extra) is None:
            raise UsageError(f"--include {extra}: no such module (or a framework's or the standard library's)")
        if first not in layouts:
            layouts[first] = layout
            external_tops.add(first)
            for earlier in rejected.pop(first, []):
                add(earlier)
        add(extra)
    while queue:
        name = queue.pop()
        if name in imports:
            continue
        file, first = found[name]
        digest = _file_sha(file) or ""
        record = previous.get(name)
        if record and record.get("digest") == digest and isinstance(record.get("raw_imports"), list):
            raw = record["raw_imports"]
        else:
            raw = _raw_imports(file, name, layouts[first], inside)
        deps = [p for p in _with_parents(name)[:-1] if p in found]  # importing it runs its packages first
        for dep in raw:
            for candidate in _with_parents(local_name(dep)):
                if add(candidate):
                    if candidate != name:
                        deps.append(candidate)
                elif candidate.split(".")[0] == top:
                    unresolved.add(candidate)
        imports[name] = sorted(set(deps))
        previous.setdefault(name, {})["raw_imports_now"] = raw
    # names that resolve to modules only as `from X import n`: the others are attributes (in an
    # overlay, the installed package's modules)
    unresolved = set() if overlay else {u for u in unresolved if u not in found and not _is_attribute_candidate(u, found)}

    # What the rules of each module need to know of the others
    facts = _program_facts(target, found)
    for name, fact in facts.items():
        previous.setdefault(name, {})["program_now"] = sorted(fact.rngs_callables)

    # Port every module of the closure
    tasks: list[_Task] = []
    reused: dict[str, tuple] = {}
    for name in sorted(found):
        file, first = found[name]
        rel = file.relative_to(layouts[first].root)
        output = out / rel
        if name in inits:
            reused[name] = _write_overlay_init(file, output)
            continue
        digest = _file_sha(file) or ""
        record = previous.get(name, {})
        if (record.get("digest") == digest and record.get("status") in STATUSES
                and record.get("program", []) == record.get("program_now", [])
                and record.get("written") and _file_sha(output) == record.get("written")):
            reused[name] = (record["status"], digest, [_finding_of(r) for r in record.get("findings", [])],
                            record.get("error"), record["written"])
            continue
        original = (inside + name[len(top):]) if inside and first == top else name
        tasks.append(_Task(name, file, output, target, unsafe, inside if first == top else "", original, select, ignore,
                           facts.get(name)))
    results: dict[str, tuple] = dict(reused)
    if jobs > 1 and len(tasks) > 1:
        # workers from a fresh interpreter (forkserver, else spawn), not forks of this process:
        # a fork of a process with other threads (a test runner's, a server's) can start holding
        # a lock another thread held, and with this process's signal handlers; such a worker
        # hung at the pool's terminate (measured: a test stopped at its 20-minute timeout there)
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                          else "spawn")
        with ctx.Pool(min(jobs, len(tasks))) as pool:
            for task, result in zip(tasks, pool.map(_port_one_detached, tasks, chunksize=1)):
                results[task.name] = result
    else:
        for task in tasks:
            results[task.name] = _port_one(task)

    modules: dict[str, ModulePort] = {}
    for name in sorted(found):
        file, first = found[name]
        status, digest, findings, error, written = results[name]
        modules[name] = ModulePort(
            name, file, out / file.relative_to(layouts[first].root), status, list(findings), error, digest,
            imports=imports.get(name, []), selected=name in selection, reused=name in reused and name not in inits,
        )
    data_files = [] if overlay else _copy_data(found, layouts, out)
    _remove_stale(out, previous, found)
    _write_manifest(out, key, modules, previous, results, checked)
    followed = sorted(n for n, m in modules.items() if not m.selected)
    return PackagePort(top, out, target, modules, unsafe, sel_name, followed, sorted(external_tops), data_files,
                       sorted(unresolved))


# Subpackages that by the zoos' convention hold the host-side input pipeline (torchvision's
# datasets/transforms/io, timm's and gluoncv's data): an overlay never ports them, even where
# they define torch modules (torchvision's transforms are nn.Modules, and a model file's weights
# name its preset transforms): the port's batches are made on the host, by the installed code.
HOST_SUBPACKAGES = frozenset({"data", "datasets", "transforms", "io", "tv_tensors"})

OVERLAY_HEADER = ("# porter: an overlay of the installed package: the modules of this folder are ported, "
                  "the others are the installed package's\n")


def _host_side(name: str) -> bool:
    return any(part in HOST_SUBPACKAGES for part in name.split(".")[1:])


def overlay_init(text: str) -> str:
    """A package ``__init__``'s text for an overlay: the original, with its ``__path__``
    extended (``pkgutil.extend_path``) by the installed package's folder of the same name on
    ``sys.path``, after its docstring and ``__future__`` imports: what the overlay does not hold is
    imported from the installed package, its own modules first."""
    module = engine.parse(text)
    body = list(module.body)
    at = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) \
            and isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        at = 1
    while at < len(body) and isinstance(body[at], cst.SimpleStatementLine) and isinstance(body[at].body[0], cst.ImportFrom) \
            and isinstance(body[at].body[0].module, cst.Name) and body[at].body[0].module.value == "__future__":
        at += 1
    added = list(cst.parse_module("import pkgutil as _porter_pkgutil\n"
                                  "__path__ = _porter_pkgutil.extend_path(__path__, __name__)\n").body)
    added[0] = added[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(OVERLAY_HEADER.strip()))])
    return module.with_changes(body=[*body[:at], *added, *body[at:]]).code


def _write_overlay_init(file: Path, output: Path) -> tuple:
    """(status, digest, findings, error, written) of an overlay's package ``__init__``."""
    try:
        src = read_source(file)
        digest = _sha(file.read_bytes())
        data = src.encode(overlay_init(src.text))
        write_atomic(output, data, src.mode, follow_symlinks=False)
        return "ported", digest, [], None, _sha(data)
    except (engine.PorterError, OSError) as exc:
        return "failed", "", [], f"cannot write the overlay's {output}: {exc}", ""


# a script that picks a package's models by name at run time needs all of them
_DYNAMIC_PICKS = re.compile(r"__dict__\s*\[|\bgetattr\s*\(|\bget_model\s*\(|\bget_model_builder\b|\blist_models\b"
                            r"|\bcreate_model\s*\(")


_MXNET_IMPORT = re.compile(r"^\s*(import mxnet|from mxnet[\s.])", re.MULTILINE)


def imports_mxnet(path: Path) -> bool:
    """Whether a package (its folder) or module imports MXNet anywhere: a Gluon library."""
    files = path.rglob("*.py") if path.is_dir() else [path]
    for f in files:
        try:
            if _MXNET_IMPORT.search(f.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def overlay_selection(package: str, used: Sequence[str], sources: Sequence[str] = ()) -> list[str]:
    """For an overlay (``porter migrate --with`` of a torch library): the modules of ``used``
    (as :func:`used_modules` gives them) whose model code the port holds: a module that is
    model code, and the model-code modules directly in a package (``torchvision.models`` ->
    ``torchvision.models.resnet``, ...; not its subpackages), host-side subpackages aside. Of a
    package's modules, those defining a name the scripts ``sources`` spell (``resnet18``), or
    all of them where a script picks models by name at run time (``models.__dict__[arch]``,
    ``getattr``, ``get_model``)."""
    path, name, _env = resolve_source(package)
    layout = _Layout(name, path.parent)
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(sources)))
    dynamic = not sources or any(_DYNAMIC_PICKS.search(text) for text in sources)
    out: list[str] = []
    for module in used:
        file = layout.file(module)
        if file is None or _host_side(module):
            continue
        whole = file.name == "__init__.py"
        files = sorted(file.parent.glob("*.py")) if whole else [file]
        for f in files:
            if f.name == "__init__.py":
                continue
            child = module if f == file else f"{module}.{f.stem}"
            try:
                text = read_source(f).text
                if "torch" not in text or child in out:
                    continue
                tree = engine.parse(text)
                if whole and not dynamic and not words & {n for n in astutil.top_level_names(tree) if not n.startswith("_")}:
                    continue  # the scripts name none of its models
                if is_model_code(tree):
                    out.append(child)
            except (engine.PorterError, RecursionError, MemoryError):
                continue
    return out


def used_modules(package: str, sources: Sequence[str]) -> list[str]:
    """The modules of the installed ``package`` (a top-level name) that the scripts
    ``sources`` (their text) import: ``import gluoncv.utils``, ``from gluoncv import
    model_zoo`` (``gluoncv.model_zoo`` when it is a module), ``from gluoncv.data import
    transforms``, and for ``import gluoncv as gcv`` the modules its attribute chains name
    (``gcv.utils.TrainingHistory`` -> ``gluoncv.utils``); the package itself always (importing
    a module runs it). Sorted. Raises :class:`UsageError` when the package cannot be found
    (here, or in the MXNet venv) or is not a package."""
    path, name, _env = resolve_source(package)
    if "." in name or not path.is_dir() or not (path / "__init__.py").is_file():
        raise UsageError(f"--with {package}: not a top-level package (a folder with __init__.py)")
    layout = _Layout(name, path.parent)
    used = {name}
    for text in sources:
        module = engine.parse(text)
        bound: dict[str, str] = {}  # local name -> the module (or candidate) it is bound to
        candidates: set[str] = set()
        for node in astutil.walk(module, into_functions=True):
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = _dotted(alias.name)
                    candidates.update(_with_parents(full))
                    local = _dotted(alias.asname.name) if alias.asname else full.split(".")[0]
                    bound[local] = full if alias.asname else local
            elif isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
                base = _dotted(node.module)
                candidates.update(_with_parents(base))
                if not isinstance(node.names, cst.ImportStar):
                    for alias in node.names:
                        full = f"{base}.{_dotted(alias.name)}"
                        candidates.add(full)
                        bound[_dotted(alias.asname.name) if alias.asname else _dotted(alias.name)] = full
        for node in astutil.walk(module, into_functions=True):  # gcv.utils.TrainingHistory -> gluoncv.utils (a module)
            if isinstance(node, cst.Attribute):
                chain = _attribute_chain(node)
                if chain and chain[0] in bound:
                    candidates.update(_with_parents(".".join([bound[chain[0]], *chain[1:]])))
        used.update(c for c in candidates if c.split(".")[0] == name and layout.file(c) is not None)
    return sorted(used)


def _attribute_chain(node: cst.BaseExpression) -> Optional[list[str]]:
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    return [node.value, *reversed(parts)]


def _program_facts(target: str, found: dict) -> dict[str, program.ProgramFacts]:
    """Per module of the closure, the facts of the whole program its rules read (porter.program).
    JAX: the names of each module that refer to classes and factories of the other modules
    whose ported constructors take ``rngs`` (each module is ported alone, so a class imported
    from another module would otherwise be built without ``rngs=``). A module that does not
    parse contributes nothing (porting it fails with the reason)."""
    if target != "jax":
        return {}
    from porter._layout import mapped_package

    mapped_package("porter.codemods", "codemods")
    from porter.codemods.jax import _program as jax_program

    parsed = {}
    for name, (file, _first) in sorted(found.items()):
        try:
            parsed[name] = (engine.parse(read_source(file).text), file.name == "__init__.py")
        except (engine.PorterError, RecursionError, MemoryError):
            continue
    spelled = jax_program.package_rngs_callables(parsed)
    return {name: program.ProgramFacts(frozenset(spelled.get(name, ()))) for name in found}


def overlay_constructors(port: PackagePort) -> tuple:
    """The ``(module, names)`` pairs of porter.program's ``ported_libraries`` for a JAX overlay:
    for each ported model module, the classes and factories whose ported constructors take
    ``rngs`` (the module rules' plan, read from the port), with the functions that hand their
    ``**kwargs`` on to one of them (torchvision's ``resnet18(**kwargs)`` -> ``_resnet`` ->
    ``ResNet``); under the module's name and its package's (which re-exports them)."""
    if port.target != "jax":
        return ()
    from porter._layout import mapped_package

    mapped_package("porter.codemods", "codemods")
    from porter.codemods.jax import _program as jax_program

    pairs: dict[str, set] = {}
    for name, m in sorted(port.modules.items()):
        if m.status == "failed" or m.source.name == "__init__.py":
            continue
        try:
            module = engine.parse(read_source(m.output).text)
        except (engine.PorterError, OSError, RecursionError, MemoryError):
            continue
        names = set(jax_program._constructors_of(module, m.output, 0, {}))
        functions = [s for s in module.body if isinstance(s, cst.FunctionDef) and isinstance(s.params.star_kwarg, cst.Param)]
        grew = True
        while grew:
            grew = False
            for fn in functions:
                kwargs = fn.params.star_kwarg.name.value  # type: ignore[union-attr]
                if fn.name.value not in names and any(
                        isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in names
                        and any(a.star == "**" and isinstance(a.value, cst.Name) and a.value.value == kwargs for a in n.args)
                        for n in astutil.walk(fn.body)):
                    names.add(fn.name.value)
                    grew = True
        public = {n for n in names if "." not in n}
        for key in (name, name.rpartition(".")[0]):
            if key:
                pairs.setdefault(key, set()).update(public)
    return tuple((key, frozenset(names)) for key, names in sorted(pairs.items()) if names)


def _is_attribute_candidate(name: str, found: dict) -> bool:
    """``from pkg.mod import f``: ``pkg.mod.f`` is a candidate that names a function, not a module."""
    return name.rpartition(".")[0] in found


def _raw_imports(file: Path, name: str, layout: _Layout, inside: str) -> list[str]:
    """Every module name ``file`` imports, as absolute names in the original package."""
    try:
        module = engine.parse(read_source(file).text)
    except (engine.PorterError, RecursionError, MemoryError):
        return []  # porting it fails with the reason; it imports nothing we can see
    original = name
    if inside and layout.origin:
        original = inside + name[len(layout.top):]
    modules, candidates = imported_names(module, original, file.name == "__init__.py")
    return sorted(modules | candidates)


def _check_out(out: Path, sources: Sequence[Path]) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"out {out} exists and is not a folder")
    real_out = os.path.realpath(out)
    for s in sources:
        real = os.path.realpath(s)
        if real_out == real or real_out.startswith(real.rstrip(os.sep) + os.sep):
            raise UsageError(f"out {out} lies inside the source {s}; choose a folder outside it")
        if real.startswith(real_out.rstrip(os.sep) + os.sep):
            raise UsageError(f"the source {s} lies inside out {out}; the port could overwrite it")


def _copy_data(found: dict, layouts: dict, out: Path) -> list[Path]:
    """Copy the non-Python files beside each ported module (and folders of data without
    Python files below them): resources, native extensions. Unchanged copies are kept."""
    folders = {found[n][0].parent: layouts[found[n][1]].root for n in found}
    copied: list[Path] = []
    # the shared libraries a repaired wheel's extensions load by RUNPATH $ORIGIN/../<top>.libs
    libs = {}
    for first in {found[n][1] for n in found}:
        vendored = layouts[first].root / f"{first}.libs"
        if vendored.is_dir():
            libs[vendored] = layouts[first].root
    for folder, root in sorted(folders.items()) + sorted(libs.items()):
        for entry in sorted(folder.iterdir()):
            if entry.name in SKIP_DIRS or entry.name.startswith("."):
                continue
            if entry.is_file() and entry.suffix not in (".py", ".pyc"):
                items = [entry]
            elif entry.is_dir() and not entry.is_symlink() and not any(entry.rglob("*.py")):
                items = [f for f in sorted(entry.rglob("*")) if f.is_file() and "__pycache__" not in f.parts]
            else:
                continue
            for f in items:
                dst = out / f.relative_to(root)
                try:
                    st = f.stat()
                    old = dst.stat() if dst.exists() else None
                    if old is None or old.st_size != st.st_size or old.st_mtime_ns != st.st_mtime_ns:
                        copy_atomic(f, dst)
                    copied.append(dst)
                except (OSError, engine.PorterError):
                    continue
    return copied


def _remove_stale(out: Path, previous: dict, found: dict) -> None:
    """A module of the previous call's port that is no longer in the closure (removed from the
    package, no longer imported): its output goes, when it is still what porter wrote."""
    for name, record in previous.items():
        rel = record.get("output")
        if name in found or not isinstance(rel, str) or not record.get("written"):
            continue
        path = out / rel
        if os.path.realpath(path).startswith(os.path.realpath(out) + os.sep) and _file_sha(path) == record["written"]:
            try:
                path.unlink()
            except OSError:
                pass


def _write_manifest(out: Path, key: dict, modules: dict[str, ModulePort], previous: dict, results: dict,
                    checked: dict) -> None:
    doc = {"key": key, "modules": {}, "checked": dict(sorted(checked.items()))}
    for name, m in modules.items():
        doc["modules"][name] = {
            "digest": m.digest, "status": m.status, "error": m.error, "written": results[name][4],
            "output": str(m.output.relative_to(out)),
            "findings": [_finding_record(f) for f in m.findings],
            "raw_imports": previous.get(name, {}).get("raw_imports_now", []),
            "program": previous.get(name, {}).get("program_now", []),
        }
    write_atomic(out / MANIFEST, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def summary(port: PackagePort) -> dict:
    """Plain data for a front end: counts by status, modules followed, packages ported along,
    failures with their reasons, findings by code."""
    codes: dict[str, int] = {}
    for m in port.modules.values():
        for f in m.findings:
            codes[f.code] = codes.get(f.code, 0) + 1
    return {
        "name": port.name, "target": port.target, "root": str(port.root), **port.counts(),
        "modules": len(port.modules), "followed": list(port.followed), "external": list(port.external),
        "failed_modules": {n: m.error for n, m in port.modules.items() if m.status == "failed"},
        "findings": dict(sorted(codes.items())), "data_files": len(port.data_files),
        "unresolved": list(port.unresolved),
    }


__all__ = ["ModulePort", "PackagePort", "port_package", "resolve_source", "summary", "is_model_code", "imported_names",
           "Environment", "FRAMEWORKS"]
