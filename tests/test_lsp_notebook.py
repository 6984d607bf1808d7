"""`porter lsp` on notebooks (LSP 3.17 notebook document sync), end to end with pytest-lsp:
open a notebook, get diagnostics per cell (on each cell's own document URI) equal to
`porter check` on the .ipynb, change a cell, apply a quick-fix whose edits reach two cells
(the fix and the import it needs), and see the cells check clean for that rule."""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from porter import notebook
from porter.runner import Settings
from test_lsp import apply_edits, diagnostics, make_client

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "fixtures" / "notebooks" / "train_classifier" / "notebook.ipynb"

onserver = pytest.mark.asyncio(loop_scope="module")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "porter", "lsp", "--debounce-ms", "50"],
                              client_factory=make_client),
    scope="module",
)
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    capabilities = pytest_lsp.client_capabilities("visual-studio-code")
    if capabilities.notebook_document is None:  # (VS Code sends it; pytest-lsp's copy may not)
        capabilities.notebook_document = types.NotebookDocumentClientCapabilities(
            synchronization=types.NotebookDocumentSyncClientCapabilities(execution_summary_support=True))
    result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=capabilities,
        root_uri=tmp_path_factory.getbasetemp().as_uri(),
    ))
    lsp_client.server_capabilities = result.capabilities  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


class Editor:
    """A notebook open in the client: cell URIs, texts and versions."""

    def __init__(self, client: LanguageClient, path: Path) -> None:
        self.client, self.path = client, path
        self.uri = path.as_uri()
        doc = json.loads(path.read_text(encoding="utf-8"))
        self.cells = []  # (kind, uri, text)
        for i, c in enumerate(doc["cells"]):
            kind = types.NotebookCellKind.Code if c["cell_type"] == "code" else types.NotebookCellKind.Markup
            source = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            self.cells.append([kind, f"vscode-notebook-cell:{path}#{c.get('id', i)}", source, 1])
        self.version = 1
        self.changed = 0  # the cell changed last (0: none since the notebook was opened)
        self.mark = len(client.published)  # type: ignore[attr-defined]
        client.notebook_document_did_open(types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=self.uri, notebook_type="jupyter-notebook", version=1,
                cells=[types.NotebookCell(kind=k, document=u) for k, u, _, _ in self.cells]),
            cell_text_documents=[types.TextDocumentItem(uri=u, language_id="python" if k == types.NotebookCellKind.Code else "markdown",
                                                        version=1, text=t) for k, u, t, _ in self.cells],
        ))

    def cell(self, number: int):
        return self.cells[number - 1]

    async def all_diagnostics(self) -> list[tuple[int, str, int, int]]:
        """(cell, code, line, column) of every diagnostic, once the check after the last
        change has published its last code cell."""
        last = max(i for i, c in enumerate(self.cells, 1) if c[0] == types.NotebookCellKind.Code)
        # the check of the notebook as it is now publishes the changed cell at its new version,
        # then the others in order (a check of the version before may still publish after the
        # change was sent: its cells of unchanged versions would read as current)
        _, changed_uri, _, changed_version = self.cell(self.changed) if self.changed else (None, None, None, None)
        for _ in range(3000):
            published = self.client.published[self.mark:]  # type: ignore[attr-defined]
            start = next((i for i, p in enumerate(published)
                          if changed_uri is None or (p.uri == changed_uri and p.version == changed_version)), None)
            if start is not None and any(p.uri == self.cell(last)[1] for p in published[start:]):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("no diagnostics after the last change")
        got = []
        for number, (kind, _, _, _) in enumerate(self.cells, 1):
            if kind == types.NotebookCellKind.Code:
                got += [(number, d.code, d.range.start.line, d.range.start.character) for d in await self.diagnostics(number)]
        return sorted(got)

    async def diagnostics(self, number: int) -> list[types.Diagnostic]:
        _, uri, _, version = self.cell(number)
        return await diagnostics(self.client, uri, version)

    def set_cell(self, number: int, text: str) -> None:
        cell = self.cell(number)
        old = cell[2]
        lines = old.splitlines(keepends=True)
        end = types.Position(line=len(lines) - 1, character=len(lines[-1])) if lines and not lines[-1].endswith("\n") else types.Position(line=len(lines), character=0)
        cell[2], cell[3] = text, cell[3] + 1
        self.changed = number
        self.version += 1
        self.mark = len(self.client.published)  # type: ignore[attr-defined]
        self.client.notebook_document_did_change(types.DidChangeNotebookDocumentParams(
            notebook_document=types.VersionedNotebookDocumentIdentifier(uri=self.uri, version=self.version),
            change=types.NotebookDocumentChangeEvent(cells=types.NotebookDocumentCellChanges(text_content=[
                types.NotebookDocumentCellContentChanges(
                    document=types.VersionedTextDocumentIdentifier(uri=cell[1], version=cell[3]),
                    changes=[types.TextDocumentContentChangePartial(
                        range=types.Range(start=types.Position(line=0, character=0), end=end), text=text)])]))))

    def apply(self, edit: types.WorkspaceEdit) -> set[int]:
        """Apply a workspace edit to the cells (one notebook change); the cells changed."""
        assert edit.document_changes, "VS Code's capabilities ask for versioned edits"
        changed = set()
        for change in edit.document_changes:
            number = next(i for i, c in enumerate(self.cells, 1) if c[1] == change.text_document.uri)
            assert change.text_document.version == self.cell(number)[3]
            changed.add(number)
            self.set_cell(number, apply_edits(self.cell(number)[2], change.edits))
        return changed


