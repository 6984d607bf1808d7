"""A ported notebook run end to end in a real Jupyter kernel (nbclient, ipykernel, this venv's
python): the original on the CPU (CUDA hidden: its ``torch.device('cuda' if ...)`` picks the
CPU) and the torch_xla port on XLA (PJRT_DEVICE=CPU), same seed; the losses each prints are
compared. One run of each, shared by the assertions."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import nbhelp

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "notebooks" / "train_classifier"

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("nbrun")
    shutil.copy(FIXTURE / "notebook.ipynb", work / "original.ipynb")
    shutil.copy(FIXTURE / "expected_torch_xla.ipynb", work / "port.ipynb")
    original = nbhelp.execute(work / "original.ipynb", {"CUDA_VISIBLE_DEVICES": "", "PJRT_DEVICE": "CPU"})
    port = nbhelp.execute(work / "port.ipynb", {"PJRT_DEVICE": "CPU"})
    return original, port


def test_both_notebooks_run_every_cell(runs):
    for nb in runs:
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code)
        assert not [o for c in code for o in c.outputs if o.output_type == "error"]
        assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)  # the plot cell ran


def test_the_port_trains_on_xla_and_the_original_on_the_cpu(runs):
    original, port = runs
    assert "training on cpu" in nbhelp.printed(original)
    assert "training on xla" in nbhelp.printed(port)


def test_the_port_prints_the_original_losses(runs):
    original, port = runs
    want, got = nbhelp.losses(original), nbhelp.losses(port)
    assert len(want) == 8, nbhelp.printed(original)
    assert len(got) == len(want), nbhelp.printed(port)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
