"""Reading and writing users' source files safely.

Reading turns every kind of bad input into a one-line :class:`PorterError`: unreadable paths,
symlink loops, non-regular files, binary files, huge files, undecodable text. Text keeps its
encoding (PEP 263 cookie or UTF-8), BOM and line endings, so a file written back differs only
where a rule changed it. Writing is atomic: a temporary file in the same folder, fsynced,
then renamed over the original with the original's permission bits.
"""
from __future__ import annotations

import codecs
import errno
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from porter.engine import PorterError

MAX_BYTES = 10 * 1024 * 1024
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", ".tox", ".nox",
    "build", "dist", "site-packages", "node_modules", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", ".eggs", ".ipynb_checkpoints",
})


@dataclass(frozen=True)
class SourceText:
    text: str  # decoded, BOM stripped, newlines as in the file
    encoding: str
    bom: bool

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return (codecs.BOM_UTF8 + data) if self.bom else data


def _os_error(exc: OSError) -> PorterError:
    if exc.errno == errno.ELOOP:
        return PorterError("symlink loop")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PorterError("permission denied")
    if exc.errno == errno.ENOENT:
        return PorterError("no such file (or a broken symlink)")
    return PorterError(f"cannot read: {exc.strerror or exc}")


def read_source(path: Path, max_bytes: int = MAX_BYTES) -> SourceText:
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise PorterError("is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise PorterError("not a regular file")
        if st.st_size > max_bytes:
            raise PorterError(f"file too large ({st.st_size / 1e6:.1f} MB; limit {max_bytes / 1e6:.0f} MB)")
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise _os_error(exc) from None
    return decode(data)


def decode(data: bytes) -> SourceText:
    if b"\0" in data:
        raise PorterError("binary file (contains NUL bytes), not Python source")
    bom = data.startswith(codecs.BOM_UTF8)
    if bom:
        data = data[len(codecs.BOM_UTF8):]
    encoding = "utf-8"
    for line in data.split(b"\n", 2)[:2]:
        m = _COOKIE.match(line)
        if m:
            encoding = m.group(1).decode("ascii")
            break
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


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    mode = None
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".porter-tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def iter_python_files(paths: list[Path]) -> list[tuple[Path, Path]]:
    """(file, root) pairs for every .py file under ``paths``; ``root`` anchors --out trees.

    Directories are walked without following symlinked folders, skipping virtualenvs, VCS
    and build folders. A path given explicitly is always taken (even a bad one: reading it
    reports the error).
    """
    out: list[tuple[Path, Path]] = []
    for p in paths:
        if p.is_dir():
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        out.append((Path(dirpath) / name, p))
        else:
            out.append((p, p.parent))
    return out


def iter_all_files(root: Path) -> list[Path]:
    """Every file under ``root`` (for copying untouched files into an --out tree)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            found.append(Path(dirpath) / name)
    return found
