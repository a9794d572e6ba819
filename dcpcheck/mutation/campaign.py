"""One mutation run of a kernel: its files' mutants (``operators``), chosen
(``selection``), judged by its authors (``equivalents``) or run through the gate
(``runner``), the survivors given the property search when asked, and the score.

The kernel must pass its own gate first, and its property search when asked (the
baseline, run like a mutant that edits nothing): a mutant's failure means something only
against a kernel that passes. A gate that refuses its arguments raises
``runner.GateError``.

The score counts the mutants the gate could see: killed, timed out and crashed over those
and the survivors. Equivalent, not applicable and not compiled mutants are listed apart,
and so are the unreached: edits of functions that nothing the unedited kernel's gate ran
can reach (``reach``), which are not run.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dcpcheck.mutation import equivalents, reach, runner, selection
from dcpcheck.mutation.operators import Mutant, mutants_of
from dcpcheck.mutation.runner import COUNTED_KILLED, SURVIVED, Cache, Gate, Outcome

UNREACHED = "unreached"
"""A mutant's status when nothing the gate runs reaches its function (``reach``)."""


class MutationError(RuntimeError):
    """The run cannot mean anything (the kernel fails its own gate, a bad pattern): one
    line."""


@dataclass
class Entry:
    """A mutant and what became of it: an outcome, or its authors' judgement."""

    mutant: Mutant
    outcome: Outcome | None = None
    judged: equivalents.Judged | None = None

    @property
    def status(self) -> str:
        return self.judged.kind if self.judged else self.outcome.outcome  # type: ignore[union-attr]


@dataclass
class Campaign:
    """What ``mutate`` found (module docstring)."""

    gate: Gate
    files: list[Path]
    entries: list[Entry] = field(default_factory=list)
    error: str | None = None  # why no mutant ran (the kernel fails its own gate)
    stopped: KeyboardInterrupt | None = None  # the Ctrl-C or SIGTERM that cut it short

    @property
    def interrupted(self) -> bool:
        return self.stopped is not None

    @property
    def counted(self) -> list[Entry]:
        return [e for e in self.entries if e.status in (*COUNTED_KILLED, SURVIVED)]

    @property
    def survivors(self) -> list[Entry]:
        return [e for e in self.entries if e.status == SURVIVED]

    @property
    def score(self) -> float | None:
        """Killed (timed out and crashed included) over the counted mutants, in percent;
        None when none was counted."""
        counted = self.counted
        if not counted:
            return None
        return 100.0 * sum(e.status in COUNTED_KILLED for e in counted) / len(counted)

    def statuses(self) -> Counter[str]:
        return Counter(e.status for e in self.entries)

    def by_operator(self) -> dict[str, tuple[int, int]]:
        """Operator -> (killed, counted)."""
        table: dict[str, list[int]] = {}
        for entry in self.counted:
            row = table.setdefault(entry.mutant.operator, [0, 0])
            row[0] += entry.status in COUNTED_KILLED
            row[1] += 1
        return {op: (k, n) for op, (k, n) in table.items()}

    def by_check(self) -> dict[str, int]:
        """Check -> how many killed mutants it failed on (any scenario)."""
        counts: Counter[str] = Counter()
        for entry in self.counted:
            if entry.outcome is not None:
                counts.update({check for _, check in entry.outcome.failing})
        return dict(sorted(counts.items()))

    def by_scenario(self) -> dict[str, int]:
        """Scenario -> how many mutants it was the first to kill."""
        counts = Counter(
            e.outcome.scenario for e in self.counted if e.outcome and e.outcome.scenario
        )
        return dict(sorted(counts.items()))


def plan(
    files: Sequence[Path],
    patterns: Sequence[str] = (),
    limit: int | None = None,
    operators: Sequence[str] = (),
) -> list[Mutant]:
    """The mutants of ``files`` a run takes: those ``patterns`` name (all when none), of
    ``operators`` (all when none), then at most ``limit`` of them (``selection.sample``)."""
    mutants = [m for path in files for m in mutants_of(path)]
    if operators:
        mutants = [m for m in mutants if m.operator in operators]
    if patterns:
        mutants = selection.named(mutants, patterns)
        if not mutants:
            raise MutationError(f"no mutant is named {' or '.join(patterns)}")
    if limit is not None:
        mutants = selection.sample(mutants, limit)
    return mutants


