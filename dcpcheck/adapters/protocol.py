"""What every op's adapters share: the contract items a foreign callable's API cannot
express (:class:`Limitation`), and the error of a callable that fits no adapter.

It imports nothing of dcpcheck, so loading a kernel never pulls in the checks: each op's
runner applies the limitations to its check results.
"""

from __future__ import annotations

from dataclasses import dataclass


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
