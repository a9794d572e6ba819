"""dcpcheck's commands run in a fork of a resident server that has imported torch.

With ``DCPCHECK_RESIDENT=1`` in the environment, ``dcpcheck ARGS`` (and ``python -m
dcpcheck ARGS``) does not import torch itself: it hands its arguments, environment,
working directory and terminal to a resident fork server (``dcpcheck.fork_server``), which
forks a child that runs ``python -m dcpcheck ARGS`` as a fresh interpreter would (the
working directory first on its import path, as ``-m`` puts it), and exits as that child
exits. Importing torch is most of a warm gate's floor (1.4 - 1.6 s of the 5.9 - 6.2 s it
took on one lent H100; 2.2 s of CPU on a 2-core machine), paid here once per server
instead of once per command. The first command starts the server and pays the import; the
server leaves after ``IDLE_S`` seconds with no command running.

What a command can share with an earlier one, and why it is never stale:

* dcpcheck itself is never shared: each child drops the ``dcpcheck`` modules the server
  holds and imports them from its own path, so an edit to dcpcheck (a kernel under
  development, a checkout switched by ``git bisect``) is seen by the next command.
* torch and what it imports are the server's (Triton is not: each command imports it as
  its backend chooses, ``dcpcheck.fork_server``). The server is chosen by a key
  (``server_key``) of everything torch was imported from and the server's own code: the
  interpreter, the files ``torch``, ``dcpcheck.fork_server`` and ``dcpcheck.forked_child``
  resolve to with their sizes and modification times, the import path, and every
  environment variable that names a path or option read as torch loads (``PYTHON*``,
  ``TORCH*``, ``PYTORCH*``, ``CUDA*``, ``LD_*``). A reinstall, another environment or an
  edit to the server's code reaches another server; the old one is left to leave when
  idle.
* Nothing of CUDA: the server never initializes it, so each command makes its own
  context, as a fresh process does.

The terminal: the child gets this process's standard input, output and error, so it prints
as the command would (colours and widths where they are a terminal). It runs in a session
of its own, outside the terminal's process group, so this process forwards the signals a
terminal or a job runner sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT) to the child's whole
session, as the terminal would have sent them to the command and its workers; should this
process die without forwarding (SIGKILL), the server kills that session. Ctrl-Z (SIGTSTP)
stops the command's session and then this process, and the ``fg`` or ``bg`` that resumes
this process resumes the command (``_suspend``). This process exits with the child's
status, or by the signal that ended it.

What the server prints itself (a traceback, should it die) goes to ``KEY.log`` beside its
socket, written afresh by each server of that key; the commands print to their callers.

Servers listen at ``$XDG_RUNTIME_DIR/dcpcheck/KEY.sock`` (else under the system's temporary
directory, ``dcpcheck-UID/``), a directory only its user may enter.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from dcpcheck import fork_server, forked_child, observers
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_INTERRUPTED

ENV = "DCPCHECK_RESIDENT"
"""``1`` in the environment: commands run in a resident server's fork."""

IDLE_S = 900.0
"""Seconds a resident server waits with no command running before it leaves."""

KEYED_ENV_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "CUDA", "LD_")
"""Environment variables that are part of a server's key (module docstring)."""

PROGRAM_ENV = "DCPCHECK_PROGRAM"
"""In a command's environment: the program name its usage and help show, its client's
(``dcpcheck``, or ``python -m dcpcheck``); the fork, run as ``-m``, would show the latter."""

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals this process passes on to the command's session."""


def wanted() -> bool:
    """Whether this process's command runs in a resident server's fork: ``ENV`` is ``1``,
    and the process is neither a torchrun rank nor watched by a profiler, a tracer or a
    CUDA tool, which must see the command itself (``dcpcheck.observers``)."""
    return (
        os.environ.get(ENV) == "1"
        and not observers.in_torchrun_environment()
        and not observers.watched()
    )


def server_key(env: Mapping[str, str]) -> str:
    """The key of the server whose torch is the one this process would import with ``env``
    (module docstring), without importing it."""
    facts: list[object] = [os.path.realpath(sys.executable), sys.version, _server_path()]
    server_code = (("the server", fork_server.__file__), ("its child", forked_child.__file__))
    for name, origin in (("torch", _origin("torch")), *server_code):
        stat = None if origin is None else os.stat(origin)
        facts.append([name, origin, None if stat is None else [stat.st_size, stat.st_mtime_ns]])
    facts.append(sorted((k, v) for k, v in env.items() if k.startswith(KEYED_ENV_PREFIXES)))
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:24]


