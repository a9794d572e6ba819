"""Scenario strategies (dcpcheck.ops.fused_norm_rope.strategies) and the value regimes they
draw (case.py).

Every drawn scenario is checked against the ownership partition of docs/dcp-contract.md, computed by
``dcp.slot_mappings`` at each DCP size it runs (and the DCP1 baseline): every real token
owned by exactly one rank, padding by none, no two tokens on one slot of a rank. The named
shapes are checked by counting owned tokens per rank, shrinking by asking Hypothesis for
the minimal example, and the value regimes by what the oracle computes from them.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.strategies import SearchStrategy

import reference
from dcpcheck.cases import limits
from dcpcheck.cases.dcp import NO_SLOT, Batch, Request, SlotMappings, num_blocks, slot_mappings
from dcpcheck.ops.fused_norm_rope import strategies
from dcpcheck.ops.fused_norm_rope.case import make_activations, oracle_for, scenario_inputs
from dcpcheck.ops.fused_norm_rope.contract import (
    DS_MLA_SCALES_OFFSET,
    DS_MLA_TILE,
    FP8_E4M3_MAX,
    NVFP4_DS_MLA_ROPE_OFFSET,
    NVFP4_DS_MLA_SCALES_OFFSET,
    NVFP4_DS_MLA_TILE,
    NVFP4_SCALE_FLOOR,
    UE8M0_AMAX_FLOOR,
    CacheLayout,
    DsMlaScale,
    IndexFormat,
    IndexScale,
)
from dcpcheck.ops.fused_norm_rope.scenario import Scenario, load_scenario, scenario_to_toml
from dcpcheck.ops.fused_norm_rope.strategies import (
    FP8_SCALES,
    SearchSpace,
    all_negative_ranks,
    mixed_ownership,
    prefix_cached,
    scenarios,
)

SPACE = SearchSpace(max_tokens=8, max_requests=3)

drawn = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def mappings(scenario: Scenario, dcp_size: int) -> SlotMappings:
    return slot_mappings(scenario.batch, scenario.layout(dcp_size), scenario.block_tables(dcp_size))


def owned_counts(scenario: Scenario, dcp_size: int) -> list[int]:
    """Real tokens each rank owns (has a slot >= 0 for)."""
    m = mappings(scenario, dcp_size)
    real = m.owner >= 0
    return [int(((m.per_rank[rank] >= 0) & real).sum()) for rank in range(dcp_size)]


def assert_ownership_partition(scenario: Scenario, dcp_size: int) -> None:
    m = mappings(scenario, dcp_size)
    real = m.owner >= 0
    holders = (m.per_rank >= 0).sum(dim=0)
    assert torch.equal(holders[real], torch.ones_like(holders[real])), "real token not owned once"
    assert torch.equal(holders[~real], torch.zeros_like(holders[~real])), "padding row owned"
    for rank in range(dcp_size):
        owned = m.per_rank[rank] >= 0
        assert torch.equal(m.owner[owned], torch.full_like(m.owner[owned], rank))
        slots = torch.cat([m.per_rank[rank][owned], m.prefix_per_rank[rank]])
        slots = slots[slots != NO_SLOT]
        assert slots.unique().numel() == slots.numel(), "two tokens on one slot"
        capacity = num_blocks(scenario.block_tables(dcp_size)) * scenario.block_size
        assert bool((slots < capacity).all())
    prefix_holders = (m.prefix_per_rank >= 0).sum(dim=0)
    assert torch.equal(prefix_holders, torch.ones_like(prefix_holders))


def minimal(
    strategy: SearchStrategy[Scenario], holds=lambda scenario: True, search_seed: int = 0
) -> Scenario:
    """Hypothesis's shrunk example of ``strategy`` among those where ``holds`` is true, from
    the examples ``search_seed`` generates."""

    class Found(Exception):
        pass

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )
    @seed(search_seed)
    @given(strategy)
    def search(scenario: Scenario) -> None:
        if holds(scenario):
            raise Found(scenario)

    with pytest.raises(Found) as found:
        search()
    return found.value.args[0]


# ---------------------------------------------------------------------------------------
# Every drawn scenario is a valid, replayable batch


@drawn
@given(scenarios(SPACE))
def test_drawn_scenarios_are_valid_batches_whose_ownership_partitions_tokens(
    scenario: Scenario,
) -> None:
    batch = scenario.batch
    assert 1 <= len(batch.requests) <= SPACE.max_requests
    assert batch.num_tokens <= SPACE.max_tokens
    assert scenario.preset in SPACE.presets
    assert scenario.block_size % scenario.interleave == 0
    assert all(r.length <= scenario.model.max_position for r in batch.requests)
    for dcp_size in {1, *scenario.dcp_sizes}:
        assert_ownership_partition(scenario, dcp_size)


@drawn
@given(scenarios(SPACE))
def test_drawn_scenarios_round_trip_through_toml(scenario: Scenario) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"{scenario.name}.toml"
        path.write_text(scenario_to_toml(scenario), encoding="utf-8")
        assert load_scenario(path) == scenario


@drawn
@given(scenarios(SearchSpace(max_tokens=4, dcp_sizes=(1, 4))))
def test_dcp_sizes_fixed_by_the_command_line_are_kept(scenario: Scenario) -> None:
    assert scenario.dcp_sizes == (1, 4)
    assert_ownership_partition(scenario, 4)


def test_a_space_with_dcp1_only_has_no_all_negative_shape() -> None:
    dcp1 = SearchSpace(dcp_sizes=(1,))
    with pytest.raises(ValueError, match="no rank can own nothing"):
        all_negative_ranks(dcp1)
    assert minimal(scenarios(dcp1)).dcp_sizes == (1,)


# ---------------------------------------------------------------------------------------
# The named shapes are what they say


@drawn
@given(all_negative_ranks(SPACE))
def test_all_negative_ranks_leave_some_rank_without_a_token(scenario: Scenario) -> None:
    largest = max(scenario.dcp_sizes)
    assert largest >= 2
    assert 0 in owned_counts(scenario, largest)


@drawn
@given(mixed_ownership(SPACE))
def test_mixed_ownership_gives_some_rank_some_but_not_all_tokens(scenario: Scenario) -> None:
    real = scenario.batch.num_real_tokens
    for dcp_size in scenario.dcp_sizes:
        assert dcp_size >= 2
        assert any(0 < owned < real for owned in owned_counts(scenario, dcp_size))


@drawn
@given(prefix_cached(SPACE))
def test_prefix_cached_gives_every_request_a_cached_prefix(scenario: Scenario) -> None:
    assert all(r.prefix >= 1 for r in scenario.batch.requests)
    m = mappings(scenario, scenario.dcp_sizes[0])
    assert m.prefix_owner.numel() == scenario.batch.num_prefix_tokens
    assert int(m.positions[m.owner >= 0].min()) >= 1  # no real token at position 0


def test_the_search_visits_every_ownership_shape_and_value_regime() -> None:
    seen_shapes, seen_regimes = set(), set()

    @drawn
    @given(scenarios(SPACE))
    def record(scenario: Scenario) -> None:
        seen_regimes.add(scenario.values)
        for dcp_size in scenario.dcp_sizes:
            real = scenario.batch.num_real_tokens
            for owned in owned_counts(scenario, dcp_size):
                seen_shapes.add("none" if owned == 0 else "all" if owned == real else "some")

    record()
    assert seen_shapes == {"none", "some", "all"}
    assert seen_regimes == {"normal", "zero-rows", "fp8-saturating", "exact-ties", "below-floor"}


# ---------------------------------------------------------------------------------------
# Shrinking lands on the simplest meaningful case

SIMPLEST = Scenario(
    name=strategies.GENERATED_NAME,
    description=strategies.GENERATED_DESCRIPTION,
    preset="small-neox",
    dtype="bfloat16",
    cache_layout=CacheLayout.AUTO,
    mla_scale=None,
    indexer="sharded",
    block_size=16,
    interleave=1,
    dcp_sizes=(2,),
    seed=0,
    block_table="identity",
    profiling=False,
    batch=Batch((Request(prefix=1, new=1),)),
    values="normal",
)


def test_the_minimal_scenario_is_one_decode_token_that_one_rank_does_not_own() -> None:
    shrunk = minimal(scenarios(SPACE))
    assert shrunk == SIMPLEST
    assert owned_counts(shrunk, 2) == [0, 1]  # position 1: rank 1 owns it, rank 0 nothing


@pytest.mark.parametrize("search_seed", range(4))
def test_shrinking_keeps_what_the_failure_needs_and_drops_the_rest(search_seed: int) -> None:
    """A "bug" needing a padding row and the ds_mla layout shrinks to exactly that, whichever
    examples the search happened to start from: every draw takes as many choices whatever
    the values before it (``strategies.index_formats``), so no other block size or indexer
    mode is simpler to Hypothesis than the simplest one."""

    def needs(scenario: Scenario) -> bool:
        return scenario.batch.padding > 0 and scenario.cache_layout is CacheLayout.FP8_DS_MLA

    shrunk = minimal(scenarios(SPACE), needs, search_seed)
    assert shrunk == dataclasses.replace(
        SIMPLEST, cache_layout=CacheLayout.FP8_DS_MLA, batch=Batch(SIMPLEST.batch.requests, 1)
    )


def test_the_search_draws_caches_whose_blocks_lie_apart() -> None:
    """A block-outermost layout's gap is drawn, and a failure needing one shrinks to the
    minimal scenario with that gap alone (blocks back to back otherwise)."""
    assert SIMPLEST.block_gap == 0
    apart = minimal(scenarios(SPACE), lambda s: s.block_gap > 0)
    assert apart == dataclasses.replace(SIMPLEST, block_gap=max(strategies.BLOCK_GAPS))
    assert all(g % limits.BLOCK_GAP_ALIGNMENT == 0 for g in strategies.BLOCK_GAPS)
    assert max(strategies.BLOCK_GAPS) <= limits.BLOCK_GAP_MAX


def test_the_search_reaches_the_newer_cache_formats() -> None:
    """Each of the newer cache formats is drawn, and a failure needing one shrinks to it alone
    (the plain fp32 indexer of the minimal scenario otherwise)."""
    assert SIMPLEST.index_format == IndexFormat()
    nvfp4 = minimal(scenarios(SPACE), lambda s: s.cache_layout is CacheLayout.NVFP4_DS_MLA)
    assert (nvfp4.cache_layout, nvfp4.index_format) == (CacheLayout.NVFP4_DS_MLA, IndexFormat())
    shuffled = minimal(scenarios(SPACE), lambda s: s.index_format.shuffled)
    assert shuffled.index_format == IndexFormat(True, IndexScale.FP32)
    assert shuffled.block_size % 16 == 0
    mx = minimal(scenarios(SPACE), lambda s: s.index_format.scale is IndexScale.MX)
    assert mx.index_format == IndexFormat(False, IndexScale.MX) and mx.has_indexer


def test_named_shapes_shrink_to_their_simplest_instance() -> None:
    fixed = SearchSpace(dcp_sizes=(4,))
    assert minimal(all_negative_ranks(fixed)).batch == Batch((Request(prefix=1, new=1),))
    mixed = minimal(mixed_ownership(SPACE))
    assert (mixed.dcp_sizes, mixed.interleave) == ((2,), 1)
    assert mixed.batch == Batch((Request(prefix=1, new=2),))


# ---------------------------------------------------------------------------------------
# Value regimes (case.make_activations) do what they claim


def regime(values: str, **changes) -> Scenario:
    """Three tokens and a padding row in ``values``, indexer on."""
    batch = Batch((Request(prefix=5, new=3),), padding=1)
    return dataclasses.replace(SIMPLEST, values=values, batch=batch, **changes)


def oracle(scenario: Scenario, act):
    """The oracle on a scenario's activations."""
    return oracle_for(scenario_inputs(scenario, act))


