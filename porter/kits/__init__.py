"""Run kits: what it takes to run a port on a TPU, written out as files the user runs.

``porter kit colab`` writes a Colab notebook (porter.kits.colab), ``porter kit tpu-vm`` shell
scripts for a Cloud TPU VM (porter.kits.tpu_vm). Both take their versions from
porter.platforms and their text from ``templates/kit_*.j2``.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import jinja2

from porter._layout import templates_dir
from porter.platforms import PROFILES

_MAGIC = re.compile(r"^\s*[!%]")


class KitError(Exception):
    """The kit cannot be written as asked (bad port, unknown accelerator, bad --data)."""


@dataclass(frozen=True)
class Port:
    path: Path
    target: str
    kind: str  # "script" | "notebook"
    code: str  # the script's text, or the notebook's code cells joined (magics left out)
    cells: tuple[str, ...] = ()  # a notebook's code cells, as they are


def _notebook_cells(path: Path) -> tuple[str, ...]:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KitError(f"{path}: not a readable notebook ({exc})") from None
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            cells.append("".join(src) if isinstance(src, list) else str(src))
    return tuple(cells)


def python_of(cells: tuple[str, ...]) -> str:
    """The cells' Python with IPython magics and shell lines blanked (line numbers kept)."""
    return "\n".join("\n".join("" if _MAGIC.match(line) else line for line in c.splitlines()) for c in cells)


def imported_modules(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise KitError(f"the port does not parse (line {exc.lineno}: {exc.msg})") from None
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
    return mods


def detect_target(code: str) -> Optional[str]:
    """torch-xla when the code imports torch_xla, jax when it imports jax/flax/optax (and not
    torch_xla); None for neither."""
    mods = imported_modules(code)
    if "torch_xla" in mods:
        return "torch-xla"
    if mods & {"jax", "flax", "optax"}:
        return "jax"
    return None


def load_port(path: Path, target: Optional[str] = None) -> Port:
    if not path.is_file():
        raise KitError(f"{path}: no such file")
    if target is not None and target not in PROFILES:
        raise KitError(f"unknown target {target!r}; choose {' or '.join(PROFILES)}")
    if path.suffix == ".ipynb":
        cells = _notebook_cells(path)
        code, kind = python_of(cells), "notebook"
    else:
        try:
            code = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KitError(f"{path}: cannot read the port ({exc})") from None
        cells, kind = (), "script"
    found = detect_target(code)
    if target is None:
        if found is None:
            raise KitError(f"{path} imports neither torch_xla nor jax: is it a port? "
                           "(`porter migrate --to torch-xla|jax` writes one; or give --target)")
        target = found
    return Port(path, target, kind, code, cells)


def check_data(data: Optional[str], allowed: tuple[str, ...]) -> Optional[str]:
    """``gs://bucket[/prefix]`` or ``drive:PATH`` (where allowed), normalized; else KitError."""
    if not data:
        return None
    if data.startswith("gs://"):
        bucket = data[5:].split("/")[0]
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]", bucket):
            raise KitError(f"--data {data}: {bucket!r} is not a Cloud Storage bucket name")
        return data.rstrip("/")
    if data.startswith("drive:") and "drive" in allowed:
        if not data[6:]:
            raise KitError("--data drive:PATH needs a path inside My Drive")
        return data
    raise KitError(f"--data {data}: give {' or '.join(('gs://BUCKET/PREFIX', 'drive:PATH')[:len(allowed)])}")


def environment(autoescape: bool = False) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())), keep_trailing_newline=True,
        autoescape=autoescape, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
