"""Requests answered by worker processes forked from one that imported their module once.

Compiling a Triton binary holds the GIL for most of a second, so the fit check
(``dcpcheck.gpu_fit``) and the gate's ahead-of-time compiles (``dcpcheck.gate_binaries``)
hand their compiles to processes of their own. A process that compiles must first import
torch and Triton: 1.3 s on an H100 box, and more when sixteen import at once and contend
for the disk and the cores. So one process is started, the *template* (``python -m
dcpcheck.line_workers MODULE JOBS``, in the environment and directory the workers need).
It imports ``MODULE`` (and with it torch and Triton), reads every request, runs
``MODULE.prepare(requests)`` where the module has one (work every worker shares: Triton's
version key, the kernels' own cache keys), and only then forks its workers, one a request
at most, each of which answers one request at a time with ``MODULE.answer(request)``, a
JSON object. CUDA does not work in a forked child, so no worker may call it: a module may
ask CUDA's driver about the device as it is imported (the fused op's kernel asks for the
device's capability, which chooses the code it compiles), which starts the driver's own
thread in the template, but no worker calls CUDA after the fork.

The template hands the next request to whichever worker answered, and writes each answer
to its stdout, with the request's index, as it lands. It starts no thread of its own. Its
answers go out on a copy of its stdout, and its stdout and its workers' is its stderr, so
nothing a module or a worker prints reaches the answers. A worker that dies loses the
request it held (:data:`DIED`); the rest go to the workers left, and requests no worker
was left to take are :data:`NOT_TAKEN`. The caller says what that means.

The template may be started before the requests are known (:class:`Workers`), so that
its imports overlap the caller's own work; a caller with nothing to ask stops it.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import json
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Sequence
from multiprocessing.connection import Connection, Pipe, wait
from pathlib import Path
from types import ModuleType
from typing import Any

DIED = "its worker process died"
"""Why a request has no answer: the worker it was handed to ended before answering."""

NOT_TAKEN = "no worker process was left"
"""Why a request has no answer: every worker had ended before it was taken."""

ONE_THREAD_ENV = "OMP_NUM_THREADS"
"""Set to 1 in the template's environment: importing torch otherwise starts a CPU thread
pool's thread, and a fork copies only the thread that forks, leaving any lock the pool held
locked in the worker. The workers compile; none computes with torch."""


class Workers:
    """A template for ``module``'s workers (module docstring), started now; :meth:`answer`
    hands it the requests. ``env``, ``cwd`` and ``stderr`` are the template's and so its
    workers' (``stderr`` None: this process's)."""

    def __init__(
        self,
        module: str,
        jobs: int | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stderr: int | None = None,
    ) -> None:
        count = jobs or os.cpu_count() or 1
        self._template: subprocess.Popen | None = None
        with contextlib.suppress(OSError):  # no process: no worker takes any request
            self._template = subprocess.Popen(
                [sys.executable, "-m", "dcpcheck.line_workers", module, str(count)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**(os.environ if env is None else env), ONE_THREAD_ENV: "1"},
                cwd=cwd,
            )

    def answer(self, requests: Sequence[Any]) -> list[dict[str, Any] | str]:
        """Each of ``requests``' answer, the JSON object a worker wrote back, at the
        request's index, or why there is none (:data:`DIED`, :data:`NOT_TAKEN`); no
        requests stop the template at once."""
        answers: list[dict[str, Any] | str] = [NOT_TAKEN] * len(requests)
        template = self._template
        if template is None or not requests:
            self.close()
            return answers
        assert template.stdin is not None and template.stdout is not None
        try:
            template.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
            template.stdin.close()
        except OSError:  # the template is gone: nothing was taken
            self.close()
            return answers
        for line in template.stdout:
            index, answer = json.loads(line)
            answers[index] = answer
        self.close()
        return answers

    def close(self) -> None:
        """Stop the template and its workers if they still run, and reap it."""
        template = self._template
        if template is None:
            return
        if template.poll() is None and not (template.stdin and template.stdin.closed):
            template.kill()  # asked nothing: its imports were for nothing
        for stream in (template.stdin, template.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        template.wait()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def answered(
    module: str,
    requests: Sequence[Any],
    jobs: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stderr: int | None = None,
) -> list[dict[str, Any] | str]:
    """``requests`` answered by ``module``'s workers (:class:`Workers`), none started
    where there are no requests."""
    if not requests:
        return []
    with Workers(module, jobs, env, cwd, stderr) as workers:
        return workers.answer(requests)


def _serve(module: ModuleType, requests: Connection) -> None:
    """A worker: one answer sent back for each request received, until the template
    closes its end."""
    while True:
        try:
            request = requests.recv()
        except EOFError:
            return
        requests.send(module.answer(request))


def _template(module_name: str, jobs: int) -> None:
    """The template (module docstring): every request read from stdin, answered by at most
    ``jobs`` forked workers, each answer a ``[index, answer]`` line on stdout."""
    said = os.fdopen(os.dup(1), "w")  # the answers; what else is printed goes to stderr
    os.dup2(2, 1)
    module = importlib.import_module(module_name)
    requests = [json.loads(line) for line in sys.stdin]
    if requests:
        getattr(module, "prepare", lambda _: None)(requests)
    sys.stdout.flush()
    # Python warns of any thread at a fork; the one a fork may leave is CUDA's driver's,
    # which no worker calls (module docstring).
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
    held: dict[Connection, int | None] = {}
    for _ in range(min(jobs, len(requests))):
        mine, theirs = Pipe()
        if os.fork() == 0:
            said.close()
            mine.close()
            for other in held:
                other.close()
            code = 0
            try:
                _serve(module, theirs)
            except BaseException:  # said on stderr; the template names the request lost
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        held[mine] = None
    todo = collections.deque(range(len(requests)))

    def hand(worker: Connection) -> None:
        """The next request to ``worker``, or its end where none is left."""
        if todo:
            index = todo.popleft()
            try:
                worker.send(requests[index])
                held[worker] = index
                return
            except OSError:  # it died before taking it: the next worker takes it
                todo.appendleft(index)
        worker.close()
        del held[worker]

    for worker in list(held):
        hand(worker)
    while held:
        for worker in wait(list(held)):
            index = held[worker]
            try:
                answer = worker.recv()
            except (EOFError, OSError):
                answer = DIED
                worker.close()
                del held[worker]
            else:
                hand(worker)
            print(json.dumps([index, answer]), file=said, flush=True)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.wait()


if __name__ == "__main__":
    _template(sys.argv[1], int(sys.argv[2]))
