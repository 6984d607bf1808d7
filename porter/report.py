"""Renders results for people (text) and machines (json, sarif). Returns strings; prints nothing."""
from __future__ import annotations

import json
from collections import Counter
from typing import Iterable, Sequence

from porter import __version__, registry
from porter.runner import FileOutcome, FindingRecord

DOCS_URL = "https://porter.readthedocs.io/en/latest/rules/{code}.html"


def findings_of(outcomes: Iterable[FileOutcome]) -> list[FindingRecord]:
    return [f for o in outcomes for f in o.findings]


def text(outcomes: Sequence[FileOutcome]) -> str:
    lines = []
    for o in outcomes:
        for f in o.findings:
            mark = " [*]" if f.fixable and f.safety == "safe" else (" [unsafe fix]" if f.fixable else "")
            lines.append(f"{f.path}:{f.line}:{f.column + 1}: {f.code} {f.message}{mark}")
    return "\n".join(lines)


def errors(outcomes: Sequence[FileOutcome]) -> str:
    return "\n".join(f"{o.path}: error: {o.error}" for o in outcomes if o.status == "failed")


def as_json(outcomes: Sequence[FileOutcome]) -> str:
    return json.dumps(
        {
            "findings": [f.__dict__ for f in findings_of(outcomes)],
            "errors": [{"path": o.path, "error": o.error} for o in outcomes if o.status == "failed"],
            "files": len(outcomes),
        },
        indent=2,
    )


def sarif(outcomes: Sequence[FileOutcome]) -> str:
    rules = {r.code: r for r in registry.infos()}
    used = sorted({f.code for f in findings_of(outcomes)})
    level = {"error": "error", "warning": "warning", "info": "note"}
    results = [
        {
            "ruleId": f.code,
            "level": level.get(f.severity, "warning"),
            "message": {"text": f.message},
            "locations": [{
                "physicalLocation": {
                    "artifactLocation": {"uri": f.path},
                    "region": {
                        "startLine": f.line, "startColumn": f.column + 1,
                        "endLine": f.end_line, "endColumn": f.end_column + 1,
                    },
                }
            }],
        }
        for f in findings_of(outcomes)
    ]
    notifications = [
        {"level": "error", "message": {"text": f"{o.path}: {o.error}"}}
        for o in outcomes if o.status == "failed"
    ]
    doc = {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {
                "name": "porter", "version": __version__,
                "rules": [
                    {
                        "id": c, "name": rules[c].name,
                        "shortDescription": {"text": rules[c].summary},
                        "helpUri": DOCS_URL.format(code=c),
                    }
                    for c in used if c in rules
                ],
            }},
            "results": results,
            "invocations": [{"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}],
        }],
    }
    return json.dumps(doc, indent=2)


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
        "fixed": dict(sorted(fixed.items())),
        "left": dict(sorted(left.items())),
    }
