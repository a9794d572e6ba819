"""What every op package does the same way with its cases: turn one scenario at some DCP
sizes into ``CaseResult`` s, name the command that replays a case, save a failing case or a
shrunk search failure as a scenario file of the op, run a property search, and run the
op's selftest. An op gives its own parts: how it judges one case, its scenario type and
TOML writer, its strategy and its kernels.

Within a case, an exception of the kernel's is that case's ``error`` (``raising`` turns
it into a ``KernelError``) and the run goes on; one of dcpcheck's own (building the case,
checking it) is not caught here.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dcpcheck import device_faults
from dcpcheck.backend import Backend
from dcpcheck.cases.scenario_files import NamedBatch
from dcpcheck.cases.seeded_draws import seed_alone
from dcpcheck.cases.verdicts import (
    CaseResult,
    CheckResult,
    KernelError,
    SelftestReport,
    SelftestRow,
    Status,
)
from dcpcheck.files import FAILURES_DIR, kernel_slug, save_failure

if TYPE_CHECKING:
    from hypothesis import strategies as st

DEFAULT_SEED = 0
"""The property search's seed when none is given."""


@dataclass(frozen=True)
class OpCases:
    """An op's parts the functions here need: its name, its shipped scenarios' folder, how
    a scenario is written back as TOML, and how one case is judged
    (``judge(kernel, batch, dcp_size, device) -> checks``)."""

    op: str
    scenarios: Path
    to_toml: Callable[[Any], str]
    judge: Callable[[Any, Any, int, torch.device], list[CheckResult]]


def replay_command(op: OpCases, scenario: NamedBatch, dcp_size: int, kernel_name: str) -> str:
    """The command that runs this one case again: a shipped scenario by name, any other by
    its file."""
    kernel = f" --kernel {shlex.quote(kernel_name)}" if kernel_name != "default" else ""
    source = scenario.source
    if source is not None and source.resolve().parent != op.scenarios.resolve():
        return f"dcpcheck repro {shlex.quote(str(source))} --dcp {dcp_size}{kernel}"
    return f"dcpcheck run --op {op.op} --scenario {scenario.name} --dcp {dcp_size}{kernel}"


def save_failed_case(
    op: OpCases, scenario: NamedBatch, result: CaseResult, kernel_name: str, home: Path
) -> Path:
    """A failing case as a scenario file of the op under ``home/failures/``, at the DCP
    size it failed at, which ``dcpcheck repro`` replays."""
    case = dataclasses.replace(scenario, dcp_sizes=(result.dcp_size,))
    stem = f"{scenario.name}-{kernel_slug(kernel_name)}-dcp{result.dcp_size}"
    failed = ", ".join(c.check for c in result.failed_checks) or result.status
    description = (
        f"Saved by dcpcheck: kernel {kernel_name} fails {op.op} scenario "
        f"{scenario.name} at DCP{result.dcp_size}: {failed}. Replay: dcpcheck repro "
        f"<this file> --kernel {kernel_name}"
    )
    return save_failure(case, stem, description, home / FAILURES_DIR, op.to_toml)


def not_applicable(routine: object, asked: Sequence[object]) -> str | None:
    """Why ``routine`` cannot be asked this case at all (an adapter's ``not_applicable``
    of any of ``asked``: its API cannot say it, and its caller never asks it), or None.
    Its checks are then skipped with the reason: never launched, never a pass."""
    ask = getattr(routine, "not_applicable", None)
    if ask is None:
        return None
    reasons = [ask(inputs) for inputs in asked]
    return next((reason for reason in reasons if reason is not None), None)