def baseline(path: Path) -> Mutant:
    """The edit of nothing: the kernel's file as it is, run as a mutant is."""
    source = path.read_text(encoding="utf-8")
    return Mutant(path, "<baseline>", 0, runner.BASELINE, "nothing", source, source)


@functools.lru_cache(maxsize=64)
def _reachable(path: Path, ran: tuple[str, ...]) -> frozenset[str]:
    """``reach.reachable``, parsed once a file and record: a campaign asks it of every
    mutant of the file, and the file stays as it is while the campaign runs."""
    return frozenset(reach.reachable(path, ran))


def unreached(mutant: Mutant, ran: dict[str, list[str]]) -> equivalents.Judged | None:
    """``mutant`` judged unreached when its function lies outside what the functions of its
    file that the unedited gate ran can reach (``reach``); None when it may be reached,
    or when nothing of its file was seen to run (no claim without a record)."""
    names = ran.get(str(mutant.path.resolve()))
    if not names or mutant.function in _reachable(mutant.path, tuple(names)):
        return None
    reason = f"the gate runs only {', '.join(names)} of {mutant.path.name}, which never reach it"
    return equivalents.Judged(mutant.name, UNREACHED, reason)


def mutate(
    gate: Gate,
    files: Sequence[Path],
    mutants: Sequence[Mutant],
    home: Path,
    jobs: int,
    on_outcome: Callable[[Mutant, Outcome, bool], None] = lambda m, o, searched: None,
) -> Campaign:
    """Run ``mutants`` of ``files`` through ``gate`` (module docstring);
    ``equivalents.EquivalentsError`` for a mutants file that is not one, before anything
    runs; ``MutationError`` when the kernel fails its own gate. A Ctrl-C or SIGTERM
    returns what finished, marked with it (``stopped``). ``on_outcome`` hears each
    outcome as it lands, with whether it came from the search pass over the survivors."""
    judgements = {path: equivalents.load(equivalents.file_for(path)) for path in files}
    cache = Cache(home / "mutants", gate)
    unedited = baseline(files[0])
    ran: dict[str, list[str]] = {}
    for search in (False, True) if gate.search else (False,):
        base = runner.run_mutants([unedited], gate, cache, 1, search=search, watched=files)[
            unedited.name
        ]
        if base.outcome != SURVIVED:
            where = f" ({base.scenario}: {base.check})" if base.scenario else ""
            raise MutationError(
                f"{gate.kernel} does not pass its own gate{where}: {base.detail or base.outcome}"
            )
        for path, names in base.ran.items():
            ran[path] = sorted({*ran.get(path, ()), *names})
    campaign = Campaign(gate, list(files))
    to_run = []
    for mutant in mutants:
        judged = equivalents.judged(mutant.name, judgements[mutant.path])
        entry = Entry(mutant, judged=judged or unreached(mutant, ran))
        campaign.entries.append(entry)
        if entry.judged is None:
            to_run.append(mutant)
    by_name = {e.mutant.name: e for e in campaign.entries}

    def landed_in(searched: bool) -> Callable[[Mutant, Outcome], None]:
        def landed(mutant: Mutant, outcome: Outcome) -> None:
            entry = by_name[mutant.name]
            if entry.outcome is None or outcome.outcome != SURVIVED:  # the search's kill counts
                entry.outcome = outcome
            on_outcome(mutant, outcome, searched)

        return landed

    try:
        runner.run_mutants(to_run, gate, cache, jobs, landed_in(False))
        if gate.search:
            survivors = [e.mutant for e in campaign.survivors]
            runner.run_mutants(survivors, gate, cache, jobs, landed_in(True), search=True)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (``cli.common.Terminated``)
        campaign.stopped = stop
        campaign.entries = [e for e in campaign.entries if e.outcome or e.judged]
    return campaign
