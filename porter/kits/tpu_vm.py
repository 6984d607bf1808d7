"""``porter kit tpu-vm``: shell scripts that create a Cloud TPU VM, install porter's pins on
every worker, stage the data from Cloud Storage, copy and run the port, fetch the results and
delete the VM. Every script shares ``env.sh``, has ``set -euo pipefail`` and ``--dry-run``."""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Optional, Sequence

from porter import platforms
from porter.kits import KitError, check_data, environment, load_port
from porter.sources import write_atomic

STEPS = ("create", "install", "stage", "copy", "run", "fetch", "delete")
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def _check_command(target: str, extra: Sequence[str] = ()) -> str:
    """A shell command that succeeds when every pin of the target's profile is installed and
    each of ``extra`` is (any version); a missing package raises, which fails it too."""
    pins = dict(platforms.profile(target).pins)
    code = (f"import importlib.metadata as m, sys; [m.version(n) for n in {json.dumps(list(extra))}]; "
            f"sys.exit(any(m.version(n) != v for n, v in {json.dumps(pins)}.items()))")
    return f"python3 -c {shlex.quote(code)} 2>/dev/null"


def zone_note(accelerator: str, zone: Optional[str]) -> Optional[str]:
    """A warning when ``zone`` is not among the accelerator's documented zones (the docs'
    list may be behind: the kit is still written)."""
    acc = platforms.accelerator(accelerator)
    if zone and acc.zones and zone not in acc.zones:
        return (f"--zone {zone} is not among the documented zones of {acc.name} ({', '.join(acc.zones)}; "
                "docs/tpu.md); the kit uses it as given")
    return None


def write_kit(port_path: Path, out: Path, accelerator: str = "v5litepod-8", zone: Optional[str] = None,
              project: Optional[str] = None, name: Optional[str] = None, data: Optional[str] = None,
              target: Optional[str] = None, args: Sequence[str] = ()) -> list[Path]:
    """Write the kit into ``out``; returns the files written."""
    port = load_port(port_path, target)
    if port.kind != "script":
        raise KitError(f"{port_path}: a TPU VM runs scripts; convert the notebook first (jupyter nbconvert --to script)")
    try:
        acc = platforms.accelerator(accelerator)
    except ValueError as exc:
        raise KitError(str(exc)) from None
    data = check_data(data, ("gs",))
    if zone is None:
        if not acc.zones:
            raise KitError(f"no documented zone for {acc.name}: give --zone")
        zone = acc.zones[0]
    name = name or re.sub(r"[^a-z0-9-]+", "-", f"porter-{port.path.stem}".lower()).strip("-")[:63]
    if not _NAME.fullmatch(name):
        raise KitError(f"--name {name!r}: a TPU name is lowercase letters, digits and '-', starting with a letter")
    if out.exists() and not out.is_dir():
        raise KitError(f"--out {out} exists and is not a folder")
    prof = platforms.profile(port.target)
    extra = ["gcsfs"] if data else []
    install_words = shlex.split(prof.tpu_install[0])[2:] + extra
    q = shlex.quote
    values = dict(
        project=q(project or ""), zone=q(zone), name=q(name), accelerator=q(acc.name), runtime=q(acc.runtime),
        queued="1" if acc.queued else "0", hosts="" if acc.hosts is None else str(acc.hosts),
        target=port.target, install=q(" ".join(q(w) for w in install_words)),
        check=q(_check_command(port.target, extra)), data=q(data or ""), port=q(port.path.name),
        args=" ".join(q(a) for a in args),
    )
    env = environment()
    files: dict[str, tuple[str, bool]] = {"env.sh": (env.get_template("kit_env.sh.j2").render(**values), False)}
    for step in (*STEPS, "all"):
        files[f"{step}.sh"] = (env.get_template(f"kit_{step}.sh.j2").render(**values, target_name=port.target), True)
    hosts_text = ("hosts not in porter's sources: `fetch.sh` and `run.sh` ask gcloud for the workers" if acc.hosts is None
                  else f"{acc.hosts} host(s)" + (" (multi-host)" if acc.hosts > 1 else ""))
    run_text = ("PJRT_DEVICE=TPU python3 " if port.target == "torch-xla" else "python3 launch_jax.py ") + port.path.name + " on every worker"
    files["README.md"] = (env.get_template("kit_README.md.j2").render(
        port=port.path.name, accelerator=acc.name, target=port.target, chips=acc.chips, hosts_text=hosts_text,
        runtime=acc.runtime, queued=values["queued"], zone=zone, zones=", ".join(acc.zones) or "unknown",
        install=" ".join(install_words), data=data, run_text=run_text), False)
    code = {f"code/{port.path.name}": (port.path.read_text(encoding="utf-8"), False)}
    if port.target == "jax":
        code["code/launch_jax.py"] = (env.get_template("kit_launch_jax.py.j2").render(), False)
    files.update(code)
    written = []
    for rel, (text, executable) in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o755 if executable else 0o644
        write_atomic(path, text.encode("utf-8"), mode)
        os.chmod(path, mode | (stat.S_IXGRP | stat.S_IXOTH if executable else 0))
        written.append(path)
    return written
