"""Python processes forked from one that has imported torch already.

Each process dcpcheck starts to run code (an isolated kernel's worker, a mutant's worker,
an import probe) is ``python -m MODULE ARGS`` whose first work is importing torch: about
1.1 s on an H100 box, 2.3 s of CPU on a 2-core CI machine, for every process. A fork
server imports it once; each process asked of it is then a fork of the server that runs
``MODULE`` as ``python -m`` would, with the caller's environment, working directory,
import path and file descriptors (``dcpcheck.forked_child``). A run that starts several
processes pays the import once (``start``); a resident server (``dcpcheck.resident``) pays
it once for many commands.

Why a fork is sound here:

* CUDA: the server never initializes CUDA (importing torch does not), and PyTorch refuses
  CUDA only in a child of a process that had. A child may use the GPU.
* Threads: a fork copies only the thread that forks, so the server has one. Importing
  torch starts a CPU pool's thread unless ``OMP_NUM_THREADS`` is set, so the server runs
  with it at 1, and torch's thread count is fixed as it loads: each request says how many
  intra-op threads its child's torch uses (``threads``), as a fresh interpreter would take
  them from its environment or the machine.
* Triton: the server does not import it. Triton's own library (``tl.max``, ``tl.cdiv``)
  is interpreted or compiled as Triton is imported, by ``TRITON_INTERPRET``, which each
  process sets as it chooses its backend (``dcpcheck.backend``): in the child, after the
  fork.
* dcpcheck itself: the child drops the ``dcpcheck`` modules the server imported, so that
  the module it runs and everything that imports come from the child's own import path (a
  mutant's checkout, a test's tree), as in a fresh interpreter.

What a child shares with its server where a fresh interpreter would not: torch and what it
imports, imported under the server's environment (no choice of dcpcheck's is made there);
the interpreter's start-up options (``-X``, ``-W``, ``PYTHONWARNINGS``, the hash seed).
Read from the child's environment as a fresh interpreter would: ``PYTHONPATH``,
``PYTHONDONTWRITEBYTECODE``, ``PYTHONPYCACHEPREFIX``, ``PYTHONUNBUFFERED`` and
``PYTHONFAULTHANDLER``; ``sys.stdin``, ``stdout`` and ``stderr`` are opened afresh on its
descriptors.

Processes: a caller's server is ``python -m dcpcheck.fork_server FD``, the caller's child
in its process group, speaking over one ``SOCK_SEQPACKET`` socket pair (a request carries
its descriptors with it). It ignores SIGINT, which the terminal sends the whole group:
Ctrl-C is for the caller, and for the children that did not ask a session of their own,
as for ``subprocess.Popen``'s. It exits when the caller's end of the socket closes, as it
does when the caller exits however it ends. A child is the server's, which reaps it and
tells the caller its exit status: ``ForkedProcess`` stands in for ``subprocess.Popen``
(``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``). A resident server
is ``python -m dcpcheck.fork_server --listening FD IDLE_S PATH``, in a session of its own,
serving every connection to the socket it listens on (``serve``).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from dcpcheck import forked_child
from dcpcheck.line_workers import ONE_THREAD_ENV  # 1 in the server's environment: no thread

START_TIMEOUT_S = 120.0
"""Seconds the server may take to import torch and Triton and fork the first child (about
2.5 s on a warm machine, more on a cold file cache)."""

MESSAGE_BYTES = 1 << 20
"""Largest request (its environment, mostly) or answer: a ``SOCK_SEQPACKET`` message
longer than this would arrive cut."""

MAX_FDS = 16
"""Most descriptors one request may hand its child: stdin, stdout, stderr and ``pass_fds``."""


MACHINE_THREADS = 0
"""A request's torch thread count that a resident server replaces with the machine's
default (``_ask_machine_threads``)."""


class ForkServerError(OSError):
    """The server could not start, or stopped answering: no child can be started (an
    ``OSError``, as ``subprocess.Popen`` raises when it cannot start a process)."""


def _send(sock: socket.socket, message: object, fds: Sequence[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket) -> tuple[object, list[int]] | None:
    """The next message and the descriptors it carried, or None once the peer has closed."""
    data, fds, flags, _ = socket.recv_fds(sock, MESSAGE_BYTES, MAX_FDS)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ForkServerError("a fork server message arrived cut")
    if not data:
        return None
    return json.loads(data), fds


# --- The caller's side ---------------------------------------------------------------------


class ForkedProcess:
    """A child of the fork server, in the terms of ``subprocess.Popen``: ``returncode`` is
    None while it runs, then its exit status (negative: the signal that killed it)."""

    def __init__(self, server: ForkServer, pid: int, args: Sequence[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the child if it has not exited. Its pid is freed once the server reaps
        it, so its exit is read first: between the two, the pid is still the child's
        unless its exit and a reuse both fall inside this call."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def kill_session(process: ForkedProcess | subprocess.Popen, sig: int) -> None:
    """Signal the session of a process started with ``start_new_session``, once: the
    process alone where it has none yet (a child just forked: ``os.setsid`` is its first
    step, and it has started nothing before), through ``send_signal``, which leaves a
    process that has exited alone. Nothing if it is gone."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        process.send_signal(sig)


