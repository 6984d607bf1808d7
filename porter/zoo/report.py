"""The zoo's results as JSON, text and an HTML dashboard (templates/zoo_report.html.j2).

``top_blockers`` ranks what stops models: each manual finding (rule, module and line) and each
error cause (the first line of a failing side's error, or a porting error) by how many models
it blocks.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import jinja2

from porter._layout import templates_dir
from porter.zoo.model import STATUSES

TOP = 20
_ADDRESS = re.compile(r"0x[0-9a-f]+|\b\d+(\.\d+)?\b")


def _cause(error: dict) -> str:
    text = (error.get("error") or error.get("cause") or "").strip().splitlines()
    first = text[-1] if text and text[0].startswith("Traceback") else (text[0] if text else "")
    return f"{error.get('side', '?')}: {first[:200]}"


def blockers_of(result) -> list[tuple[str, str]]:
    """(kind, what) of everything that blocks RESULT (none for a verified model)."""
    if result.status == "verified":
        return []
    out = [("finding", f"{b['code']} at {b['module']}:{b['line']}: {b['message']}") for b in result.blockers]
    if result.status in ("port-failed", "original-failed", "timeout"):
        out += [("error", _cause(e)) for e in result.errors]
    elif result.status == "mismatch" and result.first_divergence:
        out.append(("mismatch", f"first divergence at {result.first_divergence.get('where', '?')}"))
    elif result.status == "over-budget" and result.health:
        out += [("health", _ADDRESS.sub("N", p)) for p in result.health.get("problems", [])]
    return list(dict.fromkeys(out))


def top_blockers(results, top: int = TOP) -> list[dict]:
    counts: Counter = Counter()
    models = defaultdict(list)
    for r in results:
        for b in blockers_of(r):
            counts[b] += 1
            models[b].append(r.name)
    return [{"kind": kind, "what": what, "models": n, "examples": sorted(models[(kind, what)])[:5]}
            for (kind, what), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]


def summary(run) -> dict:
    counts = Counter(r.status for r in run.results)
    return {"package": run.package, "target": run.target, "registry": run.registry, "total": len(run.results),
            "counts": {s: counts.get(s, 0) for s in STATUSES}, "cached": sum(1 for r in run.results if r.cached),
            "seconds": run.seconds, "top_blockers": top_blockers(run.results), "skipped_modules": run.skipped}


def as_json(run) -> str:
    return json.dumps(run.as_dict(), indent=2, default=str)


def as_html(run) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=True)
    data = run.as_dict()
    return env.get_template("zoo_report.html.j2").render(models=data["models"], s=data["summary"], statuses=STATUSES)


def as_text(run) -> str:
    s = summary(run)
    width = max((len(r.name) for r in run.results), default=10)
    lines = [f"porter zoo {s['package']} --to {s['target']}: {s['total']} models ({s['registry']}), {s['seconds']:.0f} s"]
    for r in sorted(run.results, key=lambda r: r.name):
        lines.append(f"  {r.name:<{width}}  {r.status:<15}  {r.seconds:7.1f} s  {r.summary[:160]}")
    lines.append("  " + ", ".join(f"{n} {k}" for k, n in s["counts"].items() if n))
    if s["top_blockers"]:
        lines.append("top blockers:")
        lines += [f"  {b['models']:4d}  {b['kind']}: {b['what'][:160]}" for b in s["top_blockers"][:10]]
    return "\n".join(lines)
