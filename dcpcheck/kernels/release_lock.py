"""The lock file: the SHA256 of every file dcpcheck keeps of every vLLM release it supports,
shipped with dcpcheck (``release_lock.json`` beside this module, package data of the wheel).

Why it ships with the project: the release cache keeps, beside each file, the SHA256 its
wheel's RECORD gave when it was fetched (``dcpcheck.kernels.releases``). Whoever can change
a cached file can change that record too, so a cache checked only against itself vouches
for itself: one release's file with its SHA256 written into another's record is judged as
the other release. A release the lock file knows is checked against the lock file alone:
every cached file of it against the SHA256 the lock gives, and a file the lock says its
wheel lacks is not looked for. A release it does not know is checked against its wheel's
RECORD as the cache kept it at fetch, and every command that loads one says so.

The format, relative paths inside the wheel and hex digests::

    {"package": "vllm",
     "members": [every wheel member the lock was made for: releases.KEPT_MEMBERS],
     "releases": {"0.30.0": {"wheel": "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                             "files": {"vllm/models/deepseek_v32/common/kernels.py": "3d52...",
                                       ...}}}}

A member of ``members`` that a release's ``files`` lacks is a file its wheel does not have.

``python -m dcpcheck.kernels.relock`` regenerates it from the wheels (``dcpcheck.kernels.
relock``). The lock file is reviewed like code: a change to it changes what dcpcheck runs
under a release's name.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

LOCK_FILE = Path(__file__).with_name("release_lock.json")

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class MalformedLock(ValueError):
    """A lock file that does not have the format of the module docstring: one line."""


@dataclass(frozen=True)
class LockedRelease:
    """One release in the lock file: its wheel's name and the SHA256 its RECORD gives each
    member of the lock's ``members`` the wheel has."""

    wheel: str
    files: dict[str, str]


@dataclass(frozen=True)
class Lock:
    """The lock file's content (module docstring); ``releases`` in the file's order."""

    package: str
    members: tuple[str, ...]
    releases: dict[str, LockedRelease]

    def knows(self, version: str, member: str) -> bool:
        """Whether the lock says what release ``version``'s ``member`` is (its SHA256, or
        that the wheel lacks it)."""
        return version in self.releases and member in self.members

    def sha256(self, version: str, member: str) -> str | None:
        """The SHA256 the lock gives ``member`` of ``version``; None when its wheel lacks
        the member. Only for a member the lock :meth:`knows`."""
        return self.releases[version].files.get(member)


def _member(text: object, where: str) -> str:
    """``text`` as a member path: relative, POSIX, without ``..``."""
    path = PurePosixPath(text) if isinstance(text, str) else None
    if path is None or path.is_absolute() or ".." in path.parts or not path.parts:
        raise MalformedLock(f"{where}: {text!r} is not a relative path inside a wheel")
    return str(path)


def _release(content: object, members: tuple[str, ...], where: str) -> LockedRelease:
    if not isinstance(content, dict) or not isinstance(content.get("wheel"), str):
        raise MalformedLock(f"{where}: expected {{'wheel': name, 'files': {{path: sha256}}}}")
    files = content.get("files")
    if not isinstance(files, dict):
        raise MalformedLock(f"{where}: 'files' is not a map of path to SHA256")
    for member, digest in files.items():
        if _member(member, where) not in members:
            raise MalformedLock(f"{where}: {member} is not one of the lock's members")
        if not isinstance(digest, str) or not SHA256_HEX.match(digest):
            raise MalformedLock(f"{where}: {member}: {digest!r} is not a hex SHA256")
    return LockedRelease(content["wheel"], dict(files))


def parse(text: str, where: str) -> Lock:
    """The lock of ``text`` (``where`` names it in errors); :class:`MalformedLock`."""
    try:
        content = json.loads(text)
    except ValueError as exc:
        raise MalformedLock(f"{where}: not JSON: {exc}") from None
    if not isinstance(content, dict) or not isinstance(content.get("package"), str):
        raise MalformedLock(f"{where}: expected an object with 'package', 'members', 'releases'")
    members = content.get("members")
    if not isinstance(members, list):
        raise MalformedLock(f"{where}: 'members' is not a list of paths")
    members = tuple(_member(m, f"{where}: members") for m in members)
    releases = content.get("releases")
    if not isinstance(releases, dict):
        raise MalformedLock(f"{where}: 'releases' is not a map of version to release")
    locked = {
        version: _release(release, members, f"{where}: {version}")
        for version, release in releases.items()
    }
    return Lock(content["package"], members, locked)


def render(lock: Lock) -> str:
    """``lock`` as the lock file holds it: releases in the order given, each one's files in
    the order of ``members``, one entry a line (a change reads as a diff of lines)."""
    content = {
        "package": lock.package,
        "members": list(lock.members),
        "releases": {
            version: {
                "wheel": release.wheel,
                "files": {m: release.files[m] for m in lock.members if m in release.files},
            }
            for version, release in lock.releases.items()
        },
    }
    return json.dumps(content, indent=1) + "\n"


def read(path: Path = LOCK_FILE) -> Lock:
    """The lock file at ``path``; :class:`MalformedLock` when it cannot be read or parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MalformedLock(f"{path}: cannot read: {exc.strerror}") from None
    return parse(text, str(path))


@functools.cache
def shipped() -> Lock:
    """The lock file dcpcheck ships (:data:`LOCK_FILE`), read once."""
    return read()
