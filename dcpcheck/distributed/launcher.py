"""The launcher: start N ranks of ``python -m dcpcheck`` on this machine, watch
their heartbeats and exit statuses, and stop them all (naming the rank at fault) when one
dies or the group stops making progress.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from dcpcheck.distributed.group import (
    DEFAULT_RANK_TIMEOUT_S,
    HEARTBEAT_DIR_ENV,
    ROOT,
    DistributedUsageError,
    Heartbeat,
    read_heartbeat,
)
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK, EXIT_PEER_LOST
from dcpcheck.output import console

EXIT_GRACE_S = 5.0
"""How long the launcher waits, after one rank ended with a non-zero code, for the others to
end by themselves (they leave the final barrier together) before it stops them."""

POLL_INTERVAL_S = 0.1
"""How often the launcher reads the ranks' exit statuses and heartbeats."""

LOOPBACK = "127.0.0.1"
"""Rendezvous address of :func:`launch`: every rank runs on this machine."""


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
    """Run ``python -m dcpcheck ARGV`` as ``n`` ranks on this machine and return
    the run's exit code: rank 0's when every rank ends by itself, ``EXIT_FAIL`` when a rank
    died or hung (named on stderr).

    Each rank gets torchrun's environment (:func:`rank_environment`) and its own process
    group; ``timeout`` is the ``--rank-timeout`` of the ranks and of the watchdog. Whatever
    happens (Ctrl-C included), every process group is killed before this returns.
    """
    if n < 1:
        raise DistributedUsageError(f"a group needs at least one rank, got {n}")
    command = [sys.executable, "-m", "dcpcheck", *argv, "--rank-timeout", str(timeout)]
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
