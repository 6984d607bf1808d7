"""The top-level ``codemods/`` and ``templates/`` folders, installed as ``porter.codemods`` and
``porter.templates``. From a source checkout without installation they are loaded from the
repository folders under the same names."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def mapped_package(name: str, folder: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        src = REPO / folder
        spec = importlib.util.spec_from_file_location(name, src / "__init__.py", submodule_search_locations=[str(src)])
        if spec is None or spec.loader is None or not (src / "__init__.py").is_file():
            raise ModuleNotFoundError(f"cannot find {name} (looked in {src})") from None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


def templates_dir() -> Path:
    return Path(mapped_package("porter.templates", "templates").__path__[0])
