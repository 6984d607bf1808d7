"""Where a port runs: Cloud TPU accelerators, their TPU VM runtime (software) versions, the
framework versions porter pins for each target, and the check of pinned versions against them.

Every fact in :data:`ACCELERATORS` and :data:`PROFILES` names its source (:data:`SOURCES`);
a fact the sources do not give is ``None`` here and "unknown" in docs/tpu.md (which
``python -m porter.docs`` renders from this module), and the kits then fall back to the
documented install command of the target instead of a guessed version.

The pin check (:func:`check_pins`) reads requirement files (``requirements*.txt``,
``constraints*.txt``) and ``pip install`` command lines (shell scripts and Dockerfiles, a
Python file's command strings, a notebook's ``!pip install`` lines) and reports each pinned version of a package that the
target's profile pins differently. The PV rules (``codemods/*/pv00*_pinned_versions.py``)
report it inside Python files; ``porter check`` calls :func:`check_pin_file` for the
requirement files among the paths it checks.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

import libcst as cst

from porter.astutil import string_value
from porter.rules import Edit, Fix, Rule, Safety, Severity
from porter.sources import SKIP_DIRS

# --------------------------------------------------------------------------------------
# Sources (rendered in docs/tpu.md)
# --------------------------------------------------------------------------------------
SOURCES: dict[str, tuple[str, str]] = {
    "runtimes": ("TPU software versions (Cloud TPU docs)", "https://cloud.google.com/tpu/docs/runtimes"),
    "zones": ("TPU regions and zones (Cloud TPU docs)", "https://cloud.google.com/tpu/docs/regions-zones"),
    "v5e": ("TPU v5e: system architecture and configurations (Cloud TPU docs)", "https://cloud.google.com/tpu/docs/v5e"),
    "v6e": ("Trillium (v6e) introduction (Cloud TPU docs)", "https://cloud.google.com/tpu/docs/v6e-intro"),
    "v4": ("TPU v4: system architecture (Cloud TPU docs: two TensorCores per chip)", "https://cloud.google.com/tpu/docs/v4"),
    "v5p": ("TPU v5p: configurations (Cloud TPU docs: cores, chips and hosts per topology)",
            "https://cloud.google.com/tpu/docs/v5p-training"),
    "queued": ("gcloud compute tpus queued-resources create (Cloud SDK reference)",
               "https://cloud.google.com/sdk/gcloud/reference/compute/tpus/queued-resources/create"),
    "torch_xla": ("PyTorch/XLA README, installation on a TPU VM (torch_xla 2.9.0 on PyPI)", "https://pypi.org/project/torch-xla"),
    "jax": ("JAX installation: TPU (pip install \"jax[tpu]\")", "https://docs.jax.dev/en/latest/installation.html"),
    "facts": ("porter's measured platform facts (shared/docs/platform-facts.md: torch_xla 2.9.0 built "
              "against torch 2.9.0; jax 0.10.2, flax 0.12.8, optax 0.2.8; Colab 2025-09: v2-8 retired, "
              "v5e-1 in the free tier)", ""),
}


# --------------------------------------------------------------------------------------
# Framework profiles: what porter pins per target
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """The versions a target's ports are written for and tested with (requirements.lock)."""

    target: str
    pins: tuple[tuple[str, str], ...]  # (distribution name, version)
    # the install command on a TPU host, as documented by the framework (the [tpu] extra
    # pulls the libtpu that matches; porter does not know its version)
    tpu_install: tuple[str, ...]
    libtpu: Optional[str] = None  # None: the version the [tpu] extra selects (not documented)
    sources: tuple[str, ...] = ()

    def pin(self, package: str) -> Optional[str]:
        key = normalize(package)
        return next((v for n, v in self.pins if normalize(n) == key), None)


