"""The memory a run may hold, and the one-line refusal of a scenario that would hold more.

Every op estimates, before anything is allocated, what a run of one of its scenarios at
the DCP sizes it will run at holds at its peak (``dcpcheck.ops.<op>.cost``), by what holds
the bytes. What they share is here: the budget (:func:`available_memory`: the device's
free memory, or the RAM the system has available), how a refusal reads (:func:`refusal`,
naming the estimate, the part that holds the most and the budget), and which scenario key
drives the size (:func:`driving_key`: the key whose cheapest value would shrink the
estimate the most), so that a refusal is one line naming the file and that key, whatever
the op. An op package whose cases run one DCP size after another describes a run's size as
a :class:`RunShape`, and :func:`scenario_check` makes its ``check_cost`` of it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from dcpcheck.cases.scenario_files import ScenarioError, where_of

MIB = 1 << 20
GIB = 1 << 30

MEMINFO = Path("/proc/meminfo")
"""Where Linux says how much RAM is available (``MemAvailable``, in KiB)."""

Shape = TypeVar("Shape")


@dataclass(frozen=True)
class Peak:
    """Bytes a case holds at its peak, by what holds them: each part's description (as a
    refusal names it) and its bytes."""

    parts: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def largest(self) -> tuple[str, int]:
        """The part that holds the most bytes, and how many."""
        return max(self.parts.items(), key=lambda part: part[1])


class RunShape(Protocol):
    """What sizes a run of an op's scenario: a dataclass of the numbers that size it
    (free to be changed one at a time by :func:`driving_key`), the DCP sizes it runs at,
    the peak of its case at each, and each scenario key that may drive the size with the
    fields at its cheapest value."""

    dcp_sizes: tuple[int, ...]

    def case(self, dcp_size: int) -> Peak: ...

    def cheapest(self) -> Mapping[str, Mapping[str, Any]]: ...


def run_peak(shape: RunShape) -> Peak:
    """The peak of a run whose cases run one DCP size after another, nothing of one kept
    for the next (``op_cases.run_scenario``): the largest case's."""
    return max((shape.case(n) for n in shape.dcp_sizes), key=lambda peak: peak.total)


def available_memory(device: torch.device) -> int | None:
    """The memory budget of a run on ``device``, in bytes: CUDA's free memory on a GPU;
    otherwise the RAM the system could give without swapping (``MemAvailable``), else the
    free physical pages (``os.sysconf``); ``None`` where the platform says neither."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:  # no /proc (macOS): ask sysconf
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # a name this platform does not define
        return None


def format_bytes(count: int) -> str:
    """``count`` bytes for a person: GiB from 1 GiB up, else MiB, one decimal."""
    return f"{count / GIB:.1f} GiB" if count >= GIB else f"{count / MIB:.1f} MiB"


def refusal(
    total: int, largest: tuple[str, int], dcp_sizes: Iterable[int], budget: int | None
) -> str | None:
    """Why a run at ``dcp_sizes`` that would hold ``total`` bytes at its peak (``largest``:
    the part that holds the most, and its bytes) cannot start with ``budget`` bytes, or
    None when it fits (or no budget is known)."""
    if budget is None or total <= budget:
        return None
    sizes = ", ".join(str(n) for n in sorted(set(dcp_sizes)))
    what, held = largest
    return (
        f"a run at DCP {sizes} would hold about {format_bytes(total)} at its peak "
        f"({format_bytes(held)} of it {what}), over the memory budget of {format_bytes(budget)}"
    )


def driving_key(
    total_of: Callable[[Shape], int], shape: Shape, cheapest: Mapping[str, Mapping[str, Any]]
) -> str:
    """The key of ``cheapest`` (a scenario key, and the fields of the dataclass ``shape``
    at that key's cheapest value) whose cheapest value would shrink ``total_of(shape)``
    the most; the earlier on a tie."""
    return min(cheapest, key=lambda key: total_of(dataclasses.replace(shape, **cheapest[key])))


def checked(
    peak: Peak, dcp_sizes: Iterable[int], budget: int | None, where: str, key: Callable[[], str]
) -> Peak:
    """``peak``, the estimate of a run at ``dcp_sizes`` of the scenario ``where`` names,
    when it fits ``budget``; else a one-line ``ScenarioError`` naming the scenario, the
    key that drives the size (``key()``, asked only then), the estimate and the budget."""
    problem = refusal(peak.total, peak.largest(), dcp_sizes, budget)
    if problem is not None:
        raise ScenarioError(f"{where}: key '{key()}': {problem}")
    return peak


def check_run(shape: RunShape, where: str, budget: int | None) -> Peak:
    """:func:`checked` of a run of ``shape`` (:func:`run_peak`), the key that drives its
    size found among ``shape.cheapest()`` (:func:`driving_key`)."""
    return checked(
        run_peak(shape),
        shape.dcp_sizes,
        budget,
        where,
        lambda: driving_key(lambda changed: run_peak(changed).total, shape, shape.cheapest()),
    )


def scenario_check(
    shape_of: Callable[[Any, Sequence[int]], RunShape],
) -> Callable[[Any, Sequence[int], int | None], Peak]:
    """An op's ``check_cost(scenario, dcp_sizes, budget)`` (``dcpcheck.ops.OpPackage``)
    from how its scenario's batch at some DCP sizes is shaped (``shape_of``):
    :func:`check_run` of that shape, the scenario named by its file, else its name."""

    def check_cost(scenario: Any, dcp_sizes: Sequence[int], budget: int | None) -> Peak:
        where = where_of(scenario.source, scenario.name)
        return check_run(shape_of(scenario.batch, dcp_sizes), where, budget)

    return check_cost
