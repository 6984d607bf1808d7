"""Facts about the whole program a file is ported with, for the rules that port one file at a time.

``porter.packages.port_package`` knows every module of the package's import closure before it
ports any of them. While it ports one module it sets here what the target's rules need to know
about the others (``with program.facts(...)``); a rule reads it with :func:`current`. Outside a
package port (``porter migrate FILE``, the LSP) there are no program facts: :func:`current` is
None and the rules fall back on what they can read themselves.

The facts are plain data (picklable: a package port's worker processes get them with their task):

- ``rngs_callables``: the names of the file (as it spells them: ``Stem``, ``L.Stem``,
  ``blocks.Stage``) that refer to classes or factory functions of other modules of the program
  which the JAX port turns into constructors taking ``rngs`` (torch module classes become
  ``nnx.Module`` classes whose ``__init__`` takes ``*, rngs: nnx.Rngs``; the functions that
  build them take it too). None: not known here (the rules read the files next to the one
  they port, see codemods/jax/_program.py).
- ``ported_libraries``: the model code of installed libraries ported along with the program
  (``porter migrate --with torchvision --to jax``: an overlay package beside the scripts, see
  porter.packages), as ``(module, names)`` pairs: the names a script reaches through that
  module (``torchvision.models`` -> ``resnet18``, ``ResNet``...) build NNX modules and take
  ``rngs`` in the port, so they are no torch library's models there.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Optional


@dataclass(frozen=True)
class ProgramFacts:
    rngs_callables: Optional[frozenset] = None
    ported_libraries: tuple = ()


_CURRENT: ContextVar[Optional[ProgramFacts]] = ContextVar("porter_program_facts", default=None)


@contextmanager
def facts(value: Optional[ProgramFacts]) -> Iterator[None]:
    """The program facts of the module being ported, for the duration of the block."""
    token = _CURRENT.set(value)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Optional[ProgramFacts]:
    return _CURRENT.get()


def ported_library(qualname: str, whole_module: bool = False) -> bool:
    """Whether ``qualname`` (``torchvision.models.resnet18``) names a constructor of library
    model code the program's port holds; ``whole_module``: whether it names such a module itself
    (``torchvision.models``, for ``models.__dict__[name]``)."""
    facts = _CURRENT.get()
    if facts is None or not qualname:
        return False
    module, _, last = qualname.rpartition(".")
    for prefix, names in facts.ported_libraries:
        if whole_module and qualname == prefix:
            return True
        if not whole_module and module == prefix and last in names:
            return True
    return False


def under_ported_library(qualname: str) -> bool:
    """Whether ``qualname`` lies in a module of library model code the program's port holds."""
    facts = _CURRENT.get()
    return facts is not None and bool(qualname) and any(
        qualname == prefix or qualname.startswith(prefix + ".") for prefix, _ in facts.ported_libraries)
