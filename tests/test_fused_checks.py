"""The fused verdicts (``dcpcheck.ops.fused_norm_rope.fused_checks``) against the detailed checks.

A check the fused pass calls clear is never run in its detailed form, so the fused
predicate must be the detailed one: for every broken kernel here and every case, each
flag is raised exactly where the detailed check has findings, and ``check_case`` returns
the same results either way. The broken kernels break one contract item each
(``tests.kernels_under_test``); the mutants and regressions run through the interpreter
on the scenarios that expose them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcpcheck.ops.fused_norm_rope import fused_checks
from dcpcheck.ops.fused_norm_rope.case import (
    build_case,
    make_activations,
    oracle_for,
    scenario_inputs,
)
from dcpcheck.ops.fused_norm_rope.case_checks import check_case
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import launch
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS as SHIPPED
from dcpcheck.ops.fused_norm_rope.scenario import Scenario, load_scenario
from tests import kernels_under_test as k
from tests.conftest import BACKEND

STRAY_CHECKS = {
    "guard_bands",
    "prefix_intact",
    "padding_inert",
    "cache_foreign",
    "profiling_no_write",
}

BROKEN = (
    k.oracle_kernel,
    k.writes_foreign_token,
    k.writes_guard_block,
    k.one_rank_differs,
    k.writes_padding_row,
    k.overwrites_prefix,
    k.modifies_input,
    k.skips_foreign_kv,
    k.doubles_ds_mla_scales,
    k.shifts_q_out,
    k.doubles_ds_mla_scales_and_writes_foreign,
    k.skips_q_out_row_zero,
    k.skips_first_owned_entry,
)

SCENARIOS = (
    "decode-single-dcp4",
    "mixed-prefill-decode-padding",
    "fp8-ds-mla-cache",
    "nvfp4-ds-mla-cache",
    "indexer-replicated",
    "indexer-shuffled",
    "indexer-mx-scales",
    "profiling-call",
    "interleave-block",
)


def shipped(name: str) -> Scenario:
    return load_scenario(SHIPPED / f"{name}.toml")


def assert_fused_is_detailed(kernel, scenario: Scenario, dcp: int, oracle: bool) -> list:
    """Launch ``scenario`` at DCP1 and ``dcp``; the fused flags and results must be the
    detailed ones. Returns the detailed results."""
    device = BACKEND.device
    act = make_activations(scenario, scenario.seed, device)
    expected = oracle_for(scenario_inputs(scenario, act))

    def launched(size: int):
        case = build_case(scenario, size, device, activations=act, expected=expected)
        return launch(kernel, case)

    baseline = launched(1)
    case = baseline if dcp == 1 else launched(dcp)
    assert case.error is None and baseline.error is None
    detailed = check_case(case.case, baseline.case, case.changes, oracle, fused=False)
    fused = check_case(case.case, baseline.case, case.changes, oracle, fused=True)
    assert fused == detailed
    failing = {r.check for r in detailed if r.findings}
    for name, flag in fused_checks.suspect_checks(case.case, baseline.case, oracle).items():
        if name == fused_checks.STRAY:
            assert flag == bool(failing & STRAY_CHECKS), (name, failing)
        else:
            assert flag == (name in failing), (name, failing)
    return detailed


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_fused_flags_are_the_detailed_checks_on_every_broken_kernel(name):
    scenario = shipped(name)
    caught = set()
    for kernel in BROKEN:
        for dcp in (1, 4):
            for oracle in (True, False):
                results = assert_fused_is_detailed(kernel, scenario, dcp, oracle)
                caught |= {r.check for r in results if r.findings}
    assert caught, "no broken kernel failed here: the comparison proved nothing"


@pytest.mark.parametrize(
    ("kernel", "scenario", "dcp", "check"),
    [
        ("regress/pre-54908", "decode-single-dcp4", 4, "ranks_agree"),
        ("mutant/negative-slot-wraps", "decode-single-dcp4", 4, "cache_foreign"),
        ("mutant/foreign-rows-write-cache", "decode-single-dcp4", 4, "prefix_intact"),
        ("mutant/block-offset-off-by-one", "decode-single-dcp4", 4, "cache_owned"),
        ("mutant/topk-fill-skipped", "decode-single-dcp4", 4, "topk"),
        ("mutant/nvfp4-scale-unpermuted", "nvfp4-ds-mla-cache", 1, "cache_owned"),
        ("mutant/index-shuffle-tile-transposed", "indexer-shuffled", 1, "cache_owned"),
        ("mutant/index-mx-scale-one-byte", "indexer-mx-scales", 1, "cache_owned"),
    ],
)
def test_the_fused_flags_are_the_detailed_checks_on_mutants(kernel, scenario, dcp, check):
    results = assert_fused_is_detailed(load_kernel(kernel), shipped(scenario), dcp, True)
    assert check in {r.check for r in results if r.findings}


def test_a_correct_kernel_is_clear_of_every_flag():
    scenario = dataclasses.replace(shipped("mixed-prefill-decode-padding"), dcp_sizes=(4,))
    device = BACKEND.device
    act = make_activations(scenario, scenario.seed, device)
    expected = oracle_for(scenario_inputs(scenario, act))
    baseline = launch(
        k.oracle_kernel, build_case(scenario, 1, device, activations=act, expected=expected)
    )
    case = launch(
        k.oracle_kernel, build_case(scenario, 4, device, activations=act, expected=expected)
    )
    flags = fused_checks.suspect_checks(case.case, baseline.case)
    assert set(flags) == set(fused_checks.FLAGS)
    assert not any(flags.values())


def test_stacked_is_a_view_of_side_by_side_buffers_and_a_copy_otherwise():
    side_by_side = torch.arange(12).reshape(3, 4)
    view = fused_checks.stacked([side_by_side[0], side_by_side[1], side_by_side[2]])
    assert view.data_ptr() == side_by_side.data_ptr() and torch.equal(view, side_by_side)
    apart = [torch.arange(4), torch.arange(4, 8)]
    copy = fused_checks.stacked(apart)
    assert copy.data_ptr() not in {t.data_ptr() for t in apart}
    assert torch.equal(copy, torch.arange(8).reshape(2, 4))
    out_of_order = fused_checks.stacked([side_by_side[1], side_by_side[0]])
    assert torch.equal(out_of_order, side_by_side[[1, 0]])


@pytest.mark.parametrize("name", ["decode-single-dcp4", "interleave-block"])
def test_every_ranks_slot_mapping_starts_on_a_16_byte_boundary(name):
    """Triton compiles another binary for a pointer off a 16-byte boundary: rows of an odd
    number of slots packed end to end would compile each scenario twice."""
    scenario = shipped(name)
    case = build_case(scenario, 4, BACKEND.device)
    assert scenario.batch.num_tokens % 2 == 1  # packed rows would put ranks 1 and 3 off
    for launch_inputs in (r.inputs for r in case.ranks):
        for mapping in (launch_inputs.slot_mapping, launch_inputs.index_slot_mapping):
            if mapping is not None:
                assert mapping.data_ptr() % 16 == 0 and mapping.is_contiguous()
                assert mapping.shape == (scenario.batch.num_tokens,)
    assert [
        torch.equal(r.inputs.slot_mapping.cpu(), case.mappings.per_rank[r.rank]) for r in case.ranks
    ] == [True] * 4
