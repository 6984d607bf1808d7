"""How fast is `porter lsp` on a large file, next to LibCST's bare parse of the same file?

The document: the torch_xla fixtures' code joined into one module of about 3,000 lines (their
imports once at the top; their functions and classes copied as often as needed, each copy
renamed ``name_<k>`` with every use in the copy). Measured in this one run, on the same text:

  1. bare      LibCST ``parse_module`` of the document (best and median of --repeat)
  2. check     ``engine.check`` in this process (the same work as `porter check`)
  3. open      the same server: didOpen -> publishDiagnostics (a first, full check)
  4. diagnostics  a real server (``python -m porter lsp --debounce-ms 0``, over stdio, driven
               by pygls' client): time from sending a didChange to receiving the
               publishDiagnostics of that version, for --changes edits: each adds one
               statement line inside the body of a function (spread over the document),
               as typing does; the server checks incrementally (porter.incremental)
  5. incremental  the same edits checked in this process by ``porter.incremental.Document``
               (no protocol): what the server's worker does for each change
  6. code actions  latency of textDocument/codeAction at each diagnostic (the diagnostic in
               the context, as an editor sends it), on a checked version: p50, p95, max
  7. resolve   codeAction/resolve of "fix all" and of one quick-fix offered for resolve
               (a fix that removes imports), once each

The debounce (150 ms by default in editors' use) is set to 0 here: it is a wait, not work,
and comes on top of the diagnostics time. Targets: diagnostics within 1.5x the bare parse;
code actions under 50 ms at the 95th percentile. The JSON goes to
benchmarks/results/bench_lsp.json.

    .venv/bin/python benchmarks/bench_lsp.py
    .venv/bin/python benchmarks/bench_lsp.py --lines 3000 --changes 5 --no-resolve
    .venv/bin/python benchmarks/bench_lsp.py --target jax --lines 1000 --changes 5 --no-resolve

``--target jax`` checks the same kind of document with the JAX rules (the server reads the
target from a ``[tool.porter]`` pyproject.toml written beside the document); its JSON goes to
benchmarks/results/bench_lsp_jax.json unless --out says otherwise.

This is a measurement, not a test: it asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import libcst as cst

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from porter import engine  # noqa: E402
from porter.runner import Settings  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "bench_lsp.json"
FIXTURES = REPO / "fixtures" / "torch_xla"


def build_document(lines: int = 3000) -> str:
    """About ``lines`` lines of fixture code as one module (see the module docstring)."""
    imports: dict[str, None] = {}
    bodies: list[tuple[list[cst.BaseStatement], list[str]]] = []
    for path in sorted(FIXTURES.glob("*/train.py")):
        module = cst.parse_module(path.read_text(encoding="utf-8"))
        rest = []
        for i, stmt in enumerate(module.body):
            if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
                code = module.code_for_node(stmt.with_changes(leading_lines=())).strip()
                if "__future__" not in code:
                    imports[code] = None
            elif i == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) \
                    and isinstance(stmt.body[0].value, cst.SimpleString):  # the docstring
                continue
            else:
                rest.append(stmt)
        names = [s.name.value for s in rest if isinstance(s, (cst.FunctionDef, cst.ClassDef))]
        bodies.append((rest, names))
    head = '"""A large module made of porter\'s fixtures, for benchmarks/bench_lsp.py."""\n' + "\n".join(imports) + "\n"
    parts = [head]
    total = head.count("\n")
    k = 0
    full = False
    while not full:
        rest, names = bodies[k % len(bodies)]
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None
        for stmt in rest:
            code = cst.Module([]).code_for_node(stmt)
            if pattern is not None:
                code = pattern.sub(lambda m: f"{m.group(1)}_{k}", code)
            n = code.count("\n")
            if total + n > lines and total >= lines * 0.97:
                full = True  # stop at a statement boundary close to the size asked for
                break
            parts.append(code)
            total += n
            if total >= lines:
                full = True
                break
        k += 1
    return "".join(parts)


