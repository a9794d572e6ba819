"""Real ranks: dcpcheck with one DCP rank per process, through torch.distributed.

The simulated mode (``dcpcheck.runner``) runs every rank of a DCP group in one process on
one device. Here the DCP size is the world size and each process is one rank, on its own
device: ``cuda:LOCAL_RANK`` with NCCL when CUDA is available, else the CPU and Triton's
interpreter with gloo. For each scenario every rank builds the case with ``build_case``
(one seeded generator fills the ranks' caches in rank order, so building them all is how a
rank gets exactly the bytes the simulated mode gives it) and launches the kernel on **its
own** rank's inputs, slot mapping and caches; then it sends its launched buffers to rank 0
(:class:`LaunchedRank`). Rank 0 runs the DCP1 baseline itself (it is one rank), puts every
rank's buffers into its case and runs the same checks (``runner.check_case``), so the report
is the simulated mode's: same verdicts, same findings, same JSON. The token-stream check
merges decode attention across processes with all-gathers (``dcpcheck.distributed_streams``).

Three ways in:

* ``torchrun --nproc-per-node N -m dcpcheck.distributed run ...`` (or ``hash``): torchrun
  sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
* :func:`launch`: spawns the N processes itself with that same environment (rendezvous on
  127.0.0.1, a free port), watches them and stops them all when one fails;
* :func:`run_distributed` inside :func:`rank_group`, for a caller that parsed its options.

A rank that crashes or hangs ends the run. Each rank reports where it is (a heartbeat file,
when started by :func:`launch`); the launcher names a rank that died, or, when no rank has
made progress for ``--rank-timeout`` seconds, the rank(s) furthest behind: the others are
waiting for them at a collective. It then kills every rank's process group and checks that
none is left. Collectives time out ``COLLECTIVE_TIMEOUT_MARGIN_S`` later, so under plain
torchrun a stuck rank still ends the run, while under :func:`launch` the watchdog, which can
tell the stuck rank from the waiting ones, speaks first.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
import torch
import torch.distributed as dist

from dcpcheck import adapters, console, report
from dcpcheck.backend import Backend, BackendError, select_backend
from dcpcheck.case import Case, build_case, make_activations, run_oracle
from dcpcheck.checks import Finding
from dcpcheck.cli import common  # it imports this module only inside functions
from dcpcheck.cli.hashing import hash_config, stream_options
from dcpcheck.contract import Kernel
from dcpcheck.distributed_streams import (
    compare_streams_distributed,
    streams_to_json,
    token_stream_case,
)
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.kernel_loading import KernelLoadError, load_kernel
from dcpcheck.runner import (
    CaseResult,
    KernelError,
    RunConfig,
    _ownership_shapes,
    check_case,
    declared_ds_mla_scale,
    launch_all,
    with_effective_ds_mla_scale,
)
from dcpcheck.scenario import Scenario, ScenarioError, load_scenarios

ROOT = 0
"""The rank that runs the DCP1 baseline and the checks, and prints the report."""

DEFAULT_RANK_TIMEOUT_S = 300.0
"""Longest the run may go with no rank making progress. The slowest shipped scenario takes
about 10 s per launch on the CPU interpreter, so only a real hang gets near it."""

COLLECTIVE_TIMEOUT_MARGIN_S = 30.0
"""Collectives give up this much later than the rank timeout: under :func:`launch` the
watchdog then names the stuck rank before the waiting ones fail (NCCL's watchdog aborts a
waiting process outright, which would look like a crash of the wrong rank)."""

EXIT_PEER_LOST = 3
"""A rank's exit code when a collective failed because another rank died or stopped: the
launcher then looks for that other rank instead of naming this one."""

EXIT_INTERRUPTED = 130
"""Ctrl-C, as ``dcpcheck.cli.main`` reports it (128 + SIGINT)."""

EXIT_GRACE_S = 5.0
"""How long the launcher waits, after one rank ended with a non-zero code, for the others to
end by themselves (they leave the final barrier together) before it stops them."""

POLL_INTERVAL_S = 0.1
"""How often the launcher reads the ranks' exit statuses and heartbeats."""

