"""What a report path names decides how the report is written (``dcpcheck.files``): a
rename only over a regular file or nothing, a device or FIFO written into as it is, a
symlink followed, a directory or socket refused before any work.

Run as root (as CI jobs often are), a rename over ``/dev/null`` would replace the
machine's null device with a regular file; these tests use the real ``/dev/null`` to show
it stays a device, and a FIFO, a socket and symlinks of their own.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dcpcheck import files
from tests.test_bad_input import REPO

DEV_NULL = Path("/dev/null")


def run_dcpcheck(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dcpcheck", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_a_regular_file_is_replaced_atomically(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    files.write_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_a_symlink_is_followed_and_stays_a_symlink(tmp_path):
    target = tmp_path / "reports" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    files.ensure_writable(link)
    files.write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "made.json")
    files.ensure_writable(link)
    files.write_atomic(link, "new")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "new"


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    files.ensure_writable(fifo)
    files.write_atomic(fifo, "report\n")
    reader.join(timeout=30)
    assert received == [b"report\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_dev_null_stays_a_device(tmp_path):
    files.ensure_writable(DEV_NULL)
    files.write_atomic(DEV_NULL, "report\n")
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode)


@pytest.fixture
def a_socket(tmp_path):
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    yield path
    server.close()


def test_a_directory_or_socket_is_refused_up_front(tmp_path, a_socket):
    for path, words in ((tmp_path, "is a directory"), (a_socket, "is a socket")):
        with pytest.raises(files.ReportPathError, match=words):
            files.ensure_writable(path)
        with pytest.raises(OSError):
            files.write_atomic(path, "x")
    assert stat.S_ISSOCK(os.stat(a_socket).st_mode)


def test_run_writes_both_reports_into_dev_null_and_leaves_it_a_device():
    done = run_dcpcheck(
        "run", "--dcp", "1", "--no-tokens", "--scenario", "decode-single-dcp4",
        "--json", "/dev/null", "--junit", "/dev/null",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode)


def test_hash_json_into_dev_null_leaves_it_a_device():
    done = run_dcpcheck("hash", "--dcp", "1,2", "--json", "/dev/null")
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode)


def test_run_refuses_a_socket_before_any_work(a_socket):
    done = run_dcpcheck("run", "--json", str(a_socket))
    assert done.returncode == 2
    assert f"dcpcheck: error: {a_socket}: is a socket" in done.stderr
    assert "backend:" not in done.stderr  # refused before the backend was opened
