"""Reading and writing users' source files safely, and finding them.

Reading turns every kind of bad input into a one-line :class:`PorterError`: unreadable paths,
symlink loops, directories, FIFOs and other non-regular files (opened without blocking),
binary files, huge files, undecodable text. Text keeps its encoding (PEP 263 cookie or UTF-8),
BOM and line endings, so a file written back differs only where a rule changed it.

Writing is atomic: a temporary file in the target's folder, fsynced, given the intended
permission bits, then renamed over the target. Readers see the old file or the new one, never
half of one, and a failed write leaves no temporary file behind.
"""
from __future__ import annotations

import codecs
import errno
import importlib.machinery
import importlib.util
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from porter.engine import PorterError

MAX_BYTES = 10 * 1024 * 1024
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
_BLANK_OR_COMMENT = re.compile(rb"^[ \t\f]*(?:[#\r\n]|$)")
SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", ".tox", ".nox",
    "build", "dist", "site-packages", "node_modules", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", ".eggs", ".ipynb_checkpoints",
})
TMP_SUFFIX = ".porter-tmp"


@dataclass(frozen=True)
class SourceText:
    text: str  # decoded, BOM stripped, newlines as in the file
    encoding: str
    bom: bool
    raw: bytes = b""  # the file's bytes, exactly
    mode: Optional[int] = None  # permission bits of the file read

    def encode(self, text: str) -> bytes:
        try:
            data = text.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise PorterError(
                f"the new code has a character {text[exc.start]!r} that {self.encoding} cannot encode"
            ) from None
        return (codecs.BOM_UTF8 + data) if self.bom else data


def _os_error(exc: OSError, doing: str = "cannot read") -> PorterError:
    if exc.errno == errno.ELOOP:
        return PorterError("symlink loop")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PorterError(f"{doing}: permission denied")
    if exc.errno == errno.ENOENT:
        return PorterError("no such file (or a broken symlink)")
    return PorterError(f"{doing}: {exc.strerror or exc}")


