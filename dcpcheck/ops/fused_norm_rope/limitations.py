"""Checks an adapter's API cannot express, reported as skipped with the reason.

An adapter declares :class:`~dcpcheck.adapters.protocol.Limitation` s; this turns them
into skipped check results, so a check the kernel could not have been asked to pass is
never counted as passed. A plain protocol kernel has none, so this is a no-op for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dcpcheck.adapters.protocol import Limitation
from dcpcheck.cases.verdicts import CheckResult


def apply_limitations(
    results: Sequence[CheckResult], limitations: Sequence[Limitation]
) -> list[CheckResult]:
    """``results`` with what ``limitations`` rule out reported as skipped.

    A whole-check limitation replaces the check by a skipped one. A field limitation
    drops that field's findings from the check and adds ``check[field]``, skipped with
    the reason, so the report shows both what was checked and what could not be.
    A check already skipped for its own reason stays as it is.
    """
    adjusted: list[CheckResult] = []
    for result in results:
        relevant = [lim for lim in limitations if result.check in lim.checks]
        if not relevant or result.skipped is not None:
            adjusted.append(result)
            continue
        whole = next((lim for lim in relevant if lim.field is None), None)
        if whole is not None:
            adjusted.append(replace(result, findings=(), skipped=whole.reason))
            continue
        kept = tuple(f for f in result.findings if not any(lim.covers(f.field) for lim in relevant))
        adjusted.append(replace(result, findings=kept))  # keeps its without_oracle note
        adjusted += [
            CheckResult(f"{result.check}[{lim.field}]", skipped=lim.reason) for lim in relevant
        ]
    return adjusted
