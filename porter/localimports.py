"""The files of a program's own tree that a file imports, read from disk next to it.

A script's model often lives in a module beside it (``from model import RNNModel``, ``from
models import *``). Each file is ported alone; the rules that need to know what such a module
does (the JAX rules: which imported names build NNX modules; TX203: whether it sets torch's
swap flag or builds recurrent layers) read it here: imports are resolved as Python would from
the importing file's folder (the folder itself for absolute imports, the package for relative
ones), and parsed files are kept per (path, size, mtime). A file that cannot be found, read or
parsed contributes nothing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import libcst as cst

from porter.context import dotted_name

_PARSED: dict[tuple, Optional[cst.Module]] = {}


def stamp(path: Path) -> Optional[tuple[int, int]]:
    """(size, mtime) of a file, None where it is no file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if os.path.isfile(path) else None


def resolve_from(node: cst.ImportFrom, folder: Path, looked: Optional[list] = None) -> Optional[Path]:
    """The source file of ``from <module> import ...``, as seen from a file in ``folder``
    (each candidate file looked at goes to ``looked`` with its stamp)."""
    level = len(node.relative)
    base = folder
    for _ in range(max(level - 1, 0)):
        base = base.parent
    mod = dotted_name(node.module) if node.module is not None else ""
    if mod is None:
        return None
    parts = [p for p in mod.split(".") if p]
    if not parts and level == 0:
        return None
    candidate = base.joinpath(*parts)
    for f in (candidate.with_suffix(".py") if parts else None, candidate / "__init__.py"):
        if f is None:
            continue
        if looked is not None:
            looked.append((f, stamp(f)))
        if f.is_file():
            return f.resolve()
    return None


def parse(path: Path) -> Optional[cst.Module]:
    """The file's tree as it is on disk (None where it cannot be read or parsed)."""
    st = stamp(path)
    if st is None:
        return None
    key = (str(path), *st)
    if key not in _PARSED:
        try:
            _PARSED[key] = cst.parse_module(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
            _PARSED[key] = None
    return _PARSED[key]


def imported_files(module: cst.Module, path: str, depth: int = 3) -> list[Path]:
    """The files of the tree that ``module`` (the file at ``path``) imports at its top level
    (``from m import ...``, ``from . import m``, ``import m``, ``import pkg.m``), and what those
    import in turn, up to ``depth`` levels; each once, nearest first."""
    found: dict[Path, None] = {}
    frontier = [(module, Path(path).resolve().parent)]
    for _ in range(depth):
        following = []
        for mod, folder in frontier:
            for target in _imports_of(mod, folder):
                if target not in found:
                    found[target] = None
                    parsed = parse(target)
                    if parsed is not None:
                        following.append((parsed, target.parent))
        frontier = following
    return list(found)


def _imports_of(module: cst.Module, folder: Path) -> list[Path]:
    out = []
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom):
                target = resolve_from(small, folder)
                if target is not None:
                    out.append(target)
                if small.module is None and not isinstance(small.names, cst.ImportStar):
                    # `from . import model`: the module files themselves
                    for alias in small.names:
                        name = dotted_name(alias.name)
                        sub = resolve_from(small.with_changes(module=alias.name), folder) if name else None
                        if sub is not None:
                            out.append(sub)
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    name = dotted_name(alias.name)
                    if name:
                        target = resolve_from(cst.ImportFrom(module=cst.parse_expression(name), names=cst.ImportStar()),
                                              folder)
                        if target is not None:
                            out.append(target)
    return out