def server_env(path: Sequence[str] | None = None) -> dict[str, str]:
    """A server's environment: this process's, with one torch thread (no thread of torch's
    in the process that forks) and ``path`` (None: this process's import path), where it
    finds dcpcheck and torch, as its ``PYTHONPATH``."""
    env = {**os.environ, ONE_THREAD_ENV: "1"}
    env["PYTHONPATH"] = os.pathsep.join(entry for entry in (path or sys.path) if entry)
    return env


def asked_threads(env: Mapping[str, str]) -> int | None:
    """The torch threads ``env`` asks for (its ``OMP_NUM_THREADS``, a positive count), or
    None where it asks for none."""
    given = env.get(ONE_THREAD_ENV, "")
    return int(given) if given.isdigit() and int(given) > 0 else None


def threads_for(env: Mapping[str, str]) -> int:
    """Torch's intra-op threads in a fresh interpreter with environment ``env``: its
    ``OMP_NUM_THREADS``, else this process's own count (torch's default for the machine,
    where nothing in this process changed it)."""
    asked = asked_threads(env)
    if asked is not None:
        return asked
    import torch

    return torch.get_num_threads()


class ForkServer:
    """One server and the socket to it; ``start`` forks a child. Safe to share between
    threads."""

    def __init__(self, connected: socket.socket | None = None) -> None:
        """A server process of this process's own, or (``connected``) the resident server
        at the other end of a socket connected to it (``dcpcheck.resident``)."""
        self._process: subprocess.Popen | None = None
        if connected is None:
            connected, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "dcpcheck.fork_server", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    env=server_env(),
                )
            except BaseException:
                connected.close()
                raise
            finally:
                theirs.close()
        self._socket = connected
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}
        self._lost: str | None = None

    def start(
        self,
        module: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        threads: int | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        pass_fds: Sequence[int] = (),
        start_new_session: bool = False,
        tied: bool = False,
    ) -> ForkedProcess:
        """A child running ``python -m module *args`` as ``subprocess.Popen`` would start
        it with these arguments: ``stdin``, ``stdout`` and ``stderr`` are descriptors,
        ``subprocess.DEVNULL``, or None for this process's own; ``pass_fds`` keep their
        numbers in the child; every other descriptor is closed there. ``threads``: torch's
        intra-op threads in the child (None: ``threads_for(env)``). ``tied``: the child is
        killed (its session, if it has one) should this connection close before it exits
        (a resident server's child; a server of this process's own ends with it and leaves
        its children). ``ForkServerError`` if the server cannot fork it."""
        sources: list[int] = []
        with contextlib.ExitStack() as opened:
            for target, given in ((0, stdin), (1, stdout), (2, stderr)):
                if given == subprocess.DEVNULL:
                    given = os.open(os.devnull, os.O_RDWR)
                    opened.callback(os.close, given)
                sources.append(target if given is None else given)
            sources += pass_fds
            request = {
                "module": module,
                "args": list(args),
                "env": dict(env),
                "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                "threads": threads_for(env) if threads is None else threads,
                "session": start_new_session,
                "tied": tied,
                "fds": [0, 1, 2, *pass_fds],
            }
            with self._lock:
                self._check()
                try:
                    _send(self._socket, request, sources)
                    answer = self._answer(START_TIMEOUT_S)
                except OSError as exc:
                    raise self._lose(f"the fork server stopped answering ({exc})") from None
        match answer:
            case ["started", int(pid)]:
                return ForkedProcess(self, pid, [sys.executable, "-m", module, *args])
            case ["failed", str(reason)]:
                raise ForkServerError(f"the fork server could not start {module}: {reason}")
        raise self._lose(f"the fork server answered {answer!r}")

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status once it has exited, waiting up to ``timeout`` seconds
        (None: for ever); None if it still runs then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while pid not in self._exits:
                self._check()
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not select.select([self._socket], [], [], left)[0]:
                    return None
                self._read_one()
            return self._exits.pop(pid)

    def close(self) -> None:
        """Close the socket, which ends a server of this process's own (its children run
        on) or this connection to a resident one."""
        self._socket.close()
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5.0)

    def _answer(self, timeout: float) -> object:
        """The server's answer to a request, its children's exits read on the way."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._socket], [], [], left)[0]:
                if self._process is not None:
                    self._process.kill()
                raise self._lose(f"the fork server did not answer within {timeout:g} s")
            answer = self._read_one()
            if answer is not None:
                return answer

    def _read_one(self) -> object:
        """Read one message: an exit is recorded (None returned); another is returned."""
        received = _receive(self._socket)
        if received is None:
            raise self._lose(f"the fork server exited ({self._server_exit()})")
        message, _ = received
        match message:
            case ["exited", int(pid), int(code)]:
                self._exits[pid] = code
                return None
        return message

    def _server_exit(self) -> str:
        if self._process is None:
            return "it closed the connection"
        try:
            code = self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "it closed its socket"
        return f"status {code}" if code >= 0 else f"signal {-code}"

    @property
    def lost(self) -> bool:
        """Whether the server died or stopped answering: it starts no more children."""
        return self._lost is not None

    def _lose(self, reason: str) -> ForkServerError:
        self._lost = reason
        return ForkServerError(reason)

    def _check(self) -> None:
        if self._lost is not None:
            raise ForkServerError(self._lost)


_server: ForkServer | None = None
_server_pid: int | None = None
_server_lock = threading.Lock()


def start(module: str, args: Sequence[str], **popen: object) -> ForkedProcess:
    """``ForkServer.start`` on this process's server, started with the first child (and
    again after one was lost) and closed at exit; a process forked from this one starts its
    own."""
    global _server, _server_pid
    with _server_lock:
        if _server is None or _server_pid != os.getpid() or _server.lost:
            _server, _server_pid = ForkServer(), os.getpid()
            atexit.register(_server.close)
        server = _server
    return server.start(module, args, **popen)  # type: ignore[arg-type]


# --- The server's side ---------------------------------------------------------------------


def serve(caller: socket.socket | None, listener: socket.socket | None = None,
          idle_s: float | None = None) -> None:  # fmt: skip
    """Import torch, then fork a child per request and report each child's exit to the
    connection that asked for it. With ``caller``: until the caller closes its end.
    With ``listener`` (a resident server, ``dcpcheck.resident``): for every connection it
    accepts, until none is open and no child runs for ``idle_s`` seconds; a child whose
    request said ``tied`` is killed (its session, if it has one) when its connection closes
    before it exits, as its caller's death would end a process of the caller's own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # from the start: Ctrl-C is the caller's
    asking = _ask_machine_threads() if listener is not None else None
    path = forked_child.base_path()
    gc.disable()  # as dcpcheck's entry point imports torch (dcpcheck.__main__.uncollected)
    import torch  # noqa: F401  (what every child is spared)

    gc.freeze()
    gc.enable()

    machine_threads = None if asking is None else int(asking.communicate()[0])

    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd says a child exited
    watched = select.poll()
    watched.register(wake_read, select.POLLIN)
    connections: dict[int, socket.socket] = {}
    children: dict[int, tuple[socket.socket, bool, bool]] = {}  # pid: (asker, tied, session)
    for sock in (caller, listener):
        if sock is not None:
            watched.register(sock, select.POLLIN)
    if caller is not None:
        connections[caller.fileno()] = caller
    while True:
        idle = listener is not None and not connections and not children
        events = watched.poll(idle_s * 1000 if idle and idle_s is not None else None)
        if not events:
            return
        for fd, _ in events:
            if fd == wake_read:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 512):
                        pass
                _report_exits(children)
                continue
            if listener is not None and fd == listener.fileno():
                accepted, _ = listener.accept()
                connections[accepted.fileno()] = accepted
                watched.register(accepted, select.POLLIN)
                continue
            sock = connections[fd]
            try:
                received = _receive(sock)
            except OSError:
                received = None
            if received is None:
                if listener is None:
                    return
                watched.unregister(fd)
                del connections[fd]
                _end_tied(sock, children)
                sock.close()
                continue
            request, fds = received
            if request["threads"] == MACHINE_THREADS and machine_threads is not None:
                request["threads"] = machine_threads
            try:
                pid = os.fork()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    _send(sock, ["failed", str(exc)])
            else:
                if pid == 0:
                    ours = [*connections.values(), *([listener] if listener else [])]
                    forked_child.become(request, fds, ours, (wake_read, wake_write), path)
                children[pid] = (sock, bool(request.get("tied")), bool(request["session"]))
                with contextlib.suppress(OSError):  # a caller gone: its end is read next
                    _send(sock, ["started", pid])
            finally:
                for fd in fds:
                    os.close(fd)