HEARTBEAT_DIR_ENV = "DCPCHECK_HEARTBEAT_DIR"
"""Set by :func:`launch`: the folder where each rank writes ``rank<R>.json``."""

LOOPBACK = "127.0.0.1"
"""Rendezvous address of :func:`launch`: every rank runs on this machine."""

T = TypeVar("T")


class DistributedUsageError(ValueError):
    """Options that real ranks cannot run (a usage error, exit 2)."""


class PeerLost(RuntimeError):
    """A collective failed: another rank died or stopped responding."""


# -- heartbeats ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    """Where one rank is. ``collectives`` counts the collectives it entered: every rank
    enters the same sequence, so a rank with fewer is behind and the others wait for it."""

    beat: int  # bumped on every write, so the launcher sees any activity
    collectives: int
    phase: str
    exit_code: int | None = None  # set by a rank that ends by itself, right before exiting


@dataclass
class Progress:
    """This rank's heartbeat file (none outside :func:`launch`: torchrun has its own
    supervision, and the collective timeout ends a stuck run)."""

    path: Path | None
    beat: int = 0
    collectives: int = 0

    @classmethod
    def from_environment(cls) -> Progress:
        folder = os.environ.get(HEARTBEAT_DIR_ENV)
        if folder is None:
            return cls(None)
        return cls(Path(folder) / f"rank{os.environ['RANK']}.json")

    def working(self, phase: str) -> None:
        self._write(phase)

    def collective(self, what: str) -> None:
        self.collectives += 1
        self._write(f"waiting for every rank at {what}")

    def finished(self, exit_code: int) -> None:
        self._write("finished", exit_code)

    def _write(self, phase: str, exit_code: int | None = None) -> None:
        if self.path is None:
            return
        self.beat += 1
        beat = Heartbeat(self.beat, self.collectives, phase, exit_code)
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(asdict(beat)))
        os.replace(scratch, self.path)  # atomic: the launcher never reads half a heartbeat


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The last heartbeat written at ``path``; ``None`` before the rank wrote one."""
    try:
        return Heartbeat(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None


# -- the group of ranks -------------------------------------------------------------------


def in_torchrun_environment() -> bool:
    """Whether this process was started as one rank of a group (by torchrun or :func:`launch`)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


@dataclass
class RankGroup:
    """This process's rank, its device, and the collectives dcpcheck uses.

    Every collective goes through :meth:`_collective`, which counts it in the heartbeat and
    turns the backend's failure into :class:`PeerLost`.
    """

    rank: int
    world_size: int
    backend: Backend  # this rank's device (``cuda:LOCAL_RANK``) or the CPU interpreter
    progress: Progress

    @property
    def is_root(self) -> bool:
        return self.rank == ROOT

    @property
    def transport(self) -> str:
        return "gloo" if self.backend.interpreted else "nccl"

    def _collective(self, what: str, operation: Callable[[], T]) -> T:
        self.progress.collective(what)
        try:
            return operation()
        except RuntimeError as exc:  # gloo and NCCL report a lost or stuck peer this way
            raise PeerLost(
                f"rank {self.rank}: lost contact with the other ranks at {what}: {exc}"
            ) from exc

    def join(self, rank_timeout_s: float) -> None:
        timeout = timedelta(seconds=rank_timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S)
        self._collective(
            "the rendezvous", lambda: dist.init_process_group(self.transport, timeout=timeout)
        )

    def gather_to_root(self, value: Any, what: str) -> list[Any] | None:
        """Every rank's ``value`` (pickled) on rank 0, in rank order; ``None`` elsewhere."""
        gathered = [None] * self.world_size if self.is_root else None
        self._collective(what, lambda: dist.gather_object(value, gathered, dst=ROOT))
        return gathered

    def broadcast_from_root(self, value: Any, what: str) -> Any:
        box = [value]
        self._collective(what, lambda: dist.broadcast_object_list(box, src=ROOT))
        return box[0]

    def all_gather(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype on every rank), in rank order."""
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._collective(what, lambda: dist.all_gather(parts, tensor))
        return parts

    def barrier(self, what: str) -> None:
        self._collective(what, dist.barrier)


def _rank_backend(device: str, local_rank: int) -> Backend:
    """``select_backend(device)``, pinned to ``cuda:LOCAL_RANK`` on a GPU machine."""
    chosen = select_backend(device)
    if chosen.interpreted:
        return chosen
    if local_rank >= torch.cuda.device_count():
        raise BackendError(
            f"LOCAL_RANK {local_rank}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    torch.cuda.set_device(local_rank)  # NCCL's object collectives use the current device
    return replace(chosen, device=torch.device("cuda", local_rank))


@contextmanager
def rank_group(
    device: str = "auto",
    rank_timeout_s: float = DEFAULT_RANK_TIMEOUT_S,
    progress: Progress | None = None,
) -> Iterator[RankGroup]:
    """Join the group described by the environment (torchrun's variables) and leave it.

    Torch runs one CPU thread per rank: the ranks share the machine's cores, and their CPU
    work is small tensor ops, where threads cost more in hand-offs than they win (as in
    ``tests/conftest.py``); it also makes fp32 reductions round as in a single-threaded
    simulated run. The ranks leave together (a final barrier), so no rank exits while rank 0
    may still need it. Raises ``DistributedUsageError`` outside a group's environment and
    ``BackendError`` if ``device`` cannot be used.
    """
    if not in_torchrun_environment():
        raise DistributedUsageError(
            "not started as a rank: run under `torchrun --nproc-per-node N -m "
            "dcpcheck.distributed ...`, or through `dcpcheck run --launcher torchrun`"
        )
    backend = _rank_backend(device, int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    torch.set_num_threads(1)
    group = RankGroup(
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        backend,
        progress or Progress.from_environment(),
    )
    group.join(rank_timeout_s)
    try:
        yield group
        group.barrier("the end of the run")
    finally:
        dist.destroy_process_group()


# -- contract checks on real ranks --------------------------------------------------------


def distributed_sizes(requested: Sequence[int] | None, world_size: int) -> tuple[int, ...]:
    """The DCP sizes a group of ``world_size`` ranks checks: its own size, and DCP1 (the
    baseline, which rank 0 runs alone) if asked. ``None`` means the world size."""
    if requested is None:
        return (world_size,)
    if world_size not in requested or any(n not in (1, world_size) for n in requested):
        raise DistributedUsageError(
            f"--dcp {','.join(map(str, requested))} on {world_size} rank(s): each process is one "
            f"rank, so the DCP size is the number of processes; use --dcp {world_size} "
            f"(or 1,{world_size})"
        )
    return tuple(requested)


@dataclass
class LaunchedRank:
    """What one rank sends rank 0 after its launch: its ``RankLaunch`` (``torch.save``d), the
    inputs the kernel modified, or the kernel's exception.

    The launch travels whole (outputs inside their guard storages, caches with their initial
    copies: whatever the checks read), less its inputs: ``launch_all`` restores those after
    recording any change, so they equal rank 0's copy, and their shared tables (RoPE
    ``cos_sin``: 42 MB at DeepSeek's max position) would be sent by every rank.
    ``torch.save`` keeps views views (an output inside its guard storage) and lets rank 0
    load the tensors straight onto its device.
    """

    rank: int
    error: str | None  # as ``runner.launch_all`` words it: "rank R: Type: message"
    launch: bytes = b""
    input_changes: list[Finding] = field(default_factory=list)


def _launch_own_rank(kernel: Kernel, case: Case, rank: int) -> LaunchedRank:
    """Launch this process's rank of ``case`` (``runner.launch_all`` on that one rank: the
    same input snapshot and restore, the same error text)."""
    own = case.ranks[rank]
    try:
        changes = launch_all(kernel, replace(case, ranks=[own]))
    except KernelError as exc:
        return LaunchedRank(rank, str(exc))
    saved = io.BytesIO()
    torch.save(replace(own, inputs=None), saved)
    return LaunchedRank(rank, None, saved.getvalue(), changes)


def _adopt(case: Case, launched: Sequence[LaunchedRank]) -> tuple[str | None, list[Finding]]:
    """Put every rank's launch into rank 0's ``case``, on rank 0's device.

    Returns the error of the lowest rank whose kernel raised (``launch_all`` stops there in
    the simulated mode), else every rank's input changes in rank order.
    """
    errors = [r.error for r in launched if r.error is not None]
    if errors:
        return errors[0], []
    device = case.activations.q_c.device
    changes: list[Finding] = []
    for rank in launched:
        # Trusted bytes: another rank of this run pickled its own launch.
        loaded = torch.load(io.BytesIO(rank.launch), map_location=device, weights_only=False)
        case.ranks[rank.rank] = replace(loaded, inputs=case.ranks[rank.rank].inputs)
        changes += rank.input_changes
    return None, changes


@dataclass
class _Launched:
    """A case after its launch, as ``runner.run_scenario`` keeps it."""

    case: Case
    changes: list[Finding]
    error: str | None
    seconds: float


def _judge(
    kernel: Kernel,
    scenario: Scenario,
    config: RunConfig,
    launched: _Launched,
    baseline: _Launched,
) -> CaseResult:
    """The verdict of one launched case, as ``runner.run_scenario`` gives it."""
    case = launched.case
    result = CaseResult(
        scenario.name,
        case.dcp_size,
        "pass",
        replay=config.replay_command(scenario, case.dcp_size),
        ownership=_ownership_shapes(case),
    )
    start = time.perf_counter()
    if launched.error is not None:
        result.status, result.error = "error", launched.error
    elif baseline.error is not None:
        result.status = "error"
        result.error = f"the DCP1 baseline run failed: {baseline.error}"
    else:
        result.checks = adapters.apply_limitations(
            check_case(case, baseline.case, launched.changes, config.oracle),
            adapters.kernel_limitations(kernel, [launch.inputs for launch in case.ranks]),
        )
        if result.failed_checks:
            result.status = "fail"
    result.seconds = launched.seconds + time.perf_counter() - start
    return result


def _check_scenario(
    kernel: Kernel,
    scenario: Scenario,
    config: RunConfig,
    group: RankGroup,
    sizes: Sequence[int],
) -> list[CaseResult] | None:
    """One scenario on every rank; its results (one per size, in order) on rank 0."""
    scenario = with_effective_ds_mla_scale(scenario, config, kernel)  # as runner.run_scenario
    device = group.backend.device
    seed = scenario.seed if config.seed is None else config.seed
    label = f"{scenario.name}[dcp{group.world_size}]"
    group.progress.working(f"launching {label}")
    start = time.perf_counter()
    act = make_activations(scenario, seed, device)
    expected = run_oracle(scenario, act)
    case = build_case(
        scenario, group.world_size, device, seed=seed, activations=act, expected=expected
    )
    own = _launch_own_rank(kernel, case, group.rank)
    gathered = group.gather_to_root(own, f"the gathering of {label} on rank 0")
    if gathered is None:
        return None
    group.progress.working(f"checking {label}")
    error, changes = _adopt(case, gathered)
    distributed = _Launched(case, changes, error, time.perf_counter() - start)
    baseline = distributed
    if group.world_size != 1:  # rank 0 is a whole DCP1 group by itself
        start = time.perf_counter()
        base_case = build_case(scenario, 1, device, seed=seed, activations=act, expected=expected)
        try:
            baseline = _Launched(
                base_case, launch_all(kernel, base_case), None, time.perf_counter() - start
            )
        except KernelError as exc:
            baseline = _Launched(base_case, [], str(exc), time.perf_counter() - start)
    by_size = {1: baseline, group.world_size: distributed}
    return [_judge(kernel, scenario, config, by_size[n], baseline) for n in sizes]


def run_distributed(
    kernel: Kernel,
    scenarios: Sequence[Scenario],
    config: RunConfig,
    group: RankGroup,
    *,
    tokens: bool = True,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult] | None:
    """``runner.run`` (and, with ``tokens``, ``runner.token_stream_case``) on real ranks:
    call it on every rank of ``group``. Rank 0 gets the results, in the simulated mode's
    order, and ``on_result`` sees each as it lands; the other ranks get ``None``.

    ``config.dcp_sizes`` may name the world size and 1 (:func:`distributed_sizes`).
    """
    sizes = distributed_sizes(config.dcp_sizes, group.world_size)
    results: list[CaseResult] = []
    for scenario in scenarios:
        stop = False
        for result in _check_scenario(kernel, scenario, config, group, sizes) or []:
            results.append(result)
            if on_result is not None:
                on_result(result)
            if config.fail_fast and result.status != "pass":
                stop = True
                break
        if config.fail_fast and group.broadcast_from_root(stop, "the fail-fast decision"):
            return results if group.is_root else None
    if tokens and scenarios:
        result = token_stream_case(kernel, config, group)
        if result is not None:
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results if group.is_root else None


# -- the launcher -------------------------------------------------------------------------


def _free_port() -> int:
    """A TCP port free on the loopback right now, for rank 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables torchrun sets for one rank of a one-machine group, plus NVLink
    multicast off (``NCCL_NVLS_ENABLE=0``: the shared GPU hosts must keep it off)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "NCCL_NVLS_ENABLE": "0",
    }