def function_edits(text: str, count: int) -> list[tuple[int, str]]:
    """``count`` one-line edits inside functions spread over ``text``: (0-based line, the line
    to insert there), each a new statement before the first plain statement of a top-level
    function's body, at its indentation; for applying in order."""
    module = cst.parse_module(text)
    positions = engine.node_positions(module)
    spots = []
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and isinstance(stmt.body, cst.IndentedBlock):
            first = next((s for s in stmt.body.body if isinstance(s, cst.SimpleStatementLine)), None)
            if first is not None:
                spots.append(positions[first].start)
    chosen = [spots[(i * len(spots)) // count + len(spots) // (2 * count)] for i in range(count)]
    # applied one after the other: each insertion moves the later spots down a line
    return [(pos.line - 1 + i, " " * pos.column + f"edited_{i} = {i}\n") for i, pos in enumerate(chosen)]


def apply_edit(text: str, line: int, new_line: str) -> str:
    lines = text.splitlines(keepends=True)
    lines.insert(line, new_line)
    return "".join(lines)


def time_incremental(text: str, edits: list[tuple[int, str]], target: str = "torch-xla") -> tuple[float, list[float], list]:
    """The first check and each edit's check by porter.incremental in this process; the
    result of each edit is compared with engine.check (it must be equal)."""
    from porter import incremental

    options = Settings(target).options()
    doc = incremental.Document(options.rules)
    t0 = time.perf_counter()
    doc.check(text)
    first = time.perf_counter() - t0
    out, info = [], []
    for line, new_line in edits:
        text = apply_edit(text, line, new_line)
        t0, c0 = time.perf_counter(), time.process_time()
        got = doc.check(text)
        out.append(time.perf_counter() - t0)
        info.append({"cpu_seconds": time.process_time() - c0, "reparsed_statements": got.reparsed, "rules_per_statement": got.rules_local,
                     "rules_module_wide": got.rules_module_wide, "statements_checked": got.statements_run})
        want = engine.check(text, options).findings
        if [(f.code, f.message, f.position) for f in got.findings] != [(f.code, f.message, f.position) for f in want]:
            raise SystemExit("incremental findings differ from engine.check: a bug")
    return first, out, info


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def time_parse(text: str, repeat: int, cpu: Optional[list[float]] = None) -> list[float]:
    """Wall-clock seconds of each bare parse; with ``cpu``, the CPU seconds of each appended
    to it (on a shared machine the CPU time is the steadier measure)."""
    out = []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        cst.parse_module(text)
        out.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return out


def time_check(text: str, repeat: int, target: str = "torch-xla") -> tuple[list[float], int]:
    options = Settings(target).options()
    out = []
    n = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = len(engine.check(text, options).findings)
        out.append(time.perf_counter() - t0)
    return out, n


async def drive_server(text: str, path: Path, changes: int, max_actions: int, resolve: bool) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    client = LanguageClient("bench-lsp", "1")
    published: dict[tuple[str, int], tuple[float, list]] = {}
    arrived = asyncio.Event()

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
        published[(params.uri, params.version)] = (time.perf_counter(), list(params.diagnostics))
        arrived.set()

    async def wait_for(uri: str, version: int, timeout: float = 600) -> tuple[float, list]:
        # woken by the notification (no polling loop taking CPU from the server meanwhile);
        # the time is taken when the notification is handled
        deadline = time.perf_counter() + timeout
        while (uri, version) not in published:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"no diagnostics for version {version}")
            arrived.clear()
            if (uri, version) in published:
                break
            try:
                await asyncio.wait_for(arrived.wait(), left)
            except asyncio.TimeoutError:
                pass
        return published[(uri, version)]

    await client.start_io(sys.executable, "-m", "porter", "lsp", "--debounce-ms", "0")
    caps = types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(code_action=types.CodeActionClientCapabilities(
            resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"]))),
        workspace=types.WorkspaceClientCapabilities(workspace_edit=types.WorkspaceEditClientCapabilities(document_changes=True)),
    )
    await client.initialize_async(types.InitializeParams(capabilities=caps, root_uri=path.parent.as_uri()))
    client.initialized(types.InitializedParams())
    uri = path.as_uri()
    t0 = time.perf_counter()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    t1, diags = await wait_for(uri, 1)
    open_seconds = t1 - t0

    # one statement added inside a function, at spots spread over the document
    change_seconds = []
    version = 1
    for at, new_line in function_edits(text, changes):
        version += 1
        edit = types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=at, character=0), end=types.Position(line=at, character=0)),
            text=new_line)
        text = apply_edit(text, at, new_line)
        t0 = time.perf_counter()
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version), content_changes=[edit]))
        t1, diags = await wait_for(uri, version)
        change_seconds.append(t1 - t0)

    # code actions at every diagnostic of the last version (or an even sample of them)
    step = max(1, len(diags) // max_actions)
    sample = diags[::step][:max_actions]
    action_seconds = []
    to_resolve = []
    fix_all = None
    for d in sample:
        t0 = time.perf_counter()
        result = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=d.range,
            context=types.CodeActionContext(diagnostics=[d])))
        action_seconds.append(time.perf_counter() - t0)
        for a in result or []:
            if isinstance(a, types.CodeAction) and a.edit is None:
                if a.kind == "source.fixAll.porter":
                    fix_all = fix_all or a
                else:
                    to_resolve.append(a)
    resolved = {}
    if resolve:
        for name, action in (("fix_all", fix_all), ("quick_fix_removing_imports", to_resolve[0] if to_resolve else None)):
            if action is None:
                continue
            t0 = time.perf_counter()
            await client.code_action_resolve_async(action)
            resolved[name] = {"seconds": time.perf_counter() - t0, "title": action.title}
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "open_seconds": open_seconds,
        "diagnostics": len(diags),
        "change_seconds": change_seconds,
        "code_actions": len(sample),
        "code_action_seconds": action_seconds,
        "quick_fixes_left_for_resolve": len(to_resolve),
        "resolve": resolved,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=3000, help="size of the document")
    ap.add_argument("--repeat", type=int, default=5, help="runs of the bare parse and of engine.check")
    ap.add_argument("--changes", type=int, default=5, help="didChange round trips timed")
    ap.add_argument("--actions", type=int, default=200, help="code action requests timed (at most)")
    ap.add_argument("--no-resolve", dest="resolve", action="store_false", help="skip timing codeAction/resolve")
    ap.add_argument("--target", default="torch-xla", choices=("torch-xla", "jax"), help="the rules checked")
    ap.add_argument("--out", type=Path, default=None, help="where the JSON goes")
    args = ap.parse_args()
    if args.out is None:
        args.out = RESULTS if args.target == "torch-xla" else RESULTS.with_name("bench_lsp_jax.json")

    text = build_document(args.lines)
    n_lines = text.count("\n")
    load_start = [round(x, 2) for x in os.getloadavg()]
    Settings(args.target).options()  # import the rules before timing
    print(f"document: {n_lines} lines, {len(text)} characters (fixtures/torch_xla joined, renamed copies); target {args.target}", flush=True)

    parse_cpu: list[float] = []
    parse = time_parse(text, args.repeat, parse_cpu)
    print(f"  bare LibCST parse        best {min(parse) * 1000:7.0f} ms  median {statistics.median(parse) * 1000:7.0f} ms", flush=True)
    check, n_findings = time_check(text, args.repeat, args.target)
    print(f"  engine.check             best {min(check) * 1000:7.0f} ms  median {statistics.median(check) * 1000:7.0f} ms  ({n_findings} findings)", flush=True)
    inc_first, inc, inc_info = time_incremental(text, function_edits(text, args.changes), args.target)
    print(f"  incremental: first check {inc_first * 1000:7.0f} ms; an edit in a function  best {min(inc) * 1000:7.0f} ms  median {statistics.median(inc) * 1000:7.0f} ms"
          f"  (equal to engine.check; {inc_info[0]['rules_per_statement']} rules per statement, {inc_info[0]['rules_module_wide']} module-wide)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big_train.py"
        path.write_text(text, encoding="utf-8")
        if args.target != "torch-xla":
            (Path(tmp) / "pyproject.toml").write_text(f'[tool.porter]\ntarget = "{args.target}"\n', encoding="utf-8")
        lsp = asyncio.run(drive_server(text, path, args.changes, args.actions, args.resolve))
    changes = lsp["change_seconds"]
    actions = lsp["code_action_seconds"]
    print(f"  server: open -> diagnostics {lsp['open_seconds'] * 1000:7.0f} ms ({lsp['diagnostics']} diagnostics)")
    print(f"  server: didChange -> diagnostics  best {min(changes) * 1000:7.0f} ms  median {statistics.median(changes) * 1000:7.0f} ms  (n={len(changes)})")
    print(f"  server: codeAction  p50 {pct(actions, .5) * 1000:6.1f} ms  p95 {pct(actions, .95) * 1000:6.1f} ms  max {max(actions) * 1000:6.1f} ms  (n={len(actions)}; "
          f"{lsp['quick_fixes_left_for_resolve']} quick-fixes offered for codeAction/resolve)")
    for name, r in lsp["resolve"].items():
        print(f"  server: codeAction/resolve {name}: {r['seconds'] * 1000:.0f} ms")
    parse_med = statistics.median(parse)
    ratios = {
        "diagnostics/parse (medians)": statistics.median(changes) / parse_med,
        "check/parse (medians)": statistics.median(check) / parse_med,
        "incremental check in process/parse (medians)": statistics.median(inc) / parse_med,
        "incremental check in process/parse (CPU time, medians)":
            statistics.median(e["cpu_seconds"] for e in inc_info) / statistics.median(parse_cpu),
        "open (first full check in the server)/parse": lsp["open_seconds"] / parse_med,
    }
    print()
    for k, v in ratios.items():
        print(f"  {k:<52}{v:6.2f}")
    print(f"\ntargets: diagnostics <= 1.5x parse: {ratios['diagnostics/parse (medians)'] <= 1.5}; "
          f"code actions p95 < 50 ms: {pct(actions, .95) < 0.05}")
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start {load_start}, at end {load_end} (on {os.cpu_count()} cores)")
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_start": load_start, "load_average_at_end": load_end},
        "target": args.target,
        "document": {"lines": n_lines, "characters": len(text), "findings": n_findings},
        "parse_seconds": parse,
        "parse_cpu_seconds": parse_cpu,
        "check_seconds": check,
        "incremental": {"first_check_seconds": inc_first, "edit_seconds": inc, "edits": inc_info},
        "server": lsp,
        "code_action_ms": {"p50": pct(actions, .5) * 1000, "p95": pct(actions, .95) * 1000, "max": max(actions) * 1000},
        "ratios": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
