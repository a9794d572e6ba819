"""A run's session: the library call behind ``dcpcheck run``, ``repro``, the real-rank
run and the pytest plugin, so that each saves, orders and reports cases the same way.

A :class:`Session` holds what one run shares (the kernel under test, its ``RunConfig``,
the backend, where failing cases are saved) and runs cases through the runner; it adds
what a single case does not know:

* A failing case is saved under ``HOME/failures/`` as a scenario file with its seed, DCP
  size and fp8_ds_mla tile-scale rule baked in (``dcpcheck repro FILE`` replays exactly
  it); a HOME that cannot be written costs one warning, never the run.
* :func:`run_session` orders a whole run: the named scenarios, then the token-stream case
  (unless asked not to, or ``--fail-fast`` already failed), then the property search. A
  Ctrl-C or SIGTERM anywhere ends it with what ran marked ``partial``; an internal error of
  dcpcheck itself ends it with an error record (:data:`INTERNAL_ERROR_CASE`), so a report
  of a run that broke never reads as a clean one. A device fault (a CUDA error: an illegal
  address, a device-side assert) ends it too, with a crash record of its own
  (:data:`DEVICE_FAULT_CASE`): a launch reports its fault only at a later synchronising
  call, often one of dcpcheck's checks, so the fault is the kernel's to answer for, not a
  bug of dcpcheck's, and the process's device can run nothing more.

The pytest plugin calls :meth:`Session.case` and :meth:`Session.token_streams` per item;
the CLI calls :func:`run_session`, then writes the reports (``output.report.write_reports``);
both get the same saving and the same verdicts.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcpcheck import files
from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.device_faults import device_fault
from dcpcheck.e2e.stream_case import token_stream_case
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_OK
from dcpcheck.ops import session_op
from dcpcheck.ops.session_cases import SearchAsked, SearchDone, SessionCases

INTERNAL_ERROR_CASE = "dcpcheck-internal-error"
"""The ``scenario`` of the error record a run that stopped on dcpcheck's own error gets:
status ``error`` (counted as failed), the exception and where it was raised."""

DEVICE_FAULT_CASE = "dcpcheck-device-fault"
"""The ``scenario`` of the record a run that stopped on a device fault gets: status
``crash`` (the kernel's, counted as failed), the CUDA error and where it surfaced."""

KERNEL_LOAD_CASE = "dcpcheck-kernel-load"
"""The ``scenario`` of the one record the reports of a run whose kernel never loaded hold
instead of its cases (:func:`kernel_load_record`)."""


def _ignore(*_: object) -> None:
    pass


@dataclass
class Session:
    """What one run shares; every case it runs goes through :meth:`cases`.

    ``home`` None: failing cases are not saved (a caller that saves nothing on purpose).
    ``on_warning`` hears the one warning a HOME that cannot be written costs.
    """

    kernel: Any  # the op's kernel, or a CaseRunner (``session_cases``)
    config: RunConfig
    backend: Backend
    home: Path | None = None
    on_warning: Callable[[str], None] = _ignore
    saved: dict[tuple[str, int], Path] = field(default_factory=dict)
    _saving: bool = field(default=True, init=False)  # until HOME turns out unwritable
    _op: SessionCases = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._op = session_op().session_cases()

    def cases(
        self,
        scenarios: Sequence[Any],
        on_result: Callable[[CaseResult], None] = _ignore,
        compile_ahead: bool = True,
    ) -> list[CaseResult]:
        """Every case of ``scenarios`` (the op's ``run``), each failing one saved as it
        lands; with ``compile_ahead``, their Triton binaries compiled ahead, on threads
        (``compile_ahead``)."""
        by_name = {scenario.name: scenario for scenario in scenarios}

        def landed(result: CaseResult) -> None:
            self._save_if_failed(by_name[result.scenario], result)
            on_result(result)

        if compile_ahead:
            self._op.compile_ahead(self.kernel, scenarios, self.config, self.backend)
        return self._op.run(self.kernel, scenarios, self.config, self.backend, landed)

    def case(self, scenario: Any, dcp_size: int) -> CaseResult:
        """One case of ``scenario`` at ``dcp_size`` (with its own DCP1 baseline), saved if
        it fails: a pytest item."""
        config = dataclasses.replace(self.config, dcp_sizes=(dcp_size,))
        (result,) = self._op.run_scenario(self.kernel, scenario, config, self.backend)
        self._save_if_failed(scenario, result)
        return result

    def token_streams(self) -> CaseResult:
        """The end-to-end token-stream case (its replay is ``dcpcheck hash``, nothing to save)."""
        return token_stream_case(self.kernel, self.config, self.backend)

    def search(
        self, config: SearchAsked, on_example: Callable[[int], None] = _ignore
    ) -> SearchDone:
        """The property search; it saves its own shrunk failure under its HOME."""
        return self._op.search(self.kernel, config, self.backend, on_example)

    def _save_if_failed(self, scenario: Any, result: CaseResult) -> None:
        if not result.failed or self.home is None or not self._saving:
            return
        try:
            path = save_failed_case(
                self._op.as_run(scenario, self.config, self.kernel),
                result,
                self.config,
                self.home,
            )
        except OSError as exc:
            self._saving = False
            self.on_warning(
                f"cannot save failing cases under {self.home}: {exc.strerror} (see --home)"
            )
        else:
            self.saved[(result.scenario, result.dcp_size)] = path


def failure_phrase(result: CaseResult) -> str:
    """What failed, as the property search words it; a crash or timeout by its reason."""
    phrases = session_op().session_cases().failure_summary([result])
    return phrases[0] if phrases else f"DCP{result.dcp_size}: {result.status} ({result.error})"


def save_failed_case(scenario: Any, result: CaseResult, config: RunConfig, home: Path) -> Path:
    """Save the failing case under ``home/failures/`` with the seed and DCP size it ran at,
    so ``dcpcheck repro FILE`` replays exactly it. ``scenario`` is the one that ran, every
    rule the run resolves written in (the op's ``as_run``: the fused op's fp8_ds_mla
    tile-scale rule), so the file names them. ``OSError`` if ``home`` cannot be written."""
    seed = scenario.seed if config.seed is None else config.seed
    case = dataclasses.replace(scenario, dcp_sizes=(result.dcp_size,), seed=seed)
    description = (
        f"Saved by dcpcheck: kernel {config.kernel_name} fails scenario "
        f"{scenario.name} at {failure_phrase(result)}. Replay: dcpcheck repro "
        f"<this file> --kernel {config.kernel_name}{config.oracle_flag}"
    )
    stem = f"{scenario.name}-{files.kernel_slug(config.kernel_name)}-dcp{result.dcp_size}"
    to_toml = session_op().scenario_to_toml
    return files.save_failure(case, stem, description, home / files.FAILURES_DIR, to_toml)


@dataclass(frozen=True)
class RunPlan:
    """What a whole run does, in order: named scenarios, token streams, property search."""

    scenarios: Sequence[Any]  # the op's scenarios
    token_streams: bool = True
    search: SearchAsked | None = None
    compile_ahead: bool = True  # False: every binary the cases launch is loaded already


@dataclass
class RunOutcome:
    """What a run did. ``partial``: it did not finish (``stopped`` or ``broken_off``)."""

    results: list[CaseResult]  # named cases, then the token-stream case
    searched: SearchDone | None = None
    named_seconds: float = 0.0
    stopped: KeyboardInterrupt | None = None  # Ctrl-C, or SIGTERM turned into one
    broken_off: CaseResult | None = None  # dcpcheck's own error or a device fault, as a record
    internal_traceback: str = ""  # an internal error's whole traceback: for the bug report

    @property
    def partial(self) -> bool:
        return self.stopped is not None or self.broken_off is not None

    @property
    def reported(self) -> list[CaseResult]:
        """Every case the reports hold: the run's, the shrunk failure's replay, the record
        of what broke it off."""
        replayed = self.searched.replay if self.searched is not None else []
        error = [self.broken_off] if self.broken_off is not None else []
        return [*self.results, *replayed, *error]

    @property
    def passed(self) -> bool:
        return not any(r.failed for r in self.reported) and (
            self.searched is None or self.searched.passed
        )

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_FAIL


def broken_off_record(exc: BaseException) -> CaseResult:
    """What broke a run off, as a case, with the innermost frame it surfaced in: a device
    fault as a crash (:data:`DEVICE_FAULT_CASE`), any other exception as dcpcheck's own
    error (:data:`INTERNAL_ERROR_CASE`), so the report says the run broke and where."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    fault = device_fault(exc)
    if fault is not None:
        return CaseResult(
            DEVICE_FAULT_CASE,
            0,
            "crash",
            error=(
                f"the device faulted ({fault}), seen{where}: a launch of the kernel under "
                "test faulted, this case's or an earlier one's (the device reports a fault "
                "at its next synchronising call); the process's device runs nothing more, "
                "so the run stopped here; --sanitize memcheck names the launch"
            ),
        )
    return CaseResult(
        INTERNAL_ERROR_CASE,
        0,
        "error",
        error=f"dcpcheck stopped on an internal error: {type(exc).__name__}: {exc}{where}",
    )


def broken_off_by(exc: BaseException) -> tuple[CaseResult, str]:
    """``exc``, being handled, as what broke a run off: its record
    (:func:`broken_off_record`) and, for dcpcheck's own error, its whole traceback (a bug to
    report; a device fault's record already says where it surfaced), else ``""``."""
    record = broken_off_record(exc)
    return record, traceback.format_exc() if record.scenario == INTERNAL_ERROR_CASE else ""


def kernel_load_record(status: str, message: str) -> CaseResult:
    """A kernel that never loaded, as a case: status ``error`` when it raised while it
    loaded (exit 125), ``crash`` or ``timeout`` when its import ended or hung the process
    importing it (exit 1); ``message`` the one line that says so. So no case was judged,
    and the report says why rather than hold nothing, or an earlier run's cases."""
    return CaseResult(KERNEL_LOAD_CASE, 0, status, error=message)


def run_session(
    session: Session,
    plan: RunPlan,
    *,
    on_result: Callable[[CaseResult], None] = _ignore,
    on_stage: Callable[[str], None] = _ignore,
    on_example: Callable[[int], None] = _ignore,
) -> RunOutcome:
    """Run ``plan`` through ``session``; never raises for a stop or an internal error, which
    the outcome records (the caller writes the reports, then says why it stopped).

    ``on_result`` sees every case as it lands, ``on_stage`` hears ``"token streams"`` and
    ``"property search"`` as they start, ``on_example`` counts the search's examples.
    """
    outcome = RunOutcome([])
    started = time.perf_counter()
    fail_fast = session.config.fail_fast

    def failed() -> bool:
        return any(r.failed for r in outcome.results)

    def landed(result: CaseResult) -> None:
        outcome.results.append(result)
        on_result(result)

    streams = bool(plan.scenarios) and plan.token_streams
    try:
        session.cases(plan.scenarios, on_result=landed, compile_ahead=plan.compile_ahead)
        if streams and not (fail_fast and failed()):
            on_stage("token streams")
            landed(session.token_streams())
        outcome.named_seconds = time.perf_counter() - started
        if plan.search is not None and not (fail_fast and failed()):
            on_stage("property search")
            outcome.searched = session.search(plan.search, on_example)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM, wherever the run was
        outcome.stopped = stop
    except Exception as exc:  # a device fault or dcpcheck's own bug: never a clean report
        outcome.broken_off, outcome.internal_traceback = broken_off_by(exc)
    return outcome
