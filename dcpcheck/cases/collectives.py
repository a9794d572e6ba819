"""A DCP group's collectives (:class:`Group`, as the merge of partial attentions and the
tiny model's decode use them), simulated in one process (:func:`run_ranks`) or over a
torch.distributed process group (:class:`TorchGroup`).

Simulated, every rank's work runs in a thread of its own, and the threads meet in the
collectives as ranks do.

One rank runs at a time: a rank holds the group's lock while it computes and lets it go
only while it waits in a collective, so the kernels of the ranks never run at once (Triton's
interpreter keeps global state, and a GPU runs one launch after the other anyway). The
last rank to reach a collective computes it for all, in rank order (a sum adds the ranks'
tensors one after the other in their dtype, as a ring reduction does), so the results do
not depend on which thread ran first.

Every rank must make the same calls in the same order. A rank that calls another
collective, another dim, or returns or raises while the others wait in one is a
``CollectiveError`` of the ranks still waiting, which names the call and the ranks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")


class Group(Protocol):
    """The collectives a merge may use, as vLLM's ``GroupCoordinator`` names them. Every
    rank of the group must make the same calls in the same order."""

    world_size: int
    rank_in_group: int

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim``, in rank order."""
        ...

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The ranks' ``tensor`` summed, and this rank's ``1 / world_size`` slice of it
        along ``dim``."""
        ...

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The ranks' ``tensor`` summed."""
        ...

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """Slice ``s`` of dim 0 of every rank's ``tensor`` to rank ``s``: the result's
        slice ``r`` is what rank ``r`` sent this rank."""
        ...


class CollectiveError(RuntimeError):
    """The ranks did not make the same collective calls (module docstring)."""


@dataclass
class _Call:
    """One collective call as the ranks reach it."""

    what: tuple[str, int]  # (collective, dim)
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)
    results: list[torch.Tensor] | None = None
    error: CollectiveError | None = None  # the ranks' tensors could not be combined


def _all_gather(tensors: Sequence[torch.Tensor], dim: int) -> list[torch.Tensor]:
    gathered = torch.cat(list(tensors), dim=dim)
    return [gathered.clone() for _ in tensors]