def test_zero_rows_are_zero_and_normalize_to_zero() -> None:
    scenario = regime("zero-rows")
    act = make_activations(scenario, 0, torch.device("cpu"))
    for rows in (act.q_c, act.kv_c, act.index_k):
        assert bool((rows[0::2] == 0).all())
        assert bool((rows[1::2] != 0).any(dim=1).all())
    ref = oracle(scenario, act)
    for out in (ref.q_out, ref.kv_out):
        assert bool((out[0::2] == 0).all())  # eps keeps 0 * rsqrt(0 + eps) finite
        assert bool(out.isfinite().all())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp8_saturating_values_exceed_the_fp8_range_of_every_drawn_scale(dtype: str) -> None:
    scale = max(FP8_SCALES)
    scenario = regime("fp8-saturating", dtype=dtype, cache_layout=CacheLayout.FP8, mla_scale=scale)
    act = make_activations(scenario, 0, torch.device("cpu"))
    ref = oracle(scenario, act)
    for out in (ref.kv_out, ref.kpe_out):
        assert bool(out.isfinite().all())  # fp16 included: the gain stays below 65504
        assert bool((out.float().abs().amax(dim=1) > FP8_E4M3_MAX * scale).all())
    # Every token's fp8 entry holds saturated bytes: +-448 is 0x7E / 0xFE in e4m3.
    saturated = (ref.mla_entries & 0x7F) == 0x7E
    assert bool(saturated.any(dim=1).all())


