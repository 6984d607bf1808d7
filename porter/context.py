"""Per-file facts the rules share: import aliases, name resolution and the ancestor stack.

Name resolution follows imports rather than spelling (``import torch as t``, ``from torch
import cuda``, ``from torch.optim import SGD``) without LibCST's scope analysis, which costs
several times a parse: one pass over import statements, then a dictionary lookup per name.
"""
from __future__ import annotations

import builtins
from typing import Any, Iterable, Iterator, NamedTuple, Optional, Union

import libcst as cst

from porter import emitted

# The local name porter uses when it has to import a module itself.
PREFERRED_ALIASES = {
    "torch_xla.core.xla_model": "xm",
    "torch_xla.distributed.parallel_loader": "pl",
    "torch_xla.distributed.xla_multiprocessing": "xmp",
    "torch_xla.runtime": "xr",
    "torch_xla.debug.metrics": "met",
    "torch.distributed": "dist",
    "torch.utils.data.distributed": None,
    # the JAX target's names
    "jax.numpy": "jnp",
    "numpy": "np",
    "flax.nnx": "nnx",
}

_BUILTINS = frozenset(dir(builtins))


def _bound_in(fn: Union[cst.FunctionDef, cst.Lambda]) -> frozenset:
    """The names a function binds as its own: parameters, assignment / loop / with / except
    targets, nested defs and classes (``global`` / ``nonlocal`` names and the function's own
    imports excepted: an import in a function is still that import); a lambda's parameters."""
    from porter import astutil

    params = fn.params
    if isinstance(fn, cst.Lambda):
        return frozenset(p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params))
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    declared = set()
    # (exact node types: LibCST's node classes are never subclassed, and isinstance against
    # them goes through ABCMeta.__instancecheck__, most of this walk's cost)
    for node in astutil.walk(fn.body):
        kind = type(node)
        if kind not in _BINDING_KINDS:
            continue
        n: Any = node  # one of _BINDING_KINDS (told apart by ``kind`` below)
        targets: list = []
        if kind is cst.Assign:
            targets = [t.target for t in n.targets]
        elif kind is cst.AnnAssign or kind is cst.AugAssign or kind is cst.For or kind is cst.CompFor:
            targets = [n.target]
        elif kind is cst.AsName:
            targets = [n.name]
        elif kind is cst.FunctionDef or kind is cst.ClassDef:
            if n is not fn:
                names.add(n.name.value)
        elif kind is cst.Global or kind is cst.Nonlocal:
            declared |= {a.name.value for a in n.names}
        else:  # Import, ImportFrom
            declared |= {b.local for b in import_bindings(n)}
        for t in targets:
            names.update(astutil.target_names(t))
    return frozenset(names - declared)


_BINDING_KINDS = frozenset({
    cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.AsName, cst.FunctionDef, cst.ClassDef,
    cst.Global, cst.Nonlocal, cst.Import, cst.ImportFrom,
})