PROFILES: dict[str, Profile] = {
    "torch-xla": Profile(
        "torch-xla",
        (("torch", "2.9.0"), ("torch_xla", "2.9.0")),
        ("pip install torch==2.9.0 'torch_xla[tpu]==2.9.0'",),
        sources=("torch_xla", "facts"),
    ),
    "jax": Profile(
        "jax",
        (("jax", "0.10.2"), ("jaxlib", "0.10.2"), ("flax", "0.12.8"), ("optax", "0.2.8")),
        ("pip install 'jax[tpu]==0.10.2' flax==0.12.8 optax==0.2.8",),
        sources=("jax", "facts"),
    ),
}


def profile(target: str) -> Profile:
    try:
        return PROFILES[target]
    except KeyError:
        raise ValueError(f"no platform profile for target {target!r}; known: {', '.join(PROFILES)}") from None


# --------------------------------------------------------------------------------------
# Accelerators
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """One TPU generation as the Cloud TPU docs describe it."""

    generation: str  # v2, v3, v4, v5e, v5p, v6e
    prefix: str  # accelerator-type prefix: "v5litepod" for v5e
    runtime: str  # TPU VM software version for PyTorch and JAX
    zones: tuple[str, ...]  # documented zones ("" entries never)
    # the number in the accelerator type counts chips (v5e, v6e) or TensorCores (v2-v5p)
    counts: str
    cores_per_chip: Optional[int]  # for a family that counts cores; None: not documented in the sources
    chips_per_host: Optional[int]  # None: not documented in the sources
    queued: Optional[bool]  # True: documented as provisioned through queued resources (or GKE)
    sizes: tuple[int, ...]  # accelerator types listed in the table (others are accepted too)
    sources: tuple[str, ...]
    note: str = ""


FAMILIES: tuple[Family, ...] = (
    Family("v2", "v2", "tpu-ubuntu2204-base", ("us-central1-b", "us-central1-c"), "cores", None, None, False, (8,),
           ("runtimes", "zones"), "v2-8 zones; larger v2 slices: us-central1-a"),
    Family("v3", "v3", "tpu-ubuntu2204-base", ("us-central1-a", "us-central1-b"), "cores", None, None, False, (8,),
           ("runtimes", "zones")),
    Family("v4", "v4", "tpu-ubuntu2204-base", ("us-central2-b",), "cores", 2, None, False, (8, 16, 32),
           ("runtimes", "zones", "v4")),
    Family("v5e", "v5litepod", "v2-alpha-tpuv5-lite", ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
           "chips", None, 8, False, (1, 4, 8, 16, 32), ("runtimes", "zones", "v5e")),
    Family("v5p", "v5p", "v2-alpha-tpuv5", ("us-central1-a", "us-east5-a"), "cores", 2, 4, False, (8, 16, 32),
           ("runtimes", "zones", "v5p")),
    Family("v6e", "v6e", "v2-alpha-tpuv6e", ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
           "chips", None, None, True, (1, 4, 8, 16, 32), ("runtimes", "zones", "v6e"),
           "provisioned as queued resources or through GKE"),
)


