"""`porter lsp` end to end: pytest-lsp starts the real server (`python -m porter lsp`) and
talks to it as an editor would (VS Code's client capabilities). Expected results come from
the engine itself (`porter check` / `porter migrate` on the same text), never from copies."""
from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import libcst as cst
import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

from porter import edits, engine, lsp
from porter.context import FileContext
from porter.runner import Settings

REPO = Path(__file__).resolve().parent.parent
MNIST = REPO / "fixtures" / "torch_xla" / "mnist_cnn" / "train.py"
DATA = REPO / "tests" / "data" / "lsp"
TIMEOUT = 30


def make_client() -> LanguageClient:
    """pytest-lsp's client, also keeping every publishDiagnostics (with its version) in order."""
    client = LanguageClient(converter_factory=default_converter)
    client.published = []  # type: ignore[attr-defined]

    def publish(cl: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        cl.diagnostics[params.uri] = params.diagnostics
        cl.published.append(params)  # type: ignore[attr-defined]

    features = dict(DEFAULT_CLIENT_FEATURES)
    features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = publish
    register_lsp_features(client, features)
    return client


# one server for the module (starting one costs seconds); each test opens its own documents
onserver = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "porter", "lsp", "--debounce-ms", "50"],
                              client_factory=make_client),
    scope="module",
)
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=pytest_lsp.client_capabilities("visual-studio-code"),
        root_uri=tmp_path_factory.getbasetemp().as_uri(),
    ))
    yield
    await lsp_client.shutdown_session()


# --------------------------------------------------------------------------------------
# helpers: a tiny editor
# --------------------------------------------------------------------------------------
def offset(text: str, pos: types.Position) -> int:
    """A UTF-16 LSP position -> index into ``text`` (independent of porter's conversion)."""
    lines = lsp.split_lines(text)
    if pos.line >= len(lines):
        assert pos.line == len(lines) and pos.character == 0, pos
        return len(text)
    start = sum(len(x) for x in lines[: pos.line])
    line = lines[pos.line].rstrip("\r\n")
    encoded = line.encode("utf-16-le")
    assert pos.character <= len(encoded) // 2, (pos, line)
    return start + len(encoded[: 2 * pos.character].decode("utf-16-le"))


def apply_edits(text: str, edits) -> str:
    spans = sorted(((offset(text, e.range.start), offset(text, e.range.end), e.new_text) for e in edits), reverse=True)
    for (s1, e1, _), (s2, e2, _) in zip(spans[1:], spans[:-1]):
        assert e1 <= s2, "overlapping edits"
    for s, e, new in spans:
        assert s <= e
        text = text[:s] + new + text[e:]
    return text


def edits_of(edit: types.WorkspaceEdit, uri: str, version: int | None = None) -> list:
    assert edit.document_changes, "VS Code's capabilities ask for versioned edits"
    (change,) = edit.document_changes
    assert change.text_document.uri == uri
    if version is not None:
        assert change.text_document.version == version
    return list(change.edits)


def whole_line_or_document(edits, text: str) -> bool:
    return any(offset(text, e.range.start) == 0 and offset(text, e.range.end) == len(text) for e in edits)


async def diagnostics(client: LanguageClient, uri: str, version: int) -> list[types.Diagnostic]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for params in reversed(client.published):  # type: ignore[attr-defined]
            if params.uri == uri and params.version == version:
                return list(params.diagnostics)
        await asyncio.sleep(0.01)
    raise AssertionError(f"no diagnostics for {uri} version {version}")


def open_doc(client: LanguageClient, path: Path, text: str, version: int = 1) -> str:
    path.write_text(text, encoding="utf-8")
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))
    return uri


def replace_all(client: LanguageClient, uri: str, old: str, new: str, version: int) -> None:
    lines = lsp.split_lines(old)
    end = types.Position(line=len(lines), character=0)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=0, character=0), end=end), text=new)]))


async def actions_for(client, uri, diag=None, only=None, rng=None) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=rng or diag.range,
        context=types.CodeActionContext(diagnostics=[diag] if diag else [], only=only),
    ))
    return [a for a in result or [] if isinstance(a, types.CodeAction)]


def engine_findings(text: str, settings: Settings | None = None):
    return engine.check(text, (settings or Settings()).options())


