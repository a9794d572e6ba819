"""``dcpcheck selftest``: prove the harness catches every mutant of the project's own kernel.

A harness that passes a correct kernel proves little until it is shown to fail wrong
ones. ``variants.MUTANTS`` is a catalog of wrong ones: the two DCP bugs that
shipped (``regress/...``) and small, realistic slips of the same Triton kernel
(``mutant/...``), each a few edits of the correct kernel's source away from it. The
selftest runs the harness against each and reports, per mutant, whether it was caught,
by which check on which field, after how many property examples, and how small the
shrunk failure is.

Strategy per kernel:

1. the shipped named scenarios, cheapest first (``scenario_cost``), stopping at the first
   failing case: "examples to the first failure" is 0;
2. only if none fails, the property search (``search``) with the profile's
   example count; the shrunk failure is then replayed on the correct kernel, and counts as
   a catch only if the correct kernel passes it (otherwise the harness, not the mutant, is
   at fault).

The correct kernel (``default``) runs first through the same named scenarios and the same
property search, so every check that catches a mutant is known to pass the correct kernel.

Verdict: the selftest passes only when the correct kernel passes and every mutant is
caught. A mutant that cannot show in this run (a ``gpu_sized`` one on the CPU, or on a
GPU outside the ``thorough`` profile) is reported as skipped with the reason: it is never
counted as caught, and it does not fail the run.

GPU-sized case
--------------
32-bit address arithmetic only goes wrong past 2^31 bytes into the cache: at 3.3M
fp8_ds_mla slots. ``address_overflow_scenario`` builds the smallest scenario that gets
there: one short request whose block table points at a block just past that mark, so the
cache is 2.1 GB per rank but only 7 positions are written. With the harness's pristine
copy of every cache and three rank launches (DCP1, and DCP2's two ranks) that is about
13 GB of device memory, so the ``thorough`` profile adds it on a GPU only. (Measured on
2 CPU cores at DCP1 alone: 20 s and 6.6 GB under the interpreter; the 32-bit mutant fails
``cache_owned`` there, the correct kernel passes.) No shipped scenario can say this (block
tables are built from block 0 up), hence ``HighSlotScenario``.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dcpcheck.backend import Backend
from dcpcheck.cases.dcp import Batch, BlockTables, Request
from dcpcheck.cases.verdicts import CaseResult, RunConfig, SelftestReport, SelftestRow, Status
from dcpcheck.ops import SelftestRefused
from dcpcheck.ops.fused_norm_rope import search
from dcpcheck.ops.fused_norm_rope.contract import DS_MLA_ENTRY_BYTES, CacheLayout, Kernel
from dcpcheck.ops.fused_norm_rope.runner import run_scenario
from dcpcheck.ops.fused_norm_rope.scenario import Scenario, load_scenarios
from dcpcheck.ops.fused_norm_rope.variants import DEFAULT_VARIANT, MUTANTS, KernelVariant

INT32_ADDRESS_LIMIT = 2**31
"""A signed 32-bit byte offset wraps negative here."""

OVERFLOW_BLOCK_SIZE = 64
"""Block size of the GPU-sized case: the largest docs/dcp-contract.md names, so the fewest
blocks."""

OVERFLOW_FIRST_BLOCK = math.ceil(INT32_ADDRESS_LIMIT / (DS_MLA_ENTRY_BYTES * OVERFLOW_BLOCK_SIZE))
"""51,151: the first block whose first fp8_ds_mla entry starts past 2^31 bytes (slot
3,273,664 of 656 bytes)."""


@dataclass(frozen=True)
class SelftestProfile:
    """How hard the selftest tries on kernels the named scenarios do not catch."""

    name: str
    search_profile: search.Profile  # sizes of the drawn scenarios
    examples: int  # property examples per kernel (0: named scenarios only)
    gpu_scale: bool  # add ``address_overflow_scenario`` when running on a GPU
    description: str


PROFILES: dict[str, SelftestProfile] = {
    p.name: p
    for p in (
        SelftestProfile(
            "smoke",
            search.PROFILES["smoke"],
            10,
            False,
            "shipped scenarios, then 10 property examples per kernel they miss",
        ),
        SelftestProfile(
            "ci",
            search.PROFILES["ci"],
            search.PROFILES["ci"].examples,
            False,
            f"shipped scenarios, then the ci property search "
            f"({search.PROFILES['ci'].examples} examples); a few minutes on 2 CPU cores",
        ),
        SelftestProfile(
            "thorough",
            search.PROFILES["thorough"],
            search.PROFILES["thorough"].examples,
            True,
            f"shipped scenarios plus, on a GPU, a 2.1 GB cache written past 2^31 bytes, then "
            f"the thorough property search ({search.PROFILES['thorough'].examples} examples)",
        ),
    )
}


@dataclass(frozen=True)
class HighSlotScenario(Scenario):
    """A scenario whose physical block ids start at ``first_block`` instead of 0, so a few
    tokens land at high slots of a cache that is sized to reach them."""

    first_block: int = 0

    def block_tables(self, dcp_size: int) -> BlockTables:
        return tuple(
            tuple(self.first_block + block for block in table)
            for table in super().block_tables(dcp_size)
        )


def address_overflow_scenario() -> HighSlotScenario:
    """Two new tokens (positions 5 and 6, after a 5-token prefix) written past byte 2^31 of
    an fp8_ds_mla cache, at DCP1 and DCP2 (module docstring; guard and pristine copies
    are per rank, so DCP stays small)."""
    return HighSlotScenario(
        name="address-overflow-ds-mla",
        description=(
            "A 2.1 GB fp8_ds_mla cache written at slots past 3,273,664, where slot * 656 "
            "exceeds 2^31: catches 32-bit cache address arithmetic. GPU only."
        ),
        preset="small-neox",
        dtype="bfloat16",
        cache_layout=CacheLayout.FP8_DS_MLA,
        mla_scale=None,
        indexer="none",
        block_size=OVERFLOW_BLOCK_SIZE,
        interleave=1,
        dcp_sizes=(1, 2),
        seed=0,
        block_table="identity",
        profiling=False,
        batch=Batch((Request(prefix=5, new=2),)),
        first_block=OVERFLOW_FIRST_BLOCK,
    )


def scenario_cost(scenario: Scenario) -> int:
    """Relative cost of running ``scenario``: rank launches (the DCP1 baseline included)
    times rows times the row width every sub-task reads."""
    launches = 1 + sum(n for n in scenario.dcp_sizes if n != 1)
    preset = scenario.model
    width = preset.q_lora_rank + preset.kv_lora_rank + preset.rope_dim + preset.index_head_dim
    return launches * scenario.batch.num_tokens * width


def selftest_scenarios(profile: SelftestProfile, backend: Backend) -> list[Scenario]:
    """The named scenarios of a run, cheapest first: the shipped ones, plus the GPU-sized
    case when the profile asks for it and the backend is a GPU."""
    scenarios = load_scenarios([])
    if profile.gpu_scale and not backend.interpreted:
        scenarios.append(address_overflow_scenario())
    return sorted(scenarios, key=lambda s: (scenario_cost(s), s.name))


def gpu_scale_skip_reason(profile: SelftestProfile, backend: Backend) -> str | None:
    """Why a ``gpu_sized`` mutant cannot show in this run, or None if it can."""
    if backend.interpreted:
        return "not applicable on the CPU (needs a GPU-sized cache)"
    if not profile.gpu_scale:
        return f"needs the GPU-sized cache of the thorough profile (this is {profile.name})"
    return None


@dataclass(frozen=True)
class _Failure:
    """Where a kernel first failed, as a row reports it."""

    check: str
    field: str | None
    reason: str | None


def _first_failure(result: CaseResult) -> _Failure:
    if result.status == "error":
        return _Failure("error", None, result.error)
    check = result.failed_checks[0]
    finding = check.findings[0]
    return _Failure(check.check, finding.field, None)


def _first_failing_case(results: Sequence[CaseResult]) -> CaseResult | None:
    return next((r for r in results if r.failed), None)


def _run_named(
    kernel: Kernel, name: str, scenarios: Sequence[Scenario], backend: Backend
) -> CaseResult | None:
    """The first failing case of ``kernel`` over ``scenarios`` in order, or None."""
    config = RunConfig(name, None)
    for scenario in scenarios:
        for result in run_scenario(kernel, scenario, config, backend):
            if result.failed:
                return result
    return None


def _label(result: CaseResult) -> str:
    return f"{result.scenario}[dcp{result.dcp_size}]"


@dataclass(frozen=True)
class _Context:
    """What every kernel of one selftest run is run through."""

    scenarios: Sequence[Scenario]
    profile: SelftestProfile
    backend: Backend
    home: Path
    keep_failures: bool  # the caller chose ``home``: saved failures outlive the run

    def property_search(self, kernel: Kernel, name: str) -> search.SearchResult:
        config = search.SearchConfig(
            name, self.profile.search_profile, examples=self.profile.examples, home=self.home
        )
        return search.search(kernel, config, self.backend)


def _named_row(
    variant: KernelVariant,
    status: Status,
    failing: CaseResult,
    start: float,
    reason: str | None = None,
) -> SelftestRow:
    """A row for a kernel that failed a named scenario."""
    failure = _first_failure(failing)
    return SelftestRow(
        variant.name,
        variant.description,
        status,
        failure.check,
        failure.field,
        _label(failing),
        examples=0,
        seconds=time.perf_counter() - start,
        reason=failure.reason or reason,
    )


def _search_row(
    variant: KernelVariant,
    status: Status,
    searched: search.SearchResult,
    context: _Context,
    start: float,
    reason: str | None = None,
) -> SelftestRow:
    """A row for a failed property search: check and field from the saved failure's
    replay (what ``dcpcheck repro`` shows), sizes from the shrunk scenario."""
    replayed = _first_failing_case(searched.replay)
    if replayed is not None:
        failure, case = _first_failure(replayed), _label(replayed)
    else:
        failure = _Failure(searched.failed_checks[0], None, "the saved failure passed on replay")
        case = searched.shrunk.name
    batch = searched.shrunk.batch
    return SelftestRow(
        variant.name,
        variant.description,
        status,
        failure.check,
        failure.field,
        case,
        examples=searched.examples_to_first_failure,
        shrunk_requests=len(batch.requests),
        shrunk_tokens=batch.num_tokens,
        saved_path=searched.saved_path if context.keep_failures else None,
        seconds=time.perf_counter() - start,
        reason=reason or failure.reason,
    )


def _probe_default(kernel: Kernel, context: _Context) -> SelftestRow:
    """The correct kernel through everything a mutant may be run through."""
    variant = DEFAULT_VARIANT
    start = time.perf_counter()
    failing = _run_named(kernel, variant.name, context.scenarios, context.backend)
    if failing is not None:
        return _named_row(
            variant, Status.FAILED, failing, start, "a named scenario fails the correct kernel"
        )
    examples = 0
    if context.profile.examples:
        searched = context.property_search(kernel, variant.name)
        if not searched.passed:
            return _search_row(
                variant,
                Status.FAILED,
                searched,
                context,
                start,
                "the property search fails the correct kernel",
            )
        examples = searched.examples_run
    return SelftestRow(
        variant.name,
        variant.description,
        Status.PASSED,
        examples=examples,
        seconds=time.perf_counter() - start,
    )


def _probe_mutant(
    variant: KernelVariant, kernel: Kernel, correct: Kernel, context: _Context
) -> SelftestRow:
    """Named scenarios first; the property search only if they all pass (module doc)."""
    start = time.perf_counter()
    failing = _run_named(kernel, variant.name, context.scenarios, context.backend)
    if failing is not None:
        return _named_row(variant, Status.CAUGHT, failing, start)
    if not context.profile.examples:
        return SelftestRow(
            variant.name,
            variant.description,
            Status.MISSED,
            seconds=time.perf_counter() - start,
            reason="passes every named scenario (this profile runs no property search)",
        )
    searched = context.property_search(kernel, variant.name)
    if searched.passed:
        return SelftestRow(
            variant.name,
            variant.description,
            Status.MISSED,
            examples=searched.examples_run,
            seconds=time.perf_counter() - start,
            reason=f"passes every named scenario and {searched.examples_run} property examples",
        )
    on_correct = run_scenario(
        correct, searched.shrunk, RunConfig(DEFAULT_VARIANT.name, None), context.backend
    )
    if _first_failing_case(list(on_correct)) is not None:
        return _search_row(
            variant,
            Status.MISSED,
            searched,
            context,
            start,
            "the correct kernel fails the shrunk scenario too: a harness fault, not a catch",
        )
    return _search_row(variant, Status.CAUGHT, searched, context, start)


def run_selftest(
    profile: SelftestProfile,
    backend: Backend,
    *,
    mutants: Sequence[KernelVariant] = MUTANTS,
    scenarios: Sequence[Scenario] | None = None,
    home: Path | None = None,
    on_row: Callable[[SelftestRow], None] | None = None,
) -> SelftestReport:
    """Run the correct kernel, then every mutant, as the module docstring describes.

    ``scenarios`` replaces the named scenarios (default: ``selftest_scenarios``; run in
    the order given). ``home`` is the property search's run directory, where shrunk
    failures are kept. Default: a temporary directory removed afterwards, so each run
    searches from scratch; with a ``home`` of earlier runs, Hypothesis replays their
    failures first and "examples to the first failure" drops to 1. ``on_row`` sees each
    row as it lands (progress).
    """
    from dcpcheck.ops.fused_norm_rope.launcher import make_kernel  # after the backend is fixed

    named = selftest_scenarios(profile, backend) if scenarios is None else list(scenarios)
    skip_reason = gpu_scale_skip_reason(profile, backend)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dcpcheck-selftest-") as scratch:
        context = _Context(
            named, profile, backend, Path(scratch) if home is None else home, home is not None
        )
        correct = make_kernel(DEFAULT_VARIANT)
        report = SelftestReport(profile.name, backend.describe(), _probe_default(correct, context))
        if on_row is not None:
            on_row(report.default)
        for variant in mutants:
            if variant.gpu_sized and skip_reason is not None:
                row = SelftestRow(
                    variant.name, variant.description, Status.SKIPPED, reason=skip_reason
                )
            else:
                row = _probe_mutant(variant, make_kernel(variant), correct, context)
            report.mutants.append(row)
            if on_row is not None:
                on_row(row)
    report.seconds = time.perf_counter() - start
    return report


DEFAULT_PROFILE = "ci"
"""The profile ``dcpcheck selftest`` runs unless ``--profile`` names another."""


def selftest(
    backend: Backend,
    on_row: Callable[[SelftestRow], None] | None = None,
    profile: str = DEFAULT_PROFILE,
    mutant_names: Sequence[str] = (),
) -> SelftestReport:
    """The op's part of ``dcpcheck selftest`` (``dcpcheck.ops``): :func:`run_selftest` under
    the profile named, over the mutants named (every one without a name). A name that is
    no mutant, or names whose mutants all cannot show in this run, are refused
    (:class:`SelftestRefused`) before any work: the selftest would judge none of them."""
    chosen = PROFILES[profile]
    mutants = MUTANTS
    if mutant_names:
        known = {m.name: m for m in MUTANTS}
        unknown = [n for n in mutant_names if n not in known]
        if unknown:
            raise SelftestRefused(
                f"--mutant: unknown {', '.join(unknown)} (see dcpcheck list mutants)"
            )
        mutants = tuple(known[n] for n in mutant_names)
        unable = gpu_scale_skip_reason(chosen, backend)
        if unable is not None and all(m.gpu_sized for m in mutants):
            raise SelftestRefused(
                f"--mutant: {', '.join(mutant_names)} cannot show in this run ({unable}): "
                "no mutant would be judged"
            )
    return run_selftest(chosen, backend, mutants=mutants, on_row=on_row)