def _cli(path: Path) -> list[tuple[int, str, int, int]]:
    outcome = notebook.check_file(path, Settings(time_limit=0, memory_mb=0))
    assert outcome.status != "failed", outcome.error
    return sorted((f.cell, f.code, f.line - 1, f.column) for f in outcome.findings)


@onserver
async def test_server_announces_notebook_sync(client: LanguageClient):
    sync = client.server_capabilities.notebook_document_sync  # type: ignore[attr-defined]
    assert sync is not None and sync.save
    selector = sync.notebook_selector[0]
    assert selector.notebook == "jupyter-notebook" and selector.cells[0].language == "python"


@onserver
async def test_per_cell_diagnostics_equal_porter_check(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "train.ipynb"
    shutil.copy(TRAIN, path)
    ed = Editor(client, path)
    got = await ed.all_diagnostics()
    assert got == _cli(path)
    # across cells: the device of cell 4 and the loop of cell 8
    assert {c for c, *_ in got} >= {4, 8}


@onserver
async def test_change_a_cell_then_apply_a_quick_fix_across_cells(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "edit.ipynb"
    shutil.copy(TRAIN, path)
    ed = Editor(client, path)
    assert any(d.code == "TX101" for d in await ed.diagnostics(4))
    # the user edits the device cell: the CUDA-or-CPU device becomes a plain .cuda() call
    ed.set_cell(4, "device = torch.device('cuda')\ntorch.manual_seed(0)\nprint('training on', device.type)")
    diags = await ed.diagnostics(4)
    tx = [d for d in diags if d.code == "TX101"]
    assert tx and tx[0].range.start.line == 0
    result = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=ed.cell(4)[1]), range=tx[0].range,
        context=types.CodeActionContext(diagnostics=[tx[0]])))
    fixes = [a for a in result or [] if isinstance(a, types.CodeAction) and a.title.startswith("Fix TX101")]
    assert fixes and fixes[0].edit is not None
    changed = ed.apply(fixes[0].edit)
    assert changed == {3, 4}  # the import goes to the imports cell
    assert ed.cell(4)[2].startswith("device = torch_xla.device()\n")
    imports = ed.cell(3)[2].splitlines()
    assert imports[0] == "%matplotlib inline" and "import torch_xla" in imports
    assert imports.index("import torch_xla") > imports.index("import matplotlib.pyplot as plt")
    after = await ed.diagnostics(4)
    assert not [d for d in after if d.code == "TX101"]
    # the edited notebook, written out, checks the same from the command line
    doc = json.loads(path.read_text(encoding="utf-8"))
    for number, c in enumerate(doc["cells"], 1):
        c["source"] = ed.cell(number)[2]
    path.write_text(json.dumps(doc, indent=1))
    assert await ed.all_diagnostics() == _cli(path)


@onserver
async def test_a_cell_that_is_not_python_gets_the_error(client: LanguageClient, tmp_path: Path):
    path = tmp_path / "broken.ipynb"
    shutil.copy(TRAIN, path)
    ed = Editor(client, path)
    await ed.diagnostics(6)
    ed.set_cell(2, "%%bash\nnvidia-smi -L\nls {a,b}")  # a bash cell: left alone, never an error
    ed.set_cell(6, "X = torch.randn(512, 20\n")
    diags = await ed.diagnostics(6)
    assert len(diags) == 1 and diags[0].severity == types.DiagnosticSeverity.Error
    assert "cell 6: syntax error" in diags[0].message
    assert await ed.diagnostics(4) == []  # the other cells: nothing (the program cannot be read)
    ed.set_cell(6, "X = torch.randn(512, 20)\ny = (X[:, 0] > 0).long()")
    got = await ed.all_diagnostics()
    assert got and not [g for g in got if g[0] in (2, 6)]
    assert {c for c, *_ in got} >= {4, 8}