def as_cli(findings) -> list[tuple[str, int, int]]:
    return [(f.code, f.position.line - 1, f.position.column) for f in findings]


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@onserver
async def test_diagnostics_of_a_fixture(client: LanguageClient, tmp_path: Path):
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    diags = await diagnostics(client, uri, 1)
    expected = engine_findings(text).findings
    assert len(expected) >= 10
    # what `porter check` reports, in the same order, at the same places (ASCII file: units = columns)
    assert [(d.code, d.range.start.line, d.range.start.character) for d in diags] == as_cli(expected)
    for d, f in zip(diags, expected):
        assert d.source == "porter"
        assert d.message == f.message + lsp._mark(f)
        assert d.severity == {"error": types.DiagnosticSeverity.Error, "warning": types.DiagnosticSeverity.Warning,
                              "info": types.DiagnosticSeverity.Information}[f.severity.value]
        assert d.code_description is not None
        assert d.code_description.href == (REPO / "docs" / "rules" / f"{f.code}.md").as_uri()
        assert Path(d.code_description.href.removeprefix("file://")).is_file()
        assert (d.range.end.line, d.range.end.character) == (f.position.end_line - 1, f.position.end_column)


@pytest.mark.slow
@onserver
async def test_every_quick_fix_applies_and_rechecks_clean(client: LanguageClient, tmp_path: Path):
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    diags = await diagnostics(client, uri, 1)
    module = engine_findings(text)
    by_place = {(f.code, f.position.line - 1, f.position.column): f for f in module.findings}
    version = 1
    tried = 0
    for d in diags:
        f = by_place[(d.code, d.range.start.line, d.range.start.character)]
        actions = await actions_for(client, uri, d, only=[types.CodeActionKind.QuickFix])
        fixes = [a for a in actions if a.title.startswith(f"Fix {d.code}")]
        if f.fix is None:
            assert not fixes
            continue
        (action,) = fixes
        if action.edit is None:  # offered for codeAction/resolve (a fix that removes imports)
            action = await client.code_action_resolve_async(action)
        unsafe = f.fix.safety.value == "unsafe"
        assert action.title.endswith("(unsafe)") == unsafe
        assert action.is_preferred is (not unsafe)
        assert action.kind == types.CodeActionKind.QuickFix
        edits = edits_of(action.edit, uri, version)
        assert edits and not whole_line_or_document(edits, text)
        fixed = apply_edits(text, edits)
        # exactly that finding's fix, as the engine applies it (plus its imports)
        assert fixed == engine.apply_fixes(module.module, [f.fix], FileContext(module.module)).code
        cst.parse_module(fixed)
        # the fixed document re-checks (through the server) without that finding
        version += 1
        replace_all(client, uri, text, fixed, version)
        after = await diagnostics(client, uri, version)
        assert sum(x.code == d.code for x in after) < sum(x.code == d.code for x in diags)
        assert [(x.code, x.range.start.line) for x in after] == [(c, l) for c, l, _ in as_cli(engine_findings(fixed).findings)]
        version += 1
        replace_all(client, uri, fixed, text, version)  # back; the next code action waits for its check
        tried += 1
    assert tried >= 8


@pytest.mark.slow
def test_single_fixes_on_fixtures_equal_the_engine():
    """The quick-fix edits (computed on the target nodes, the innermost statement or the
    top-level statements they touch, not the whole module) give exactly the text of the
    engine applying that one fix to the whole module: every fixable finding of three
    fixtures (each way of computing them: in place, innermost statement, top-level
    statements, edits in the imports at the top)."""
    n = 0
    for name in ("mnist_cnn", "dcgan", "vae", "xla_deprecated"):
        path = REPO / "fixtures" / "torch_xla" / name / "train.py"
        text = path.read_text(encoding="utf-8")
        an = lsp.analyze(text, Settings(), str(path))
        assert an.error is None, an.error
        for f in an.findings:
            if f.fix is None or f.fix.remove_imports:
                continue  # (a fix that removes imports is applied by the engine to the whole module)
            changes = lsp.fix_changes(an, f)
            new = engine.apply_fixes(an.module, [f.fix], FileContext(an.module)).code
            assert _apply_changes(text, changes) == new, (path, f.code, f.position)
            n += 1
    assert n >= 45, n


def _apply_changes(text: str, changes) -> str:
    lines = lsp.split_lines(text)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    for c in sorted(changes, key=lambda c: (c.start, c.end), reverse=True):
        s = starts[c.start[0]] + c.start[1] if c.start[0] < len(lines) else len(text)
        e = starts[c.end[0]] + c.end[1] if c.end[0] < len(lines) else len(text)
        text = text[:s] + c.text + text[e:]
    return text