@dataclass
class _Worker:
    """One rank's process (the leader of its own process group) and its heartbeat file."""

    rank: int
    process: subprocess.Popen
    heartbeat_path: Path

    def exit_status(self) -> int | None:
        """Like ``Popen.poll()`` (negative: killed by that signal), but the process is left
        unreaped: its pid, and so its process group id, stays ours until :func:`_stop`."""
        info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def heartbeat(self) -> Heartbeat | None:
        return read_heartbeat(self.heartbeat_path)


@dataclass(frozen=True)
class _RankState:
    status: int | None  # exit status, None while running
    heartbeat: Heartbeat | None

    @property
    def crashed(self) -> bool:
        """Ended without saying so: killed, ``os._exit``, or an uncaught error."""
        ended_itself = self.heartbeat is not None and self.heartbeat.exit_code == self.status
        return self.status is not None and not ended_itself

    @property
    def where(self) -> str:
        return self.heartbeat.phase if self.heartbeat is not None else "starting up"


def _describe_status(status: int) -> str:
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit code {status}"


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _furthest_behind(states: dict[int, _RankState]) -> list[int]:
    """The running ranks that entered the fewest collectives: the ones the others wait for."""
    running = {r: s for r, s in states.items() if s.status is None}
    entered = {r: s.heartbeat.collectives if s.heartbeat else -1 for r, s in running.items()}
    fewest = min(entered.values())
    return [r for r, count in entered.items() if count == fewest]


