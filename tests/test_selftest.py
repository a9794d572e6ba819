"""``dcpcheck.ops.fused_norm_rope.selftest`` on tiny runs: the rows, the table and the verdict.

A tiny profile (two property examples) over one named scenario keeps each run to a few
seconds on the CPU. The verdict is shown both ways: real mutants are caught and the run
passes; a "mutant" that is really the correct kernel is missed and the run fails.
"""

from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import SelftestReport, SelftestRow, Status
from dcpcheck.exit_codes import EXIT_USAGE
from dcpcheck.ops.fused_norm_rope import search
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario, load_scenarios
from dcpcheck.ops.fused_norm_rope.selftest import (
    PROFILES,
    SelftestProfile,
    address_overflow_scenario,
    run_selftest,
    scenario_cost,
    selftest_scenarios,
)
from dcpcheck.ops.fused_norm_rope.variants import MUTANTS, KernelVariant
from dcpcheck.output.console import selftest_table
from tests.conftest import BACKEND

TINY = SelftestProfile("tiny", search.PROFILES["smoke"], 2, False, "2 property examples")
"""Enough property examples to prove the search runs, few enough to stay fast."""

DECODE = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
"""Named scenario of the tiny runs: one decode token under DCP4."""

FAKE = KernelVariant("mutant/fake-correct", "the correct kernel posing as a mutant")
"""Mutation.NONE under a mutant's name: nothing can catch it."""


def variant(name: str) -> KernelVariant:
    return next(m for m in MUTANTS if m.name == name)


def table_text(report: SelftestReport) -> str:
    console = Console(record=True, width=240, color_system=None)
    console.print(selftest_table(report))
    return console.export_text()


@pytest.fixture(scope="module")
def caught_report() -> SelftestReport:
    mutants = [variant("regress/pre-54908"), variant("mutant/previous-entry-overwritten")]
    return run_selftest(TINY, BACKEND, mutants=mutants, scenarios=[DECODE])


def test_caught_mutants_make_a_passing_run(caught_report):
    report = caught_report
    assert report.passed
    assert report.default.status is Status.PASSED
    assert report.default.examples == TINY.examples  # the correct kernel ran the search too
    assert [(r.kernel, r.status, r.check, r.field, r.case, r.examples) for r in report.mutants] == [
        ("regress/pre-54908", Status.CAUGHT, "outputs", "kv_out", "decode-single-dcp4[dcp4]", 0),
        (
            "mutant/previous-entry-overwritten",
            Status.CAUGHT,
            "prefix_intact",
            "mla_cache",
            "decode-single-dcp4[dcp4]",
            0,
        ),
    ]
    assert all(r.shrunk_requests is None and r.seconds > 0 for r in report.mutants)
    assert report.count(Status.CAUGHT) == 2


def test_table_has_one_row_per_kernel_and_the_verdict(caught_report):
    text = table_text(caught_report)
    lines = [line for line in text.splitlines() if "│" in line and "kernel" not in line]
    assert [line.split("│")[1].strip() for line in lines] == [
        "default",
        "regress/pre-54908",
        "mutant/previous-entry-overwritten",
    ]
    assert "outputs: kv_out" in lines[1] and "decode-single-dcp4[dcp4]" in lines[1]
    assert "prefix_intact: mla_cache" in lines[2]
    assert "PASS: 2 of 2 mutants caught, 0 missed, 0 skipped; correct kernel passed" in text


def test_a_mutant_nothing_catches_fails_the_run():
    report = run_selftest(TINY, BACKEND, mutants=[FAKE], scenarios=[DECODE])
    assert not report.passed
    assert report.default.status is Status.PASSED
    (row,) = report.mutants
    assert row.status is Status.MISSED and row.check is None
    assert row.examples == TINY.examples
    assert "passes every named scenario" in row.reason
    assert "FAIL: 0 of 1 mutants caught, 1 missed" in table_text(report)


