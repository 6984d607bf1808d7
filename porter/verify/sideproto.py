"""What every side of a model-level verification does the same way, whatever framework runs
it: read the JSON request named on the command line, run, and write the metadata JSON with
``ok`` — or, when the user's code (or anything else) fails, ``ok: false`` with the error and
its traceback, exit status 3; load the user's file; name the arrays of a model's outputs.
Standard library only: the MXNet side imports it in a venv that has neither torch nor jax."""
from __future__ import annotations

import json
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Sequence


def record(meta_path: str, run: Callable[[], dict]) -> int:
    """Run ``run()`` and write its metadata (or the failure) to ``meta_path``; the exit status."""
    try:
        meta = run()
        meta["ok"] = True
    except BaseException as exc:  # report every failure of the user's code, with its traceback
        meta = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        Path(meta_path).write_text(json.dumps(meta))
        sys.stderr.write(meta["traceback"])
        return 3
    Path(meta_path).write_text(json.dumps(meta))
    return 0


def main(run: Callable[[dict], dict], argv: Optional[Sequence[str]] = None) -> None:
    """``python -m porter.verify.side_X REQUEST.json``: the request's ``run``, recorded."""
    request = json.loads(Path((sys.argv[1:] if argv is None else argv)[0]).read_text())
    sys.exit(record(request["meta"], lambda: run(request)))


def load_namespace(path: str) -> dict:
    """The user's file as a module namespace (its ``__main__`` block does not run), with its
    folder importable as when it runs."""
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return runpy.run_path(path, run_name="__porter_verify__")


def flatten(obj: Any, is_array: Callable[[Any], bool], prefix: str = "") -> list[tuple[str, Any]]:
    """The arrays in a model's output (nested tuples, lists, dicts, named tuples), each named
    by its path (``"0"``, ``"1.logits"``): the same names on every side, whatever framework."""
    out: list[tuple[str, Any]] = []
    if is_array(obj):
        out.append((prefix, obj))
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            out += flatten(item, is_array, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(obj, dict):
        for k, item in obj.items():
            out += flatten(item, is_array, f"{prefix}.{k}" if prefix else str(k))
    elif hasattr(obj, "_asdict"):
        out += flatten(obj._asdict(), is_array, prefix)
    return out


def as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