def _hang_message(states: dict[int, _RankState], why: str) -> str:
    stuck = _furthest_behind(states)
    message = f"{_ranks(stuck)} hung ({why}) at: {states[stuck[0]].where}"
    waiting = [r for r, s in states.items() if s.status is None and r not in stuck]
    if waiting:
        message += f"; {_ranks(waiting)}: {states[waiting[0]].where}"
    return message


def _supervise(workers: Sequence[_Worker], timeout_s: float) -> tuple[int, str | None]:
    """Watch the ranks until they all end, or one fails: ``(exit code, failure message)``.

    A rank that dies is named at once. A rank that ends with a non-zero code by itself (a
    usage error, a kernel that did not load, or ``EXIT_PEER_LOST``) gets ``EXIT_GRACE_S``
    for the others to end too; after that, the run stops with its code, or, if it lost its
    peers, with the name of the rank that stopped. When no rank has made progress for
    ``timeout_s``, the ranks furthest behind are named as hung.
    """
    seen: dict[int, _RankState] = {}
    last_change = ended_early = time.monotonic()
    while True:
        now = time.monotonic()
        states = {w.rank: _RankState(w.exit_status(), w.heartbeat()) for w in workers}
        if states != seen:
            seen, last_change = states, now
        crashed = [r for r, s in states.items() if s.crashed]
        if crashed:
            s = states[crashed[0]]
            return EXIT_FAIL, f"{_ranks(crashed)} died ({_describe_status(s.status)}) at: {s.where}"
        if all(s.status is not None for s in states.values()):
            if states[ROOT].status == EXIT_PEER_LOST:
                return EXIT_FAIL, "every rank lost contact with the others"
            return states[ROOT].status, None
        ended = {r: s.status for r, s in states.items() if s.status not in (None, EXIT_OK)}
        if not ended:
            ended_early = now
        elif now - ended_early > EXIT_GRACE_S:
            if EXIT_PEER_LOST in ended.values():
                return EXIT_FAIL, _hang_message(states, "the other ranks lost contact with it")
            rank, status = next(iter(ended.items()))
            return status, f"rank {rank} ended with exit code {status} while the others ran on"
        if now - last_change > timeout_s:
            idle = f"no rank made progress for {now - last_change:.0f} s, --rank-timeout"
            return EXIT_FAIL, _hang_message(states, idle)
        time.sleep(POLL_INTERVAL_S)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(workers: Sequence[_Worker], deadline_s: float = EXIT_GRACE_S) -> list[int]:
    """Kill every rank's process group (the rank and anything it started), reap the ranks,
    and return the process groups that still have members after ``deadline_s``."""
    for worker in workers:
        with suppress(ProcessLookupError):  # the group is already empty
            os.killpg(worker.process.pid, signal.SIGKILL)
    for worker in workers:
        worker.process.wait()
    deadline = time.monotonic() + deadline_s
    alive = [w.process.pid for w in workers if _group_alive(w.process.pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        alive = [pgid for pgid in alive if _group_alive(pgid)]
    return alive


def launch(n: int, argv: Sequence[str], timeout: float = DEFAULT_RANK_TIMEOUT_S) -> int:
    """Run ``python -m dcpcheck.distributed ARGV`` as ``n`` ranks on this machine and return
    the run's exit code: rank 0's when every rank ends by itself, ``EXIT_FAIL`` when a rank
    died or hung (named on stderr).

    Each rank gets torchrun's environment (:func:`rank_environment`) and its own process
    group; ``timeout`` is the ``--rank-timeout`` of the ranks and of the watchdog. Whatever
    happens (Ctrl-C included), every process group is killed before this returns.
    """
    if n < 1:
        raise DistributedUsageError(f"a group needs at least one rank, got {n}")
    command = [sys.executable, "-m", "dcpcheck.distributed", *argv, "--rank-timeout", str(timeout)]
    port = _free_port()
    workers: list[_Worker] = []
    with tempfile.TemporaryDirectory(prefix="dcpcheck-ranks-") as heartbeats:
        try:
            for rank in range(n):
                env = {**os.environ, **rank_environment(rank, n, port)}
                env[HEARTBEAT_DIR_ENV] = heartbeats
                process = subprocess.Popen(command, env=env, process_group=0)
                workers.append(_Worker(rank, process, Path(heartbeats) / f"rank{rank}.json"))
            code, failure = _supervise(workers, timeout)
        finally:
            survivors = _stop(workers)
    if failure is not None:
        console.err.print(f"dcpcheck: {failure}; stopped every rank", markup=False, soft_wrap=True)
    if survivors:
        console.err.print(
            f"dcpcheck: process group(s) {', '.join(map(str, survivors))} survived SIGKILL",
            markup=False,
        )
    return code


# -- command line (one rank per process) --------------------------------------------------


def _rank_options(function: Callable) -> Callable:
    """Options every command of a rank takes."""
    for option in reversed(
        (
            common.kernel_option,
            common.adapter_option,
            click.option(
                "--device",
                type=click.Choice(["auto", "cuda", "cpu"]),
                default="auto",
                show_default=True,
                help="auto: cuda:LOCAL_RANK over NCCL if CUDA is present, else the CPU "
                "interpreter over gloo.",
            ),
            click.option(
                "--rank-timeout",
                "rank_timeout_s",
                type=click.FloatRange(min=1.0),
                default=DEFAULT_RANK_TIMEOUT_S,
                show_default=True,
                help="Seconds the run may go without any rank making progress before it is "
                "stopped, naming the rank(s) that hung. Collectives give up "
                f"{COLLECTIVE_TIMEOUT_MARGIN_S:g} s later (all that ends a hang under torchrun).",
            ),
        )
    ):
        function = option(function)
    return function


@click.group(help=__doc__.split("\n\n", 1)[0])
def commands() -> None:
    pass


def _group_kernel(name: str, adapter: str) -> Kernel:
    try:
        kernel = load_kernel(name, adapter)
    except KernelLoadError as exc:
        raise common.KernelLoadFailure(str(exc)) from None
    try:
        declared_ds_mla_scale(kernel)  # a rule dcpcheck does not know: exit 125, as in run
    except ValueError as exc:
        raise common.KernelLoadFailure(f"{name}: {exc}") from None
    return kernel


@contextmanager
def _joined(device: str, rank_timeout_s: float, progress: Progress) -> Iterator[RankGroup]:
    try:
        with rank_group(device, rank_timeout_s, progress) as group:
            if group.is_root:
                console.err.print(
                    f"[bold]backend:[/] {group.backend.describe()}, {group.world_size} rank(s) "
                    f"over {group.transport}"
                )
            yield group
    except (BackendError, DistributedUsageError) as exc:
        raise common.InputError(str(exc)) from None


@commands.command("run")
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N]",
    help="The world size, and 1 for a DCP1 case (default: the world size).",
)
@common.scenario_option
@common.scenario_dir_option
@click.option("--seed", type=int, default=None, help="Override every scenario's value seed.")
@common.json_option
@common.junit_option
@common.no_tokens_option
@click.option("--stats", is_flag=True, help="Report throughput and ownership shapes.")
@common.ds_mla_scale_option
@common.oracle_option
@common.fail_fast_option
@_rank_options
@click.pass_obj
def run_command(
    progress: Progress,
    dcp_text,
    patterns,
    scenario_dir,
    seed,
    json_path,
    junit_path,
    no_tokens,
    stats,
    ds_mla_scale,
    oracle,
    fail_fast,
    kernel_name,
    adapter,
    device,
    rank_timeout_s,
) -> None:
    """`dcpcheck run` with this process as one rank; rank 0 prints the report."""
    dcp_sizes = common.parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    try:
        scenarios = load_scenarios(list(patterns), scenario_dir)
        for path in (json_path, junit_path):
            if path is not None:
                report.ensure_writable(path)
    except (ScenarioError, report.ReportPathError) as exc:
        raise common.InputError(str(exc)) from None
    config = RunConfig(
        kernel_name,
        dcp_sizes,
        seed,
        fail_fast,
        ds_mla_scale=common.ds_mla_scale_rule(ds_mla_scale),
        oracle=oracle == "on",
    )
    with _joined(device, rank_timeout_s, progress) as group:
        if group.is_root:
            common.announce_oracle(config.oracle)
        kernel = _group_kernel(kernel_name, adapter)
        started = time.perf_counter()
        results = run_distributed(kernel, scenarios, config, group, tokens=not no_tokens)
        if results is None:
            return
        backend_name = "interpreter" if group.backend.interpreted else "cuda"
        if json_path is not None:
            text = report.to_json(
                results,
                kernel=kernel_name,
                backend=backend_name,
                partial=False,
                oracle=config.oracle,
            )
            report.write_atomic(json_path, text)
        if junit_path is not None:
            text = report.to_junit(results, kernel=kernel_name, partial=False, oracle=config.oracle)
            report.write_atomic(junit_path, text)
        console.print_results(results)
        if stats:
            console.print_stats(results, time.perf_counter() - started, None)
    raise SystemExit(EXIT_OK if all(r.status == "pass" for r in results) else EXIT_FAIL)


