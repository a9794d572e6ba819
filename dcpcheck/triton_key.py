"""Triton's own version key, worked out once per installed Triton rather than per process.

Every binary's cache key starts with ``triton_key()``: a sha256 of Triton's compiler,
backend and language sources and of ``libtriton.so`` (415 MB in Triton 3.6). Triton works
it out once per process, before the first binary it compiles or loads from its on-disk
cache: 0.37 - 0.41 s on an H200 (BENCHMARKS.md, the gate's section), and as much in
each mutant's worker process and in the template the compile workers fork from.

The files it reads change only when Triton is installed again, upgraded or edited. So
:func:`remember` keeps the key in Triton's cache directory under a fingerprint of the
installed package (Triton's version and the path, size and modification time of every
file under it, ``__pycache__`` aside), and a process whose fingerprint finds a kept key
hands Triton that key. Installing or editing a file sets its modification time, so the
fingerprint moves and the key is worked out again, by Triton's own function (only a write
that put back both the size and the time would go unseen). Nothing else of a cache key
changes: the kernel's source, the target, the options and the environment are keyed by
Triton as before. Nothing is installed under the interpreter, which asks for no key, nor
with a Triton older than 3.4, which keeps its key elsewhere and works it out per process.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

FOLDER = "dcpcheck-triton-key"
"""Where, under Triton's cache directory, kept keys lie: one file a fingerprint."""


def fingerprint(package: Path, version: str) -> str:
    """A digest of ``version`` and of the relative path, size and modification time of every
    file under ``package`` but its ``__pycache__`` folders (module docstring)."""
    digest = hashlib.sha256(version.encode())
    for root, folders, files in os.walk(package):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            path = Path(root, name)
            stat = path.stat()
            relative = path.relative_to(package).as_posix()
            digest.update(f"\n{relative}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def kept_key(store: Path, compute: Callable[[], str]) -> str:
    """The key kept at ``store``, or ``compute()``'s, then kept there (written whole or not
    at all; a cache directory that cannot be written keeps nothing)."""
    try:
        return store.read_text(encoding="utf-8")
    except OSError:  # none kept, or none can be
        pass
    key = compute()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=store.parent, delete=False, suffix=".tmp"
        ) as partial:
            partial.write(key)
        os.replace(partial.name, store)
    except OSError:
        pass
    return key


def remember() -> None:
    """Hand Triton's cache keys the key kept for the installed Triton (module docstring):
    Triton's ``triton_key`` replaced, where its modules look it up, by one that reads the
    kept key, or works it out with Triton's function and keeps it, on its first call."""
    import triton
    from triton.runtime import cache

    try:
        from triton import knobs  # Triton >= 3.4
    except ImportError:
        return
    original = getattr(cache, "triton_key", None)
    if original is None:  # an older Triton keeps it elsewhere: it works it out per process
        return
    package = Path(triton.__file__).resolve().parent
    answer: list[str] = []

    def triton_key() -> str:
        if not answer:
            store = Path(knobs.cache.dir, FOLDER, fingerprint(package, triton.__version__))
            answer.append(kept_key(store, original))
        return answer[0]

    cache.triton_key = triton_key
