"""Every file the tool writes, written atomically, and its path checked before any work.

Reports, saved failing cases and ownership maps go through :func:`write_atomic`: a
temporary file beside the target, renamed over it, so a reader (CI, a crashed run's
post-mortem) never sees half a file. The ``ensure_*`` checks turn an unwritable path into
a one-line usage error before a run spends minutes on the kernel.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class ReportPathError(ValueError):
    """An output path that cannot be written; raised before any work starts."""


def ensure_writable(path: Path) -> None:
    """Fail early, with one line, if ``path`` cannot be written as a report.

    The test is the real thing: a temporary file is created beside ``path`` (and removed),
    as ``write_atomic`` will do at the end. Permission bits alone can say yes where the
    write fails (read-only mounts, ``/proc``, a full quota).
    """
    if path.is_dir():
        raise ReportPathError(f"{path}: is a directory, expected a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ReportPathError(f"{path}: directory {parent} does not exist")
    _probe(parent, f"{path}: directory {parent} is not writable")


def ensure_directory_writable(directory: Path) -> None:
    """Fail early if files cannot be created under ``directory``, which need not exist yet
    (it is created on first use): its nearest existing ancestor must be a writable one."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ReportPathError(f"{directory}: {existing} is not a directory")
    _probe(existing, f"{directory}: cannot create files under {existing}")


def _probe(directory: Path, problem: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".dcpcheck-probe.")
    except OSError as exc:
        raise ReportPathError(f"{problem} ({exc.strerror})") from None
    os.close(fd)
    Path(probe).unlink()


def _creation_mode() -> int:
    """The mode ``open()`` gives a new file (0o666 less the umask): ``mkstemp`` uses 0o600,
    and a report CI or a colleague cannot read is a report lost."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write ``content`` to a temporary file beside ``path``, then rename it over ``path``."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _creation_mode())
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
