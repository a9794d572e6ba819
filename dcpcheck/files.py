"""Every file the tool writes, written atomically where it is a file, and its path checked
before any work.

Reports, saved failing cases and ownership maps go through :func:`write_atomic`: a
temporary file beside the target, renamed over it, so a reader (CI, a crashed run's
post-mortem) never sees half a file. What a path names decides how it is written, since
a rename replaces whatever is there (run as root, ``--json /dev/null`` would turn the
machine's null device into a regular file):

* nothing, or a regular file: the atomic rename;
* a symlink: followed, and its target written by these same rules (never replaced by a
  file of its own);
* a character or block device, or a FIFO (``/dev/null``, ``/dev/stdout`` on a pipe, a
  named pipe a CI step reads): written into as it is, opened like ``>`` in a shell;
* a directory or a socket: refused, by :func:`ensure_writable` before any work.

The ``ensure_*`` checks turn an unwritable path into a one-line usage error before a run
spends minutes on the kernel; :func:`ensure_not_input` refuses a report path that names
one of the run's inputs (the kernel file under test, a scenario file it runs), which the
report would replace.

A run's directory (``--home``, ``$DCPCHECK_HOME``) holds what outlives a run: failing cases
saved as scenario files of their op (:func:`save_failure`) and Hypothesis's writes.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HOME_ENV = "DCPCHECK_HOME"
"""Environment variable naming the run directory (default ``.dcpcheck`` in the cwd)."""

DEFAULT_HOME = Path(".dcpcheck")

FAILURES_DIR = "failures"
"""Under home: shrunk failures, one scenario file each."""

HYPOTHESIS_DIR = "hypothesis"
"""Under home: all Hypothesis writes. Its example database, one directory per kernel, and
its storage directory for the rest (a kernel's directory is its ``kernel_slug``, never one
of Hypothesis's own names: a spec's slug has a ``-`` for its ``:``, and registry names are
none of them)."""

SLUG_MAX = 40
"""Longest kernel slug in a failure's name (a file path as ``--kernel`` can be long)."""

HASH_HEX_DIGITS = 8
"""Hex digits of the hash that names a saved failure."""


class ReportPathError(ValueError):
    """An output path that cannot be written; raised before any work starts."""


def _mode(path: Path) -> int | None:
    """``path``'s file type bits, symlinks followed; None where nothing is (or a symlink
    points nowhere)."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def written_in_place(path: Path) -> bool:
    """Whether ``path`` is a device or FIFO, which reports are written into as it is."""
    try:
        return _written_in_place(_mode(path))
    except OSError:
        return False


def _written_in_place(mode: int | None) -> bool:
    """A device or FIFO: written into as it is, never renamed over (module docstring)."""
    return mode is not None and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode))


def ensure_writable(path: Path) -> None:
    """Fail early, with one line, if ``path`` cannot be written as a report.

    A device or FIFO must be open to writing; anywhere else the test is the real thing: a
    temporary file is created beside the file the path resolves to (and removed), as
    ``write_atomic`` will do at the end. Permission bits alone can say yes where the write
    fails (read-only mounts, ``/proc``, a full quota).
    """
    try:
        mode = _mode(path)
    except OSError as exc:
        raise ReportPathError(f"{path}: {exc.strerror}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ReportPathError(f"{path}: is a directory, expected a file path")
    if mode is not None and stat.S_ISSOCK(mode):
        raise ReportPathError(f"{path}: is a socket, expected a file path")
    if _written_in_place(mode):
        if not os.access(path, os.W_OK):
            raise ReportPathError(f"{path}: is not writable")
        return
    target = Path(os.path.realpath(path))
    parent = target.parent
    if not parent.is_dir():
        raise ReportPathError(f"{path}: directory {parent} does not exist")
    _probe(parent, f"{path}: directory {parent} is not writable")


def ensure_not_input(path: Path, inputs: Iterable[tuple[str, Path]]) -> None:
    """Fail early, with one line, if ``path`` is the same file as one of ``inputs`` (what
    each is, and its path), by name, symlink or hard link: the report written there would
    replace what the run reads."""
    for what, source in inputs:
        if _same_file(path, source):
            raise ReportPathError(f"{path}: is {what} {source}, which the report would replace")


def _same_file(first: Path, second: Path) -> bool:
    """Whether ``first`` and ``second`` name one file; False where either names none."""
    try:
        return os.path.samefile(first, second)
    except (OSError, ValueError):
        return False


def ensure_directory_writable(directory: Path) -> None:
    """Fail early if files cannot be created under ``directory``, which need not exist yet
    (it is created on first use): its nearest existing ancestor must be a writable one."""
    existing = directory
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        mode = os.stat(existing).st_mode
    except OSError as exc:  # a symlink that loops, or that points nowhere
        where = directory if existing == directory else f"{directory}: {existing}"
        raise ReportPathError(f"{where}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
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
    """Write ``content`` to what ``path`` names, by the rules of the module docstring: a
    temporary file beside the (symlink-resolved) target renamed over it, or straight into
    a device or FIFO. ``IsADirectoryError`` / ``OSError`` for a directory or a socket."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    mode = _mode(path)
    if _written_in_place(mode):
        with open(path, "wb") as handle:
            handle.write(data)
        return
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "is neither a file, a device nor a FIFO", str(path))
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _creation_mode())
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_home() -> Path:
    """``$DCPCHECK_HOME`` if set, else ``.dcpcheck`` relative to the working directory."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME)


def kernel_slug(kernel_name: str) -> str:
    """``regress/pre-54908`` -> ``regress-pre-54908``: a kernel name fit for a file name."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", kernel_name).strip("-.")
    return slug[:SLUG_MAX].rstrip("-.") or "kernel"


def save_failure(
    scenario: Any,
    stem: str,
    description: str,
    directory: Path,
    to_toml: Callable[[Any], str],
) -> Path:
    """Write ``scenario`` as ``directory/<stem>-<hash>.toml`` (atomically), renamed and
    described, so it loads as is and ``dcpcheck repro`` replays it; its path. ``to_toml``
    writes the scenario's op's file format.

    The hash is of the file's text under the name without the hash, so one failure always
    gets one name and saving it twice overwrites one file.
    """
    unhashed = dataclasses.replace(scenario, name=stem, description=description, source=None)
    digest = hashlib.sha256(to_toml(unhashed).encode()).hexdigest()[:HASH_HEX_DIGITS]
    named = dataclasses.replace(unhashed, name=f"{stem}-{digest}")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{named.name}.toml"
    write_atomic(path, to_toml(named))
    return path