def read_source(path: Path, max_bytes: int = MAX_BYTES) -> SourceText:
    """Read and decode one Python file, or raise a one-line :class:`PorterError`.

    The file is opened with O_NONBLOCK and checked with fstat on the open descriptor, so a
    FIFO never blocks and nothing can swap the file between the check and the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise PorterError("is a directory, not a Python file") from None
    except OSError as exc:
        raise _os_error(exc) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PorterError("is a directory, not a Python file")
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device or special file"
            raise PorterError(f"not a regular file ({kind})")
        if st.st_size > max_bytes:
            raise PorterError(f"file too large ({st.st_size / 1e6:.1f} MB; the limit is {max_bytes / 1e6:.0f} MB)")
        chunks = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise PorterError(f"file too large (over the {max_bytes / 1e6:.0f} MB limit)")
    except OSError as exc:
        raise _os_error(exc) from None
    finally:
        os.close(fd)
    src = decode(data)
    return SourceText(src.text, src.encoding, src.bom, data, stat.S_IMODE(st.st_mode))


def _declared_encoding(data: bytes) -> Optional[str]:
    """The PEP 263 cookie: on line 1, or on line 2 if line 1 is blank or a comment."""
    lines = data.split(b"\n", 2)
    for i, line in enumerate(lines[:2]):
        m = _COOKIE.match(line)
        if m:
            return m.group(1).decode("ascii")
        if i == 0 and not _BLANK_OR_COMMENT.match(line):
            return None
    return None


def _wide_encoding(data: bytes) -> Optional[str]:
    """"UTF-16 (little-endian, with BOM)" and the like for text in UTF-16/32, else None: a
    BOM, or ASCII-range text whose NUL bytes fall in the places those encodings put them."""
    for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32 (little-endian"), (codecs.BOM_UTF32_BE, "UTF-32 (big-endian"),
                      (codecs.BOM_UTF16_LE, "UTF-16 (little-endian"), (codecs.BOM_UTF16_BE, "UTF-16 (big-endian")):
        if data.startswith(bom):
            return f"{name}, with BOM)"
    sample = data[:4096]
    n = len(sample) - len(sample) % 4
    if n < 8:
        return None
    sample = sample[:n]
    zeros = [sample[k::4].count(0) / (n // 4) for k in range(4)]
    if zeros[1] > 0.9 and zeros[2] > 0.9 and zeros[3] > 0.9 and zeros[0] < 0.1:
        return "UTF-32 (little-endian, no BOM)"
    if zeros[0] > 0.9 and zeros[1] > 0.9 and zeros[2] > 0.9 and zeros[3] < 0.1:
        return "UTF-32 (big-endian, no BOM)"
    even, odd = (zeros[0] + zeros[2]) / 2, (zeros[1] + zeros[3]) / 2
    if odd > 0.6 and even < 0.1:
        return "UTF-16 (little-endian, no BOM)"
    if even > 0.6 and odd < 0.1:
        return "UTF-16 (big-endian, no BOM)"
    return None


def decode(data: bytes) -> SourceText:
    if b"\0" in data or data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        wide = _wide_encoding(data)
        if wide:
            raise PorterError(
                f"text in {wide}, not Python source: Python source must be UTF-8 or an ASCII-compatible "
                "encoding declared by a PEP 263 coding line; convert the file to UTF-8"
            )
        if b"\0" in data:
            raise PorterError("binary file (contains NUL bytes), not Python source")
    bom = data.startswith(codecs.BOM_UTF8)
    if bom:
        data = data[len(codecs.BOM_UTF8):]
    encoding = _declared_encoding(data) or "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise PorterError(f"unknown encoding {encoding!r} in the coding declaration") from None
    if bom and codecs.lookup(encoding).name != "utf-8":
        raise PorterError(f"UTF-8 BOM but the coding declaration says {encoding}")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise PorterError(
            f"not valid {encoding} (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "add a coding declaration or convert the file to UTF-8"
        ) from None
    return SourceText(text, encoding, bom)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes, mode: Optional[int] = None, follow_symlinks: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half.

    ``path`` may be a symlink: its target is replaced and the link kept (with
    ``follow_symlinks=False`` the link itself is replaced by the file). Permission bits are
    ``mode`` when given, else those of the file replaced, else 0o666 less the umask. Parent
    folders are created. On any failure the temporary file is removed and the error raised.
    """
    target = Path(os.path.realpath(path)) if follow_symlinks else Path(os.path.abspath(path))
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy a regular file (not a FIFO: opened without blocking) to ``dst`` atomically, with
    its permission bits and times."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_error(exc) from None
    with os.fdopen(fd, "rb") as fin:
        st = os.fstat(fin.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PorterError("not a regular file")
        target = Path(dst)  # a symlink already at dst is replaced, never written through
        target.parent.mkdir(parents=True, exist_ok=True)
        tfd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=target.parent)
        try:
            with os.fdopen(tfd, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
                fout.flush()
                os.fsync(fout.fileno())
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise


def _walk(root: Path, errors: Optional[list[tuple[Path, str]]] = None):
    """os.walk without following symlinked folders, skipping VCS, virtualenv and build dirs.

    A folder that cannot be listed is recorded in ``errors`` (path, message) and skipped.
    """
    def onerror(exc: OSError) -> None:
        if errors is not None:
            errors.append((Path(exc.filename or root), f"cannot list folder: {exc.strerror or exc}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        yield Path(dirpath), dirnames, sorted(filenames)


SOURCE_SUFFIXES = (".py", ".ipynb")  # Python files and Jupyter notebooks (porter/notebook.py)


def iter_python_files(paths: list[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Every .py and .ipynb file under ``paths``, in a stable order, each once; and the walk's errors.

    Directories are walked (symlinked folders are not followed). A path given explicitly is
    always taken, even a bad one: reading it reports the error. A folder named like a Python
    file (``x.py/``) found while walking is listed too, so it is reported; it is also walked.
    """
    out: list[Path] = []
    errors: list[tuple[Path, str]] = []
    seen: set[str] = set()

    def add(p: Path) -> None:
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            out.append(p)

    for p in paths:
        if p.is_dir():
            found = [
                dirpath / name
                for dirpath, dirnames, filenames in _walk(p, errors)
                for name in (*dirnames, *filenames) if name.endswith(SOURCE_SUFFIXES)
            ]
            for f in sorted(found, key=lambda f: f.parts):
                add(f)
        else:
            add(p)
    return out, errors


def iter_other_files(root: Path) -> list[Path]:
    """Every entry under ``root`` that is neither a folder nor a source (.py, .ipynb) file (for
    copying into an --out tree)."""
    found = []
    for dirpath, dirnames, filenames in _walk(root):
        for name in filenames:
            if not name.endswith(SOURCE_SUFFIXES):
                found.append(dirpath / name)
    return found


def find_spec(name: str, roots: Optional[tuple[str, ...]] = None) -> Optional[importlib.machinery.ModuleSpec]:
    """The spec of module ``name`` as ``import`` would find it, without importing it or its
    parents: on ``roots`` (folders, in order) or, when None, on this interpreter's finders.
    None where it is not found (or a folder on the way cannot be read, or the name is malformed)."""
    parts = name.split(".")
    try:
        if roots is None:
            spec = importlib.util.find_spec(parts[0])  # a top-level name imports nothing
        else:
            spec = importlib.machinery.PathFinder.find_spec(parts[0], list(roots))
        for i in range(1, len(parts)):
            if spec is None or not spec.submodule_search_locations:
                return None
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    return spec
