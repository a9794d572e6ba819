"""A group of real ranks: each process one DCP rank over torch.distributed (gloo on the
CPU, NCCL on GPUs), its collectives with timeouts, and the heartbeat each rank writes so
the launcher (dcpcheck.distributed.launcher) can tell a rank that hung from one that waits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from dcpcheck import observers
from dcpcheck.backend import Backend, BackendError, select_backend

ROOT = 0
"""The rank that runs the DCP1 baseline and the checks, and prints the report."""

DEFAULT_RANK_TIMEOUT_S = 300.0
"""Longest the run may go with no rank making progress. The slowest shipped scenario takes
about 10 s per launch on the CPU interpreter, so only a real hang gets near it."""

COLLECTIVE_TIMEOUT_MARGIN_S = 30.0
"""Collectives give up this much later than the rank timeout: under :func:`launch` the
watchdog then names the stuck rank before the waiting ones fail (NCCL's watchdog aborts a
waiting process outright, which would look like a crash of the wrong rank)."""

HEARTBEAT_DIR_ENV = "DCPCHECK_HEARTBEAT_DIR"
"""Set by :func:`launch`: the folder where each rank writes ``rank<R>.json``."""

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
            f"LOCAL_RANK {local_rank}, but torch sees {torch.cuda.device_count()} CUDA "
            "device(s): each rank needs a device of its own (--device cpu runs the ranks on "
            "the CPU over gloo)"
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
    if not observers.in_torchrun_environment():
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
