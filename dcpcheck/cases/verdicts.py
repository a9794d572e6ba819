"""The run's data model: what a run was asked (``RunConfig``), and what it found - a
verdict per case (``CaseResult``), per check (``CheckResult``), and per way a check
failed (``Finding``, and its wording, ``format_finding``); and a selftest's rows
(``SelftestRow``, ``SelftestReport``). Every op's runner fills these
and every report, console table and saved failure reads them, so they live here, below
everything that executes a case.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dcpcheck.cases.scenario_files import SCENARIO_DIR


class NamedScenario(Protocol):
    """What a replay command needs of a scenario of any op."""

    name: str
    source: Path | None
    dcp_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Finding:
    """One way a check failed, located as precisely as the evidence allows."""

    field: str
    rank: int | None
    detail: str
    token: int | None = None
    ownership: str | None = None  # of ``token`` on ``rank``: owned / foreign / padding
    max_error: str | None = None  # in steps of the stored format, or "NaN (unwritten)"
    count: int = 1  # how many rows/entries/bytes are bad
    tokens: tuple[int, ...] = ()  # every bad token, where rows are tokens (ownership maps)


@dataclass(frozen=True)
class CheckResult:
    check: str
    findings: tuple[Finding, ...] = ()
    skipped: str | None = None  # reason; a skipped check is reported, never counted as passed
    # Set by an oracle-free form (--oracle off): what it compared with instead of the
    # oracle, so that a pass there never reads as a pass against the oracle.
    without_oracle: str | None = None

    @property
    def passed(self) -> bool:
        return self.skipped is None and not self.findings


def format_finding(check: str, f) -> str:
    """One line a kernel engineer can act on."""
    where = f"rank {f.rank}" if f.rank is not None else "all ranks"
    token = ""
    if f.token is not None:
        owned = f" ({f.ownership})" if f.ownership is not None else ""
        token = f", first bad token {f.token}{owned}"
    err = f", max error {f.max_error}" if f.max_error else ""
    return f"{check}: {f.field} on {where}{token}{err}: {f.detail}"


TOKEN_STREAM_DCP = 4
"""DCP size of the token-stream check when the run names none (scenarios' own sizes)."""

TOKEN_STREAM_CASE = "token-streams"
"""The ``scenario`` name of the token-stream case in results and reports."""

STATUSES = ("pass", "fail", "error", "crash", "timeout", "nondeterministic", "not_applicable")
"""``CaseResult.status`` values. ``nondeterministic``: two runs of the same launch left
different bytes (``dcpcheck.ops.fused_norm_rope.determinism``), so no finding of the case can be
pinned on DCP; ``error``: the kernel raised (its exception text);
``crash``: the worker process running the case died (a signal such as SIGSEGV, or a CUDA
error that poisoned its context); ``timeout``: the case outlived ``--case-timeout`` and
its worker was killed. The last two exist only under isolation (dcpcheck.harness.isolation).
``not_applicable``: the kernel cannot run the case on this machine at all, or is never
asked it by its release's callers (an adapter's ``not_applicable``, e.g. an instruction
this GPU lacks, an input the callers never pass, with their lines); never launched, never a
pass."""

NOT_FAILED = ("pass", "not_applicable")
"""Statuses that do not fail a run (``CaseResult.failed``)."""


@dataclass(frozen=True)
class RunConfig:
    """What one ``dcpcheck run`` was asked to do; enough to print a replay command."""

    kernel_name: str
    dcp_sizes: tuple[int, ...] | None  # None: each scenario's own sizes
    seed: int | None = None  # None: each scenario's own seed
    fail_fast: bool = False
    # The options of the op's own that change what a case demands of a kernel, as typed
    # ((name, value) pairs, ``("ds-mla-scale", "pow2")``; ``dcpcheck.cases.options``):
    # the op reads its own, and a replay repeats them all.
    demands: tuple[tuple[str, str], ...] = ()
    oracle: bool = True  # --oracle off: judge against the kernel's own DCP1 run alone
    sanitize: str | None = None  # --sanitize TOOL: every case's kernel under compute-sanitizer
    case_timeout: float | None = None  # --case-timeout SECONDS, as given (None: not given)
    # Put before every printed replay command: what that command's environment needs (the
    # pytest plugin's "PYTHONPATH=src " for a kernel imported from a directory a fresh
    # process would not search).
    replay_prefix: str = ""

    @property
    def oracle_flag(self) -> str:
        """The ``--oracle`` option a replay needs ("" when on, the default)."""
        return "" if self.oracle else " --oracle off"

    @property
    def kernel_options(self) -> str:
        """``--kernel`` (shell-quoted: a file path may hold spaces) and every option that
        changes what a case demands of it (how long it may take too), as a replay must
        repeat them."""
        options = f" --kernel {shlex.quote(self.kernel_name)}"
        options += "".join(f" --{name} {shlex.quote(value)}" for name, value in self.demands)
        options += self.oracle_flag
        options += f" --sanitize {self.sanitize}" if self.sanitize else ""
        return options + (f" --case-timeout {self.case_timeout!r}" if self.case_timeout else "")

    @property
    def token_stream_dcp(self) -> int:
        """DCP size of the token-stream case: the largest requested, else TOKEN_STREAM_DCP."""
        return max(self.dcp_sizes or (TOKEN_STREAM_DCP,))

    def sizes_of(self, scenario: NamedScenario) -> tuple[int, ...]:
        """The DCP sizes ``scenario`` runs at: one ``CaseResult`` each, in this order."""
        return self.dcp_sizes or scenario.dcp_sizes

    def token_stream_replay(self, dcp_size: int) -> str:
        kernel = shlex.quote(self.kernel_name)
        return f"{self.replay_prefix}dcpcheck hash --dcp 1,{dcp_size} --kernel {kernel}"

    def replay_command(self, scenario: NamedScenario, dcp_size: int) -> str:
        """The command that runs this one case again, from where the run was started: a
        shipped scenario by name, any other by its file (``dcpcheck repro``), with the seed,
        DCP size and options the case ran with."""
        seed = f" --seed {self.seed}" if self.seed is not None else ""
        if scenario.source is not None and not is_shipped(scenario.source):
            return (
                f"{self.replay_prefix}dcpcheck repro {shlex.quote(str(scenario.source))} "
                f"--dcp {dcp_size}{seed}{self.kernel_options}"
            )
        return (
            f"{self.replay_prefix}dcpcheck run --scenario {scenario.name} --dcp {dcp_size}"
            f"{self.kernel_options}{seed}"
        )


def is_shipped(source: Path) -> bool:
    """Whether a scenario file is one of dcpcheck's shipped scenarios (a file of an op's
    folder of ``SCENARIO_DIR``), which ``dcpcheck run --scenario NAME`` finds wherever it
    is started."""
    try:
        return source.resolve().parent.parent == SCENARIO_DIR.resolve()
    except OSError:
        return False


OWNERSHIP_SHAPES = ("all_negative", "mixed", "fully_owned")
"""Keys of ``CaseResult.ownership``: rank launches by the shape of their slot mapping (no
token owned, some, every real one), which ``run --stats`` counts over a run."""


@dataclass
class CaseResult:
    """The verdict of one scenario at one DCP size."""

    scenario: str
    dcp_size: int
    status: str  # one of STATUSES
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None  # what went wrong (error, crash, timeout); why not applicable
    replay: str = ""
    seconds: float = 0.0  # wall time; reported on screen, never in JSON (determinism)
    ownership: dict[str, int] = field(default_factory=dict)  # rank launches by mapping shape

    @property
    def failed(self) -> bool:
        """Whether this case fails the run: any status but ``NOT_FAILED``."""
        return self.status not in NOT_FAILED

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed and c.skipped is None]


