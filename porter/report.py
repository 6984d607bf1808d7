"""Renders results for people (text) and machines (json, sarif). Returns strings; prints nothing.

Positions: internally LibCST's (line 1-based, column 0-based in code points, end exclusive).
Every rendering shows 1-based columns: text ``path:line:col``, JSON ``column``/``end_column``
(end exclusive) and SARIF (``columnKind: unicodeCodePoints``). The JSON shape is documented in
docs/cli.md and versioned by ``format``; fields are only ever added within one format version.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Iterable, Optional, Sequence
from urllib.parse import quote

from porter import __version__, registry
from porter.runner import FileOutcome, FindingRecord

JSON_FORMAT = 1
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def findings_of(outcomes: Iterable[FileOutcome]) -> list[FindingRecord]:
    return [f for o in outcomes for f in o.findings]


def failed(outcomes: Iterable[FileOutcome]) -> list[FileOutcome]:
    return [o for o in outcomes if o.status == "failed"]


def python_files(outcomes: Iterable[FileOutcome]) -> list[FileOutcome]:
    return [o for o in outcomes if o.status != "copied"]


def _mark(f: FindingRecord) -> str:
    if not f.fixable:
        return ""
    return " [*]" if f.safety == "safe" else " [unsafe fix]"


def _where(f: FindingRecord) -> str:
    """``path:line:col``, or ``nb.ipynb:cell 7:line:col`` for a notebook's finding."""
    cell = f"cell {f.cell}:" if f.cell is not None else ""
    return f"{f.path}:{cell}{f.line}:{f.column + 1}"


def text(outcomes: Sequence[FileOutcome]) -> str:
    """``path:line:col: CODE message [*]`` (``path:cell N:line:col`` in a notebook), one
    finding a line."""
    return "\n".join(f"{_where(f)}: {f.code} {f.message}{_mark(f)}" for f in findings_of(outcomes))


def _json_finding(f: FindingRecord, names: dict[str, str]) -> dict:
    doc = {
        "path": f.path,
        "code": f.code,
        "rule": names.get(f.code, ""),
        "message": f.message,
        "severity": f.severity,
    }
    if f.cell is not None:
        doc["cell"] = f.cell
    doc.update({
        "line": f.line,
        "column": f.column + 1,
        "end_line": f.end_line,
        "end_column": f.end_column + 1,
        "fixable": f.fixable,
        "fix_safety": f.safety,
    })
    return doc


def errors(outcomes: Sequence[FileOutcome]) -> str:
    """``path: error: message``, one failed file a line."""
    return "\n".join(f"{o.path}: error: {_one_line(o.error)}" for o in failed(outcomes))


def _one_line(message: str) -> str:
    return " ".join(message.split()) if "\n" in message or "\r" in message else message


def _rule_names() -> dict[str, str]:
    try:
        return {r.code: r.name for r in registry.infos()}
    except registry.RegistryError:
        return {}


def as_json(outcomes: Sequence[FileOutcome], target: Optional[str] = None) -> str:
    """The `porter check --format json` document (format 1, see docs/cli.md)."""
    names = _rule_names()
    found = findings_of(outcomes)
    bad = failed(outcomes)
    doc = {
        "porter": {"version": __version__, "format": JSON_FORMAT},
        "target": target,
        "files": len(python_files(outcomes)),
        "findings": [_json_finding(f, names) for f in found],
        "errors": [{"path": o.path, "message": _one_line(o.error)} for o in bad],
        "summary": {
            "findings": len(found),
            "fixable": sum(1 for f in found if f.fixable and f.safety == "safe"),
            "files_with_findings": len({f.path for f in found}),
            "errors": len(bad),
            "by_rule": dict(sorted(Counter(f.code for f in found).items())),
        },
    }
    return _dump(doc)


