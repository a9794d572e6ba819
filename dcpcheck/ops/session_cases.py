"""What ``dcpcheck.workflows.session`` asks of the op whose cases it judges
(``Op.judged_by_session``), as ``op_cases.OpCases`` is what ``op_cases`` asks of every
other op.

That op's run has parts an ``OpCases`` does not describe: a kernel may run behind a worker
process (``dcpcheck.harness.isolation``) or under compute-sanitizer, its binaries are
compiled ahead on threads, a kernel declares facts of itself that its cases depend on, and
its property search has profiles and saves its own shrunk failure. The session, the worker,
the command line and the reports reach all of it through one :class:`SessionCases`, the op
package's ``session.SESSION_CASES`` (``OpPackage.session_cases``), and read a search's
request and outcome through :class:`SearchAsked` and :class:`SearchDone`.

A kernel under test is what ``OpPackage.kernel`` loads, or a ``CaseRunner`` that runs whole
cases elsewhere (``isolation.IsolatedKernel``); a scenario is the op's own. Both are
handed back to the op's functions only, so they are typed ``Any`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dcpcheck.backend import Backend
    from dcpcheck.cases.verdicts import CaseResult, RunConfig


@runtime_checkable
class CaseRunner(Protocol):
    """A kernel under test that runs whole cases elsewhere and returns their verdicts
    (``dcpcheck.harness.isolation.IsolatedKernel``: a worker process). The op's
    ``run_scenario`` and ``compile_ahead``, and the token-stream case, hand it the work
    whole."""

    def run_cases(self, scenario: Any, config: RunConfig) -> Iterator[CaseResult]:
        """What the op's ``run_scenario`` yields for this kernel, one result per DCP size."""
        ...

    def run_token_streams(self, config: RunConfig) -> CaseResult:
        """What ``dcpcheck.e2e.stream_case.token_stream_case`` returns for this kernel."""
        ...

    def compile_ahead(self, scenarios: Sequence[Any], config: RunConfig) -> None:
        """The op's ``compile_ahead`` where the cases will run."""
        ...


class RankProgress(Protocol):
    """Where a rank is, as its heartbeat reports it (``dcpcheck.distributed.Progress``)."""

    def working(self, phase: str) -> None:
        """Say what this rank does now (its heartbeat names it if the run hangs)."""
        ...


class RanksOfARun(Protocol):
    """What an op's cases on real ranks ask of their rank group
    (``dcpcheck.distributed.RankGroup``): this process's rank and device, and the one
    collective that brings every rank's launch to rank 0."""

    rank: int
    world_size: int
    backend: Backend
    progress: RankProgress

    @property
    def is_root(self) -> bool: ...

    def gather_to_root(self, value: Any, what: str) -> list[Any] | None:
        """Every rank's ``value`` on rank 0, in rank order (None on the others); ``what``
        names the collective if a rank never arrives."""
        ...


LaunchWatcher = ContextVar[Callable[[str, int, bool], None] | None]
"""Who hears each rank's kernel call, as ``watcher(case_label, rank, started)`` right before
(``started`` True) and right after it: a sanitized worker, so compute-sanitizer's findings
are told apart by case and rank."""


class SearchAsked(Protocol):
    """A property search's request, as the reports and the console read it."""

    @property
    def profile_name(self) -> str: ...

    @property
    def seed_used(self) -> int:
        """The seed given, or the search's default one (a search is reproducible)."""
        ...

    @property
    def dcp_sizes(self) -> tuple[int, ...] | None: ...

    @property
    def max_examples(self) -> int: ...


class SearchDone(Protocol):
    """What a property search did, as the reports and the console read it."""

    @property
    def examples_run(self) -> int: ...

    @property
    def scenarios_run(self) -> int: ...

    @property
    def seconds(self) -> float: ...

    @property
    def examples_to_first_failure(self) -> int | None: ...

    @property
    def ownership(self) -> dict[str, int]: ...

    @property
    def saved_path(self) -> Path | None: ...

    @property
    def failed_checks(self) -> tuple[str, ...]: ...

    @property
    def replay(self) -> list[CaseResult]: ...

    @property
    def replay_command(self) -> str: ...

    @property
    def passed(self) -> bool: ...

    @property
    def shrunk_summary(self) -> str:
        """The shrunk failure's size: requests, tokens, padding, DCP sizes."""
        ...

    @property
    def examples_per_second(self) -> float: ...

    @property
    def scenarios_per_second(self) -> float: ...


@dataclass(frozen=True)
class SessionCases:
    """The session-judged op's parts (module docstring).

    ``run`` judges scenarios in order (``on_result`` sees each case as it lands; it stops
    at the first failure under ``RunConfig.fail_fast``); ``run_scenario`` yields one
    scenario's cases, one per DCP size; ``compile_ahead`` compiles, on threads, the binaries
    those cases will launch. ``as_run`` is a scenario as its cases run it, every rule the
    run resolves written in, so a saved failure replays exactly it. ``declarations`` are
    the facts a loaded kernel states of itself, by attribute name, which an isolated kernel
    carries for its worker's kernel (``ValueError`` of one line for one it cannot read).
    ``search_config`` builds a search's request from the option table; ``search`` runs it;
    ``failure_summary`` words a failing case's checks as the search does.
    ``scenario_on_ranks`` runs one scenario's cases with a process per rank (called on
    every rank of the group; the results on rank 0, None elsewhere).
    """

    run: Callable[
        [Any, Sequence[Any], RunConfig, Backend, Callable[[CaseResult], None] | None],
        list[CaseResult],
    ]
    run_scenario: Callable[[Any, Any, RunConfig, Backend], Iterator[CaseResult]]
    compile_ahead: Callable[[Any, Sequence[Any], RunConfig, Backend], None]
    as_run: Callable[[Any, RunConfig, Any], Any]
    declarations: Callable[[Any], Mapping[str, object]]
    launch_watcher: LaunchWatcher
    search_config: type[SearchAsked]
    search: Callable[[Any, Any, Backend, Callable[[int], None] | None], SearchDone]
    failure_summary: Callable[[list[CaseResult]], list[str]]
    scenario_on_ranks: Callable[
        [Any, Any, RunConfig, RanksOfARun, Sequence[int]], list[CaseResult] | None
    ]
