"""Released kernels as test subjects: ``--kernel vllm==0.29.0`` names the fused MLA kernel
file of that published vLLM wheel.

The first use of a release downloads its wheel with pip (``pip download --no-deps``, the
package index pip is configured for, which checks the wheel against the index's hash),
keeps only the files dcpcheck judges, in a cache outside the checkout, and deletes the
wheel (about 330 MB); later uses, offline ones included, read the cache. Nothing of vLLM is
ever written into the repository. The cache lives in ``$DCPCHECK_CACHE`` or else
``~/.cache/dcpcheck`` (made absolute, so a command run elsewhere finds the same one)::

    <cache>/releases/vllm/0.29.0/vllm/models/deepseek_v32/common/kernels.py
    <cache>/releases/vllm/0.29.0/source.json    the wheel's name, each kept file's SHA256
                                                 as the wheel's own RECORD gives it, and
                                                 the members looked for

Why a record: a cached file is code that dcpcheck imports and runs, and whose verdict it
reports under the release's name. A cached file edited by hand (or by a stray tool) would
be judged as that release. So every kept file is checked against its RECORD entry when the
wheel is unpacked, and again before every import (:func:`fetch`): a mismatch, a missing
record or a missing file is :class:`CacheFault`, one line naming the file and the command
that fetches it afresh (``dcpcheck fetch --refresh vllm==X``).

The record lives in the cache, so it cannot vouch for the cache on its own: the lock file
that ships with dcpcheck (``dcpcheck.kernels.release_lock``) gives the SHA256 of every kept
file of every release dcpcheck supports, and a release it knows is checked against it, at
the unpacking of its wheel and before every import, whatever the cache's record says. A
release it does not know is checked against its wheel's RECORD as kept in the cache, and
the first load of one in a process says so (a warning on stderr).

What is checked is what runs: the bytes whose SHA256 matched are kept
(:func:`verified_source`) and the loaders compile those (``dcpcheck.kernels.loading``),
never the cached file read again, nor a bytecode cache beside it; none is written there.

Versions are normalised as pip compares them (``0.30`` is ``0.30.0``), so one release has
one cache folder and one name in every report. A version the package index does not have
is :class:`UnknownRelease`, naming the nearest published ones, and leaves nothing behind.

The loaded file goes through the same loader and adapter as any ``file.py:function``
(dcpcheck.kernels.loading): the vLLM stand-ins answer its imports, and the adapter calls it
the way that release's own caller does and reads from the file what its signature cannot
say (the fp8_ds_mla tile-scale rule it writes), so a release and the same file given by
path are judged alike.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dcpcheck.kernels import release_lock
from dcpcheck.kernels.errors import KernelLoadError, KernelSpecError
from dcpcheck.op_registry import DEFAULT_OP, OPS

log = logging.getLogger(__name__)

PACKAGE = "vllm"
KERNEL_MEMBER = OPS[DEFAULT_OP].wheel_members[-1]
"""The member a fetch returns unless asked for another: where the newest releases keep the
default op's routine (``fused_norm_rope``, from 0.27.0; 0.25.0 - 0.26.0 keep it at the
registry's older path, which that op's loader looks for too)."""

KEPT_MEMBERS = tuple(dict.fromkeys(m for op in OPS.values() for m in op.wheel_members))
"""Every wheel member an op judges (``dcpcheck.op_registry``); a fetch keeps those the
wheel has, and its record names them all, so a member a release lacks is known to be
lacking without a second download."""

DEFAULT_FUNCTION = OPS[DEFAULT_OP].function
"""The routine ``vllm==X`` names without ``:FUNCTION``: the default op's."""

VERSION = re.compile(r"^(?P<release>\d+(?:\.\d+)*)(?P<suffix>(?:a|b|rc)\d+)?(?P<post>\.post\d+)?$")
"""The versions vLLM publishes: a release segment, then maybe a pre-release (``rc1``) and
a post-release (``.post1``). Anything else (``0.3O.0``, ``latest``) is refused as written."""