def _valid_text(value):
    """``value`` (a JSON document) with every string valid Unicode: a file name's bytes that
    are not UTF-8 (held as lone surrogates, Python's surrogateescape) written ``\\xff``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_text(v) for v in value]
    return value


def _dump(doc: dict) -> str:
    return json.dumps(_valid_text(doc), indent=2, ensure_ascii=False)


def _artifact(path: str) -> dict:
    """A SARIF artifactLocation: relative to %SRCROOT% (the working folder) when possible.
    The URI percent-encodes the name's bytes (also those that are not UTF-8)."""
    raw = os.fsencode(path)
    if os.path.isabs(path):
        return {"uri": "file://" + quote(raw)}
    return {"uri": quote(os.fsencode(PurePosixPath(Path(path).as_posix()).as_posix())), "uriBaseId": "%SRCROOT%"}


def _region(f: FindingRecord) -> dict:
    if f.file_region is not None:
        line, col, end_line, end_col = f.file_region
        if (end_line, end_col) <= (line, col):
            end_line, end_col = line, col + 1
        return {"startLine": line, "startColumn": col + 1, "endLine": end_line, "endColumn": end_col + 1}
    return {
        "startLine": max(1, f.line), "startColumn": f.column + 1,
        "endLine": max(1, f.end_line), "endColumn": f.end_column + 1,
    }


def sarif(outcomes: Sequence[FileOutcome]) -> str:
    """A SARIF 2.1.0 log with one run: the rules that fired, one result per finding, one
    tool-execution notification per file that could not be processed."""
    infos = {r.code: r for r in registry.infos()}
    found = findings_of(outcomes)
    used = sorted({f.code for f in found})
    index = {c: i for i, c in enumerate(used)}
    rules = []
    for c in used:
        info = infos.get(c)
        rule: dict = {"id": c}
        if info is not None:
            rule.update({
                "name": info.name,
                "shortDescription": {"text": info.summary},
                "fullDescription": {"text": info.doc or info.summary},
                "help": {"text": f"Run `porter explain {c}` for the rule's documentation and examples."},
                "defaultConfiguration": {"level": _SARIF_LEVEL.get(info.severity.value, "warning")},
            })
        rules.append(rule)
    results = []
    for f in found:
        properties: dict = {"fixable": f.fixable, "fixSafety": f.safety}
        location: dict = {
            "physicalLocation": {
                "artifactLocation": _artifact(f.path),
                "region": _region(f),
            }
        }
        if f.cell is not None:
            # a notebook: the region is in the .ipynb's JSON text (the string holding the
            # line); the cell and the place in it go with the location
            location["logicalLocations"] = [{"name": f"cell {f.cell}", "kind": "module"}]
            location["properties"] = {"cell": f.cell, "cellLine": f.line, "cellColumn": f.column + 1,
                                      "cellEndLine": f.end_line, "cellEndColumn": f.end_column + 1}
            properties.update({"cell": f.cell})
        results.append({
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": _SARIF_LEVEL.get(f.severity, "warning"),
            "message": {"text": f"{f.message} (cell {f.cell}, line {f.line})" if f.cell is not None else f.message},
            "locations": [location],
            "properties": properties,
        })
    notifications = [
        {
            "level": "error",
            "message": {"text": f"{o.path}: {_one_line(o.error)}"},
            "locations": [{"physicalLocation": {"artifactLocation": _artifact(o.path)}}],
        }
        for o in failed(outcomes)
    ]
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "porter",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": rules,
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": "file://" + quote(os.fsencode(os.getcwd())).rstrip("/") + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": results,
            "invocations": [{
                "executionSuccessful": not notifications,
                "toolExecutionNotifications": notifications,
            }],
        }],
    }
    return _dump(doc)


def summary(outcomes: Sequence[FileOutcome]) -> dict:
    status = Counter(o.status for o in outcomes)
    fixed: Counter[str] = Counter()
    for o in outcomes:
        for code, n in o.fixed:
            fixed[code] += n
    left = Counter(f.code for f in findings_of(outcomes))
    return {
        "changed": status.get("changed", 0),
        "unchanged": status.get("unchanged", 0),
        "failed": status.get("failed", 0),
        "copied": status.get("copied", 0),
        "fixed": dict(sorted(fixed.items())),
        "left": dict(sorted(left.items())),
    }
