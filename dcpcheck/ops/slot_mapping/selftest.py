"""The slot-mapping op's part of ``dcpcheck selftest``: the project's kernel passes every
shipped scenario of the op at every DCP size it names, and each mutant (``mutants``) fails
at least one, in a report of the same rows as the fused op's (``workflows.selftest``).

Named scenarios only: the op has no property search yet, so a mutant no shipped scenario
catches is reported missed, and fails the selftest.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dcpcheck.backend import Backend
from dcpcheck.ops.slot_mapping.contract import Routines
from dcpcheck.ops.slot_mapping.kernels import DESCRIPTIONS, KERNELS
from dcpcheck.ops.slot_mapping.runner import run_scenario
from dcpcheck.ops.slot_mapping.scenario import SlotMappingScenario, load_scenarios
from dcpcheck.workflows.selftest import SelftestReport, SelftestRow, Status

PROFILE = "named scenarios"


def _first_failure(
    kernel: Routines, name: str, scenarios: list[SlotMappingScenario], backend: Backend
):
    """The first failing case of ``kernel`` over ``scenarios``, or None."""
    for scenario in scenarios:
        for result in run_scenario(kernel, name, scenario, scenario.dcp_sizes, backend.device):
            if result.failed:
                return result
    return None


def _row(name: str, description: str, mutant: bool, scenarios, backend: Backend) -> SelftestRow:
    started = time.perf_counter()
    failure = _first_failure(KERNELS[name], name, scenarios, backend)
    seconds = time.perf_counter() - started
    if failure is None:
        status = Status.MISSED if mutant else Status.PASSED
        reason = "passed every shipped scenario of the op" if mutant else None
        return SelftestRow(name, description, status, seconds=seconds, reason=reason)
    case = f"{failure.scenario}[dcp{failure.dcp_size}]"
    if failure.status != "fail":
        check, field = failure.status, None
    else:
        [first, *_] = failure.failed_checks
        check, field = first.check, first.findings[0].field
    if not mutant:
        reason = f"{case}: {check} failed on the correct kernel"
        return SelftestRow(
            name, description, Status.FAILED, check, field, case, seconds=seconds, reason=reason
        )
    return SelftestRow(name, description, Status.CAUGHT, check, field, case, 0, seconds=seconds)


def run_selftest(
    backend: Backend, on_row: Callable[[SelftestRow], None] | None = None
) -> SelftestReport:
    """The op's selftest (module docstring)."""
    scenarios = load_scenarios([])
    start = time.perf_counter()
    default = _row("default", DESCRIPTIONS["default"], False, scenarios, backend)
    report = SelftestReport(PROFILE, backend.describe(), default)
    if on_row is not None:
        on_row(default)
    for name in KERNELS:
        if name == "default":
            continue
        row = _row(name, DESCRIPTIONS.get(name, ""), True, scenarios, backend)
        report.mutants.append(row)
        if on_row is not None:
            on_row(row)
    report.seconds = time.perf_counter() - start
    return report