@pytest.mark.slow
@onserver
async def test_fix_all(client: LanguageClient, tmp_path: Path):
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    diags = await diagnostics(client, uri, 1)
    actions = await actions_for(client, uri, only=[types.CodeActionKind.SourceFixAll],
                                rng=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)))
    (action,) = actions
    assert action.kind == "source.fixAll.porter" and action.title == "Fix all porter findings in this file"
    assert action.edit is None  # resolved lazily: VS Code supports codeAction/resolve
    resolved = await client.code_action_resolve_async(action)
    edits = edits_of(resolved.edit, uri, 1)
    assert not whole_line_or_document(edits, text)
    fixed = apply_edits(text, edits)
    assert fixed == engine.fix(text, Settings().options()).source  # `porter migrate` (safe fixes)
    replace_all(client, uri, text, fixed, 2)
    left = await diagnostics(client, uri, 2)
    assert len(left) < len(diags)
    assert not any(d.message.endswith("[*]") for d in left)  # every safe fix applied


@onserver
async def test_suppress(client: LanguageClient, tmp_path: Path):
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    diags = await diagnostics(client, uri, 1)
    target = next(d for d in diags if d.code == "TX201")
    actions = await actions_for(client, uri, target)
    (action,) = [a for a in actions if a.title.startswith("Suppress")]
    assert action.title == "Suppress TX201 on this line (# porter: ignore[TX201])"
    (edit,) = edits_of(action.edit, uri, 1)
    fixed = apply_edits(text, [edit])
    line = target.range.start.line
    assert lsp.split_lines(fixed)[line].rstrip("\n") == lsp.split_lines(text)[line].rstrip("\n") + "  # porter: ignore[TX201]"
    replace_all(client, uri, text, fixed, 2)
    after = await diagnostics(client, uri, 2)
    assert [d.code for d in after] == [d.code for d in diags if d is not target]
    # a second code on the same line joins the bracket
    both = fixed.replace("# porter: ignore[TX201]", "# porter: ignore[TX999]")
    replace_all(client, uri, fixed, both, 3)
    again = await diagnostics(client, uri, 3)
    target = next(d for d in again if d.code == "TX201")
    (action,) = [a for a in await actions_for(client, uri, target) if a.title.startswith("Suppress")]
    assert "# porter: ignore[TX999, TX201]" in apply_edits(both, edits_of(action.edit, uri, 3))


UNICODE = '''\
import torch
import torch.nn as nn


def save(model: nn.Module) -> None:
    größe = "🙂🙂"; torch.save(model.state_dict(), f"modèle-{größe}.pt")
    ε = "😀"; torch.save(model.state_dict(), "😀.pt"); torch.save(model, "b.pt")
'''


@onserver
async def test_utf16_positions(client: LanguageClient, tmp_path: Path):
    uri = open_doc(client, tmp_path / "uni.py", UNICODE)
    diags = await diagnostics(client, uri, 1)
    lines = UNICODE.splitlines()
    expected = [f for f in engine_findings(UNICODE).findings if f.code == "TX704"]
    got = [d for d in diags if d.code == "TX704"]
    assert len(got) == len(expected) == 3
    for d, f in zip(got, expected):
        line = lines[f.position.line - 1]
        # LibCST's column is in code points; the LSP's in UTF-16 units (each emoji is 2)
        assert d.range.start.character == len(line[: f.position.column].encode("utf-16-le")) // 2
        assert d.range.start.character > f.position.column
        assert UNICODE[offset(UNICODE, d.range.start):].startswith("torch.save(")
        assert UNICODE[offset(UNICODE, d.range.start):offset(UNICODE, d.range.end)] == cst.Module([]).code_for_node(f.node)
    module = engine_findings(UNICODE)
    fixes = {(f.position.line, f.position.column): f for f in module.findings if f.code == "TX704"}
    for d, f in zip(got, expected):
        (action,) = [a for a in await actions_for(client, uri, d) if a.title.startswith("Fix TX704")]
        fixed = apply_edits(UNICODE, edits_of(action.edit, uri, 1))
        ref = fixes[(f.position.line, f.position.column)]
        assert fixed == engine.apply_fixes(module.module, [ref.fix], FileContext(module.module)).code
    # a code action asked for by a UTF-16 range lands on the right finding
    last = got[-1]
    rng = types.Range(start=last.range.start, end=last.range.start)
    titles = [a.title for a in await actions_for(client, uri, rng=rng)]
    assert titles.count("Suppress TX704 on this line (# porter: ignore[TX704])") == 1