def test_a_run_whose_mutants_were_all_skipped_proves_nothing_and_fails():
    """A selftest in which no mutant could show (each skipped) judged none of the checks:
    it fails, whatever the correct kernel did; one mutant caught beside the skips passes."""
    default = SelftestRow("default", "correct", Status.PASSED)
    skipped = SelftestRow("mutant/a", "a", Status.SKIPPED, reason="needs a GPU")
    caught = SelftestRow("mutant/b", "b", Status.CAUGHT, check="outputs")
    for mutants in ([skipped], [], [skipped, skipped]):
        report = SelftestReport("ci", "cpu", default, list(mutants))
        assert report.judged_none and not report.passed
        assert "FAIL" in table_text(report)
    report = SelftestReport("ci", "cpu", default, [skipped, caught])
    assert not report.judged_none and report.passed


def test_property_search_catches_what_the_named_scenarios_miss(tmp_path):
    """A shared-layer mutant passes the (indexer-layer) decode scenario; the search draws
    a shared layer, shrinks it to one token, and keeps the file under ``home``."""
    mutant = variant("mutant/topk-fill-on-shared-layer")
    # The default seed draws a shared layer at example 4; 8 leave room for a changed
    # strategy, and every example costs the correct kernel's probe too.
    profile = dataclasses.replace(TINY, examples=8)
    report = run_selftest(profile, BACKEND, mutants=[mutant], scenarios=[DECODE], home=tmp_path)
    assert report.passed
    (row,) = report.mutants
    assert (row.status, row.check, row.field) == (Status.CAUGHT, "topk", "topk_indices")
    assert row.examples >= 1
    assert (row.shrunk_requests, row.shrunk_tokens) == (1, 1)
    assert row.case.startswith("shrunk-mutant-topk-fill-on-shared-layer-")
    assert row.saved_path is not None and row.saved_path.parent == tmp_path / "failures"
    assert load_scenario(row.saved_path).indexer == "none"
    assert "1 req / 1 tok" in table_text(report)


def test_gpu_scale_mutant_is_skipped_on_the_cpu_never_counted_as_caught():
    if not BACKEND.interpreted:
        pytest.skip("on a GPU this mutant runs (thorough) or is skipped for the profile")
    (gpu_only,) = [m for m in MUTANTS if m.gpu_sized]
    report = run_selftest(TINY, BACKEND, mutants=[gpu_only], scenarios=[DECODE])
    (row,) = report.mutants
    assert row.status is Status.SKIPPED
    assert row.reason == "not applicable on the CPU (needs a GPU-sized cache)"
    # no mutant was judged: not a pass, however correct the kernel
    assert report.judged_none and not report.passed and report.count(Status.CAUGHT) == 0
    assert "0 of 1 mutants caught, 0 missed, 1 skipped" in table_text(report)


def test_mutants_named_that_cannot_show_here_are_refused_before_any_work():
    """The selftest would judge none of them (the ci profile has no GPU-sized cache, nor
    has the CPU): one line and exit 2, not a pass that caught nothing."""
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    result = CliRunner().invoke(
        cli, ["selftest", "--op", "fused-norm-rope", "--mutant", "mutant/address-32bit"]
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--mutant: mutant/address-32bit cannot show in this run" in result.output
    assert "no mutant would be judged" in result.output


def test_named_scenarios_run_cheapest_first_and_the_gpu_case_only_on_a_gpu():
    cpu = Backend(BACKEND.device, interpreted=True)
    gpu = Backend(BACKEND.device, interpreted=False)
    shipped = {s.name for s in load_scenarios([])}
    on_cpu = selftest_scenarios(PROFILES["thorough"], cpu)
    assert {s.name for s in on_cpu} == shipped
    costs = [scenario_cost(s) for s in on_cpu]
    assert costs == sorted(costs)
    assert on_cpu[-1].name == "glm5-prefill-1536-prefix"
    on_gpu = {s.name for s in selftest_scenarios(PROFILES["thorough"], gpu)}
    assert on_gpu == shipped | {address_overflow_scenario().name}
    assert {s.name for s in selftest_scenarios(PROFILES["ci"], gpu)} == shipped


def test_profiles_grow_and_only_thorough_adds_the_gpu_case():
    assert list(PROFILES) == ["smoke", "ci", "thorough"]
    examples = [p.examples for p in PROFILES.values()]
    assert examples == sorted(examples) and examples[0] > 0
    assert [p.gpu_scale for p in PROFILES.values()] == [False, False, True]
