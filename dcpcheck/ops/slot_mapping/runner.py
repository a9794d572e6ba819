"""The slot-mapping op's cases, one per scenario and DCP size, as ``CaseResult`` s: the
run's data model the reports and the console already speak.

A case builds every rank's inputs, launches the kernel on each, then runs the op's
checks. An exception of the kernel's is that case's ``error``, and the run goes on; one of
dcpcheck's own (building the case, checking it) is not caught here.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from dcpcheck.harness.runner import CaseResult
from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops.slot_mapping.case import SlotMappingCase, build_case, launch_all
from dcpcheck.ops.slot_mapping.checks import check_launched, snapshot
from dcpcheck.ops.slot_mapping.contract import SlotMappingKernel
from dcpcheck.ops.slot_mapping.scenario import SCENARIOS, SlotMappingScenario, scenario_to_toml
from dcpcheck.workflows.search import FAILURES_DIR, kernel_slug, save_failure


def replay_command(scenario: SlotMappingScenario, dcp_size: int, kernel_name: str) -> str:
    """The command that runs this one case again: a shipped scenario by name, any other by
    its file."""
    kernel = f" --kernel {shlex.quote(kernel_name)}" if kernel_name != "default" else ""
    source = scenario.source
    if source is not None and source.resolve().parent != SCENARIOS.resolve():
        return f"dcpcheck repro {shlex.quote(str(source))} --dcp {dcp_size}{kernel}"
    return f"dcpcheck run --op {SLOT_MAPPING} --scenario {scenario.name} --dcp {dcp_size}{kernel}"


def save_failed_case(
    scenario: SlotMappingScenario, result: CaseResult, kernel_name: str, home: Path
) -> Path:
    """A failing case as a scenario file of the op under ``home/failures/``, at the DCP
    size it failed at, which ``dcpcheck repro`` replays."""
    case = dataclasses.replace(scenario, dcp_sizes=(result.dcp_size,))
    stem = f"{scenario.name}-{kernel_slug(kernel_name)}-dcp{result.dcp_size}"
    failed = ", ".join(c.check for c in result.failed_checks) or result.status
    description = (
        f"Saved by dcpcheck: kernel {kernel_name} fails {SLOT_MAPPING} scenario "
        f"{scenario.name} at DCP{result.dcp_size}: {failed}. Replay: dcpcheck repro "
        f"<this file> --kernel {kernel_name}"
    )
    return save_failure(case, stem, description, home / FAILURES_DIR, scenario_to_toml)


def not_applicable(kernel: SlotMappingKernel, case: SlotMappingCase) -> str | None:
    """Why ``kernel`` cannot be asked this case at all (an adapter's ``not_applicable``
    of any rank's inputs: its API cannot say it, and its caller never asks it), or None.
    Such a case is reported ``not_applicable`` with the reason: never launched, never a
    pass."""
    ask = getattr(kernel, "not_applicable", None)
    if ask is None:
        return None
    reasons = [ask(inputs) for inputs in case.ranks]
    return next((reason for reason in reasons if reason is not None), None)


def run_scenario(
    kernel: SlotMappingKernel,
    kernel_name: str,
    scenario: SlotMappingScenario,
    dcp_sizes: Sequence[int],
    device: torch.device,
) -> list[CaseResult]:
    """One ``CaseResult`` per DCP size of ``dcp_sizes`` (module docstring)."""
    results = []
    for size in dcp_sizes:
        replay = replay_command(scenario, size, kernel_name)
        started = time.perf_counter()
        case = build_case(scenario.batch, size, device)
        reason = not_applicable(kernel, case)
        if reason is not None:
            results.append(
                CaseResult(scenario.name, size, "not_applicable", error=reason, replay=replay)
            )
            continue
        before = snapshot(case)
        try:
            launched = launch_all(kernel, case)
        except Exception as exc:  # the kernel under test raised: its case's verdict
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            results.append(CaseResult(scenario.name, size, "error", error=error, replay=replay))
            continue
        checks = list(check_launched(launched, before))
        status = "fail" if any(not check.passed for check in checks) else "pass"
        seconds = time.perf_counter() - started
        results.append(
            CaseResult(scenario.name, size, status, checks, replay=replay, seconds=seconds)
        )
    return results
