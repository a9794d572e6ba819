"""Regenerate the lock file (``dcpcheck.kernels.release_lock``) from the releases' wheels::

    python -m dcpcheck.kernels.relock                  # every release the lock has, again
    python -m dcpcheck.kernels.relock 0.35.0 0.35.1    # those added (or taken again)
    python -m dcpcheck.kernels.relock --from-cache     # from $DCPCHECK_CACHE, no network

Each release's wheel is downloaded by pip (as ``dcpcheck fetch`` does; it checks the wheel
against the package index's hash), and the lock takes the SHA256 its RECORD gives each
file dcpcheck keeps (``releases.KEPT_MEMBERS``), each checked against the file's bytes;
the wheel is deleted. ``--from-cache`` reads the release cache instead, each kept file
checked against its wheel's RECORD as the cache's record gives it: only as good as that
cache, so for a cache filled by ``dcpcheck fetch`` on a machine you trust. Either way the
new lock file is reviewed like code (its diff names every file whose SHA256 changed) before
it is committed: it decides what dcpcheck runs under a release's name.

A release the lock has and the command does not take again keeps its entry, unless the
files dcpcheck keeps changed (an op added): then every release must be taken again, and
the command says so. Exit 0 when written, 2 for bad input, 1 when a release cannot be had.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dcpcheck import files
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from dcpcheck.kernels import release_lock, releases


def _versions(texts: Sequence[str], lock: release_lock.Lock) -> list[str] | str:
    """The versions to take (normalised), or why the command cannot run."""
    try:
        versions = [releases.normalise(text) for text in texts]
    except releases.MalformedVersion as exc:
        return str(exc)
    if not versions:
        return list(lock.releases)
    if lock.members != releases.KEPT_MEMBERS and set(lock.releases) - set(versions):
        return (
            "the files dcpcheck keeps differ from those the lock was made for: take every "
            "release again (give no version)"
        )
    return versions


def relocked(
    lock: release_lock.Lock, versions: Sequence[str], from_cache: bool
) -> release_lock.Lock:
    """``lock`` with ``versions`` taken again (module docstring), releases oldest first;
    ``releases.ReleaseError`` when one cannot be had."""
    taken = dict(lock.releases)
    for version in versions:
        taken[version] = (
            releases.recorded_release(version) if from_cache else releases.wheel_release(version)
        )
        print(
            f"{releases.PACKAGE}=={version}: {len(taken[version].files)} file(s), from "
            f"{taken[version].wheel}"
        )
    ordered = {v: taken[v] for v in sorted(taken, key=releases.version_key)}
    return release_lock.Lock(releases.PACKAGE, releases.KEPT_MEMBERS, ordered)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dcpcheck.kernels.relock",
        description="Regenerate dcpcheck's release lock file from the releases' wheels.",
    )
    parser.add_argument("versions", nargs="*", metavar="VERSION")
    parser.add_argument(
        "--from-cache",
        action="store_true",
        help="Read the release cache ($DCPCHECK_CACHE) instead of downloading the wheels.",
    )
    arguments = parser.parse_args(argv)
    try:
        lock = release_lock.read(release_lock.LOCK_FILE)
    except release_lock.MalformedLock as exc:
        print(f"relock: {exc}; starting an empty lock", file=sys.stderr)
        lock = release_lock.Lock(releases.PACKAGE, releases.KEPT_MEMBERS, {})
    versions = _versions(arguments.versions, lock)
    if isinstance(versions, str):
        print(f"relock: {versions}", file=sys.stderr)
        return EXIT_USAGE
    try:
        new = relocked(lock, versions, arguments.from_cache)
    except releases.ReleaseError as exc:
        print(f"relock: {exc}; the lock file is unchanged", file=sys.stderr)
        return EXIT_FAIL
    files.write_atomic(release_lock.LOCK_FILE, release_lock.render(new))
    print(f"{len(new.releases)} release(s) in {release_lock.LOCK_FILE}: review the diff")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