RELEASE_SPEC = re.compile(r"^vllm==(?P<version>[^:\s]+)(?::(?P<function>\w+))?$")
"""``vllm==X.Y.Z`` or ``vllm==X.Y.Z:function``."""

RELEASE_SEGMENT_WIDTH = 3
"""vLLM spells its releases with three numbers (``0.30.0``); a shorter spelling is padded
and trailing zeros past three are dropped, as pip compares them (``0.9.0.1`` stays)."""

PIP_TIMEOUT_S = 900
"""A wheel is about 330 MB; a slow index may take minutes, a dead one should not hang CI."""

NEAREST_SHOWN = 2
"""Published versions an unknown version's message names: the one below and the one above."""

SOURCE_RECORD = "source.json"


class ReleaseError(KernelLoadError):
    """A release cannot be had: not cached and not downloadable, or its wheel lacks the
    kernel file. One line; a kernel that cannot be loaded (125)."""


class CacheFault(ReleaseError, KernelSpecError):
    """The release cache cannot be trusted or used: a kept file that does not match the
    lock file or its wheel's RECORD, a missing record or file, a record that contradicts
    the lock file, a cache folder that is not a writable folder, or a lock file that
    cannot be read. One line; bad input (exit 2), since no revision would fix it."""


class UnknownRelease(ReleaseError, KernelSpecError):
    """A version the package index does not publish (exit 2): ``nearest`` names the
    published versions around it."""

    def __init__(self, version: str, nearest: Sequence[str]) -> None:
        self.nearest = tuple(nearest)
        shown = f" (nearest published: {', '.join(nearest)})" if nearest else ""
        super().__init__(f"{PACKAGE}=={version}: no such release on the package index{shown}")


class MalformedVersion(ValueError):
    """A version that is not a version: one line naming it."""


@dataclass(frozen=True)
class ReleaseSpec:
    """A parsed ``vllm==X`` kernel spec, its version normalised."""

    version: str
    function: str = DEFAULT_FUNCTION

    @property
    def name(self) -> str:
        return f"{PACKAGE}=={self.version}"


@dataclass(frozen=True)
class KeptFile:
    """A file kept from a wheel: where it is cached, the SHA256 the lock file (or its
    RECORD) gives, and its bytes as read when they were found to have that SHA256."""

    path: Path
    sha256: str
    source: bytes = field(repr=False, compare=False)


def normalise(version: str) -> str:
    """``version`` as the cache and the reports spell it (RELEASE_SEGMENT_WIDTH);
    :class:`MalformedVersion` if it is not a version vLLM could publish (VERSION)."""
    match = VERSION.match(version.strip())
    if match is None:
        raise MalformedVersion(f"{version!r} is not a version (expected e.g. 0.30.0)")
    numbers = [str(int(part)) for part in match["release"].split(".")]
    while len(numbers) > RELEASE_SEGMENT_WIDTH and numbers[-1] == "0":
        numbers.pop()
    numbers += ["0"] * (RELEASE_SEGMENT_WIDTH - len(numbers))
    return ".".join(numbers) + (match["suffix"] or "") + (match["post"] or "")


def parse_spec(spec: str, default_function: str = DEFAULT_FUNCTION) -> ReleaseSpec | None:
    """``spec`` as a release (its function ``default_function`` unless it names one), or
    None when it does not name one; :class:`MalformedVersion` when it names one by
    something that is not a version (``vllm==0.3O.0``)."""
    match = RELEASE_SPEC.match(spec)
    if match is None:
        return None
    return ReleaseSpec(normalise(match["version"]), match["function"] or default_function)


def version_key(version: str) -> tuple[tuple[int, ...], int, int, int]:
    """An order on normalised versions: release numbers, then a pre-release before its
    release and a post-release after it."""
    match = VERSION.match(version)
    if match is None:
        raise MalformedVersion(f"{version!r} is not a version")
    numbers = tuple(int(part) for part in match["release"].split("."))
    pre = match["suffix"]
    rank = {"a": 0, "b": 1, "rc": 2}[re.match(r"[a-z]+", pre)[0]] if pre else 3
    pre_number = int(re.search(r"\d+", pre)[0]) if pre else 0
    post = int(match["post"].removeprefix(".post")) if match["post"] else -1
    return numbers, rank, pre_number, post