def _report_exits(children: dict[int, tuple[socket.socket, bool, bool]]) -> None:
    """Reap every exited child and tell its connection, where that is still open."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        asker, _, _ = children.pop(pid, (None, False, False))
        if asker is not None and asker.fileno() >= 0:
            with contextlib.suppress(OSError):  # it closed meanwhile
                _send(asker, ["exited", pid, os.waitstatus_to_exitcode(status)])


def _end_tied(closed: socket.socket, children: dict[int, tuple[socket.socket, bool, bool]]) -> None:
    """Kill the tied children of a connection that closed (``serve``), with their sessions;
    they are reaped and forgotten as they exit."""
    for pid, (asker, tied, session) in children.items():
        if asker is closed and tied:
            # A child just forked may not have made its session yet (``os.setsid`` is its
            # first step): it is then alone. Unreaped, its pid is no one else's.
            with contextlib.suppress(ProcessLookupError):
                if session:
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _ask_machine_threads() -> subprocess.Popen:
    """Ask a fresh interpreter with no ``OMP_NUM_THREADS`` (this server's is 1) how many
    intra-op threads torch takes on this machine: what a resident server's request that
    names no count gets, since its caller has not imported torch to ask. Started beside
    the server's own imports; its answer is read with ``int(communicate()[0])``."""
    env = {k: v for k, v in os.environ.items() if k != ONE_THREAD_ENV}
    return subprocess.Popen(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
    )  # fmt: skip


def _serve_listening(fd: int, idle_s: float, path: str) -> None:
    """A resident server on the listening socket ``fd`` bound at ``path``; on its way out,
    ``path`` is removed unless another server answers there now (``dcpcheck.resident``).
    A fatal signal prints the server's Python stack to its log (its stderr)."""
    faulthandler.enable()
    listener = socket.socket(fileno=fd)
    serve(None, listener, idle_s)
    listener.close()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(path)
    except OSError:  # nobody answers there: the path is this server's
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        probe.close()


if __name__ == "__main__":
    if sys.argv[1] == "--listening":
        _serve_listening(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
    else:
        serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)  # nothing to write: the interpreter's teardown of torch would only cost time
