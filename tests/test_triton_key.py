"""Triton's version key kept across processes (``dcpcheck.triton_key``): the key handed to
Triton is the one its own function works out, and any change to the installed files asks
for it again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from triton.runtime import cache

from dcpcheck import triton_key


def package(root: Path) -> Path:
    (root / "_C").mkdir(parents=True)
    (root / "_C" / "libtriton.so").write_bytes(b"\0" * 64)
    (root / "compiler.py").write_text("x = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "compiler.pyc").write_bytes(b"pyc")
    return root


def test_the_fingerprint_moves_with_every_installed_file_and_the_version(tmp_path):
    root = package(tmp_path / "triton")
    first = triton_key.fingerprint(root, "3.6.0")
    assert triton_key.fingerprint(root, "3.6.0") == first
    assert triton_key.fingerprint(root, "3.6.1") != first

    (root / "__pycache__" / "other.pyc").write_bytes(b"written by an import")
    assert triton_key.fingerprint(root, "3.6.0") == first

    library = root / "_C" / "libtriton.so"
    stat = library.stat()
    library.write_bytes(b"\1" * 64)  # same size, same time: not seen (module docstring)
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert triton_key.fingerprint(root, "3.6.0") == first
    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert triton_key.fingerprint(root, "3.6.0") != first

    os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (root / "compiler.py").write_text("x = 22\n")  # another size
    second = triton_key.fingerprint(root, "3.6.0")
    assert second != first
    (root / "backends").mkdir()
    (root / "backends" / "new.py").write_text("")
    assert triton_key.fingerprint(root, "3.6.0") != second


def test_a_key_is_worked_out_once_then_read(tmp_path):
    computed = []

    def compute() -> str:
        computed.append(1)
        return "3.6.0-abc"

    store = tmp_path / "keys" / "fingerprint"
    assert triton_key.kept_key(store, compute) == "3.6.0-abc"
    assert triton_key.kept_key(store, compute) == "3.6.0-abc"
    assert computed == [1]
    assert [p.name for p in store.parent.iterdir()] == ["fingerprint"]  # no partial file left


def test_a_cache_that_cannot_be_written_keeps_nothing_and_answers(tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    assert triton_key.kept_key(blocked / "keys" / "fp", lambda: "3.6.0-abc") == "3.6.0-abc"


def test_triton_is_handed_its_own_key_then_reads_it_from_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("triton.knobs")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    original = cache.triton_key
    monkeypatch.setattr(cache, "triton_key", original)  # put back after the test
    triton_key.remember()
    assert cache.triton_key is not original
    assert cache.triton_key() == original()
    (kept,) = (tmp_path / triton_key.FOLDER).iterdir()
    assert kept.read_text() == original()

    def refused() -> str:
        raise AssertionError("worked out again though the installed files did not change")

    monkeypatch.setattr(cache, "triton_key", refused)
    triton_key.remember()  # a later process: wraps what it finds, reads the kept key
    assert cache.triton_key() == original()