def cache_root() -> Path:
    """``$DCPCHECK_CACHE``, else ``~/.cache/dcpcheck``; absolute (module docstring)."""
    configured = os.environ.get("DCPCHECK_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "dcpcheck"
    return root.absolute()


def release_dir(version: str) -> Path:
    return cache_root() / "releases" / PACKAGE / version


def refetch_command(version: str) -> str:
    return f"dcpcheck fetch --refresh {PACKAGE}=={version}"


@dataclass(frozen=True)
class SourceRecord:
    """What ``source.json`` says: the wheel's name, each kept member's SHA256 from the
    wheel's RECORD, and every member the fetch looked for (those not kept are not in the
    wheel)."""

    wheel: str
    files: dict[str, str]
    looked_for: tuple[str, ...]


def _record_of(folder: Path, version: str) -> SourceRecord | None:
    """``folder``'s source record, None without one."""
    record = folder / SOURCE_RECORD
    if not record.exists():
        return None
    if not record.is_file():  # a FIFO or a device would block the read: never opened
        raise CacheFault(
            f"{record}: not a regular file; fetch it afresh: {refetch_command(version)}"
        )
    try:
        content = json.loads(record.read_text(encoding="utf-8"))
        files = content["files"]
        if not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
            raise TypeError("files is not a map of member to sha256")
        looked_for = content.get("looked_for", [])
        if not (isinstance(looked_for, list) and all(isinstance(m, str) for m in looked_for)):
            raise TypeError("looked_for is not a list of members")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = (
            exc.strerror
            if isinstance(exc, OSError)
            else "gives no file's SHA256 from its wheel's RECORD"
        )
        raise CacheFault(f"{record}: {why}; fetch it afresh: {refetch_command(version)}") from None
    return SourceRecord(str(content.get("wheel", "")), files, tuple(looked_for))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CacheFault(f"{path}: cannot read: {exc.strerror}") from None


def lock() -> release_lock.Lock:
    """The lock file dcpcheck ships; :class:`CacheFault` when it cannot be read."""
    try:
        return release_lock.shipped()
    except release_lock.MalformedLock as exc:
        raise CacheFault(f"dcpcheck's release lock file: {exc}; reinstall dcpcheck") from None


_UNLOCKED_SAID: set[str] = set()
"""The releases this process has said are not in the lock file (said once each)."""


def _say_unlocked(version: str) -> None:
    if version not in _UNLOCKED_SAID:
        _UNLOCKED_SAID.add(version)
        log.warning(
            "%s==%s is not in dcpcheck's lock file (%s): its files are checked against "
            "the SHA256 its wheel's RECORD gave when it was fetched, as the cache keeps it",
            PACKAGE,
            version,
            release_lock.LOCK_FILE.name,
        )


_VERIFIED: dict[Path, bytes] = {}
"""Each cached file's bytes as last read and found to have the SHA256 expected of them."""


def verified_source(path: Path) -> bytes | None:
    """The bytes of the release file at ``path`` as :func:`cached` last checked them; None
    for a file it never checked (not a release file)."""
    return _VERIFIED.get(path.resolve())


def cached(version: str, member: str = KERNEL_MEMBER) -> KeptFile | None:
    """``member`` of release ``version`` from the cache, checked against the lock file when
    it knows the release, else against the cache's record of its wheel's RECORD; None when
    the release was never fetched (or not since ``member`` was kept). :class:`CacheFault`
    when the cache holds the file without a record entry, the entry without the file, a
    file whose SHA256 differs from the expected one, or a record that says the wheel lacks
    a file the lock file gives; :class:`ReleaseError` when the release's wheel has no such
    member."""
    folder = release_dir(version)
    path = folder / member
    if folder.exists() and not folder.is_dir():
        raise CacheFault(f"{folder}: not a folder; remove it, or set DCPCHECK_CACHE elsewhere")
    record = _record_of(folder, version)
    files = {} if record is None else record.files
    locked = lock().knows(version, member)
    expected = lock().sha256(version, member) if locked else files.get(member)
    if member not in files:
        stray = [p for p in (path, folder / Path(member).name) if p.is_file()]
        if stray:
            raise CacheFault(
                f"{stray[0]}: cached without a record of its wheel's SHA256, so it cannot be "
                f"trusted; fetch it afresh: {refetch_command(version)}"
            )
        said_lacking = record is not None and member in record.looked_for
        if locked and expected is not None and said_lacking:
            raise CacheFault(
                f"{folder / SOURCE_RECORD}: says {PACKAGE} {version}'s wheel has no {member}, "
                f"which dcpcheck's lock file gives; fetch it afresh: {refetch_command(version)}"
            )
        if expected is None and (locked or said_lacking):
            raise ReleaseError(f"{PACKAGE}=={version}: its wheel has no {member}")
        return None  # never fetched, or fetched before this member was kept: fetch() adds it
    if expected is None:
        raise CacheFault(
            f"{path}: cached, though dcpcheck's lock file says {PACKAGE} {version}'s wheel has "
            f"no such file; fetch it afresh: {refetch_command(version)}"
        )
    if not path.is_file():
        raise CacheFault(
            f"{path}: missing from the release cache; fetch it afresh: {refetch_command(version)}"
        )
    source = _read(path)
    actual = hashlib.sha256(source).hexdigest()
    if actual != expected:
        vouching = "dcpcheck's lock file gives" if locked else "its wheel's RECORD gave"
        raise CacheFault(
            f"{path}: SHA256 {actual[:16]}... differs from {expected[:16]}... that "
            f"{vouching} for {PACKAGE} {version}: the cached file was changed; fetch it "
            f"afresh: {refetch_command(version)}"
        )
    if not locked:
        _say_unlocked(version)
    _VERIFIED[path.resolve()] = source
    return KeptFile(path, actual, source)


def published_versions() -> list[str] | None:
    """Every version of vLLM the package index publishes, oldest first; None when the index
    cannot be asked (no network). Normalised (``normalise``); versions dcpcheck could not
    name (``.dev`` builds) are left out."""
    command = [sys.executable, "-m", "pip", "index", "versions", PACKAGE]
    command += ["--disable-pip-version-check"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    for line in done.stdout.splitlines():
        if line.startswith("Available versions:"):
            return _sorted_versions(line.split(":", 1)[1].split(","))
    return None


def _sorted_versions(words: Sequence[str]) -> list[str]:
    versions = set()
    for word in words:
        try:
            versions.add(normalise(word))
        except MalformedVersion:
            continue
    return sorted(versions, key=version_key)


def nearest(version: str, published: Sequence[str]) -> list[str]:
    """The published versions just below and just above ``version`` (NEAREST_SHOWN)."""
    key = version_key(version)
    below = [v for v in published if version_key(v) < key]
    above = [v for v in published if version_key(v) > key]
    return [*below[-1:], *above[:1]][:NEAREST_SHOWN]


def _download_wheel(version: str, into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(into),
        f"{PACKAGE}=={version}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReleaseError(
            f"{PACKAGE}=={version}: pip download took over {PIP_TIMEOUT_S} s"
        ) from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        listed = re.search(r"\(from versions: ([^)]*)\)", done.stderr)
        if listed is not None and listed[1].strip() not in ("", "none"):
            published = _sorted_versions(listed[1].split(","))
            if version not in published:
                raise UnknownRelease(version, nearest(version, published))
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        why = errors[-1].removeprefix("ERROR: ") if errors else f"pip exited {done.returncode}"
        raise ReleaseError(
            f"{PACKAGE}=={version} is not in dcpcheck's cache ({cache_root()}) and could not "
            f"be downloaded: {why}"
        )
    return wheels[0]


def record_sha256(archive: zipfile.ZipFile, member: str) -> str:
    """The SHA256 (hex) the wheel's ``*.dist-info/RECORD`` gives ``member``; ReleaseError
    when the wheel has no RECORD or no entry for it (a wheel must list every file)."""
    records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise ReleaseError(
            f"{archive.filename}: expected one .dist-info/RECORD, found {len(records)}"
        )
    rows = csv.reader(io.StringIO(archive.read(records[0]).decode("utf-8")))
    for row in rows:
        if row and row[0] == member:
            algorithm, _, digest = row[1].partition("=") if len(row) > 1 else ("", "", "")
            if algorithm != "sha256":
                break
            padded = digest + "=" * (-len(digest) % 4)
            return base64.urlsafe_b64decode(padded).hex()
    raise ReleaseError(f"{archive.filename}: its RECORD gives no sha256 for {member}")


def _wheel_files(version: str, wheel: Path) -> dict[str, bytes]:
    """The KEPT_MEMBERS the wheel has, member -> bytes, each checked against its RECORD. A
    wheel with none of them is refused."""
    kept: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            if not names & set(KEPT_MEMBERS):
                raise ReleaseError(
                    f"{PACKAGE}=={version}: its wheel has none of the files dcpcheck judges "
                    f"({', '.join(KEPT_MEMBERS)})"
                )
            for member in KEPT_MEMBERS:
                if member not in names:
                    continue
                source = archive.read(member)
                if hashlib.sha256(source).hexdigest() != record_sha256(archive, member):
                    raise ReleaseError(f"{wheel.name}: {member} does not match its RECORD")
                kept[member] = source
    except zipfile.BadZipFile as exc:
        raise ReleaseError(f"{PACKAGE}=={version}: {wheel.name}: {exc}") from None
    return kept


def _check_against_lock(version: str, wheel: Path, files: dict[str, str]) -> None:
    """ReleaseError when the lock file knows ``version`` and ``files`` (member -> SHA256 of
    the wheel's RECORD) differ from what it gives: a wheel other than the one locked."""
    for member in KEPT_MEMBERS:
        if lock().knows(version, member) and files.get(member) != lock().sha256(version, member):
            raise ReleaseError(
                f"{wheel.name}: {member} differs from what dcpcheck's lock file gives for "
                f"{PACKAGE} {version}"
            )


def _unpack(version: str, wheel: Path, into: Path) -> dict[str, str]:
    """Write the KEPT_MEMBERS the wheel has under ``into``, each checked against its RECORD
    and the lock file, and the source record; member -> sha256."""
    sources = _wheel_files(version, wheel)
    kept = {member: hashlib.sha256(source).hexdigest() for member, source in sources.items()}
    _check_against_lock(version, wheel, kept)
    for member, source in sources.items():
        target = into / member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source)
    record = {
        "package": PACKAGE,
        "version": version,
        "wheel": wheel.name,
        "files": kept,
        "looked_for": list(KEPT_MEMBERS),
    }
    (into / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return kept


def wheel_release(version: str) -> release_lock.LockedRelease:
    """Release ``version`` as the lock file gives it, read from its wheel (downloaded into a
    temporary folder, deleted after): the SHA256 its RECORD gives each of KEPT_MEMBERS it
    has, each checked against the member's bytes. :class:`ReleaseError` as :func:`fetch`."""
    with tempfile.TemporaryDirectory(prefix=f"dcpcheck-wheel-{version}-") as tmp:
        wheel = _download_wheel(version, Path(tmp))
        sources = _wheel_files(version, wheel)
    files = {member: hashlib.sha256(source).hexdigest() for member, source in sources.items()}
    return release_lock.LockedRelease(wheel.name, files)


def recorded_release(version: str) -> release_lock.LockedRelease:
    """Release ``version`` as the lock file gives it, read from the cache: each kept file
    checked against its wheel's RECORD as the cache's record gives it (not against the lock
    file). :class:`CacheFault` for a file that differs, :class:`ReleaseError` for a release
    not cached, or cached before every one of KEPT_MEMBERS was looked for."""
    folder = release_dir(version)
    record = _record_of(folder, version)
    if record is None:
        raise ReleaseError(f"{PACKAGE}=={version}: not in the release cache ({cache_root()})")
    unknown = [m for m in KEPT_MEMBERS if m not in record.files and m not in record.looked_for]
    if unknown:
        raise ReleaseError(
            f"{folder / SOURCE_RECORD}: does not say whether the wheel has {unknown[0]}; "
            f"fetch it afresh: {refetch_command(version)}"
        )
    for member, expected in record.files.items():
        actual = hashlib.sha256(_read(folder / member)).hexdigest()
        if actual != expected:
            raise CacheFault(f"{folder / member}: does not match its wheel's RECORD")
    kept = {m: record.files[m] for m in KEPT_MEMBERS if m in record.files}
    return release_lock.LockedRelease(record.wheel, kept)


def _cache_fault(exc: OSError) -> CacheFault:
    where = exc.filename or cache_root()
    return CacheFault(
        f"release cache {cache_root()}: {where}: {exc.strerror} (set DCPCHECK_CACHE to a "
        "writable folder)"
    )


def fetch(version: str, member: str = KERNEL_MEMBER, *, refresh: bool = False) -> KeptFile:
    """``member`` of release ``version`` (normalised): from the cache, checked against the
    lock file or its wheel's RECORD (:func:`cached`), else downloaded into it (module
    docstring). ``refresh`` downloads the
    wheel again and replaces what the cache holds of the release.

    Raises :class:`CacheFault` for a cache that cannot be trusted or written,
    :class:`UnknownRelease` for a version the index does not have, and
    :class:`ReleaseError` (one line) when the release cannot be had otherwise."""
    if not refresh:
        found = cached(version, member)
        if found is not None:
            return found
    folder = release_dir(version)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".fetch-{version}-") as tmp:
            staging = Path(tmp) / "release"
            staging.mkdir()
            wheel = _download_wheel(version, Path(tmp))
            _unpack(version, wheel, staging)
            wheel.unlink()
            if not _moved_into_place(staging, folder, version, member, refresh):
                os.rename(folder, Path(tmp) / "replaced")  # goes with the temporary folder
                os.rename(staging, folder)
    except OSError as exc:
        raise _cache_fault(exc) from None
    found = cached(version, member)
    if found is None:
        raise ReleaseError(f"{PACKAGE}=={version}: its wheel has no {member}")
    return found


def _moved_into_place(
    staging: Path, folder: Path, version: str, member: str, refresh: bool
) -> bool:
    """Rename the unpacked release to its folder, so a reader never sees half of one; True
    when done, or when a concurrent fetch put a valid one there first. False when the
    folder there must be replaced (``refresh``, or it lacks ``member``)."""
    if refresh:
        return not folder.exists() and _renamed(staging, folder)
    if _renamed(staging, folder):
        return True
    return folder.is_dir() and cached(version, member) is not None


def _renamed(source: Path, target: Path) -> bool:
    try:
        os.rename(source, target)
    except OSError:
        if not target.is_dir():
            raise
        return False
    return True


def fetch_all(version: str, *, refresh: bool = False) -> list[KeptFile]:
    """Every member of KEPT_MEMBERS release ``version`` has, as :func:`fetch` gives each
    (one download at most); :func:`fetch`'s errors."""
    kept = []
    for number, member in enumerate(KEPT_MEMBERS):
        try:
            kept.append(fetch(version, member, refresh=refresh and number == 0))
        except ReleaseError as exc:
            if isinstance(exc, CacheFault | UnknownRelease) or not lacks(version, member):
                raise
    return kept


def lacks(version: str, member: str) -> bool:
    """Whether release ``version``'s wheel has no ``member``, as the lock file says, else
    as the cached record says (False for a release never fetched: only a fetch can tell)."""
    if lock().knows(version, member):
        return lock().sha256(version, member) is None
    record = _record_of(release_dir(version), version)
    return record is not None and member in record.looked_for and member not in record.files
