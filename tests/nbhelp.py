"""Running notebooks in a real Jupyter kernel of this venv's python (nbclient + ipykernel).

The kernel spec is written into a temporary folder, which nbclient's kernel manager reads
through its kernel spec manager (``kernel_name`` names the spec); the kernel's environment is this process's plus
``env`` (e.g. PJRT_DEVICE=CPU), with this venv's bin first on PATH (so that ``!pip`` is the
venv's pip).
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "porter-test-python"
_LOSS = re.compile(r"loss (-?\d+\.\d+)")


def kernel_dir(root: Path) -> Path:
    """Write a kernel spec for ``sys.executable`` under ``root/kernels``; returns ``root``."""
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "porter test python",
        "language": "python",
    }))
    return root


def execute(path: Path, env: dict[str, str], timeout: int = 300):
    """Run every cell of the notebook at ``path`` in a fresh kernel, in the notebook's folder;
    returns the executed notebook (nbformat node). A cell that raises fails the run."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="porter-kernels-") as tmp:
        root = kernel_dir(Path(tmp))
        ksm = KernelSpecManager(kernel_dirs=[str(root / "kernels")])
        kernel_env = dict(os.environ)
        kernel_env.update(env)
        kernel_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + kernel_env.get("PATH", "")
        client = NotebookClient(
            nb, timeout=timeout, kernel_name=KERNEL_NAME, resources={"metadata": {"path": str(path.parent)}},
        )
        client.km = client.create_kernel_manager()
        client.km.kernel_spec_manager = ksm
        client.execute(env=kernel_env)
    return nb


def printed(nb) -> str:
    """Everything the cells printed (stream outputs), in order."""
    return "".join(
        "".join(out.get("text", "")) for cell in nb.cells if cell.cell_type == "code"
        for out in cell.get("outputs", []) if out.get("output_type") == "stream"
    )


def losses(nb) -> list[float]:
    return [float(x) for x in _LOSS.findall(printed(nb))]