def dotted_name(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None (no resolution)."""
    parts: list[str] = []
    while type(node) is cst.Attribute:  # (exact types: see _bound_in)
        parts.append(node.attr.value)
        node = node.value
    if type(node) is cst.Name:
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


class ImportBinding(NamedTuple):
    """One name an import statement binds."""

    local: str  # the name bound in the file: `t` for `import torch as t`, `os` for `import os.path`
    bound: str  # the dotted name it is bound to: `torch`, `os`
    imported: str  # the dotted name imported: `torch`, `os.path`
    spelled: str  # how the file reaches `imported`: `t`, `os.path`


def import_bindings(node: cst.CSTNode, package: Optional[str] = None) -> Iterator[ImportBinding]:
    """The names an ``import`` / ``from ... import`` statement binds, in order (none for a star
    import). A relative import is resolved against ``package`` (the importing module's
    package) when one is given, else it binds nothing that is followed."""
    if isinstance(node, cst.Import):
        for alias in node.names:
            full = dotted_name(alias.name)
            if full is None:
                continue
            if alias.asname is not None:
                local = dotted_name(alias.asname.name)
                if local:
                    yield ImportBinding(local, full, full, local)
            else:
                top = full.split(".")[0]
                yield ImportBinding(top, top, full, full)
    elif isinstance(node, cst.ImportFrom):
        if isinstance(node.names, cst.ImportStar):
            return
        if node.relative:
            if package is None:
                return
            from libcst.helpers import get_absolute_module_from_package_for_import

            mod = get_absolute_module_from_package_for_import(package or None, node)
        else:
            mod = dotted_name(node.module) if node.module is not None else None
        if not mod:
            return
        for alias in node.names:
            name = dotted_name(alias.name)
            if name is None:
                continue
            local = dotted_name(alias.asname.name) if alias.asname else name
            if local:
                yield ImportBinding(local, f"{mod}.{name}", f"{mod}.{name}", local)


class FileContext:
    def __init__(self, module: cst.Module, path: str = "<string>", text: Optional[str] = None,
                 document: Optional[str] = None) -> None:
        self.module = module
        self.path = path
        self._text = text  # the code the module was parsed from, when the caller has it
        # the text a fix run (`porter migrate`) began from, in every pass; None in a check, whose
        # text is the document
        self.document = document
        # local name -> fully qualified name it is bound to by an import
        self.aliases: dict[str, str] = {}
        # fully qualified module -> local name it is imported as (``import a.b as c`` -> c)
        self.module_names: dict[str, str] = {}
        self.ancestors: list[cst.CSTNode] = []
        # per-traversal memo for rule helpers, keyed by (what, node): facts about a loop or a
        # function asked for at many nodes inside it are computed once per pass
        self.cache: dict = {}
        for stmt in _top_level_statements(module.body):
            self.add_import(stmt)

    @property
    def text(self) -> str:
        """The module's code: the text it was parsed from (LibCST gives it back byte for byte),
        or its codegen, made once, when the caller did not pass the text."""
        if self._text is None:
            self._text = self.module.code
        return self._text

    @property
    def emitted(self) -> frozenset[int]:
        """The ids of the module's top-level definitions that are porter's own rendered helpers
        (porter.emitted): the engine does not walk them, nor do rules that check statement by
        statement."""
        found = self.cache.get("emitted")
        if found is None:
            found = self.cache["emitted"] = emitted.emitted_ids(self.module)
        return found

    @property
    def fixing(self) -> bool:
        """The rules run in a fix run (`porter migrate`, engine.fix), whose findings are those
        of its last pass, once no rule has a fix left to make; not in a check."""
        return self.document is not None

    # Imports -------------------------------------------------------------------------
    def add_import(self, node: cst.CSTNode) -> None:
        for b in import_bindings(node):
            self.aliases[b.local] = b.bound
            self.module_names.setdefault(b.imported, b.spelled)

    def qualname(self, node: cst.CSTNode) -> Optional[str]:
        """The fully qualified name an expression refers to, through the file's imports.

        ``t.cuda.is_available`` with ``import torch as t`` -> ``torch.cuda.is_available``;
        a builtin -> ``builtins.print``; anything else (locals, calls, subscripts) -> None.
        """
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        full = self.aliases.get(head)
        if full is not None and self._own_name(head):
            return None  # a function's own name (`def batchify(data, bsz)` beside `import data`)
        if full is None:
            if head in _BUILTINS and not rest:
                return f"builtins.{head}"
            return None
        return f"{full}.{rest}" if rest else full

    def _own_name(self, name: str) -> bool:
        """A function (or lambda) around the current node binds ``name`` as its own (a parameter,
        an assignment, a loop or with target): there it is the function's value, not an import
        of the same name. Read from the ancestors, so that a rule run on one statement by
        itself (porter.incremental) needs nothing of the rest of the module."""
        ancestors = self.ancestors
        for at in range(len(ancestors) - 1):
            anc: Any = ancestors[at]
            kind = type(anc)
            if kind is cst.FunctionDef or kind is cst.Lambda:
                key = ("context.own_names", anc)
                own = self.cache.get(key)
                if own is None:
                    own = self.cache[key] = _bound_in(anc)
                if name in own:
                    return True
        return False

    def matches(self, node: cst.CSTNode, *names: str) -> bool:
        return self.qualname(node) in names

    def module_alias(self, module: str) -> str:
        """The expression text to reach ``module`` in this file, importing it if needed.

        Uses the file's own alias when it already imports the module; otherwise porter's
        preferred alias (``xm``, ``pl``, ``xr``...) or the full dotted name. The caller lists
        ``module`` in its Fix's ``imports`` so the engine adds the import.
        """
        if module in self.module_names:
            return self.module_names[module]
        preferred = PREFERRED_ALIASES.get(module)
        return preferred or module

    # Tree ----------------------------------------------------------------------------
    @property
    def parent(self) -> Optional[cst.CSTNode]:
        return self.ancestors[-2] if len(self.ancestors) >= 2 else None

    def enclosing(self, *types: type) -> Optional[cst.CSTNode]:
        """The innermost ancestor (excluding the current node) of one of ``types``."""
        for node in reversed(self.ancestors[:-1]):
            if isinstance(node, types):
                return node
        return None

    def inside(self, *types: type) -> bool:
        return self.enclosing(*types) is not None


def _top_level_statements(body: Iterable[cst.CSTNode]) -> Iterable[cst.CSTNode]:
    """Import statements at module level, also inside top-level if/try blocks."""
    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    yield small
        elif isinstance(stmt, (cst.If, cst.Try, cst.TryStar)):
            yield from _top_level_statements(stmt.body.body)
            for handler in getattr(stmt, "handlers", ()):
                yield from _top_level_statements(handler.body.body)
            orelse = getattr(stmt, "orelse", None)
            if isinstance(orelse, cst.If):
                yield from _top_level_statements([orelse])
            elif orelse is not None:
                yield from _top_level_statements(orelse.body.body)
