"""A fork of the fork server (``dcpcheck.fork_server``) turned into ``python -m MODULE
ARGS`` as a fresh interpreter would run it: its session if asked, the caller's descriptors
at their numbers and no other, the caller's working directory and environment, standard
streams opened afresh and buffered as an interpreter buffers them, the import path a fresh
interpreter would have there, no ``dcpcheck`` module of the server's, torch's thread
count as asked; then the module as ``__main__``, and the exit status the interpreter would
give, after the exit handlers and the final flush it would run.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import faulthandler
import fcntl
import importlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import NoReturn


def base_path() -> list[str]:
    """A fresh interpreter's ``sys.path`` after its working directory and ``PYTHONPATH``
    (the standard library, site-packages and what their ``.pth`` files add): asked of this
    interpreter under ``-E``, which reads no ``PYTHONPATH``."""
    shown = subprocess.run(
        [sys.executable, "-E", "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout)


def become(
    request: dict,
    fds: list[int],
    sockets: list[socket.socket],
    wake: tuple[int, int],
    path: list[str],
) -> NoReturn:
    """Turn this fork of the server into ``python -m MODULE ARGS`` as ``request``
    describes (``fork_server.ForkServer.start``), on the descriptors ``fds`` it carried:
    ``sockets`` and ``wake`` are the server's, closed here; ``path`` is ``base_path()``,
    asked once by the server. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request["session"]:
            os.setsid()
        for sock in sockets:
            os.close(sock.detach())
        for fd in wake:
            os.close(fd)
        _install_fds(fds, request["fds"])
        os.chdir(request["cwd"])
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        _reopen_stdio(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
        if env.get("PYTHONFAULTHANDLER"):
            faulthandler.enable()
        else:  # a resident server's is on (fork_server._serve_listening)
            faulthandler.disable()
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        sys.pycache_prefix = env.get("PYTHONPYCACHEPREFIX") or None
        extra = [os.path.abspath(e) for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
        sys.path[:] = list(dict.fromkeys([os.getcwd(), *extra, *path]))
        for name in [n for n in sys.modules if n == "dcpcheck" or n.startswith("dcpcheck.")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        import torch

        torch.set_num_threads(request["threads"])
        sys.argv = ["-m", *request["args"]]
        code = _run_module(request["module"])
    except BaseException:  # a child must never return into the server
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  (as the interpreter's exit)
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                code = code or 120  # the interpreter's status for a failed final flush
        os._exit(code)


def _run_module(module: str) -> int:
    """Run ``module`` as ``__main__``; its exit status as the interpreter would give it."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the interpreter ends by the signal itself
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _install_fds(received: list[int], targets: list[int]) -> None:
    """Put each received descriptor at its target number and close every other one."""
    floor = max([*received, *targets]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target)
    keep = set(targets)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError as exc:  # the listing's own descriptor, closed already
                if exc.errno != errno.EBADF:
                    raise


def _reopen_stdio(unbuffered: bool) -> None:
    """``sys.stdin``, ``stdout`` and ``stderr`` on descriptors 0, 1 and 2, buffered as a
    fresh interpreter buffers them (a terminal by line, stderr always by line)."""
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = sys.__stdin__ = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", encoding=encoding, errors="backslashreplace", closefd=False
    )
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
