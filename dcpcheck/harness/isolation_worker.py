"""The worker side of isolation (``dcpcheck.harness.isolation``, which starts it and says
why): load the kernel (this process, never its parent, imports the kernel's module), answer
each job with its results, and report a CUDA context the kernel poisoned instead of
answering past it.

It runs as ``python -m dcpcheck.harness.isolation_worker``. The messages it exchanges are
defined in ``dcpcheck.harness.isolation`` and imported from there, so both processes
pickle them under the same module name.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from dcpcheck.backend import Backend, select_backend
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.e2e.stream_case import token_stream_case
from dcpcheck.harness import sanitizer as sanitizing
from dcpcheck.harness.isolation import (
    CompileAheadJob,
    DeviceLost,
    JobDone,
    LoadFailed,
    Loading,
    Ready,
    ScenarioJob,
    TokenStreamJob,
)
from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError
from dcpcheck.kernels.substitution import substitute
from dcpcheck.ops import session_op
from dcpcheck.ops.session_cases import SessionCases

PR_SET_PDEATHSIG = 1
"""``prctl`` option (linux/prctl.h): the signal a process gets when its parent exits."""


def _first_line(text: str) -> str:
    """CUDA errors span lines (the error, then debugging advice); the first says what."""
    return text.strip().splitlines()[0] if text.strip() else text


def device_error(backend: Backend) -> str | None:
    """The sticky CUDA error that poisoned this process's context, if any.

    A kernel's illegal access surfaces at the next synchronization, and from then on every
    CUDA call fails with it: a worker in that state can only report it and exit.
    """
    if backend.interpreted:
        return None
    try:
        torch.cuda.synchronize(backend.device)
    except RuntimeError as exc:  # torch.AcceleratorError is one
        return _first_line(str(exc))
    return None


def _results(
    op: SessionCases,
    kernel: object,
    job: ScenarioJob | TokenStreamJob | CompileAheadJob,
    backend: Backend,
) -> Iterator[CaseResult]:
    if isinstance(job, ScenarioJob):
        yield from op.run_scenario(kernel, job.scenario, job.config, backend)
    elif isinstance(job, TokenStreamJob):
        yield token_stream_case(kernel, job.config, backend)
    else:
        op.compile_ahead(kernel, job.scenarios, job.config, backend)


def _replies(
    op: SessionCases,
    kernel: object,
    job: ScenarioJob | TokenStreamJob | CompileAheadJob,
    backend: Backend,
) -> Iterator[object]:
    """The messages answering one job: its results, each sent only once the device is
    known healthy, then ``JobDone``; or ``DeviceLost`` as soon as it is not."""
    try:
        for result in _results(op, kernel, job, backend):
            lost = device_error(backend)
            if lost is not None:
                # The kernel's own exception, if it raised one, names the rank too.
                said = result.error if result.status == "error" and result.error else lost
                yield DeviceLost(_first_line(said))
                return
            yield result
    except RuntimeError as exc:  # a harness call after the kernel hit the poisoned context
        if device_error(backend) is None:
            raise  # a harness bug: the traceback goes to stderr, the parent sees a crash
        yield DeviceLost(_first_line(str(exc)))
        return
    lost = device_error(backend)  # a job without results (CompileAheadJob) checks here
    if lost is not None:
        yield DeviceLost(lost)
        return
    yield JobDone()


def serve(requests: Connection, replies: Connection) -> None:
    """The worker's loop: load the kernel, then answer jobs until the parent hangs up."""
    setup = requests.recv()
    torch.set_num_threads(setup.threads)
    backend = select_backend(setup.device)
    for original, replacement in setup.substitutes:
        substitute(Path(original), Path(replacement))
    if not setup.first:  # the run's first worker warned already of what it stands in for
        for warner in (loading, releases):
            logging.getLogger(warner.__name__).setLevel(logging.ERROR)
    replies.send(Loading())
    package = session_op()
    try:
        kernel = package.kernel(setup.kernel_name, setup.adapter)
    except KernelLoadError as exc:
        replies.send(LoadFailed(str(exc), isinstance(exc, KernelSpecError)))
        return
    op = package.session_cases()
    try:
        declared = op.declarations(kernel)
    except ValueError as exc:  # it declares what dcpcheck cannot read (a rule it does not know)
        replies.send(LoadFailed(f"{setup.kernel_name}: {exc}"))
        return
    replies.send(Ready(dict(declared)))
    if setup.sanitizer is not None:
        op.launch_watcher.set(sanitizing.launch_watcher(backend.device))
    while True:
        try:
            job = requests.recv()
        except EOFError:  # the parent closed the pipe: the run (or a sanitized job) is over
            return
        for reply in _replies(op, kernel, job, backend):
            if setup.sanitizer is not None and isinstance(reply, CaseResult):
                sanitizing.write_marker(sanitizing.case_done_marker(sanitizing.case_label(reply)))
            replies.send(reply)
            if isinstance(reply, DeviceLost):
                return


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent exits, then make sure dcpcheck
    (``parent_pid``) had not already exited before the request was in place."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if not _descends_from(parent_pid):
        os._exit(1)


def _descends_from(pid: int) -> bool:
    """Whether ``pid`` is this process's parent or (under compute-sanitizer, the parent)
    an ancestor, read from ``/proc``; an exited dcpcheck is nobody's ancestor."""
    ancestor = os.getppid()
    while ancestor != pid:
        try:
            stat = Path(f"/proc/{ancestor}/stat").read_text()
        except OSError:  # no /proc (not Linux), or that process has just exited
            return False
        ancestor = int(stat.rsplit(")", 1)[1].split()[1])
        if ancestor <= 1:  # init, or the kernel above it
            return False
    return True


def main(argv: list[str]) -> None:
    """``python -m dcpcheck.harness.isolation_worker READ_FD WRITE_FD PARENT_PID`` (started
    by ``isolation._Worker``)."""
    read_fd, write_fd, parent_pid = (int(arg) for arg in argv)
    _die_with_parent(parent_pid)
    serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False))


if __name__ == "__main__":
    main(sys.argv[1:])