@onserver
async def test_syntax_error_while_typing(client: LanguageClient, tmp_path: Path):
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    good = await diagnostics(client, uri, 1)
    broken = text.replace("def train(", "def train((", 1)
    replace_all(client, uri, text, broken, 2)
    (d,) = await diagnostics(client, uri, 2)
    assert d.severity == types.DiagnosticSeverity.Error and d.source == "porter"
    assert d.message.startswith("syntax error at line ")
    line_no = next(i for i, l in enumerate(broken.splitlines()) if "def train((" in l)
    assert d.range.start.line == line_no
    assert await actions_for(client, uri, d) == []  # nothing to fix in a broken file, and no crash
    replace_all(client, uri, broken, text, 3)
    assert [x.code for x in await diagnostics(client, uri, 3)] == [x.code for x in good]


@onserver
async def test_thousand_rapid_changes_then_correct_diagnostics(client: LanguageClient, tmp_path: Path):
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    await diagnostics(client, uri, 1)
    # type 1,000 characters into a new comment at the top, one didChange each, no pause
    current = "#\n" + text
    replace_all(client, uri, text, current, 2)
    for i in range(1000):
        ch = "x" if i % 7 else " "
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3 + i),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=0, character=1 + i), end=types.Position(line=0, character=1 + i)),
                text=ch)]))
        current = current[: 1 + i] + ch + current[1 + i:]
    final_version = 3 + 999
    diags = await diagnostics(client, uri, final_version)
    assert [(d.code, d.range.start.line, d.range.start.character) for d in diags] == as_cli(engine_findings(current).findings)
    # the server kept only the last version's result and still answers requests
    d = next(x for x in diags if x.code == "TX704")
    (action,) = [a for a in await actions_for(client, uri, d) if a.title.startswith("Fix TX704")]
    fixed = apply_edits(current, edits_of(action.edit, uri, final_version))
    assert "xm.save(" in fixed and fixed.startswith(current.splitlines()[0])
    stale = [p for p in client.published if p.uri == uri and p.version not in (1, 2, final_version)]  # type: ignore[attr-defined]
    assert len(stale) < 50, "changes were debounced, not each checked"


@onserver
async def test_edits_inside_functions_equal_porter_check(client: LanguageClient, tmp_path: Path):
    """Edits inside functions (the server checks them incrementally: porter.incremental):
    after each, the published diagnostics are `porter check`'s of the new text, and a
    quick-fix of a finding the edit added is the engine's fix."""
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "train.py", text)
    await diagnostics(client, uri, 1)
    lines = lsp.split_lines(text)
    spots = [i for i, line in enumerate(lines) if line.startswith("    ") and line.strip() and not line.startswith("     ")
             and lines[i - 1].startswith("def ") and lines[i - 1].rstrip().endswith(":")]
    assert len(spots) >= 3
    current = text
    version = 1
    for n, at in enumerate(spots[:3]):
        at += n  # the lines inserted before
        new_line = f"    extra_{n} = torch.zeros({n}).cuda()\n"
        version += 1
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=at, character=0), end=types.Position(line=at, character=0)),
                text=new_line)]))
        current = "".join(lsp.split_lines(current)[:at]) + new_line + "".join(lsp.split_lines(current)[at:])
        diags = await diagnostics(client, uri, version)
        expected = engine_findings(current)
        assert [(d.code, d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character, d.message)
                for d in diags] == [(f.code, f.position.line - 1, f.position.column, f.position.end_line - 1,
                                     f.position.end_column, f.message + lsp._mark(f)) for f in expected.findings]
        mine = [d for d in diags if d.range.start.line == at and d.code == "TX102"]
        assert mine, "the added .cuda() is reported"
        (action,) = [a for a in await actions_for(client, uri, mine[0]) if a.title.startswith("Fix TX102")]
        f = next(f for f in expected.findings if f.code == "TX102" and f.position.line - 1 == at)
        assert apply_edits(current, edits_of(action.edit, uri, version)) == \
            engine.apply_fixes(expected.module, [f.fix], FileContext(expected.module)).code