def _summed(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor
    return total


def _reduce_scatter(tensors: Sequence[torch.Tensor], dim: int) -> list[torch.Tensor]:
    total = _summed(tensors)
    if total.shape[dim] % len(tensors):
        raise CollectiveError(
            f"reduce_scatter of dim {dim} of size {total.shape[dim]} over {len(tensors)} ranks"
        )
    return [part.contiguous() for part in total.chunk(len(tensors), dim=dim)]


def _all_reduce(tensors: Sequence[torch.Tensor], dim: int) -> list[torch.Tensor]:
    total = _summed(tensors)
    return [total.clone() for _ in tensors]


def _all_to_all(tensors: Sequence[torch.Tensor], dim: int) -> list[torch.Tensor]:
    ranks = len(tensors)
    if any(t.shape[0] % ranks for t in tensors):
        raise CollectiveError(f"all_to_all of a dim 0 that {ranks} ranks do not divide")
    parts = [t.chunk(ranks, dim=0) for t in tensors]
    return [torch.cat([parts[src][dst] for src in range(ranks)], dim=0) for dst in range(ranks)]


_COLLECTIVES: dict[str, Callable[[Sequence[torch.Tensor], int], list[torch.Tensor]]] = {
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_reduce": _all_reduce,
    "all_to_all": _all_to_all,
}


class _Meeting:
    """What the ranks of one group share: the lock, and the calls made so far."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.turn = threading.Condition()
        self.calls: list[_Call] = []
        self.finished: set[int] = set()  # ranks whose merge returned or raised

    def meet(self, rank: int, index: int, name: str, dim: int, tensor: torch.Tensor):
        """Rank ``rank``'s ``index``-th collective call; waits for the others."""
        if index == len(self.calls):
            self.calls.append(_Call((name, dim)))
        call = self.calls[index]
        if call.what != (name, dim):
            raise CollectiveError(
                f"collective #{index}: rank {rank} called {name}(dim={dim}) where "
                f"rank {min(call.tensors)} called {call.what[0]}(dim={call.what[1]})"
            )
        call.tensors[rank] = tensor
        if len(call.tensors) == self.world_size:
            ordered = [call.tensors[r] for r in range(self.world_size)]
            try:
                call.results = _COLLECTIVES[name](ordered, dim)
            except (RuntimeError, ValueError) as error:  # shapes or dtypes that differ
                shapes = ", ".join(dict.fromkeys(f"{tuple(t.shape)} {t.dtype}" for t in ordered))
                call.error = CollectiveError(
                    f"collective #{index} ({name}, dim {dim}) of tensors {shapes}: "
                    f"{str(error).splitlines()[0]}"
                )
            self.turn.notify_all()
        while call.results is None:
            if call.error is not None:
                raise call.error
            absent = self.finished - set(call.tensors)
            if absent:
                raise CollectiveError(
                    f"collective #{index} ({name}): rank {min(absent)} finished without joining it"
                )
            self.turn.wait()
        return call.results[rank]


class SimulatedGroup:
    """One rank's view of the group (``contract.Group``)."""

    def __init__(self, meeting: _Meeting, rank: int) -> None:  # one of ``run_ranks``
        self._meeting = meeting
        self._calls = 0
        self.world_size = meeting.world_size
        self.rank_in_group = rank

    def _meet(self, name: str, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        index, self._calls = self._calls, self._calls + 1
        dim = dim % tensor.dim() if tensor.dim() else 0
        return self._meeting.meet(self.rank_in_group, index, name, dim, tensor)

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return self._meet("all_gather", tensor, dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return self._meet("reduce_scatter", tensor, dim)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._meet("all_reduce", tensor, 0)

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._meet("all_to_all", tensor, 0)

    @property
    def device_group(self) -> SimulatedGroup:
        """What ``torch.distributed`` calls are given as their group (``TorchDistributed``)."""
        return self


class _Done:
    """The handle of a collective that has completed (they all complete before returning)."""

    def wait(self) -> None:
        """Nothing left to wait for."""


class TorchDistributed:
    """The ``torch.distributed`` calls a merge makes on its group's ``device_group``, over
    the group the case runs in (simulated or real): ``all_to_all_single`` with equal
    splits (what vLLM's all-to-all merges call). Any other call raises ``AttributeError``,
    naming it."""

    @staticmethod
    def all_to_all_single(
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: object = None,
        input_split_sizes: object = None,
        group: SimulatedGroup | TorchGroup | None = None,
        async_op: bool = False,
    ) -> _Done | None:
        """Slice ``r`` of dim 0 of every rank's ``input`` to rank ``r``'s ``output``."""
        if group is None or output_split_sizes is not None or input_split_sizes is not None:
            raise CollectiveError("all_to_all_single: the simulated group takes equal splits only")
        output.copy_(group.all_to_all(input))
        return _Done() if async_op else None


class TorchGroup:
    """``contract.Group`` over torch.distributed's default process group: one process per
    rank (``real_ranks``), its collectives those of the transport (gloo on the CPU, NCCL
    on GPUs), summed in the transport's own order."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        moved = tensor.movedim(dim, 0).contiguous()
        if moved.shape[0] % self.world_size:
            raise CollectiveError(
                f"reduce_scatter of dim {dim} of size {moved.shape[0]} over {self.world_size} ranks"
            )
        out = moved.new_empty((moved.shape[0] // self.world_size, *moved.shape[1:]))
        # torch 2.13 renamed it reduce_scatter_single and deprecated the old name; 2.11 has
        # only the old one
        scatter = getattr(self._dist, "reduce_scatter_single", None)
        (scatter or self._dist.reduce_scatter_tensor)(out, moved)
        return out.movedim(0, dim).contiguous()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        self._dist.all_reduce(total)
        return total

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(tensor)
        self._dist.all_to_all_single(out, tensor.contiguous())
        return out

    @property
    def device_group(self) -> TorchGroup:
        """What ``torch.distributed`` calls are given as their group (``TorchDistributed``)."""
        return self


def run_ranks(world_size: int, work: Callable[[SimulatedGroup], T]) -> list[T]:
    """``work(group)`` on every rank of a simulated group of ``world_size`` (module
    docstring): what each rank returned, in rank order. The first rank that raised
    (dcpcheck's own ``CollectiveError`` after the others') raises here."""
    meeting = _Meeting(world_size)
    results: list[Any] = [None] * world_size
    errors: dict[int, BaseException] = {}

    def rank_thread(rank: int) -> None:
        with meeting.turn:
            try:
                results[rank] = work(SimulatedGroup(meeting, rank))
            except BaseException as error:  # re-raised in the caller's thread
                errors[rank] = error
            finally:
                meeting.finished.add(rank)
                meeting.turn.notify_all()

    threads = [threading.Thread(target=rank_thread, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = [e for e in errors.values() if not isinstance(e, CollectiveError)]
        raise (first or list(errors.values()))[0]
    return results
