"""Run the kernel under test in a worker process, so a crash or a hang costs one case, not the run.

Why a process: an illegal memory access poisons the CUDA context of the process that made
it (every later launch and copy fails with the same error), a segfault or an abort kills
it, and a kernel can spin forever. None of that can be caught inside the process. So
under ``--isolate`` each whole case (build, launch, checks) runs in a worker: tensors never
cross the process boundary, only ``CaseResult`` verdicts do, and the parent only waits.

* A result arrives: that is the case's verdict, exactly as in process.
* The worker dies: the case is a ``crash``, named by the signal (``killed by SIGSEGV``) or
  the exit status.
* The worker finds its CUDA context lost (it synchronizes the device before sending each
  result, which surfaces a sticky CUDA error): ``crash`` with the CUDA error text.
* No result within ``case_timeout`` seconds: ``timeout``; the worker is killed.

After any of the last three, the cases of that scenario not yet reported get the same
status, marked "not run", and the next job starts a fresh worker. A healthy worker is kept
for the whole run. Workers are forked from this process's fork server
(``dcpcheck.fork_server``), which imports torch once for all of them (about 2 s a fresh
interpreter); under compute-sanitizer, which must start the interpreter itself, each
is a fresh one.

The worker, not the parent, imports the kernel: the parent of an isolated run never runs
the kernel's module, whose import may end or hang the process running it as surely as a
launch can (``dcpcheck.kernels.import_probe``). Starting a worker takes two answers: one
once it is up (within ``STARTUP_TIMEOUT_S``: torch and Triton imported, the backend
chosen), one once it has loaded the kernel (within ``case_timeout``). A kernel that raises
while it loads is ``KernelLoadError`` (``LoadFailed``: exit 125, or 2 for a spec wrong in
itself); a worker that dies or outlives ``case_timeout`` while it loads is
``import_probe.KernelImportLost`` (``crash`` / ``timeout``: the kernel's own crash or
hang, exit 1). Either way no case can run, and :meth:`IsolatedKernel.start` raises the
same error again when asked again rather than start another worker.

Processes: the worker runs ``python -m dcpcheck.harness.isolation_worker`` (its side of what
follows lives there; forked, its parent is the fork server) in a new session (its own
process group), so the terminal's Ctrl-C reaches only the parent, which then kills the group
with SIGKILL (a hung kernel may ignore anything gentler). On Linux the worker also asks the
kernel to SIGKILL it when the thread that started it exits (``PR_SET_PDEATHSIG``): the fork
server's, which leaves as the run does, however the run ends; so a worker never outlives its
run, even one whose parent was itself killed. The worker's stdout goes to the parent's
stderr (the parent's stdout carries the results); its stderr is inherited, so a kernel's own
messages and a harness traceback stay visible.

Messages are pickles over two pipes (``multiprocessing.connection``), between two
processes running this same package::

    parent -> worker   Setup, then one ScenarioJob, TokenStreamJob or CompileAheadJob
                       at a time
    worker -> parent   Loading, then Ready or LoadFailed, after Setup;
                       per job: one CaseResult per case then JobDone, or DeviceLost

Everything that decides a case reaches the worker with the job (the ``RunConfig`` and the
scenario of each ``ScenarioJob``) except what the kernel states of itself: the worker reads
those facts from the kernel it loaded (the op's ``declarations``: the fused op's fp8_ds_mla
tile-scale rule, ``ds_mla_scale``), and ``Ready`` carries them back, so the parent's
``IsolatedKernel`` declares the same and a failure the parent saves records the rule the
worker ran. The worker runs the session op's cases (``dcpcheck.ops.session_op``); jobs
carry its scenarios, which this module only passes on.

Under ``--sanitize TOOL`` (``IsolatedKernel(sanitizer=TOOL)``, CUDA only) the process
started is compute-sanitizer, the worker its child (``dcpcheck.harness.sanitizer``): it
answers one job, its results get a ``sanitizer`` check each. It dies with
compute-sanitizer, which dies with dcpcheck: dcpcheck is its ancestor, not its parent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from dcpcheck import fork_server
from dcpcheck.backend import Backend
from dcpcheck.cases.limits import TIMEOUT_MAX_S
from dcpcheck.cases.verdicts import TOKEN_STREAM_CASE, CaseResult, RunConfig
from dcpcheck.harness import sanitizer as sanitizing
from dcpcheck.kernels import substitution
from dcpcheck.kernels.import_probe import (
    STDERR_FD,
    KernelImportLost,
    child_environment,
    describe_exit,
)
from dcpcheck.kernels.loading import KernelLoadError, KernelSpecError

DEFAULT_CASE_TIMEOUT_S = 300.0
"""Default ``--case-timeout``. Generous on purpose: the first case of a scenario includes its
DCP1 baseline run and, on a GPU, Triton's compilation of the kernel for new shapes (tens of
seconds for a large kernel); a hang is still reported within minutes, not never."""


def resolve_case_timeout(
    isolate: bool, timeout: float | None, *, timeout_option: str, isolate_option: str
) -> float | None:
    """The seconds each case of an isolated run may take (``timeout``, else
    DEFAULT_CASE_TIMEOUT_S), or None for a run in process. ``ValueError``, one line naming
    the options as the caller spells them, for a timeout that is no positive number of
    seconds (at most ``limits.TIMEOUT_MAX_S``) or one asked of a run in process: only a
    worker can be stopped mid-case."""
    if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= TIMEOUT_MAX_S):
        raise ValueError(
            f"{timeout_option}: must be a number of seconds > 0 and at most "
            f"{TIMEOUT_MAX_S:.0f}, got {timeout}"
        )
    if not isolate:
        if timeout is not None:
            raise ValueError(
                f"{timeout_option} needs {isolate_option}: only a worker process can be "
                "stopped mid-case"
            )
        return None
    return DEFAULT_CASE_TIMEOUT_S if timeout is None else timeout


STARTUP_TIMEOUT_S = 120.0
"""Seconds a new worker may take to import torch and Triton and choose its backend (about
2 s on a warm machine, longer on a cold file cache); the kernel's own import then has
``case_timeout``."""

KILL_WAIT_S = 10.0
"""Seconds to wait for a killed worker to be reaped: a process inside the GPU driver can
take a moment to die. After that it is left to the OS rather than hanging the run."""

SANITIZED_EXIT_S = 120.0
"""Seconds a sanitized worker may take to exit after its job (torch's teardown, then
compute-sanitizer's last reports and summary) before it is killed, its log read as it is."""

# ---------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Setup:
    """The first message to a worker: what to load, and where to run it."""

    kernel_name: str
    adapter: str
    device: str  # "cuda" or "cpu", as the parent's backend chose
    threads: int  # torch intra-op threads, as in the parent (timings stay comparable)
    sanitizer: str | None = None  # the compute-sanitizer tool it runs under: write markers
    substitutes: tuple[tuple[str, str], ...] = ()  # the parent's (dcpcheck.kernels.substitution)
    first: bool = True  # the run's first worker: it logs the stand-ins the kernel's file needs


@dataclass(frozen=True)
class Loading:
    """The worker is up (torch, Triton, its backend) and now loads the kernel."""


@dataclass(frozen=True)
class Ready:
    """The worker loaded the kernel and waits for jobs. ``declarations``: what the kernel
    states of itself, by attribute (the op's ``declarations``)."""

    declarations: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadFailed:
    """The worker could not load the kernel: ``KernelLoadError``'s one line; ``spec``: it
    was a ``KernelSpecError`` (a spec wrong in itself)."""

    message: str
    spec: bool = False


@dataclass(frozen=True)
class ScenarioJob:
    """Run ``runner.run_scenario`` for one scenario; a ``CaseResult`` per DCP size."""

    scenario: Any  # the op's
    config: RunConfig


@dataclass(frozen=True)
class TokenStreamJob:
    """Run ``stream_case.token_stream_case``; one ``CaseResult``."""

    config: RunConfig


@dataclass(frozen=True)
class CompileAheadJob:
    """Run ``compile_ahead.compile_ahead`` for these scenarios; no ``CaseResult``, only
    ``JobDone``."""

    scenarios: tuple[Any, ...]  # the op's
    config: RunConfig


@dataclass(frozen=True)
class JobDone:
    """Every result of the job was sent; the worker waits for the next one."""


@dataclass(frozen=True)
class DeviceLost:
    """The worker's CUDA context is unusable (a sticky error); it exits after this."""

    message: str


# ---------------------------------------------------------------------------------------
# Parent side


class WorkerLost(Exception):
    """The worker can no longer answer: ``status`` is ``crash`` or ``timeout``."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _worker_environment(sanitized: bool) -> dict[str, str]:
    """``import_probe.child_environment``: the worker imports the kernel's module as this
    process would. Sanitized, PyTorch's caching allocator is off
    (``sanitizing.NO_CACHING_ENV`` says why)."""
    env = child_environment()
    if sanitized:
        env.update(sanitizing.NO_CACHING_ENV)
    return env


class _Worker:
    """One worker process, the two pipes to it, and under compute-sanitizer (``prefix``)
    the log that is the stdout of both."""

    def __init__(self, prefix: list[str] | None = None) -> None:
        self._killed = False
        self.log = sanitizing.new_log() if prefix is not None else None
        parent_reads, worker_writes = os.pipe()
        worker_reads, parent_writes = os.pipe()
        module = "dcpcheck.harness.isolation_worker"
        arguments = [str(worker_reads), str(worker_writes), str(os.getpid())]
        popen = {
            "pass_fds": (worker_reads, worker_writes),
            "start_new_session": True,
            "stdin": subprocess.DEVNULL,
            "stdout": STDERR_FD if self.log is None else self.log.fileno(),
            "env": _worker_environment(sanitized=prefix is not None),
        }
        try:
            if prefix is None:  # forked from a process that imported torch already
                self.process = fork_server.start(module, arguments, **popen)
            else:  # compute-sanitizer must start the worker's interpreter itself
                argv = [sys.executable, "-m", module, *arguments]
                self.process = subprocess.Popen(sanitizing.launched_under(prefix, argv), **popen)
        finally:
            os.close(worker_reads)
            os.close(worker_writes)
        self.requests = Connection(parent_writes, readable=False)
        self.replies = Connection(parent_reads, writable=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: object) -> None:
        try:
            self.requests.send(message)
        except OSError:  # BrokenPipeError: it is gone
            raise WorkerLost("crash", f"worker {self._death()}") from None

    def receive(self, timeout: float) -> object:
        """The next message, or ``WorkerLost`` if none comes within ``timeout`` seconds
        (``timeout``, the worker is killed) or the worker died (``crash``)."""
        if not self.replies.poll(timeout):
            self.kill()
            raise WorkerLost("timeout", f"no answer within {timeout:g} s; the worker was killed")
        try:
            return self.replies.recv()
        except (EOFError, OSError):  # the pipe closed, mid-message or between messages
            raise WorkerLost("crash", f"worker {self._death()}") from None

    def _death(self) -> str:
        try:
            code = self.process.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # pipe closed, process alive: finish it
            self.kill()
            code = self.process.returncode
        return describe_exit(code) if code is not None else "stopped answering"

    def kill(self) -> None:
        """SIGKILL the worker's process group (the kernel may have started processes of its
        own) and reap it. Once only: afterwards the group id may belong to someone else."""
        if self._killed:
            return
        self._killed = True
        fork_server.kill_session(self.process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(KILL_WAIT_S)
        self.requests.close()
        self.replies.close()

    def finish(self) -> str:
        """A sanitized worker's log, once it has exited (its requests pipe closed ends its
        loop; killed past ``SANITIZED_EXIT_S``), so compute-sanitizer has printed all it
        holds. The log's other lines (the worker's stdout) are passed on to stderr."""
        assert self.log is not None
        if not self._killed:
            self.requests.close()
            try:
                self.process.wait(SANITIZED_EXIT_S)
            except subprocess.TimeoutExpired:
                self.kill()
            else:  # it exited and is reaped: its group id is free for others, leave it
                self._killed = True
                self.replies.close()
        log = sanitizing.take_log(self.log)
        os.write(STDERR_FD, sanitizing.other_output(log).encode())
        return log


class IsolatedKernel:
    """The kernel under test behind a worker process: a ``session_cases.CaseRunner``.

    Use as a context manager (``with IsolatedKernel(...) as kernel``), or ``start`` and
    ``close``: starting has the first worker load the kernel (``KernelLoadError`` or
    ``KernelImportLost`` if it cannot, nothing left running: module docstring); closing
    kills whatever worker is alive, so leaving the ``with`` on success, error or Ctrl-C
    leaves no process behind.

    Once started it has the loaded kernel's declarations as its own attributes, as the
    worker reported them (``Ready``): the fused op's ``ds_mla_scale``, so
    ``runner.effective_ds_mla_scale`` of this object is the worker's.
    """

    def __init__(
        self,
        kernel_name: str,
        adapter: str,
        backend: Backend,
        case_timeout: float = DEFAULT_CASE_TIMEOUT_S,
        sanitizer: str | None = None,
    ) -> None:
        """``sanitizer``: a compute-sanitizer tool to run every worker under (None: none);
        ``sanitizing.SanitizerUnavailable`` off CUDA or without compute-sanitizer."""
        self._prefix = None if sanitizer is None else sanitizing.worker_prefix(sanitizer, backend)
        self.setup = Setup(
            kernel_name,
            adapter,
            "cpu" if backend.interpreted else "cuda",
            torch.get_num_threads(),
            sanitizer,
            tuple((str(a), str(b)) for a, b in substitution.substitutes()),
        )
        self.case_timeout = case_timeout
        self._unloadable: KernelLoadError | KernelImportLost | None = None
        self._loading_seen = False  # a worker has loaded the kernel: later ones stay quiet
        self._worker: _Worker | None = None
        self._newest: _Worker | None = None  # the last one started: a sanitized job's log

    def __enter__(self) -> IsolatedKernel:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the first worker and wait until it has loaded the kernel: a
        ``KernelLoadError`` or ``KernelImportLost`` (nothing left running) if it cannot, and
        the same error at once on every later call; a sanitized worker's log,
        compute-sanitizer's own complaints included, then goes to stderr."""
        if self._unloadable is not None:
            raise self._unloadable
        try:
            self._worker = self._start_worker()
        except WorkerLost as lost:  # before the kernel's turn: the machine, not the kernel
            raise KernelLoadError(
                f"{self.setup.kernel_name}: the worker process could not start: {lost.reason}"
            ) from None
        except (KernelLoadError, KernelImportLost) as unloadable:
            self._unloadable = unloadable
            raise
        finally:
            if self._worker is None and self._newest is not None and self._newest.log:
                os.write(STDERR_FD, sanitizing.take_log(self._newest.log).encode())

    @property
    def worker_pid(self) -> int | None:
        """The live worker's process id (None between a lost worker and the next job)."""
        return self._worker.pid if self._worker is not None else None

    def close(self) -> None:
        """Kill the worker, if one is alive: it holds nothing worth a graceful exit (nor
        does the log of a sanitized job that never finished)."""
        self._drop_worker()
        if self._newest is not None and self._newest.log is not None:
            self._newest.log.close()

    def _drop_worker(self) -> None:  # kill it, if alive
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def _start_worker(self) -> _Worker:
        """A worker that has loaded the kernel (module docstring): ``WorkerLost`` before it
        is up, ``KernelLoadError`` or ``KernelImportLost`` while it loads the kernel."""
        worker = self._newest = _Worker(self._prefix)
        setup = dataclasses.replace(self.setup, first=not self._loading_seen)
        ready = False
        try:
            worker.send(setup)
            reply = worker.receive(STARTUP_TIMEOUT_S)
            if not isinstance(reply, Loading):
                raise WorkerLost("crash", f"unexpected answer to setup: {reply!r}")
            self._loading_seen = True
            reply = self._loaded(worker)
            if isinstance(reply, LoadFailed):
                raise (KernelSpecError if reply.spec else KernelLoadError)(reply.message)
            if not isinstance(reply, Ready):
                raise WorkerLost("crash", f"unexpected answer to setup: {reply!r}")
            for name, value in reply.declarations.items():
                setattr(self, name, value)
            ready = True
        finally:
            if not ready:  # a failure above, or Ctrl-C while the worker started
                worker.kill()
        return worker

    def _loaded(self, worker: _Worker) -> object:
        """The worker's answer once it has loaded the kernel, within ``case_timeout``."""
        name = self.setup.kernel_name
        try:
            return worker.receive(self.case_timeout)
        except WorkerLost as lost:
            if lost.status == "timeout":
                reason = (
                    f"{name}: loading it took over {self.case_timeout:g} s (--case-timeout); "
                    "its worker was killed"
                )
            else:
                death = lost.reason.removeprefix("worker ")
                reason = f"{name}: its worker died loading it ({death})"
            raise KernelImportLost(lost.status, reason) from None

    def _live_worker(self) -> _Worker:
        """The worker, starting a fresh one after a lost one."""
        if self._worker is None:
            try:
                self._worker = self._start_worker()
            except KernelImportLost as exc:  # it loaded before: the kernel is not steady
                raise WorkerLost(exc.status, f"a fresh worker could not start: {exc}") from None
            except (KernelLoadError, WorkerLost) as exc:  # it loaded before: the environment
                raise WorkerLost("crash", f"a fresh worker could not start: {exc}") from None
        return self._worker

    def run_cases(self, scenario: Any, config: RunConfig) -> Iterator[CaseResult]:
        """``runner.run_scenario`` in the worker: one result per DCP size, in order."""
        expected = [
            (scenario.name, size, config.replay_command(scenario, size))
            for size in config.sizes_of(scenario)
        ]
        yield from self._job(ScenarioJob(scenario, config), expected)

    def run_token_streams(self, config: RunConfig) -> CaseResult:
        """``stream_case.token_stream_case`` in the worker."""
        dcp_size = config.token_stream_dcp
        expected = [(TOKEN_STREAM_CASE, dcp_size, config.token_stream_replay(dcp_size))]
        [result] = self._job(TokenStreamJob(config), expected)
        return result

    def compile_ahead(self, scenarios: Sequence[Any], config: RunConfig) -> None:
        """Have the worker compile the scenarios' binaries ahead (``CompileAheadJob``),
        within one ``case_timeout``. A worker lost on the way is dropped and nothing is
        reported: the cases then run as without it, on a fresh worker, and report what
        went wrong. Not under compute-sanitizer (one worker per job)."""
        if self.setup.sanitizer is not None or not scenarios:
            return
        done = False
        try:
            worker = self._live_worker()
            worker.send(CompileAheadJob(tuple(scenarios), config))
            done = isinstance(worker.receive(self.case_timeout), JobDone)
        except WorkerLost:
            pass
        finally:
            if not done:  # lost, its context lost (DeviceLost), or Ctrl-C mid-job
                self._drop_worker()

    def _job(
        self, job: ScenarioJob | TokenStreamJob, expected: list[tuple[str, int, str]]
    ) -> Iterator[CaseResult]:
        """``_answers``; under compute-sanitizer all of them at once, once the job's worker
        has exited, each with its ``sanitizer`` check (``sanitizing.attach``)."""
        if self.setup.sanitizer is None:
            yield from self._answers(job, expected)
            return
        results = list(self._answers(job, expected))
        worker, self._newest = self._newest, None
        if worker is None:  # no worker could start: nothing was logged
            yield from results
            return
        if self._worker is worker:
            self._worker = None
        yield from sanitizing.attach(results, worker.finish(), self.setup.sanitizer)

    def _answers(
        self, job: ScenarioJob | TokenStreamJob, expected: list[tuple[str, int, str]]
    ) -> Iterator[CaseResult]:
        """Send ``job`` and yield its results; ``expected`` names them (scenario, DCP size,
        replay) so that cases the worker never answered are still reported.

        If the caller stops early (``--fail-fast``) or is interrupted, the worker is
        mid-job, with answers in flight that no later job must read: it is killed.
        """
        finished = False
        received = 0
        waiting_since = time.perf_counter()
        try:
            try:
                worker = self._live_worker()
                worker.send(job)
                for _ in expected:
                    waiting_since = time.perf_counter()
                    reply = worker.receive(self.case_timeout)
                    if isinstance(reply, DeviceLost):
                        raise WorkerLost("crash", reply.message)
                    if not isinstance(reply, CaseResult):
                        raise WorkerLost("crash", f"unexpected answer: {reply!r}")
                    received += 1
                    yield reply
                if not isinstance(worker.receive(self.case_timeout), JobDone):
                    raise WorkerLost("crash", "the worker sent more results than cases")
            except WorkerLost as lost:
                self._drop_worker()
                waited = time.perf_counter() - waiting_since
                yield from _unanswered(expected[received:], lost, self.case_timeout, waited)
            finished = True
        finally:
            if not finished:
                self._drop_worker()


def _unanswered(
    expected: list[tuple[str, int, str]], lost: WorkerLost, case_timeout: float, waited: float
) -> Iterator[CaseResult]:
    """Results for the cases a lost worker never answered: the first is the one it was on
    (``waited`` seconds for it), the others never started."""
    reason = lost.reason
    if lost.status == "timeout":
        reason = f"no result within {case_timeout:g} s (--case-timeout); the worker was killed"
    for index, (name, dcp_size, replay) in enumerate(expected):
        if index == 0:
            error, seconds = reason, waited
        else:
            error, seconds = f"not run: the worker was lost earlier ({reason})", 0.0
        yield CaseResult(name, dcp_size, lost.status, error=error, replay=replay, seconds=seconds)