@commands.command("hash")
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N]",
    help="The world size, and 1 (DCP1 always runs as the baseline, on rank 0).",
)
@stream_options
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write every digest, in full, and the verdict here.",
)
@_rank_options
@click.pass_obj
def hash_command(
    progress: Progress,
    dcp_text,
    prompts,
    steps,
    layout_name,
    preset,
    seed,
    json_path,
    kernel_name,
    adapter,
    device,
    rank_timeout_s,
) -> None:
    """`dcpcheck hash` with this process as one rank: decode attention is merged across
    the ranks by all-gather; rank 0 prints the digests."""
    dcp_sizes = common.parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    if json_path is not None:
        try:
            report.ensure_writable(json_path)
        except report.ReportPathError as exc:
            raise common.InputError(str(exc)) from None
    with _joined(device, rank_timeout_s, progress) as group:
        distributed_sizes(dcp_sizes, group.world_size)
        stream_config = hash_config(group.backend, layout_name, preset, prompts, steps, seed)
        kernel = _group_kernel(kernel_name, adapter)
        try:
            comparison = compare_streams_distributed(kernel, stream_config, group)
        except KernelError as exc:  # on rank 0 only: it still leaves with the others
            console.err.print(f"dcpcheck: the kernel raised: {exc}", markup=False, soft_wrap=True)
            code = EXIT_FAIL
        else:
            if comparison is None:
                return
            if json_path is not None:
                backend_name = "interpreter" if group.backend.interpreted else "cuda"
                text = streams_to_json(comparison, kernel=kernel_name, backend=backend_name)
                report.write_atomic(json_path, text)
            console.print_streams(comparison)
            code = EXIT_OK if comparison.identical else EXIT_FAIL
    raise SystemExit(code)


def _exit_code(argv: Sequence[str] | None, progress: Progress) -> int:
    """Run a command; its exit code, with click's and the collectives' errors as one line
    on stderr (``dcpcheck.cli.main``'s format)."""
    try:
        commands.main(args=argv, standalone_mode=False, obj=progress)
    except SystemExit as exc:
        return EXIT_OK if exc.code is None else int(exc.code)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        console.err.print(f"dcpcheck: error: {exc.format_message()}", markup=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Abort:
        console.err.print("dcpcheck: interrupted", markup=False)
        return EXIT_INTERRUPTED
    except PeerLost as exc:
        if progress.path is None:  # under launch(), the launcher names the rank at fault
            console.err.print(f"dcpcheck: {exc}", markup=False, soft_wrap=True)
        return EXIT_PEER_LOST
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dcpcheck.distributed {run,hash} ...`` as one rank (torchrun's variables
    or :func:`launch`'s). The last heartbeat carries the exit code, so the launcher can tell
    a rank that ended by itself from one that died."""
    progress = Progress.from_environment()
    code = _exit_code(argv, progress)
    progress.finished(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
