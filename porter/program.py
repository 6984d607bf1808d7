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
  build them take it too).
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Optional


@dataclass(frozen=True)
class ProgramFacts:
    rngs_callables: frozenset = frozenset()


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
