"""``python -m MODULE ARGS`` for tests, forked from the test process's fork server
(``dcpcheck.fork_server``) rather than started afresh: the same module, arguments,
environment and working directory, its output captured as ``subprocess.run`` captures
it, less the torch import each fresh interpreter pays (2.5 s of CPU on a 2-core CI
machine, a few hundred commands a suite). A test whose subject is the fresh interpreter
itself (an entry point, what a process imports first) starts one with ``subprocess``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from dcpcheck import fork_server


def run_module(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
    text=True, ...)`` with stdin from ``/dev/null``. Past ``timeout`` the command's process
    group (its own session, with any worker it started) is killed and
    ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    argv = [sys.executable, "-m", module, *args]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = fork_server.start(
            module,
            list(args),
            env=dict(os.environ if env is None else env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout.fileno(),
            stderr=stderr.fileno(),
            start_new_session=True,
        )
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            fork_server.kill_session(process, signal.SIGKILL)
            process.wait()
            raise subprocess.TimeoutExpired(argv, timeout or 0.0) from None
        output = [_read(stream) for stream in (stdout, stderr)]
    return subprocess.CompletedProcess(argv, code, *output)


def run_dcpcheck(args: Sequence[str], **options) -> subprocess.CompletedProcess[str]:
    """``python -m dcpcheck ARGS``, as :func:`run_module` runs it."""
    return run_module("dcpcheck", args, **options)


def _read(stream) -> str:
    stream.seek(0)
    return stream.read().decode()
