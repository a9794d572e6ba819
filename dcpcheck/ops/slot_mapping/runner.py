"""The slot-mapping op's cases, one per scenario and DCP size, as ``CaseResult`` s: the
run's data model the reports and the console already speak.

A case builds every rank's inputs, launches each routine of the kernel (``Routines``: the
slot mappings, the local sequence lengths) on each rank, then runs that routine's checks;
a routine that is absent, or cannot be asked the case, has its checks skipped with the
reason. An exception of the kernel's is that case's ``error``, and the run goes on; one of
dcpcheck's own (building the case, checking it) is not caught here.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dcpcheck.cases.verdicts import CaseResult, CheckResult, KernelError
from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops.slot_mapping import checks as checks_of_slots
from dcpcheck.ops.slot_mapping import seq_lens
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch, build_case
from dcpcheck.ops.slot_mapping.contract import Routines
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


def not_applicable(routine: object, ranks: Sequence[object]) -> str | None:
    """Why ``routine`` cannot be asked this case at all (an adapter's ``not_applicable``
    of any rank's inputs: its API cannot say it, and its caller never asks it), or None.
    Its checks are then skipped with the reason: never launched, never a pass."""
    ask = getattr(routine, "not_applicable", None)
    if ask is None:
        return None
    reasons = [ask(inputs) for inputs in ranks]
    return next((reason for reason in reasons if reason is not None), None)


def _raising(routine: Callable[[Any, torch.Tensor], None]) -> Callable[[Any, torch.Tensor], None]:
    """``routine`` with whatever it raises as a ``KernelError`` of one line, so that only
    the kernel's own exceptions become a case's ``error`` (module docstring)."""

    def launch(inputs: Any, out: torch.Tensor) -> None:
        try:
            routine(inputs, out)
        except Exception as exc:  # the kernel under test raised
            raise KernelError(f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc

    return launch


def _judged(kernel: Routines, batch: SlotMappingBatch, size: int, device) -> list[CheckResult]:
    """Every check of the op on one case: each routine launched on every rank and judged,
    or its checks skipped with the reason it is absent or cannot be asked. A routine
    that raises propagates (the case's error)."""
    slot_case = build_case(batch, size, device)
    reason = kernel.absent if kernel.slot_mappings is None else None
    reason = reason or not_applicable(kernel.slot_mappings, slot_case.ranks)
    if reason:
        checks = list(checks_of_slots.skipped(reason))
    else:
        assert kernel.slot_mappings is not None
        judged = checks_of_slots.judge(_raising(kernel.slot_mappings), slot_case)
        checks = _with_skips(judged, kernel.slot_mappings)
    lengths_case = seq_lens.build_case(batch, size, device)
    reason = kernel.absent if kernel.local_seq_lens is None else None
    reason = reason or not_applicable(kernel.local_seq_lens, lengths_case.ranks)
    if reason:
        return checks + list(seq_lens.skipped(reason))
    assert kernel.local_seq_lens is not None
    judged = seq_lens.judge(_raising(kernel.local_seq_lens), lengths_case)
    return checks + _with_skips(judged, kernel.local_seq_lens)


def _with_skips(results: Sequence[CheckResult], routine: object) -> list[CheckResult]:
    """``results`` with the checks ``routine`` declares do not apply to it (an adapter's
    ``skips``: check -> reason) reported skipped, never passed."""
    limits: dict[str, str] = getattr(routine, "skips", {})
    return [
        CheckResult(r.check, skipped=limits[r.check]) if r.check in limits else r for r in results
    ]


def run_scenario(
    kernel: Routines,
    kernel_name: str,
    scenario: SlotMappingScenario,
    dcp_sizes: Sequence[int],
    device: torch.device,
) -> list[CaseResult]:
    """One ``CaseResult`` per DCP size of ``dcp_sizes`` (module docstring): ``pass`` or
    ``fail`` by the checks run, ``not_applicable`` when no check could run (the reasons
    are the skipped checks'), ``error`` when a routine raised."""
    results = []
    for size in dcp_sizes:
        replay = replay_command(scenario, size, kernel_name)
        started = time.perf_counter()
        try:
            checks = _judged(kernel, scenario.batch, size, device)
        except KernelError as exc:  # the kernel under test raised: its case's verdict
            results.append(CaseResult(scenario.name, size, "error", error=str(exc), replay=replay))
            continue
        seconds = time.perf_counter() - started
        if all(check.skipped for check in checks):
            reasons = "; ".join(dict.fromkeys(check.skipped or "" for check in checks))
            results.append(
                CaseResult(scenario.name, size, "not_applicable", error=reasons, replay=replay)
            )
            continue
        status = "fail" if any(check.findings for check in checks) else "pass"
        results.append(
            CaseResult(scenario.name, size, status, checks, replay=replay, seconds=seconds)
        )
    return results