def _origin(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    return None if spec is None else spec.origin


def _server_path() -> list[str]:
    """A server's import path: where this dcpcheck lives, then this process's path past
    its first entry (the working directory or the script's, which differ from command to
    command and must not change what the server imports)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(fork_server.__file__)))
    return list(dict.fromkeys([package, *(entry for entry in sys.path[1:] if entry)]))


def socket_dir(env: Mapping[str, str]) -> Path:
    """Where this user's servers listen, made if missing; only its owner may enter it."""
    runtime = env.get("XDG_RUNTIME_DIR")
    where = Path(runtime, "dcpcheck") if runtime else Path(
        tempfile.gettempdir(), f"dcpcheck-{os.getuid()}"
    )  # fmt: skip
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = where.stat()
    if found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise OSError(f"{where} is not this user's alone: no resident server listens there")
    return where


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """``path`` locked against every other process of this user's that starts a server."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def _socket_path(env: Mapping[str, str]) -> Path:
    """Where the server of ``server_key(env)`` listens."""
    return socket_dir(env) / f"{server_key(env)}.sock"


def _log_of(path: Path) -> Path:
    """The log of the server listening at ``path``: what it prints itself."""
    return path.with_suffix(".log")


def server_log(env: Mapping[str, str]) -> Path:
    """Where the server of ``server_key(env)`` writes what it prints itself."""
    return _log_of(_socket_path(env))


def _start_server(path: Path) -> None:
    """Bind ``path`` and start a server that listens there, its own session's leader, so
    that no signal meant for this command's terminal reaches it, in ``/`` (a directory it
    held would stay busy as long as it lives; each child moves to its command's), printing
    to ``KEY.log`` beside ``path``."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    log = os.open(_log_of(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        listener.bind(str(path))
        listener.listen()
        fd = listener.fileno()
        subprocess.Popen(
            [sys.executable, "-m", "dcpcheck.fork_server", "--listening", str(fd),
             str(IDLE_S), str(path)],
            pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=fork_server.server_env(_server_path()), start_new_session=True, cwd="/",
        )  # fmt: skip
    finally:
        listener.close()
        os.close(log)


def connect(env: Mapping[str, str]) -> tuple[fork_server.ForkServer, bool]:
    """A connection to the resident server of ``server_key(env)``, and whether it was
    started for it."""
    path = _socket_path(env)
    sock = _connect(path)
    if sock is not None:
        return fork_server.ForkServer(sock), False
    with _locked(path.with_suffix(".lock")):
        sock = _connect(path)  # another command may have started it meanwhile
        started = sock is None
        if started:
            _start_server(path)
            sock = _connect(path)
    if sock is None:
        raise fork_server.ForkServerError(f"the resident server at {path} does not listen")
    return fork_server.ForkServer(sock), started


def _threads(env: Mapping[str, str]) -> int:
    """The child's torch threads: its ``OMP_NUM_THREADS``, else the machine's default."""
    asked = fork_server.asked_threads(env)
    return fork_server.MACHINE_THREADS if asked is None else asked


def _started(args: list[str], env: dict[str, str]) -> fork_server.ForkedProcess:
    """``dcpcheck ARGS`` started in the resident server's fork. A server that closed
    between this process's connect and its request (it left, idle) is started again,
    once."""
    retried = False
    while True:
        server, started = connect(os.environ)
        if started:
            print(
                f"dcpcheck: started a resident server ({ENV}=1); it leaves after {IDLE_S:g} s"
                " with no command running",
                file=sys.stderr,
            )
        try:
            return server.start(
                "dcpcheck", args, env=env, threads=_threads(env), start_new_session=True,
                tied=True,
            )  # fmt: skip
        except fork_server.ForkServerError:
            server.close()
            if retried or started:
                raise
            retried = True


def _suspend(child: fork_server.ForkedProcess) -> None:
    """Ctrl-Z: stop the command's session, then this process as the terminal asked; once
    this process is resumed, resume the session. The session gets SIGSTOP: a session of
    its own is an orphaned process group, where the kernel drops SIGTSTP. This process
    re-raises SIGTSTP itself, so where its own group is orphaned (no shell to resume it)
    nothing stays stopped."""
    fork_server.kill_session(child, signal.SIGSTOP)
    this_handler = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTSTP)  # returns once a SIGCONT resumes this process
    signal.signal(signal.SIGTSTP, this_handler)
    fork_server.kill_session(child, signal.SIGCONT)


def program_name() -> str:
    """This process's program name as click tells it: ``python -m PACKAGE`` when run with
    ``-m``, else its script's name."""
    package = getattr(sys.modules["__main__"], "__package__", None)
    return f"python -m {package}" if package else os.path.basename(sys.argv[0])


def run_command(args: list[str]) -> None:
    """Run ``dcpcheck ARGS`` in a resident server's fork and leave as it ends (module
    docstring); return, after one line that says why, only where no server could take
    it: the caller then runs the command itself."""
    env = {k: v for k, v in os.environ.items() if k != ENV}  # the child is the command
    env[PROGRAM_ENV] = program_name()
    try:
        child = _started(args, env)
    except OSError as exc:  # ForkServerError too: the command runs in this process
        print(f"dcpcheck: warning: no resident server ({exc}); running here", file=sys.stderr)
        return
    except KeyboardInterrupt:  # before the command started (its server importing torch)
        print("dcpcheck: interrupted before the command started", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, _: fork_server.kill_session(child, sig))
    signal.signal(signal.SIGTSTP, lambda *_: _suspend(child))
    try:
        code = child.wait()
    except fork_server.ForkServerError as exc:
        fork_server.kill_session(child, signal.SIGKILL)
        print(f"dcpcheck: error: the resident server was lost mid-command ({exc}); what it "
              f"printed: {server_log(os.environ)}", file=sys.stderr)  # fmt: skip
        raise SystemExit(EXIT_FAIL) from None
    if code < 0:  # leave by the same signal, as the command did
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
    raise SystemExit(code)
