"""What every op's checks do the same way: a finding over the rows a check found bad, a
copy of each rank's input tensors before a launch and a finding for every input the launch
modified (a kernel must leave its inputs as they were, the ``guard`` check), and every
check of the op skipped at once for one reason; and, for an op whose checks look at a case
its kernel was launched on, how a case is judged: its inputs copied, the kernel launched on
every rank, every check run. An op gives its own parts: the names of its checks and input
tensors, its launch and its checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

import torch

from dcpcheck.cases.verdicts import CheckResult, Finding

Inputs = TypeVar("Inputs")
"""One rank's inputs of an op: a dataclass whose named fields are tensors."""

Kernel = TypeVar("Kernel")
"""An op's kernel, as its launch takes it."""


class RankedCase(Protocol):
    """What :class:`LaunchChecks` reads of an op's case: every rank's inputs."""

    @property
    def ranks(self) -> Sequence[Any]: ...


Case = TypeVar("Case", bound=RankedCase)


def rows_finding(field: str, rank: int | None, rows: list[int], detail: str) -> Finding:
    """A finding in ``field`` over the batch rows ``rows`` (sorted; the first is the one
    named), ``detail`` filled in with their ``count`` and the ``first`` of them."""
    return Finding(
        field=field,
        rank=rank,
        detail=detail.format(count=len(rows), first=rows[0]),
        token=rows[0],
        count=len(rows),
        tokens=tuple(rows),
    )


def snapshot(ranks: Sequence[Inputs], names: Sequence[str]) -> tuple[Inputs, ...]:
    """Copies of every rank's input tensors ``names``, taken before a launch: what
    ``modified_inputs`` compares the inputs with after it."""
    return tuple(
        replace(inputs, **{name: getattr(inputs, name).clone() for name in names})
        for inputs in ranks
    )


def modified_inputs(rank: int, inputs: Any, kept: Any, names: Sequence[str]) -> list[Finding]:
    """A finding for each input tensor of ``names`` that ``rank``'s launch changed
    (``kept``: its copy from ``snapshot``)."""
    return [
        Finding(field=name, rank=rank, detail="an input was modified")
        for name in names
        if not torch.equal(getattr(inputs, name).cpu(), getattr(kept, name).cpu())
    ]


def skipped(checks: Sequence[str], reason: str) -> tuple[CheckResult, ...]:
    """Every check of ``checks`` skipped for ``reason`` (reported, never passed)."""
    return tuple(CheckResult(check, skipped=reason) for check in checks)


@dataclass(frozen=True)
class LaunchChecks(Generic[Kernel, Case]):
    """An op's checks of a launched case: the names of its checks (in the order reports
    list them) and of each rank's input tensors, how its kernel is launched on every rank
    of a case (``launch(kernel, case) -> launched case``) and every check run on a launched
    case (``check_launched(case, before) -> results``, ``before``: the inputs' copies)."""

    checks: tuple[str, ...]
    input_tensors: tuple[str, ...]
    launch: Callable[[Kernel, Case], Case]
    check_launched: Callable[[Case, tuple[Any, ...]], tuple[CheckResult, ...]]

    def snapshot(self, case: Case) -> tuple[Any, ...]:
        """Copies of every rank's input tensors, taken before a launch (the guard check)."""
        return snapshot(case.ranks, self.input_tensors)

    def judge(self, kernel: Kernel, case: Case) -> tuple[CheckResult, ...]:
        """Launch ``kernel`` on every rank of ``case`` and run every check of the op."""
        before = self.snapshot(case)
        return self.check_launched(self.launch(kernel, case), before)

    def skipped(self, reason: str) -> tuple[CheckResult, ...]:
        """Every check of the op, skipped for ``reason`` (reported, never passed)."""
        return skipped(self.checks, reason)
