"""Import an outside kernel's module in a process that may be lost, before a process that
must not be lost imports it.

Importing a module runs its code, and code can end the process that runs it
(``os._exit``, a signal, a crash in a native library) or never return. A command that
imports such a module itself ends with the status the module chose (0 for ``os._exit(0)``)
and no report. So the process that imports an outside kernel's module (a
``path/to/file.py:function`` or ``package.module:function`` spec) is always one whose end
is observed by another that can still report it:

* Under isolation the worker imports it (``dcpcheck.harness.isolation``); its parent never
  does. A worker lost while importing is :class:`KernelImportLost`, status ``crash``, or
  ``timeout`` past ``--case-timeout``.
* A command that runs the kernel in its own process (``dcpcheck hash``, ``run
  --no-isolate``, an op package's runs, the pytest plugin without isolation) enters
  :func:`probing` (the command line does for every command). While it holds,
  ``dcpcheck.kernels.loading.load_callable`` has the module imported first by a child,
  ``python -m dcpcheck.kernels.import_probe_child`` (:func:`probe`), which says on a pipe
  that its import returned or raised; the command imports the module itself only then
  (and raises the same ``KernelLoadError`` if it raised). A child that ends without
  saying so is :class:`KernelImportLost`, status ``crash``. It has no time limit: a
  command that runs the kernel in process cannot stop a case either (``--case-timeout``
  needs isolation), so a module whose import hangs hangs it, as its launches would.

Library callers (the test suite, the isolation worker itself) import directly: a probe
costs a process, forked from the command's fork server (``dcpcheck.fork_server``: the
first one of a command imports torch, about 2 s), and the module's own imports.
``dcpcheck.exit_codes`` says why a lost import is exit 1 where a raising one is 125.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextvars import ContextVar

from dcpcheck import fork_server

STDERR_FD = 2
"""A child's stdout goes to this process's stderr file descriptor (this process's stdout
carries results; ``sys.stderr`` may be an object without a descriptor under a test runner)."""

IMPORTED = b"imported\n"
"""What a probe writes on its pipe once the module's import has returned or raised."""

_PROBING: ContextVar[bool] = ContextVar("dcpcheck_import_probing", default=False)


class KernelImportLost(Exception):
    """Importing the kernel's module ended or hung the process that imported it: ``status``
    ``crash`` or ``timeout``, ``reason`` one line naming the module and how it ended."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def describe_exit(code: int) -> str:
    """A child's exit status in words: ``killed by SIGSEGV``, ``exited with status 1``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == 0:
        return "exited with status 0 without answering"
    return f"exited with status {code} (its stderr above says why)"


def child_environment() -> dict[str, str]:
    """This process's environment plus its import path, for a child that must import the
    kernel's module (``tests.fixtures...``, a checkout put on ``sys.path``) as this
    process would."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)
    return env


@contextlib.contextmanager
def probing() -> Iterator[None]:
    """While held, outside kernel modules are probed before this process imports them."""
    token = _PROBING.set(True)
    try:
        yield
    finally:
        _PROBING.reset(token)


def wanted() -> bool:
    """Whether this process asked for its imports to be probed (:func:`probing`)."""
    return _PROBING.get()


def probe(where: str) -> None:
    """Import ``where`` (a ``.py`` path or a module name) in a child process;
    :class:`KernelImportLost` if the child ends before the import returns or raises."""
    reads, writes = os.pipe()
    try:
        child = fork_server.start(
            "dcpcheck.kernels.import_probe_child",
            [where, str(writes)],
            pass_fds=(writes,),
            stdin=subprocess.DEVNULL,
            stdout=STDERR_FD,
            env=child_environment(),
            threads=1,  # it only imports
        )
    except BaseException:
        os.close(reads)
        raise
    finally:
        os.close(writes)
    try:
        code = child.wait()
    finally:
        if child.poll() is None:  # Ctrl-C while it imported
            child.kill()
            child.wait()
    os.set_blocking(reads, False)  # a process it started may hold the pipe open
    try:
        answer = os.read(reads, len(IMPORTED) + 1)
    except BlockingIOError:  # nothing said, the pipe still open
        answer = b""
    finally:
        os.close(reads)
    if answer != IMPORTED:
        how = describe_exit(code)
        raise KernelImportLost("crash", f"{where}: its import ended the process running it ({how})")
