"""Discovers the rules: every module under ``codemods/<target>/`` defines its Rule classes.

The rule file is the single source of truth; a rule module that fails to import is an error,
never a silently missing rule. Codes are unique across all targets.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from typing import Callable

from porter._layout import mapped_package
from porter.rules import Rule, RuleInfo

TARGETS = ("torch-xla", "jax", "torch")
_PACKAGES = {
    "torch-xla": "porter.codemods.torch_xla",
    "jax": "porter.codemods.jax",
    "torch": "porter.codemods.gluon",  # MXNet/Gluon sources -> plain (GPU-style) PyTorch
}
# Rule sets a target runs together with its own: an MXNet/Gluon source is first translated to
# PyTorch by the "torch" rules, and the target's rules take it from there, in the same
# fix-until-nothing-changes loop (each pass re-reads the text the previous pass produced).
_FRONT_ENDS = {"torch-xla": ("torch",), "jax": ("torch",)}
FRONT_END_TARGETS = frozenset(t for fronts in _FRONT_ENDS.values() for t in fronts)


class RegistryError(Exception):
    pass


@lru_cache(maxsize=None)
def rules_for(target: str) -> tuple[type[Rule], ...]:
    """Every rule a run for ``target`` uses: its own and those of its front ends."""
    return tuple(sorted(own_rules(target) + front_end_rules(target), key=lambda r: r.code))


@lru_cache(maxsize=None)
def front_end_rules(target: str) -> tuple[type[Rule], ...]:
    """The rules of ``target``'s front ends alone (an MXNet/Gluon source -> PyTorch): what a
    source is translated with before ``target``'s own rules read it."""
    return tuple(sorted((r for front in _FRONT_ENDS.get(target, ()) for r in own_rules(front)), key=lambda r: r.code))


@lru_cache(maxsize=None)
def own_rules(target: str) -> tuple[type[Rule], ...]:
    """The rules defined under ``codemods/<target's package>/``."""
    if target not in _PACKAGES:
        raise RegistryError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    mapped_package("porter.codemods", "codemods")
    package = importlib.import_module(_PACKAGES[target])
    found: list[type[Rule]] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        name = f"{package.__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise RegistryError(f"rule module {name} failed to import: {exc}") from exc
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == name:
                if getattr(obj, "target", None) != target:
                    raise RegistryError(f"{obj.__name__} in {name} declares target {getattr(obj, 'target', None)!r}, not {target!r}")
                found.append(obj)
    seen: dict[str, type[Rule]] = {}
    for rule in found:
        if rule.code in seen:
            raise RegistryError(f"rule code {rule.code} used by both {seen[rule.code].__name__} and {rule.__name__}")
        seen[rule.code] = rule
    return tuple(sorted(found, key=lambda r: r.code))


def all_rules() -> tuple[type[Rule], ...]:
    return tuple(r for t in TARGETS for r in own_rules(t))


def generated_docs() -> dict[str, Callable[[], str]]:
    """Documents a target package renders from its own tables: path under docs/ -> renderer.
    A target's package declares them as ``GENERATED_DOCS = {"name.md": "module:function"}``
    (read here, so that porter.docs writes and checks every generated page without importing
    the rules' helpers itself)."""
    mapped_package("porter.codemods", "codemods")
    found: dict[str, Callable[[], str]] = {}
    for target in TARGETS:
        package = importlib.import_module(_PACKAGES[target])
        for name, where in getattr(package, "GENERATED_DOCS", {}).items():
            module, _, function = where.partition(":")
            found[name] = getattr(importlib.import_module(module), function)
    return found


def find(code: str) -> type[Rule]:
    for rule in all_rules():
        if rule.code.upper() == code.upper() or rule.name == code:
            return rule
    raise RegistryError(f"no rule {code!r}; `porter rules` lists them")


def select(target: str, select: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> tuple[type[Rule], ...]:
    """Rules of ``target`` enabled by select/ignore (codes or code prefixes, e.g. ``TX4``)."""
    chosen = []
    for rule in rules_for(target):
        if select:
            on = any(rule.code.startswith(s.upper()) or rule.name == s for s in select)
        else:
            on = rule.default_enabled
        if any(rule.code.startswith(i.upper()) or rule.name == i for i in ignore):
            on = False
        if on:
            chosen.append(rule)
    return tuple(chosen)


def infos(target: str | None = None) -> list[RuleInfo]:
    rules = own_rules(target) if target else all_rules()
    return [RuleInfo.of(r) for r in rules]
