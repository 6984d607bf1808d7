"""The zoo's results, one JSON file per model under ``DIR/.porter-zoo/results/``.

Each file holds the model's result and the key it was verified under (the digest of the
modules it uses, porter's version and the settings): a result is reused by ``--resume`` only
when its key is today's. Every file is written atomically as its model finishes, so an
interrupted run leaves whole results of the models it finished and nothing of the others.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from porter.sources import write_atomic
from porter.zoo.model import ModelResult

FOLDER = ".porter-zoo"


class ResultCache:
    def __init__(self, out: Path) -> None:
        self.folder = Path(out) / FOLDER / "results"

    def _path(self, name: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
        return self.folder / f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:10]}.json"

    def get(self, name: str, key: str) -> Optional[ModelResult]:
        path = self._path(name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if data.get("key") != key or data.get("result", {}).get("name") != name:
            return None
        result = ModelResult(**data["result"])
        result.cached = True
        return result

    def put(self, result: ModelResult) -> None:
        data = {"key": result.key, "result": dict(result.as_dict(), cached=False)}
        write_atomic(self._path(result.name), json.dumps(data, indent=1, default=str).encode())
