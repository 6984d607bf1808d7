"""What every side of a model-level verification does around its work, whatever framework
runs it: read the JSON request named on the command line, run, and write the metadata JSON
with ``ok`` — or, when the user's code (or anything else) fails, ``ok: false`` with the error
and its traceback, exit status 3. Standard library only: the MXNet side imports it in a venv
that has neither torch nor jax."""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional, Sequence


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
