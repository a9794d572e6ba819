"""What an adapter is: a protocol kernel over a foreign callable, and the contract items
that callable's API cannot express (:class:`Limitation`).

Imports only the contract, so loading a kernel never pulls in the checks: the harness
applies limitations to its check results (dcpcheck.harness.limitations).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dcpcheck.contract import FusedOpCaches, FusedOpInputs, FusedOpOutputs, Kernel


class AdapterError(ValueError):
    """The callable does not fit the adapter asked for (a kernel load error)."""


@dataclass(frozen=True)
class Limitation:
    """A contract item an API cannot express, so the checks of it are skipped.

    ``field`` names what the findings of ``checks`` are about (``index_k_out``,
    ``index_cache``; it also covers sub-fields such as ``index_cache.values``), or is
    ``None`` when the whole check cannot apply.
    """

    checks: tuple[str, ...]
    field: str | None
    reason: str

    def covers(self, finding_field: str) -> bool:
        return self.field is not None and (
            finding_field == self.field or finding_field.startswith(f"{self.field}.")
        )


@runtime_checkable
class Adapter(Protocol):
    """A protocol kernel wrapping a foreign callable."""

    name: str

    def __call__(
        self, inputs: FusedOpInputs, outputs: FusedOpOutputs, caches: FusedOpCaches
    ) -> None: ...

    def limitations(self, inputs: FusedOpInputs) -> tuple[Limitation, ...]:
        """What the foreign API cannot express for a launch with these inputs."""
        ...


def kernel_not_applicable(kernel: Kernel, inputs: FusedOpInputs) -> str | None:
    """Why ``kernel`` cannot run a case with these inputs on this machine at all, or None.

    An adapter may say so with a ``not_applicable(inputs)`` method: a case the foreign
    kernel cannot even launch here (an instruction this GPU lacks, a format the file never
    names) is reported ``not_applicable`` with that reason, never run and never passed.
    Unlike a :class:`Limitation`, which skips checks of a case that runs, it covers the
    whole case."""
    ask = getattr(kernel, "not_applicable", None)
    return ask(inputs) if isinstance(kernel, Adapter) and callable(ask) else None


def kernel_limitations(kernel: Kernel, inputs: Iterable[FusedOpInputs]) -> tuple[Limitation, ...]:
    """Every limitation of ``kernel`` over the launches of one case (one entry per rank),
    without repeats; none for a kernel that is not an :class:`Adapter`."""
    if not isinstance(kernel, Adapter):
        return ()
    found: dict[Limitation, None] = {}
    for launch_inputs in inputs:
        found.update(dict.fromkeys(kernel.limitations(launch_inputs)))
    return tuple(found)
