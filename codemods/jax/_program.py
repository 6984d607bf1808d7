"""Facts about the other files of the program a file belongs to, read from disk next to it.

A script often builds its model from a module of its own tree (``from models import *`` then
``net = ResNet18()``, ``from model import EncoderCNN``). Those files are ported by the same
``porter migrate`` run (each on its own): their model classes become NNX modules whose
constructors take ``rngs``, so the script's constructions need ``rngs=`` too (JX304). Each
file is still ported alone; this module only reads the source files an import names
(resolved as Python would from the script's folder: the folder itself for absolute imports,
the package for relative ones), parses them, and says which imported names are model
classes or model factories there. A file that cannot be found or parsed contributes
nothing. Parsed files are kept per (path, size, mtime).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import libcst as cst

from porter import astutil, localimports
from porter.context import FileContext, dotted_name, import_bindings

from . import _loop as lp

_PARSED: dict[tuple, Optional[cst.Module]] = {}
_MAX_DEPTH = 4  # star imports followed through package __init__ files


def factories(ctx: FileContext) -> frozenset:
    """Module-level functions of the file returning a construction of one of its model classes,
    or taking a required keyword-only ``rngs`` (as the module rules give factories)."""
    key = ("program.factories",)
    if key in ctx.cache:
        return ctx.cache[key]
    classes = lp.file_facts(ctx).module_classes
    found: set[str] = set()
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.FunctionDef):
            if any(p.name.value == "rngs" and p.default is None for p in stmt.params.kwonly_params):
                found.add(stmt.name.value)
                continue
            for n in astutil.walk(stmt.body):
                if isinstance(n, cst.Return) and isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Name) \
                        and n.value.func.value in classes:
                    found.add(stmt.name.value)
    ctx.cache[key] = frozenset(found)
    return ctx.cache[key]


def imported_models(ctx: FileContext) -> frozenset:
    """Names the file imports (``from m import A`` / ``from m import *``, relative or not) that
    are model classes or model factories of another file of the same tree, or whose port takes
    ``rngs`` there (:func:`rngs_callables`: a function building a model in a local variable, or
    calling another factory, gets a required ``rngs`` from that file's module rules). The
    other file is read as it is on disk, ported or not: both readings give the same names (a
    ported factory takes a required keyword-only ``rngs``), so a second migrate of the output
    tree, which reads the ported files, finds what the first one found."""
    key = ("program.imported_models",)
    if key in ctx.cache:
        return ctx.cache[key]
    out: set[str] = set(rngs_callables(ctx))
    path = Path(ctx.path) if ctx.path and not ctx.path.startswith("<") else None
    if path is not None and path.is_file():
        for stmt in ctx.module.body:
            for small in getattr(stmt, "body", ()) if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom):
                    out |= _names_from_files(small, path.parent)
                elif isinstance(small, cst.Import):
                    out |= _module_names_from_files(small, path.parent)
    ctx.cache[key] = frozenset(out)
    return ctx.cache[key]


# (folder, the import's code) -> (its names, the files it read: ((path, stamp), ...)); every
# fix pass of a file asks again, and the other files are the same while their stamps are
_FROM: dict[tuple, tuple[frozenset, tuple]] = {}
_CODE = cst.Module([])


def _names_from_files(node: cst.ImportFrom, folder: Path, of=None) -> frozenset:
    """``_names_from(node, folder)`` from a fresh start, kept while no file it looked at (the
    candidates of every import it resolved) has changed on disk."""
    key = (str(folder), _CODE.code_for_node(node), of)
    hit = _FROM.get(key)
    if hit is not None and all(localimports.stamp(p) == stamp for p, stamp in hit[1]):
        return hit[0]
    looked: list[tuple[Path, Optional[tuple[int, int]]]] = []
    names = frozenset(_names_from(node, folder, depth=0, seen={}, looked=looked, of=of))
    _FROM[key] = (names, tuple(looked))
    return names


def _names_from(node: cst.ImportFrom, folder: Path, depth: int, seen: dict, looked: Optional[list] = None,
                of=None) -> set:
    """The names ``node`` imports that ``of(module, path, ...)`` (default: model classes and
    factories) finds in the file it imports from."""
    of = of or _models_of
    target = localimports.resolve_from(node, folder, looked)
    if target is None or depth > _MAX_DEPTH:
        return set()
    if target not in seen:
        seen[target] = set()  # an import cycle sees what is known so far
        module = _parse(target)
        seen[target] = of(module, target, depth, seen, looked) if module is not None else set()
    models = seen[target]
    if isinstance(node.names, cst.ImportStar):
        return {n for n in models if not n.startswith("_")}
    got = set()
    for alias in node.names:
        name = dotted_name(alias.name)
        local = dotted_name(alias.asname.name) if alias.asname else name
        for n in models:
            if n == name or n.startswith(name + "."):  # a class and its methods (`Net.build`)
                got.add(local + n[len(name):])
    return got


def _module_names_from_files(node: cst.Import, folder: Path, of=None) -> frozenset:
    """``import model`` / ``import pkg.model as m`` of a file of the tree: the names found in that
    file (:func:`_names_from`'s ``of``), spelled through the module (``model.Net``, ``m.Net``)."""
    out: set[str] = set()
    for alias in node.names:
        full = dotted_name(alias.name)
        if full is None:
            continue
        local = dotted_name(alias.asname.name) if alias.asname else full
        # the file `import a.b` binds is the one `from a.b import *` reads
        stmt = cst.ImportFrom(module=cst.parse_expression(full), names=cst.ImportStar())
        out |= {f"{local}.{n}" for n in _names_from_files(stmt, folder, of=of)}
    return frozenset(out)


def _models_of(module: cst.Module, path: Path, depth: int, seen: dict, looked: Optional[list] = None) -> set:
    """Model classes and factories a file defines, and those it re-exports by import."""
    ctx = FileContext(module, str(path))
    names = set(lp.file_facts(ctx).module_classes) | set(factories(ctx))
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom):
                    names |= _names_from(small, path.parent, depth + 1, seen, looked)
    return names


def _parse(path: Path) -> Optional[cst.Module]:
    """The file as the JAX rules see it when it is ported: an MXNet/Gluon source through the
    front end's translation (:func:`as_ported_by_front_end`)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        try:
            module = cst.parse_module(path.read_text(encoding="utf-8"))
        except Exception:  # not Python, not UTF-8: no facts from it
            module = None
        _PARSED[key] = as_ported_by_front_end(module, str(path)) if module is not None else None
    return _PARSED[key]


def as_ported_by_front_end(module: cst.Module, path: str = "<string>") -> cst.Module:
    """``module`` as the JAX rules read it when the file itself is ported: a file importing
    MXNet is first translated to PyTorch by the front end (porter.registry), in the same run,
    so its facts (a ``HybridBlock`` subclass is a model class, a function returning a
    ``nn.Conv2D`` a factory taking ``rngs``) are those of that translation. Read from the
    original, the Gluon classes are no model classes; read from the port, they are: a file
    importing them would come out differently from a second migrate. Any other file, or one
    the front end cannot port, is read as it is."""
    if not any(v == "mxnet" or v.startswith("mxnet.") for v in FileContext(module, path).aliases.values()):
        return module
    from porter import engine, registry

    try:
        fixed = engine.fix(module.code, engine.Options(rules=registry.front_end_rules("jax")), path)
    except (engine.PorterError, RecursionError):
        return module
    return cst.parse_module(fixed.source) if fixed.changed else module


# --------------------------------------------------------------------------------------
# A package port's program-wide fact: which names of a file construct, once ported, an NNX
# module taking rngs (porter.packages computes it over the import closure; porter.program
# hands it to the rules while each module is ported)
# --------------------------------------------------------------------------------------
def rngs_callables(ctx: FileContext) -> frozenset:
    """The names of the file (``Stem``, ``L.Stem``) that refer to classes or factories of other
    modules of the program whose ported constructors take ``rngs``: the package port's fact
    (porter.program) when there is one, else the model classes and factories of the other
    files that ``from ... import`` names (read from disk next to the file)."""
    from porter import program  # the fact is set by porter.packages while it ports a module

    facts = program.current()
    if facts is not None and facts.rngs_callables is not None:
        return facts.rngs_callables
    key = ("program.rngs_callables",)
    if key in ctx.cache:
        return ctx.cache[key]
    out: set[str] = set()
    path = Path(ctx.path) if ctx.path and not ctx.path.startswith("<") else None
    if path is not None and path.is_file():
        for stmt in ctx.module.body:
            for small in getattr(stmt, "body", ()) if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom):
                    out |= _names_from_files(small, path.parent, of=_constructors_of)
                elif isinstance(small, cst.Import):
                    out |= _module_names_from_files(small, path.parent, of=_constructors_of)
    ctx.cache[key] = frozenset(out)
    return ctx.cache[key]


def _constructors_of(module: cst.Module, path: Path, depth: int, seen: dict, looked: Optional[list] = None) -> set:
    """The classes and factories of a file whose ported constructors take rngs (the module rules'
    plan of that file, given the names its own imports bring that take rngs: a factory calling
    a class of a third file takes rngs once ported, as the port of that file itself decides),
    and those it imports (re-exports)."""
    from porter import program

    from . import _nnx

    imported: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom):
                    imported |= _names_from(small, path.parent, depth + 1, seen, looked, of=_constructors_of)
    with program.facts(program.ProgramFacts(frozenset(imported))):
        plan = _nnx.RngsPlan(FileContext(module, str(path)))
        names = {c for c, cls in plan.classes.items() if plan.class_takes_rngs(cls)}
        names |= {f.name.value for f, cls in plan.functions.items() if cls is None}
        names |= {f"{c}.{m}" for c, methods in plan.class_methods().items() for m in methods}
    return names | imported


_ROUNDS = 8  # cross-module chains (a factory of a class of a subclass of ...) settle in a few


def package_rngs_callables(modules: dict) -> dict:
    """``{module name: frozenset of the names it spells}`` for a package port: ``modules`` maps
    each module of the closure to ``(cst.Module, is_package)``. Each module's own constructors
    taking rngs are what the module rules' RngsPlan decides for it, given what its imports
    bind; the plan of one module depends on the others' (a factory calling an imported class),
    so the modules are planned again until nothing changes."""
    from porter import program

    from . import _nnx

    modules = {name: (as_ported_by_front_end(mod), is_pkg) for name, (mod, is_pkg) in modules.items()}
    bindings = {name: _bindings(mod, name, is_pkg) for name, (mod, is_pkg) in modules.items()}
    own: dict[str, frozenset] = {name: frozenset() for name in modules}
    spelled: dict[str, frozenset] = {name: frozenset() for name in modules}
    for _ in range(_ROUNDS):
        spelled = {name: _spellings(bindings[name], own, modules) for name in modules}
        new = {}
        for name, (mod, _is_pkg) in modules.items():
            with program.facts(program.ProgramFacts(spelled[name])):
                ctx = FileContext(mod, "<package>")
                plan = _nnx.RngsPlan(ctx)
                names = {c for c, cls in plan.classes.items() if plan.class_takes_rngs(cls)}
                names |= {f.name.value for f, cls in plan.functions.items() if cls is None}
            # re-exported names (`from .layers import Stem` in a package's __init__)
            names |= {local for local in spelled[name] if "." not in local and local in bindings[name]}
            new[name] = frozenset(names)
        if new == own:
            break
        own = new
    return spelled


def _bindings(module: cst.Module, name: str, is_package: bool) -> dict:
    """Top-level import bindings: local name -> the absolute dotted name it is bound to."""
    package = name if is_package else name.rpartition(".")[0]
    out: dict[str, str] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            for b in import_bindings(small, package):
                out[b.local] = b.bound
    return out


def _spellings(bindings: dict, own: dict, modules: dict) -> frozenset:
    """The dotted names through which a module's bindings reach another module's constructors."""
    found: set[str] = set()
    for local, full in bindings.items():
        mod, _, attr = full.rpartition(".")
        if mod in own and attr in own[mod]:
            found.add(local)  # from pkg.layers import Stem
        for other, names in own.items():  # import pkg.layers as L; from . import layers; import pkg.layers
            if names and (other == full or other.startswith(full + ".")):
                found |= {f"{local}{other[len(full):]}.{n}" for n in names}
    return frozenset(found)