async def raw_request(client: LanguageClient, method: str, params):
    """A request exactly as given (the typed API would refuse to send malformed params)."""
    proto = client.protocol
    msg_id = f"raw-{time.monotonic_ns()}"
    future: Future = Future()
    proto._request_futures[msg_id] = future
    proto._send_data({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return await asyncio.wait_for(asyncio.wrap_future(future), TIMEOUT)


@onserver
async def test_malformed_requests_get_errors(client: LanguageClient, tmp_path: Path):
    uri = open_doc(client, tmp_path / "t.py", "import torch\ntorch.save({}, 'a.pt')\n")
    await diagnostics(client, uri, 1)
    with pytest.raises(JsonRpcException) as bad_params:
        await raw_request(client, types.TEXT_DOCUMENT_CODE_ACTION, {"textDocument": 5, "range": "everything"})
    assert bad_params.value.code in (-32602, -32600, -32603)
    with pytest.raises(JsonRpcException) as unknown:
        await raw_request(client, "porter/noSuchMethod", {})
    assert unknown.value.code == -32601
    # a resolve for an action whose document has moved on is refused, not guessed
    stale = types.CodeAction(title="Fix all porter findings in this file", kind="source.fixAll.porter",
                             data={"uri": uri, "version": 99, "fixAll": True})
    with pytest.raises(JsonRpcException):
        await client.code_action_resolve_async(stale)
    # a code action for a document that is not open: nothing, no crash
    other = (tmp_path / "nope.py").as_uri()
    assert await actions_for(client, other, rng=types.Range(start=types.Position(line=0, character=0),
                                                             end=types.Position(line=0, character=0))) == []
    # and the server still serves
    diags = client.diagnostics[uri]
    assert [d.code for d in diags] == ["TX704"]
    assert await actions_for(client, uri, diags[0])


@onserver
async def test_settings_from_pyproject(client: LanguageClient, tmp_path: Path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text('[tool.porter]\nselect = ["TX2"]\n', encoding="utf-8")
    text = MNIST.read_text(encoding="utf-8")
    uri = open_doc(client, proj / "train.py", text)
    diags = await diagnostics(client, uri, 1)
    assert diags and all(d.code.startswith("TX2") for d in diags)
    assert [d.code for d in diags] == [f.code for f in engine_findings(text, Settings(select=("TX2",))).findings]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pyproject.toml").write_text('[tool.porter]\nselect = ["NOPE9"]\n', encoding="utf-8")
    uri = open_doc(client, bad / "train.py", text)
    (d,) = await diagnostics(client, uri, 1)
    assert d.severity == types.DiagnosticSeverity.Error and "NOPE9" in d.message


def test_lines_and_columns_as_the_lsp_counts_them():
    text = "a = '\x0c\u2028'\r\nb = 1\rc = '🙂é'\n"
    assert lsp.split_lines(text) == ["a = '\x0c\u2028'\r\n", "b = 1\r", "c = '🙂é'\n"]  # not str.splitlines
    line = "c = '🙂é'  # x\n"
    assert [lsp.column_to_units(line, c) for c in (5, 6, 7)] == [5, 7, 8]  # the emoji is 2 UTF-16 units
    assert [lsp.column_from_units(line, u) for u in (5, 6, 7, 8, 99)] == [5, 5, 6, 7, len(line) - 1]
    assert lsp.column_to_units(line, 6, "utf-8") == 9 and lsp.column_to_units(line, 6, "utf-32") == 6
    # a text change never splits a CRLF, and keeps to the characters that differ
    (change,) = edits.text_edits("x = 1\r\ny = 2\r\n", "x = 1\r\ny = 3\r\n")
    assert change == edits.TextEdit((1, 4), (1, 5), "3")


@pytest.mark.slow
@onserver
async def test_quick_fix_that_removes_imports_is_resolved(client: LanguageClient, tmp_path: Path):
    """A fix that also removes the imports it leaves unused (LibCST's scope analysis of the
    whole module) is offered without an edit and computed on codeAction/resolve."""
    text = (REPO / "fixtures" / "torch_xla" / "xla_deprecated" / "train.py").read_text(encoding="utf-8")
    uri = open_doc(client, tmp_path / "deprecated.py", text)
    diags = await diagnostics(client, uri, 1)
    module = engine_findings(text)
    (f,) = [x for x in module.findings if x.fix is not None and x.fix.remove_imports][:1]
    d = next(x for x in diags if (x.code, x.range.start.line, x.range.start.character) == (f.code, f.position.line - 1, f.position.column))
    (action,) = [a for a in await actions_for(client, uri, d) if a.title.startswith(f"Fix {f.code}")]
    assert action.edit is None and action.data
    resolved = await client.code_action_resolve_async(action)
    edits = edits_of(resolved.edit, uri, 1)
    assert not whole_line_or_document(edits, text)
    assert apply_edits(text, edits) == engine.apply_fixes(module.module, [f.fix], FileContext(module.module)).code
