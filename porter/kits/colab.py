"""``porter kit colab``: a Colab notebook that installs porter's pins on Colab's TPU runtime,
checks the TPU, makes the data reachable and runs the port."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional, Sequence

import nbformat
from nbformat import v4

from porter import platforms
from porter.kits import KitError, Port, check_data, environment, load_port
from porter.sources import write_atomic

SETUP_TAG = "porter-setup"


def install_requirements(target: str) -> list[str]:
    """The requirements of the profile's documented TPU install command (``pip install ...``)."""
    words = shlex.split(platforms.install_commands(target)[0])
    if words[:2] != ["pip", "install"]:
        raise KitError(f"the {target} install command is not a pip install: {words}")
    return words[2:]


_TORCH_XLA_CHECK = (
    "import torch_xla\n"
    "import torch_xla.runtime as xr\n"
    "n = xr.global_runtime_device_count()\n"
    "print(f'torch_xla {torch_xla.__version__}: {n} TPU device(s), device type {xr.device_type()}')\n"
    "assert xr.device_type() == 'TPU', 'no TPU: choose a TPU runtime'\n"
)
_JAX_CHECK = (
    "import jax\n"
    "devices = jax.devices()\n"
    "print(f'jax {jax.__version__}: {len(devices)} device(s): {devices}')\n"
    "assert devices[0].platform == 'tpu', 'no TPU: choose a TPU runtime'\n"
)


def _device_cell(target: str, in_kernel: bool) -> str:
    """The TPU check. A script port runs in its own process, and a TPU is held by the one
    process that opened it: then the check runs in a child process too, so the notebook's
    kernel never holds the TPU. A notebook port runs in the kernel: the check does as well."""
    code = _TORCH_XLA_CHECK if target == "torch-xla" else _JAX_CHECK
    head = "# Is there a TPU, and how many chips? (Runtime > Change runtime type > TPU)\n"
    if in_kernel:
        env = "import os\nos.environ.setdefault('PJRT_DEVICE', 'TPU')\n" if target == "torch-xla" else ""
        return head + env + code
    return (
        head + "# (in a child process: the kernel must not hold the TPU the port's process opens)\n"
        "import os, subprocess, sys\n"
        f"CHECK = {code!r}\n"
        "subprocess.run([sys.executable, '-c', CHECK], check=True, env={**os.environ, 'PJRT_DEVICE': 'TPU'})\n"
    )


def _data_cell(data: str) -> str:
    if data.startswith("drive:"):
        path = data[len("drive:"):].lstrip("/")
        return (
            "# Data from Google Drive\n"
            "from google.colab import drive\n"
            "drive.mount('/content/drive')\n"
            f"DATA = {('/content/drive/MyDrive/' + path)!r}\n"
            "import os\n"
            "print(DATA, os.listdir(DATA)[:10])\n"
        )
    return (
        "# Data in Cloud Storage, read through gcsfs with your Google account\n"
        "from google.colab import auth\n"
        "auth.authenticate_user()\n"
        "import gcsfs\n"
        "fs = gcsfs.GCSFileSystem()\n"
        f"DATA = {data!r}\n"
        "print(DATA, fs.ls(DATA)[:10])\n"
    )


def build(port: Port, data: Optional[str], args: Sequence[str]) -> nbformat.NotebookNode:
    prof = platforms.profile(port.target)
    env = environment()
    setup = env.get_template("kit_colab_setup.py.j2").render(
        target=port.target, pins=dict(prof.pins), install=install_requirements(port.target),
        extra=["gcsfs"] if data and data.startswith("gs://") else [],
    )
    nb = v4.new_notebook()
    nb.metadata["accelerator"] = "TPU"
    nb.metadata["colab"] = {"provenance": [], "name": port.path.stem + "_colab.ipynb"}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [v4.new_markdown_cell(
        f"# {port.path.name} on a Colab TPU ({port.target})\n\n"
        f"Written by `porter kit colab`. Runtime > Change runtime type > **TPU** "
        f"({platforms.COLAB['accelerator']}). Pinned: "
        + ", ".join(f"{n} {v}" for n, v in prof.pins) + " (porter's docs/tpu.md).")]
    cell = v4.new_code_cell(setup)
    cell.metadata["tags"] = [SETUP_TAG]
    cells.append(cell)
    cells.append(v4.new_code_cell(_device_cell(port.target, in_kernel=port.kind == "notebook")))
    if data:
        cells.append(v4.new_code_cell(_data_cell(data)))
    if port.kind == "notebook":
        cells.append(v4.new_markdown_cell(f"## The port: the code cells of {port.path.name}"))
        cells += [v4.new_code_cell(c) for c in port.cells]
    else:
        name = port.path.name
        cells.append(v4.new_code_cell(
            "# The port, copied next to the notebook (no upload needed)\n"
            "import pathlib\n"
            f"pathlib.Path({name!r}).write_text({port.code!r}, encoding='utf-8')\n"
        ))
        env_prefix = "PJRT_DEVICE=TPU " if port.target == "torch-xla" else ""
        cells.append(v4.new_code_cell(f"!{env_prefix}python {shlex.join([name, *args])}\n"))
    for i, c in enumerate(cells):  # stable ids: the same port gives the same notebook
        c["id"] = f"porter-{i}"
    nb.cells = cells
    nbformat.validate(nb)
    return nb


def write_kit(port_path: Path, out: Path, target: Optional[str] = None, data: Optional[str] = None,
              args: Sequence[str] = ()) -> Path:
    """Write DIR/<port>_colab.ipynb; returns its path."""
    port = load_port(port_path, target)
    data = check_data(data, ("gs", "drive"))
    if out.exists() and not out.is_dir():
        raise KitError(f"--out {out} exists and is not a folder")
    nb = build(port, data, args)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{port.path.stem}_colab.ipynb"
    write_atomic(path, nbformat.writes(nb).encode("utf-8") + b"\n")
    return path