def ownership_totals(results: Sequence[CaseResult]) -> dict[str, int]:
    """Rank launches by slot-mapping shape (``OWNERSHIP_SHAPES``), summed over ``results``."""
    totals = dict.fromkeys(OWNERSHIP_SHAPES, 0)
    for r in results:
        for shape, count in r.ownership.items():
            totals[shape] += count
    return totals


class KernelError(RuntimeError):
    """The kernel under test raised; the case fails with this text, the run goes on."""


class Status(enum.Enum):
    """The outcome of one row of the selftest."""

    CAUGHT = "caught"  # a mutant failed a check the correct kernel passes
    MISSED = "missed"  # a mutant passed everything it was run through
    SKIPPED = "skipped"  # a mutant that cannot show in this run (reason given)
    PASSED = "passed"  # the correct kernel passed everything
    FAILED = "failed"  # the correct kernel failed: the selftest proves nothing


@dataclass(frozen=True)
class SelftestRow:
    """One kernel's line of the report."""

    kernel: str
    description: str
    status: Status
    check: str | None = None  # the first failing check of the first failing case
    field: str | None = None  # that check's first finding's field ("error" has none)
    case: str | None = None  # the failing case: "scenario[dcpN]" (a shrunk one's name)
    examples: int | None = None  # property examples to the first failure; 0: named scenario
    shrunk_requests: int | None = None  # size of the shrunk failure (property catches)
    shrunk_tokens: int | None = None  # rows, padding included
    saved_path: Path | None = None  # the shrunk failure's scenario file, if kept (``home``)
    seconds: float = 0.0
    reason: str | None = None  # why skipped or missed; what failed on the correct kernel


@dataclass
class SelftestReport:
    """Every row of one selftest run, the correct kernel first."""

    profile: str
    backend: str
    default: SelftestRow
    mutants: list[SelftestRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows(self) -> list[SelftestRow]:
        return [self.default, *self.mutants]

    def count(self, status: Status) -> int:
        return sum(row.status is status for row in self.mutants)

    @property
    def judged_none(self) -> bool:
        """No mutant was caught or missed (each skipped, or none listed): the run proved
        nothing of the checks, whatever the correct kernel did."""
        return not any(row.status in (Status.CAUGHT, Status.MISSED) for row in self.mutants)

    @property
    def passed(self) -> bool:
        """The correct kernel passes, at least one mutant was judged, and every mutant that
        could show was caught."""
        return (
            self.default.status is Status.PASSED
            and not self.judged_none
            and all(row.status in (Status.CAUGHT, Status.SKIPPED) for row in self.mutants)
        )