def raising(routine: Callable[..., Any]) -> Callable[..., Any]:
    """``routine`` with whatever it raises as a ``KernelError`` of one line, so that only
    the kernel's own exceptions become a case's ``error`` (module docstring)."""

    def launch(*args: Any) -> Any:
        try:
            return routine(*args)
        except Exception as exc:  # the kernel under test raised
            raise KernelError(f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc

    return launch


def with_skips(results: Sequence[CheckResult], routine: object) -> list[CheckResult]:
    """``results`` with the checks ``routine`` declares do not apply to it (an adapter's
    ``skips``: check -> reason) reported skipped, never passed."""
    limits: dict[str, str] = getattr(routine, "skips", {})
    return [
        CheckResult(r.check, skipped=limits[r.check]) if r.check in limits else r for r in results
    ]


def merged(by_way: Sequence[tuple[str, Sequence[CheckResult]]]) -> list[CheckResult]:
    """One result per check of routines judged on one case, each way (a release's every
    routine of a kind, each way its callers ask one: ``label`` -> its results, every way's
    in the same check order): skipped where every way skipped it, each reason led by its
    way's label, else the findings of every way that ran it, each detail led so."""
    if len(by_way) == 1:
        return list(by_way[0][1])
    labels = [label for label, _ in by_way]
    results = []
    for same_check in zip(*(checks for _, checks in by_way), strict=True):
        ran = [(label, r) for label, r in zip(labels, same_check, strict=True) if r.skipped is None]
        name = same_check[0].check
        if not ran:
            reasons = dict.fromkeys(
                f"{label}: {r.skipped}" if label else r.skipped or ""
                for label, r in zip(labels, same_check, strict=True)
            )
            results.append(CheckResult(name, skipped="; ".join(reasons)))
            continue
        findings = tuple(
            dataclasses.replace(f, detail=f"{label}: {f.detail}" if label else f.detail)
            for label, r in ran
            for f in r.findings
        )
        results.append(CheckResult(name, findings))
    return results


def named_routines(routine: object) -> tuple[tuple[str, Callable[..., Any]], ...]:
    """``routine``'s routines by name (its ``routines``: a release's every routine of a
    kind, as ``slot_mapping.contract.EachRoutine`` holds them), or ``routine`` alone,
    unnamed."""
    return getattr(routine, "routines", (("", routine),))


def ways(routine: object) -> list[tuple[str, Callable[..., Any], object]]:
    """Each way a case launches ``routine``: ``(label, what is launched, the routine it
    is of)`` for every routine it holds (its ``routines``: ``(name, routine)`` pairs, a
    release's every routine of a kind), labelled by the routine's name, and every way its
    callers ask each one (its ``asks``: ``(way, what is launched)``), labelled by the way."""
    found = []
    for name, member in named_routines(routine):
        for way, ask in getattr(member, "asks", (("", member),)):
            found.append((", ".join(part for part in (name, way) if part), ask, member))
    return found


def judged_each_way(
    routine: object,
    asked: Sequence[object],
    judge: Callable[[Callable[..., Any]], Sequence[CheckResult]],
    skipped: Callable[[str], Sequence[CheckResult]],
) -> list[CheckResult]:
    """``routine``'s checks on one case (``asked``: its inputs, one per rank), each way it
    is launched (:func:`ways`) judged, or skipped with the reason it cannot be asked,
    merged into one result per check (:func:`merged`)."""
    by_way = []
    for label, ask, member in ways(routine):
        reason = not_applicable(ask, asked)
        if reason:
            by_way.append((label, tuple(skipped(reason))))
            continue
        noted = with_caller_notes(judge(raising(ask)), ask, asked)
        by_way.append((label, tuple(with_skips(noted, member))))
    return merged(by_way)


def with_caller_notes(
    results: Sequence[CheckResult], routine: object, asked: Sequence[object]
) -> list[CheckResult]:
    """``results`` with every finding of a failing check saying how ``routine``'s caller
    asks it this case other than as the case gives it (an adapter's ``as_called`` of any
    of ``asked``, with the caller's lines), so that the failure names what makes it."""
    say = getattr(routine, "as_called", None)
    notes = [say(inputs) for inputs in asked] if say is not None else []
    note = next((n for n in notes if n is not None), None)
    if note is None:
        return list(results)
    return [
        dataclasses.replace(
            r,
            findings=tuple(
                dataclasses.replace(f, detail=f"{f.detail}; {note}") for f in r.findings
            ),
        )
        for r in results
    ]


def run_scenario(
    op: OpCases,
    kernel: Any,
    kernel_name: str,
    scenario: NamedBatch,
    dcp_sizes: Sequence[int],
    device: torch.device,
) -> list[CaseResult]:
    """One ``CaseResult`` per DCP size of ``dcp_sizes``: ``pass`` or ``fail`` by the checks
    run, ``not_applicable`` when no check could run (the reasons are the skipped
    checks'), ``error`` when the kernel raised."""
    results = []
    for size in dcp_sizes:
        replay = replay_command(op, scenario, size, kernel_name)
        started = time.perf_counter()
        try:
            checks = op.judge(kernel, scenario.batch, size, device)
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


@dataclass(frozen=True)
class SearchOutcome:
    """What a search did: examples run (shrinking included), how many of them the kernel
    could not be asked (``not_applicable``: never a pass), the first that failed, and the
    shrunk failure (None when no example failed)."""

    examples_run: int
    not_applicable: int = 0
    first_failure: int | None = None
    failure: Any = None  # the op's scenario
    result: CaseResult | None = None  # the shrunk failure's case

    @property
    def passed(self) -> bool:
        return self.failure is None


def search(
    op: OpCases,
    kernel: Any,
    kernel_name: str,
    drawn: st.SearchStrategy,
    examples: int,
    device: torch.device,
    seed: int | None,
) -> SearchOutcome:
    """Run ``examples`` (batch, DCP size) pairs drawn from ``drawn`` through every check of
    ``op`` on ``kernel``, each as a scenario of the op at that one size; the smallest
    failing scenario, when any fails, as Hypothesis shrinks it."""
    # Imported here: only a search needs Hypothesis, and a run of named scenarios does not
    # pay its import.
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    ran = skipped = 0
    failing: list[tuple[int, NamedBatch, CaseResult]] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(drawn)
    @device_faults.unshrunk
    def property_holds(pair: tuple[Any, int]) -> None:
        nonlocal ran, skipped
        ran += 1
        batch, size = pair
        scenario = NamedBatch("drawn", "a batch drawn by the property search", batch, (size,))
        [result] = run_scenario(op, kernel, kernel_name, scenario, (size,), device)
        skipped += result.status == "not_applicable"
        if result.failed:
            failing.append((ran, scenario, result))
            raise AssertionError(result.status)

    try:
        with seed_alone(), device_faults.raised_as_itself():
            hypothesis_seed(DEFAULT_SEED if seed is None else seed)(property_holds)()
    except AssertionError:
        _, scenario, result = failing[-1]  # Hypothesis replays the shrunk failure last
        return SearchOutcome(ran, skipped, failing[0][0], scenario, result)
    return SearchOutcome(ran, skipped)


def save_search(op: OpCases, outcome: SearchOutcome, kernel_name: str, home: Path) -> Path | None:
    """The shrunk failure saved under ``home/failures/`` (None when the search passed)."""
    if outcome.failure is None or outcome.result is None:
        return None
    failed = ", ".join(c.check for c in outcome.result.failed_checks) or outcome.result.status
    description = (
        f"Shrunk by dcpcheck's property search: kernel {kernel_name} fails {failed}. "
        f"Replay: dcpcheck repro <this file> --kernel {kernel_name}"
    )
    stem = f"shrunk-{op.op}-{kernel_slug(kernel_name)}"
    return save_failure(outcome.failure, stem, description, home / FAILURES_DIR, op.to_toml)


def _selftest_row(
    op: OpCases,
    kernel: Any,
    name: str,
    description: str,
    mutant: bool,
    scenarios: Sequence[NamedBatch],
    backend: Backend,
) -> SelftestRow:
    """The selftest's row of one kernel: the first failing case over ``scenarios``."""
    started = time.perf_counter()
    failure = None
    for scenario in scenarios:
        results = run_scenario(op, kernel, name, scenario, scenario.dcp_sizes, backend.device)
        failure = next((result for result in results if result.failed), None)
        if failure is not None:
            break
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


SELFTEST_PROFILE = "named scenarios"


def selftest(
    op: OpCases,
    kernels: dict[str, Any],
    descriptions: dict[str, str],
    scenarios: Sequence[NamedBatch],
    backend: Backend,
    on_row: Callable[[SelftestRow], None] | None = None,
) -> SelftestReport:
    """An op's part of ``dcpcheck selftest``: its ``default`` kernel passes every one of
    ``scenarios`` at every DCP size each names, and every other kernel of ``kernels`` (its
    mutants) fails at least one. Named scenarios only: a mutant no shipped scenario
    catches is reported missed, and fails the selftest."""
    start = time.perf_counter()
    default = _selftest_row(
        op, kernels["default"], "default", descriptions["default"], False, scenarios, backend
    )
    report = SelftestReport(SELFTEST_PROFILE, backend.describe(), default)
    if on_row is not None:
        on_row(default)
    for name, kernel in kernels.items():
        if name == "default":
            continue
        description = descriptions.get(name, "")
        row = _selftest_row(op, kernel, name, description, True, scenarios, backend)
        report.mutants.append(row)
        if on_row is not None:
            on_row(row)
    report.seconds = time.perf_counter() - start
    return report