@dataclass(frozen=True)
class Accelerator:
    name: str  # the accelerator type: v5litepod-8
    family: Family
    size: int  # the number in the name

    @property
    def runtime(self) -> str:
        return self.family.runtime

    @property
    def chips(self) -> Optional[int]:
        """Chips of the slice; None where the sources give no cores per chip."""
        if self.family.counts == "chips":
            return self.size
        per = self.family.cores_per_chip
        return None if per is None else max(1, self.size // per)

    @property
    def chips_per_host(self) -> Optional[int]:
        return self.family.chips_per_host

    @property
    def hosts(self) -> Optional[int]:
        """Hosts (TPU VM workers) of the slice; None where the chips per host are not documented
        and the slice is larger than one documented single-host shape."""
        per, chips = self.family.chips_per_host, self.chips
        if chips is None:
            return None
        if per is None:
            return 1 if chips == 1 else None
        return max(1, -(-chips // per))

    @property
    def multi_host(self) -> Optional[bool]:
        h = self.hosts
        return None if h is None else h > 1

    @property
    def queued(self) -> Optional[bool]:
        return self.family.queued

    @property
    def zones(self) -> tuple[str, ...]:
        return self.family.zones


_NAME = re.compile(r"^(v2|v3|v4|v5litepod|v5p|v6e)-(\d+)$")


def accelerator(name: str) -> Accelerator:
    """The accelerator type ``name`` (``v5litepod-8``, ``v6e-4``, ``v4-8``...)."""
    m = _NAME.match(name.strip())
    if not m:
        known = ", ".join(a.name for a in table())
        raise ValueError(f"unknown accelerator type {name!r}; known types: {known} (and other sizes of these families)")
    fam = next(f for f in FAMILIES if f.prefix == m.group(1))
    size = int(m.group(2))
    if size < 1 or (fam.counts == "cores" and size % 8 and size != 8):
        raise ValueError(f"{name}: a {fam.generation} accelerator type counts TensorCores in multiples of 8")
    return Accelerator(name.strip(), fam, size)


def table() -> list[Accelerator]:
    """The accelerator types listed in docs/tpu.md."""
    return [Accelerator(f"{f.prefix}-{s}", f, s) for f in FAMILIES for s in f.sizes]


COLAB = {
    "accelerator": "v5e-1 (Colab's TPU runtime; free tier, 2025-09)",
    "retired": "v2-8",
    # Colab preinstalls a framework stack on its TPU runtime whose versions change without
    # notice: the kit checks them and installs porter's pins where they differ.
    "preinstalled": None,
    "sources": ("facts",),
}


def install_commands(target: str) -> tuple[str, ...]:
    """The documented install command for the target on a TPU host (porter's pins)."""
    return profile(target).tpu_install


def version_table_markdown() -> str:
    """docs/tpu.md's table, from :data:`FAMILIES` and :data:`PROFILES` (never typed by hand)."""
    def src(keys: Iterable[str]) -> str:
        return ", ".join(f"[{i}]" for i in (list(SOURCES).index(k) + 1 for k in keys))

    tx, jx = PROFILES["torch-xla"], PROFILES["jax"]
    lines = [
        "| accelerator | TPU VM software version | chips | chips/host | hosts | created through queued resources | zones (documented) | sources |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a in table():
        def show(v):
            return "unknown" if v is None else ("yes" if v is True else "no" if v is False else str(v))
        lines.append(
            f"| {a.name} | `{a.runtime}` | {show(a.chips)} | {show(a.chips_per_host)} | {show(a.hosts)} | "
            f"{show(a.queued)} | {', '.join(a.zones)} | {src(a.family.sources)} |"
        )
    lines += [
        "",
        "| target (porter's profile) | versions | libtpu | install on a TPU VM | sources |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in (tx, jx):
        versions = ", ".join(f"{n} {v}" for n, v in p.pins)
        libtpu = p.libtpu or "unknown: the one the `[tpu]` extra selects"
        lines.append(f"| {p.target} | {versions} | {libtpu} | `{'; '.join(p.tpu_install)}` | {src(p.sources)} |")
    lines += ["", "Every accelerator above runs both targets with the same profile: the TPU VM software "
              "version is the base image, the frameworks are installed on it with the command in the "
              "second table.", ""]
    for i, (key, (title, url)) in enumerate(SOURCES.items(), 1):
        lines.append(f"{i}. {title}" + (f": <{url}>" if url else ""))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# Pin check
# --------------------------------------------------------------------------------------
PIN_FILE_PATTERNS = ("requirements*.txt", "constraints*.txt")
SHELL_FILE_PATTERNS = ("*.sh", "Dockerfile", "Dockerfile.*", "*.dockerfile")


def normalize(name: str) -> str:
    """PEP 503 name: ``Torch_XLA`` and ``torch-xla`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    line: int  # 1-based, in the text checked
    column: int  # 0-based, where the requirement starts
    end_column: int


@dataclass(frozen=True)
class PinFinding:
    line: int
    column: int
    end_column: int
    message: str


_REQ = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[(?P<extras>[^\]]*)\])?\s*(?P<op>===|==|~=)\s*(?P<version>[A-Za-z0-9.*+!_-]+)"
)


def _requirement(spec: str) -> Optional[tuple[str, str]]:
    m = _REQ.fullmatch(spec.strip().split(";")[0].strip())
    if not m or m.group("op") == "~=":  # ~= allows a range: not a pin
        return None
    return m.group("name"), m.group("version")


def requirement_pins(text: str) -> list[Pin]:
    """The ``name==version`` lines of a requirements or constraints file."""
    pins = []
    for n, raw in enumerate(text.splitlines(), 1):
        body = raw.split(" #")[0].split("\t#")[0]
        if body.lstrip().startswith(("#", "-")):
            continue
        got = _requirement(body.strip().split(" --")[0])
        if got:
            start = len(raw) - len(raw.lstrip())
            pins.append(Pin(got[0], got[1], n, start, start + len(body.strip())))
    return pins


_PIP = re.compile(r"(?:^|[\s;&|(!%`'\"])(?:(?:python[\d.]*|\S*/python[\d.]*|sys\.executable)\s+-m\s+)?(?:uv\s+)?pip[\d.]*\s+install\b")


def command_pins(line: str, lineno: int = 1) -> list[Pin]:
    """The pinned requirements of each ``pip install`` in one shell line (``!pip install
    'torch==2.1' x``, ``python -m pip install -q a==1 && ...``)."""
    pins = []
    for m in _PIP.finditer(line):
        rest = line[m.end():]
        cut = re.search(r"(&&|\|\||;|\||`|\)|$)", rest)
        segment = rest[: cut.start()] if cut else rest
        try:
            tokens = shlex.split(segment, comments=True)
        except ValueError:
            tokens = segment.split()
        offset = m.end()
        for tok in tokens:
            if tok.startswith("-"):
                continue
            got = _requirement(tok)
            if not got:
                continue
            at = line.find(tok.split("==")[0], offset)
            at = at if at >= 0 else m.start()
            pins.append(Pin(got[0], got[1], lineno, at, at + len(tok)))
            offset = at + 1
    return pins


def compare(pins: Iterable[Pin], target: str) -> list[PinFinding]:
    prof = profile(target)
    out = []
    for p in pins:
        want = prof.pin(p.package)
        if want is None or p.version == want:
            continue
        out.append(PinFinding(
            p.line, p.column, p.end_column,
            f"{p.package}=={p.version} does not match the {target} profile ({p.package}=={want}): "
            f"porter's ports are written for {', '.join(f'{n}=={v}' for n, v in prof.pins)} "
            f"(docs/tpu.md); pin {p.package}=={want}",
        ))
    return out


def check_pins(text: str, target: str, kind: str = "requirements") -> list[PinFinding]:
    """Findings for ``text``: a requirements/constraints file (``kind="requirements"``) or
    shell lines (``kind="shell"``: each line may hold ``pip install`` commands)."""
    if kind == "requirements":
        return compare(requirement_pins(text), target)
    if kind == "shell":
        return check_shell_lines(enumerate(text.splitlines(), 1), target)
    raise ValueError(kind)


def check_shell_lines(lines: Iterable[tuple[int, str]], target: str) -> list[PinFinding]:
    """Findings for ``(line number, shell line)`` pairs: the hook for notebooks, whose
    ``!pip install`` / ``%pip install`` lines porter.notebook gives with their cell lines."""
    return compare([p for n, line in lines for p in command_pins(line, n)], target)


def notebook_pin_findings(shell_lines: Iterable, target: str) -> list[tuple[int, PinFinding]]:
    """``(cell number, finding)`` for a notebook's shell escapes: each item has ``cell``,
    ``line`` (in the cell) and ``text``, as ``porter.notebook.shell_lines(nb)`` gives them.
    The notebook check adds these to the notebook's findings (code: the target's PV rule)."""
    out = []
    for item in shell_lines:
        for f in compare(command_pins(item.text, item.line), target):
            out.append((item.cell, f))
    return out


def pin_file_kind(path: Path) -> Optional[str]:
    """"requirements" for a requirements/constraints file, "shell" for a shell script or a
    Dockerfile (its ``pip install`` lines), None for any other file."""
    if any(fnmatch.fnmatch(path.name, pat) for pat in PIN_FILE_PATTERNS):
        return "requirements"
    if any(fnmatch.fnmatch(path.name, pat) for pat in SHELL_FILE_PATTERNS):
        return "shell"
    return None


def iter_pin_files(paths: Iterable[Path]) -> Iterator[Path]:
    """The requirement, constraint and shell files among ``paths`` (folders walked, hidden and
    virtual-env folders skipped), each once, in a stable order."""
    seen: set[str] = set()
    for root in paths:
        root = Path(root)
        found: list[Path] = []
        if root.is_file():
            if pin_file_kind(root):
                found.append(root)
        elif root.is_dir():
            for folder, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
                found += [Path(folder) / f for f in sorted(filenames) if pin_file_kind(Path(f))]
        for f in found:
            key = os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                yield f


@dataclass(frozen=True)
class PinFileResult:
    path: Path
    findings: tuple[PinFinding, ...] = field(default_factory=tuple)
    error: str = ""


def check_pin_file(path: Path, target: str) -> PinFileResult:
    """A requirements/constraints file checked against ``target``'s profile; an unreadable
    file gives an error for that file, never an exception."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        return PinFileResult(path, error=f"cannot read: {exc.strerror or exc}")
    except UnicodeDecodeError:
        return PinFileResult(path, error="not UTF-8 text; porter reads requirement and shell files as UTF-8")
    return PinFileResult(path, tuple(check_pins(text, target, pin_file_kind(path) or "requirements")))


# --------------------------------------------------------------------------------------
# The PV rules' visitor (one subclass per target under codemods/<target>/)
# --------------------------------------------------------------------------------------
class PinnedVersionsRule(Rule):
    """Reports ``pip install NAME==VERSION`` in a Python file's strings (``os.system(...)``,
    ``subprocess.run("...", shell=True)``, ``[sys.executable, "-m", "pip", "install", ...]``)
    where the target's profile pins NAME to another version. Subclasses set the code, target
    and documentation."""

    needs_text = ("pip",)
    severity = Severity.WARNING

    def _finding(self, node: cst.SimpleString, found: PinFinding, package: str, old: str) -> None:
        want = profile(self.target).pin(package)
        fix = None
        for spelling in {package, normalize(package), package.replace("-", "_")}:
            if f"{spelling}=={old}" in node.value or f"{spelling}[" in node.value:
                new = re.sub(rf"({re.escape(spelling)}(?:\[[^\]]*\])?)=={re.escape(old)}(?![\w.])", rf"\g<1>=={want}", node.value)
                if new != node.value:
                    fix = Fix((Edit(node, node.with_changes(value=new)),), Safety.UNSAFE,
                              description=f"pin {package}=={want}")
                    break
        self.report(node, found.message, fix)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        # a whole command in one string (also as a list element: ["pip install torch==2.1"]);
        # a bare requirement element of an argument list is _sequence's
        value = string_value(node)
        if value is None or "pip" not in value:
            return
        for line_no, line in enumerate(value.splitlines() or [value], 1):
            for p in command_pins(line, line_no):
                for f in compare([p], self.target):
                    self._finding(node, f, p.package, p.version)

    def _sequence(self, node: cst.List | cst.Tuple) -> None:
        """``[sys.executable, "-m", "pip", "install", "torch==2.1"]``: the words joined (a
        non-string word stands for the interpreter), each requirement word checked."""
        words = [el.value if isinstance(el.value, cst.SimpleString) else None for el in node.elements]
        texts = [string_value(w) if w is not None else "python" for w in words]
        if not _PIP.search(" ".join(t or "" for t in texts)):
            return
        for w, t in zip(words, texts):
            got = _requirement(t) if w is not None and t else None
            if got:
                for f in compare([Pin(got[0], got[1], 1, 0, len(t))], self.target):
                    self._finding(w, f, got[0], got[1])

    def visit_List(self, node: cst.List) -> None:
        self._sequence(node)

    def visit_Tuple(self, node: cst.Tuple) -> None:
        self._sequence(node)
