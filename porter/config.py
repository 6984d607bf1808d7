"""``[tool.porter]`` in pyproject.toml: select, ignore, target, unsafe-fixes, time-limit,
memory-limit."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

KEYS = {"select", "ignore", "target", "unsafe-fixes", "time-limit", "memory-limit"}


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    target: Optional[str] = None
    unsafe_fixes: bool = False
    source: Optional[Path] = None
    time_limit: Optional[float] = None  # seconds a file may take (0: no limit)
    memory_limit: Optional[int] = None  # MB a file may use (0: no limit)


def find_pyproject(start: Path) -> Optional[Path]:
    start = start.resolve()
    for folder in [start, *start.parents] if start.is_dir() else [start.parent, *start.parent.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load(start: Path) -> Config:
    path = find_pyproject(start)
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    section = data.get("tool", {}).get("porter")
    if section is None:
        return Config(source=path)
    unknown = set(section) - KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown [tool.porter] keys: {', '.join(sorted(unknown))} (known: {', '.join(sorted(KEYS))})")

    def codes(key: str) -> tuple[str, ...]:
        value = section.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: [tool.porter] {key} must be a list of rule codes")
        return tuple(value)

    target = section.get("target")
    if target is not None and not isinstance(target, str):
        raise ConfigError(f"{path}: [tool.porter] target must be a string")
    unsafe = section.get("unsafe-fixes", False)
    if not isinstance(unsafe, bool):
        raise ConfigError(f"{path}: [tool.porter] unsafe-fixes must be true or false")
    limits = {}
    for key, kind in (("time-limit", float), ("memory-limit", int)):
        value = section.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (kind is int and value != int(value)):
            what = "a number of seconds" if kind is float else "a whole number of MB"
            raise ConfigError(f"{path}: [tool.porter] {key} must be {what}, 0 or more (0: no limit)")
        limits[key.replace("-", "_")] = kind(value)
    return Config(codes("select"), codes("ignore"), target, unsafe, path, **limits)