def in_half_steps(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (fp32) in units of half a ``dtype`` step at their own magnitude: an odd
    result is a value exactly halfway between two representable ones (a tie)."""
    fraction_bits = -int(math.log2(torch.finfo(dtype).eps))
    _, exponent = torch.frexp(values.double())
    half_step = torch.ldexp(
        torch.ones_like(values, dtype=torch.float64), exponent - 2 - fraction_bits
    )
    return values.double() / half_step


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_exact_ties_land_norm_outputs_exactly_on_rounding_ties(dtype: torch.dtype) -> None:
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    scenario = regime("exact-ties", dtype=name)
    act = make_activations(scenario, 3, torch.device("cpu"))
    for rows in (act.q_c, act.kv_c, act.index_k):
        assert bool((rows.float().mean(dim=1) == 0).all())
        assert bool((rows.float().square().mean(dim=1) == 64).all())  # rsqrt is exactly 1/8
    q32 = reference.rms_norm(act.q_c, act.q_weight, scenario.model.eps)
    units = in_half_steps(q32, dtype)
    assert bool((units == units.round()).all())  # exact in fp32: no bits below half a step
    ties = units.remainder(2) == 1
    assert ties.float().mean(dim=1).tolist() == [3 / 8] * q32.shape[0]


def test_exact_ties_separate_rounding_to_nearest_even_from_truncation() -> None:
    """The interpreter's fp32->bf16 truncation (tests/vectors/README.md) and the GPU's
    round-to-nearest-even disagree by one step on the tie lanes whose lower neighbour is odd:
    the regime makes that one-step allowance (tolerances.OUTPUT) carry real weight."""
    scenario = regime("exact-ties")
    act = make_activations(scenario, 3, torch.device("cpu"))
    q32 = reference.rms_norm(act.q_c, act.q_weight, scenario.model.eps)
    bf16_low_bits = 0xFFFF  # fp32 bits below bf16's 7 fraction bits
    truncated = (q32.view(torch.int32) & ~bf16_low_bits).view(torch.float32)
    nearest_even = q32.to(torch.bfloat16).float()
    differs = (nearest_even != truncated).float().mean().item()
    assert 0.1 < differs < 3 / 8


def tile_amax(rows: torch.Tensor, width: int) -> torch.Tensor:
    """``[T, tiles]``: the largest magnitude of each ``width``-lane tile of each row."""
    return rows.abs().view(rows.shape[0], -1, width).amax(dim=-1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_below_floor_rows_are_non_zero_and_below_every_scale_floor(dtype: str) -> None:
    """Rows 0 and 2 are tiny, never zero, and their quantized tiles sit under each layout's
    floor, by enough that an unfloored scale would differ from the floor's; rows 1 and 3
    stay above every floor. The stored scales of the tiny rows are the floors', their codes
    not all zero (a zero row's are)."""
    scenario = regime(
        "below-floor",
        dtype=dtype,
        cache_layout=CacheLayout.FP8_DS_MLA,
        ds_mla_scale=DsMlaScale.POW2,
    )
    for seed_value in range(4):
        act = make_activations(scenario, seed_value, torch.device("cpu"))
        for rows in (act.q_c, act.kv_c, act.index_k):
            assert bool((rows[0::2] != 0).all())  # every lane: fp16's subnormals hold them
            assert float(rows[0::2].float().abs().max()) <= 3 * 2**-23
        ref = oracle(scenario, act)
        tiny, usual = slice(0, None, 2), slice(1, None, 2)
        ds_mla = tile_amax(ref.kv_fp32[tiny], DS_MLA_TILE)
        assert bool((ds_mla > 0).all()) and bool((ds_mla / FP8_E4M3_MAX < 2**-14).all())
        nvfp4 = tile_amax(ref.kv_fp32[tiny], NVFP4_DS_MLA_TILE)
        assert bool((nvfp4 > 0).all()) and bool((nvfp4 / 6 < 2**-10).all())
        index = ref.index_k_fp32[tiny].abs().amax(dim=1)
        assert bool((index > 0).all()) and bool((index < FP8_E4M3_MAX * 2**-23).all())
        assert bool((tile_amax(ref.kv_fp32[usual], DS_MLA_TILE) > FP8_E4M3_MAX * 1e-4).all())
        assert bool((tile_amax(ref.kv_fp32[usual], NVFP4_DS_MLA_TILE) > 6 * 2**-9).all())
        assert bool((ref.index_k_fp32[usual].abs().amax(dim=1) > UE8M0_AMAX_FLOOR).all())
        # The tiny rows' scales are the floors', their codes not all zero.
        assert ref.index_scales[tiny].tolist() == [2.0**-22] * 2
        assert bool(((ref.index_values[tiny] & 0x7F) != 0).any(dim=1).all())
        entries = ref.mla_entries[tiny]
        scales = entries[:, DS_MLA_SCALES_OFFSET : DS_MLA_SCALES_OFFSET + 16].contiguous()
        assert bool((scales.view(torch.float32) == 2.0**-13).all())
        nope = (entries[:, :DS_MLA_SCALES_OFFSET] & 0x7F).view(-1, 4, DS_MLA_TILE)
        assert bool((nope != 0).any(dim=2).all())  # every tile holds non-zero codes


def test_below_floor_nvfp4_tiles_store_the_floor_scale() -> None:
    """On an nvfp4_ds_mla layer every tile of a tiny row stores e4m3 byte 0x01 (2^-9), the
    byte the floor gives; e4m3 of its unfloored ``amax / 6`` would be 0x00."""
    scenario = regime("below-floor", dtype="float16", cache_layout=CacheLayout.NVFP4_DS_MLA)
    act = make_activations(scenario, 0, torch.device("cpu"))
    ref = oracle(scenario, act)
    assert reference.fp8_e4m3_values(torch.tensor([1], dtype=torch.uint8)).item() == (
        NVFP4_SCALE_FLOOR
    )
    scales = ref.mla_entries[:, NVFP4_DS_MLA_SCALES_OFFSET:]
    assert bool((scales[0::2] == 1).all())
    assert bool((scales[1::2] > 1).all())
    nope = ref.mla_entries[0::2, :NVFP4_DS_MLA_ROPE_OFFSET]
    assert bool((nope != 0).any(dim=1).all())


def test_the_search_reaches_below_floor_rows_that_catch_a_zero_only_floor() -> None:
    """Drawn on an indexer layer, the regime shrinks to one tiny decode token, which the
    correct kernel passes and a kernel that floors the indexer's UE8M0 amax only when it is
    0 fails."""
    from dcpcheck.cases.verdicts import RunConfig
    from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
    from dcpcheck.ops.fused_norm_rope.runner import run
    from tests.conftest import BACKEND

    shrunk = minimal(scenarios(SPACE), lambda s: s.values == "below-floor" and s.has_indexer)
    assert shrunk.batch.num_tokens == 1  # row 0: tiny

    def results(name: str):
        return run(load_kernel(name), [shrunk], RunConfig(name, None), BACKEND)

    assert all(r.status == "pass" for r in results("default"))
    found = {
        (check.check, finding.field)
        for result in results("mutant/ue8m0-floor-only-zero")
        for check in result.failed_checks
        for finding in check.findings
    }
    assert ("cache_owned", "index_cache.scale") in found


# ---------------------------------------------------------------------------------------
# Examples: several scenarios launched as one

BATCHED = dataclasses.replace(SPACE, max_batched=6)


@drawn
@given(strategies.examples(BATCHED))
def test_an_examples_members_differ_only_in_their_batches(members: tuple[Scenario, ...]) -> None:
    assert 1 <= len(members) <= BATCHED.max_batched
    first = members[0]
    for member in members:
        assert dataclasses.replace(member, batch=first.batch) == first
        assert member.batch.num_tokens <= BATCHED.max_tokens  # each as large as one scenario


@drawn
@given(strategies.examples(BATCHED))
def test_batched_members_keep_each_tokens_owner_and_position(
    members: tuple[Scenario, ...],
) -> None:
    merged = strategies.batched(members)
    for dcp_size in {1, *merged.dcp_sizes}:
        assert_ownership_partition(merged, dcp_size)
        whole = mappings(merged, dcp_size)
        row = 0
        for member in members:
            alone = mappings(member, dcp_size)
            real = member.batch.num_real_tokens
            assert torch.equal(whole.owner[row : row + real], alone.owner[:real])
            assert torch.equal(whole.positions[row : row + real], alone.positions[:real])
            row += real
    assert merged.batch.padding == sum(m.batch.padding for m in members)


@drawn
@given(strategies._members(BATCHED, strategies.ALL_NEGATIVE))
def test_an_all_negative_example_is_one_scenario_and_keeps_its_empty_rank(
    members: tuple[Scenario, ...],
) -> None:
    """Beside other members, the rank that owns none of its tokens could own theirs."""
    [scenario] = members
    assert 0 in owned_counts(scenario, max(scenario.dcp_sizes))


def test_an_example_shrinks_to_the_minimal_scenario_alone() -> None:
    assert minimal(strategies.examples(BATCHED)) == (SIMPLEST,)


def test_a_needed_member_count_shrinks_to_exactly_that_count() -> None:
    two = minimal(strategies.examples(BATCHED), lambda members: len(members) >= 2)
    assert len(two) == 2
    assert all(m.batch == Batch((Request(prefix=1, new=2),)) for m in two)  # mixed, minimal


def test_batched_refuses_members_that_differ_beyond_their_batches() -> None:
    other = dataclasses.replace(SIMPLEST, seed=1)
    with pytest.raises(ValueError, match="differs from"):
        strategies.batched((SIMPLEST, other))
    assert strategies.batched((SIMPLEST,)) is SIMPLEST


def test_an_examples_cached_tokens_stay_within_the_budget(monkeypatch) -> None:
    """Many members with long prefixes would hold ~45k cached tokens on average (32 x ~1.4k);
    the example keeps the members that fit the budget (here the largest single scenario's,
    3 requests x 4,096 positions)."""
    monkeypatch.setattr(strategies, "EXAMPLE_CONTEXT_TOKENS", 1)
    space = dataclasses.replace(BATCHED, max_batched=32)
    budget = space.max_requests * 4096
    seen: list[int] = []

    @drawn
    @given(strategies.examples(space))
    def within(members: tuple[Scenario, ...]) -> None:
        merged = strategies.batched(members)
        assert merged.model.max_position == 4096
        seen.append(merged.batch.num_prefix_tokens + merged.batch.num_real_tokens)
        assert seen[-1] <= budget

    within()
    assert max(seen) > budget // 2  # the budget, not chance, is what bounded them
