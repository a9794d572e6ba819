"""The mutant catalog (``dcpcheck.ops.fused_norm_rope.variants.MUTANTS``) against the
harness's named scenarios.

Each mutant is run through ``runner.run`` on the one scenario expected to expose it, and
must fail there with the expected check on the expected field; the correct kernel must
pass every scenario used here, so each catch is the mutant's doing, not the harness's.
No property search: these are the fast, deterministic witnesses the selftest relies on.

Some mutants need a value regime or a shape to show, and the "invisible" tests pin that
down, so a scenario change that would hide a mutant from the selftest is noticed:
eps outside the rsqrt needs a row whose mean square is comparable to eps (``zero-rows``),
RoPE by token index needs positions that differ from row indices, the indexer's slot
mix-up needs an indexer mapped differently from the MLA cache, and 32-bit addresses need
a cache past 2^31 bytes (GPU only). The two fp8_ds_mla tile-scale mutants each write
the other rule, so each hides where the case demands the rule it writes. The three mutants
that floor a scale only for an all-zero row or tile need rows that are non-zero but below
the floor (``below-floor``): all-zero rows (``zero-rows``) are exactly where they are right.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from dcpcheck.cases.dcp import Batch, Request, slot_mappings
from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.ops.fused_norm_rope.contract import DS_MLA_ENTRY_BYTES
from dcpcheck.ops.fused_norm_rope.kernels import KERNELS, load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, Scenario, load_scenario
from dcpcheck.ops.fused_norm_rope.selftest import INT32_ADDRESS_LIMIT, address_overflow_scenario
from dcpcheck.ops.fused_norm_rope.variants import MUTANTS, REGRESSIONS
from tests.conftest import BACKEND, requires_cuda


@dataclass(frozen=True)
class Witness:
    """A scenario (shipped, optionally in another value regime) at some DCP sizes that a
    mutant must fail with ``check`` on ``field``."""

    scenario: str
    dcp: tuple[int, ...]
    check: str
    field: str
    values: str | None = None  # None: the scenario's own regime

    def build(self) -> Scenario:
        scenario = shipped(self.scenario, self.dcp)
        if self.values is not None:
            scenario = dataclasses.replace(scenario, values=self.values)
        return scenario


def shipped(name: str, dcp: tuple[int, ...]) -> Scenario:
    """The shipped scenario ``name`` at DCP sizes ``dcp`` only."""
    return dataclasses.replace(load_scenario(SCENARIOS / f"{name}.toml"), dcp_sizes=dcp)


DECODE = "decode-single-dcp4"
"""One decode token (position 37) under DCP4, after a cached prefix: three ranks own nothing."""

BELOW_FLOOR_POW2 = "below-floor-pow2-indexer"
"""``below-floor`` values on an fp8_ds_mla (``pow2``) layer with an indexer, in bf16."""

BELOW_FLOOR_NVFP4 = "below-floor-nvfp4-fp16"
"""``below-floor`` values on an nvfp4_ds_mla layer with an indexer, in fp16."""

WITNESSES: dict[str, Witness] = {
    "regress/pre-50005": Witness(DECODE, (4,), "outputs", "q_out"),
    "regress/pre-54908": Witness(DECODE, (4,), "outputs", "kv_out"),
    "mutant/foreign-rows-write-cache": Witness(DECODE, (4,), "prefix_intact", "mla_cache"),
    "mutant/negative-slot-wraps": Witness(DECODE, (4,), "cache_foreign", "mla_cache"),
    "mutant/block-offset-off-by-one": Witness(DECODE, (4,), "cache_owned", "mla_cache.kv"),
    "mutant/block-offset-swapped": Witness(DECODE, (4,), "cache_owned", "mla_cache.kv"),
    "mutant/kpe-rope-neox": Witness(DECODE, (4,), "outputs", "kpe_out"),
    "mutant/indexer-rope-flipped": Witness(DECODE, (4,), "outputs", "index_k_out"),
    "mutant/eps-outside-rsqrt": Witness(DECODE, (4,), "outputs", "q_out", values="zero-rows"),
    "mutant/norm-in-bf16": Witness("fp8-ds-mla-cache", (1,), "cache_owned", "mla_cache.scales"),
    "mutant/token-index-as-position": Witness(DECODE, (4,), "outputs", "kpe_out"),
    "mutant/ds-mla-row-scale": Witness("fp8-ds-mla-cache", (1,), "cache_owned", "mla_cache.scales"),
    "mutant/ue8m0-round-down": Witness(DECODE, (4,), "cache_owned", "index_cache.scale"),
    "mutant/topk-fill-skipped": Witness(DECODE, (4,), "topk", "topk_indices"),
    "mutant/topk-fill-on-shared-layer": Witness(
        "shared-layer-no-indexer", (1,), "topk", "topk_indices"
    ),
    "mutant/indexer-uses-mla-slots": Witness(
        "indexer-replicated", (2,), "cache_owned", "index_cache.values"
    ),
    "mutant/previous-entry-overwritten": Witness(DECODE, (4,), "prefix_intact", "mla_cache"),
    "mutant/ds-mla-scale-pow2-when-amax": Witness(
        "fp8-ds-mla-cache", (1,), "cache_owned", "mla_cache.scales"
    ),
    "mutant/ds-mla-scale-amax-when-pow2": Witness(
        "fp8-ds-mla-pow2-scale", (1,), "cache_owned", "mla_cache.scales"
    ),
    "mutant/nvfp4-nibbles-swapped": Witness(
        "nvfp4-ds-mla-cache", (1,), "cache_owned", "mla_cache.nope"
    ),
    "mutant/nvfp4-scale-unpermuted": Witness(
        "nvfp4-ds-mla-cache", (1,), "cache_owned", "mla_cache.scales"
    ),
    "mutant/nvfp4-scale-rounded-up": Witness(
        "nvfp4-ds-mla-cache", (1,), "cache_owned", "mla_cache.scales"
    ),
    "mutant/index-shuffle-tile-transposed": Witness(
        "indexer-shuffled", (1,), "cache_owned", "index_cache.values"
    ),
    "mutant/index-mx-scale-one-byte": Witness(
        "indexer-mx-scales", (1,), "cache_owned", "index_cache.scale"
    ),
    "mutant/ue8m0-floor-only-zero": Witness(
        BELOW_FLOOR_POW2, (1,), "cache_owned", "index_cache.scale"
    ),
    "mutant/ds-mla-pow2-floor-only-zero": Witness(
        BELOW_FLOOR_POW2, (1,), "cache_owned", "mla_cache.scales"
    ),
    "mutant/nvfp4-floor-only-zero": Witness(
        BELOW_FLOOR_NVFP4, (1,), "cache_owned", "mla_cache.scales"
    ),
}
"""Every mutant a CPU-sized scenario can show, with the scenario that shows it."""

GPU_SCALE = "mutant/address-32bit"


def run_kernel(name: str, scenario: Scenario) -> list[CaseResult]:
    return run(load_kernel(name), [scenario], RunConfig(name, None), BACKEND)


def failures(results: list[CaseResult]) -> set[tuple[str, str]]:
    """(check, field) of every finding of every failing case."""
    return {
        (check.check, finding.field)
        for result in results
        for check in result.failed_checks
        for finding in check.findings
    }


def assert_passes(results: list[CaseResult]) -> None:
    bad = [(r.scenario, r.dcp_size, r.error, sorted(failures([r]))) for r in results]
    assert all(r.status == "pass" for r in results), bad


# ----------------------------------------------------------------------------------------
# The catalog
# ----------------------------------------------------------------------------------------


def test_catalog_has_fourteen_or_more_distinct_registered_mutants():
    names = [m.name for m in MUTANTS]
    assert len(MUTANTS) >= 14
    assert len(set(names)) == len(names)
    assert len({m.description for m in MUTANTS}) == len(MUTANTS)
    assert all(m.description.strip() and "\n" not in m.description for m in MUTANTS)
    assert all(m.edits for m in MUTANTS)
    assert all(name.startswith(("mutant/", "regress/")) for name in names)
    assert set(REGRESSIONS) <= set(MUTANTS)
    assert all(name in KERNELS for name in names)


def test_the_shipped_kernel_holds_no_mutant_and_every_edit_applies_once():
    """The catalogue lives in ``variants`` as edits: the kernel's files carry no trace of
    it, and each edit still finds its text exactly once in its function."""
    from pathlib import Path

    from dcpcheck.ops.fused_norm_rope import variant_build
    from dcpcheck.ops.fused_norm_rope.variants import EDITABLE_FILES

    here = Path(variant_build.__file__).parent
    for file in EDITABLE_FILES:
        assert "MUTATION" not in (here / file).read_text(), file
    for mutant in MUTANTS:
        edited = variant_build.edited_sources(mutant)
        assert edited and all(text != (here / f).read_text() for f, text in edited.items())


def test_an_edit_that_no_longer_applies_is_an_error_naming_it():
    from dcpcheck.ops.fused_norm_rope import variant_build
    from dcpcheck.ops.fused_norm_rope.variants import KernelVariant, SourceEdit

    stale = KernelVariant("mutant/stale", "d", (SourceEdit("kernel.py", "_rms_norm", "xyz", "w"),))
    with pytest.raises(variant_build.VariantError, match=r"mutant/stale: kernel\.py, _rms_norm"):
        variant_build.edited_sources(stale)
    twice = KernelVariant("mutant/twice", "d", (SourceEdit("kernel.py", "_rms_norm", "x", "y"),))
    with pytest.raises(variant_build.VariantError, match="times, not once"):
        variant_build.edited_sources(twice)


def test_every_mutant_has_a_witness_or_is_the_gpu_scale_one():
    assert set(WITNESSES) | {GPU_SCALE} == {m.name for m in MUTANTS}


# ----------------------------------------------------------------------------------------
# Each mutant caught by the expected check
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WITNESSES))
def test_mutant_fails_the_expected_check(name):
    witness = WITNESSES[name]
    results = run_kernel(name, witness.build())
    assert any(r.status == "fail" for r in results), f"{name} passed {witness.scenario}"
    assert (witness.check, witness.field) in failures(results), sorted(failures(results))


@pytest.mark.parametrize(
    "witness",
    sorted(set(WITNESSES.values()), key=repr),
    ids=lambda w: f"{w.scenario}-{w.values or 'own-values'}-dcp{w.dcp}",
)
def test_correct_kernel_passes_every_witness(witness):
    assert_passes(run_kernel("default", witness.build()))


def test_indexer_rope_flip_is_caught_in_both_directions():
    """NeoX for the interleaved (GLM) preset too, not only interleaved for the NeoX one."""
    scenario = shipped("fp16-interleaved-indexer", (1,))
    assert scenario.model.index_rope_interleaved
    results = run_kernel("mutant/indexer-rope-flipped", scenario)
    assert ("outputs", "index_k_out") in failures(results)


# ----------------------------------------------------------------------------------------
# Where each subtle mutant hides (why the witnesses are what they are)
# ----------------------------------------------------------------------------------------


def in_zero_rows(name: str) -> Scenario:
    """The shipped scenario ``name`` at DCP 1 and 2, its values ``zero-rows``."""
    return dataclasses.replace(shipped(name, (1, 2)), values="zero-rows")


HIDING_PLACES = {
    "mutant/eps-outside-rsqrt": shipped(DECODE, (4,)),
    "mutant/token-index-as-position": dataclasses.replace(
        shipped(DECODE, (2,)), batch=Batch((Request(prefix=0, new=5),))
    ),
    "mutant/indexer-uses-mla-slots": shipped("indexer-sharded", (2,)),
    "mutant/topk-fill-on-shared-layer": shipped(DECODE, (4,)),
    "mutant/ds-mla-row-scale": shipped("fp8-cache", (1,)),
    "mutant/ds-mla-scale-pow2-when-amax": shipped("fp8-ds-mla-pow2-scale", (1, 4)),
    "mutant/ds-mla-scale-amax-when-pow2": shipped("fp8-ds-mla-cache", (1, 4)),
    GPU_SCALE: shipped(DECODE, (4,)),
    "mutant/ue8m0-floor-only-zero": in_zero_rows(BELOW_FLOOR_POW2),
    "mutant/ds-mla-pow2-floor-only-zero": in_zero_rows(BELOW_FLOOR_POW2),
    "mutant/nvfp4-floor-only-zero": in_zero_rows(BELOW_FLOOR_NVFP4),
}
"""A scenario each mutant passes: normal values (mean square ~1 >> eps), a fresh prefill
(positions 0..4 equal the row indices), an indexer sharded like the MLA cache, an indexer
layer, a per-tensor fp8 cache, fp8_ds_mla cases that demand the tile-scale rule the
mutant writes anyway, a cache far below 2^31 bytes, and the floors' own scenarios with
their tiny rows all zero instead (``zero-rows``: every scale there is the floor's, which a
kernel that floors only an amax of 0 writes too)."""


@pytest.mark.parametrize("name", sorted(HIDING_PLACES))
def test_mutant_is_invisible_where_its_regime_is_missing(name):
    assert_passes(run_kernel(name, HIDING_PLACES[name]))


# ----------------------------------------------------------------------------------------
# The GPU-sized case for 32-bit address arithmetic
# ----------------------------------------------------------------------------------------


def test_address_overflow_case_writes_past_two_gigabytes_with_a_bounded_cache():
    """Every new token's entry starts past byte 2^31 at every DCP size of the case, while
    the cache stays one block table entry past that mark (so the GPU run stays ~2 GB per
    cache copy)."""
    scenario = address_overflow_scenario()
    for dcp_size in scenario.dcp_sizes:
        tables = scenario.block_tables(dcp_size)
        slots = slot_mappings(scenario.batch, scenario.layout(dcp_size), tables).per_rank
        owned = slots[slots >= 0]
        assert int(owned.min()) * DS_MLA_ENTRY_BYTES >= INT32_ADDRESS_LIMIT
        cache_bytes = (max(max(t) for t in tables) + 1) * scenario.block_size * DS_MLA_ENTRY_BYTES
        assert INT32_ADDRESS_LIMIT < cache_bytes < INT32_ADDRESS_LIMIT + 2**24


@requires_cuda
def test_address_32bit_mutant_is_caught_on_a_gpu_sized_cache():
    scenario = address_overflow_scenario()
    assert_passes(run_kernel("default", scenario))
    assert ("cache_owned", "mla_cache.nope") in failures(run_kernel(GPU_SCALE, scenario))
