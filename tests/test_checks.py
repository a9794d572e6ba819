"""Each contract check fails on a kernel built to break it, and passes on a correct one,
with the oracle and without it (``--oracle off``: judged against the kernel's own DCP1 run).

The kernels come from ``tests/kernels_under_test.py`` (oracle-backed, so these run fast
on the CPU); the Triton kernel's own runs are in ``test_run_cli.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dcpcheck.backend import current_backend
from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.ops.fused_norm_rope.activation_rows import INDEXER_WEIGHT_COLUMNS
from dcpcheck.ops.fused_norm_rope.case import build_case
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import load_scenario, load_scenarios
from tests import kernels_under_test as k

SCENARIO = """
name = "{name}"
description = "harness self-test"
preset = "small-neox"
dtype = "bfloat16"
cache_layout = "{layout}"
{scale}
indexer = "{indexer}"
block_size = 4
block_gap = {gap}
interleave = 1
dcp = [1, 4]
seed = 3
block_table = "shuffled"
profiling = {profiling}
padding = 2

[[requests]]
prefix = 5
new = 6

[[requests]]
prefix = 9
new = 1
"""


def make_scenario(
    tmp_path: Path, *, layout="auto", indexer="sharded", profiling=False, block_gap=0
):
    name = f"selftest-{layout}-{indexer}-{'prof' if profiling else 'run'}-{block_gap}"
    name = name.replace("_", "-")
    scale = "mla_scale = 0.3" if layout == "fp8" else ""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        SCENARIO.format(
            name=name,
            layout=layout,
            scale=scale,
            indexer=indexer,
            profiling=str(profiling).lower(),
            gap=block_gap,
        )
    )
    return load_scenario(path)


def run_one(kernel, scenario, dcp=(4,), oracle=True) -> list[CaseResult]:
    return run(kernel, [scenario], RunConfig("test", dcp, oracle=oracle), current_backend())


@pytest.fixture(params=[True, False], ids=["oracle-on", "oracle-off"])
def oracle(request) -> bool:
    """Every check of a faulty kernel must fire whether or not the oracle judges."""
    return request.param


def failing(results: list[CaseResult]) -> dict[str, set[str]]:
    """check name -> fields that failed, over all results."""
    found: dict[str, set[str]] = {}
    for r in results:
        for c in r.failed_checks:
            found.setdefault(c.check, set()).update(f.field for f in c.findings)
    return found


@pytest.mark.parametrize("layout", ["auto", "fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("indexer", ["sharded", "replicated", "none"])
def test_correct_kernel_passes_every_check(tmp_path, layout, indexer, oracle):
    results = run_one(
        k.oracle_kernel,
        make_scenario(tmp_path, layout=layout, indexer=indexer),
        dcp=(1, 2, 4),
        oracle=oracle,
    )
    assert [r.status for r in results] == ["pass"] * 3, failing(results)
    dcp4 = results[-1]
    ran = {c.check for c in dcp4.checks if c.skipped is None}
    expected = {
        "outputs",
        "topk",
        "cache_owned",
        "cache_foreign",
        "prefix_intact",
        "padding_inert",
        "guard_bands",
        "inputs_unmodified",
        "ranks_agree",
        "shards_reassemble",
    }
    assert expected <= ran
    replaced = {c.check for c in dcp4.checks if c.without_oracle}
    assert replaced == (set() if oracle else {"outputs", "cache_owned"})


def test_profiling_call_passes_and_checks_no_write(tmp_path, oracle):
    results = run_one(k.oracle_kernel, make_scenario(tmp_path, profiling=True), oracle=oracle)
    assert results[0].status == "pass"
    assert "profiling_no_write" in {c.check for c in results[0].checks if c.passed}


def test_profiling_call_that_writes_fails(tmp_path, oracle):
    def writes_anyway(inputs, outputs, caches):
        k.oracle_kernel(inputs, outputs, caches)
        caches.mla[0, 0, 0] ^= 0xFF

    results = run_one(writes_anyway, make_scenario(tmp_path, profiling=True), oracle=oracle)
    assert "profiling_no_write" in failing(results)


def test_foreign_write_is_caught(tmp_path, oracle):
    found = failing(run_one(k.writes_foreign_token, make_scenario(tmp_path), oracle=oracle))
    assert found.get("cache_foreign") == {"mla_cache"}, found


def test_guard_block_write_is_caught(tmp_path, oracle):
    found = failing(run_one(k.writes_guard_block, make_scenario(tmp_path), oracle=oracle))
    assert set(found) == {"guard_bands"}, found


@pytest.mark.parametrize(
    ("kernel", "cache"),
    [
        (k.mla_blocks_as_if_contiguous, "mla_cache"),
        (k.index_blocks_as_if_contiguous, "index_cache"),
    ],
)
def test_blocks_addressed_as_if_contiguous_are_caught(tmp_path, oracle, kernel, cache):
    """A cache whose blocks lie apart (``block_gap``) is addressed by its ``stride(0)``: a
    kernel that takes ``block_size * entry`` writes its owned entries into the wrong block
    and into the gaps. Without a gap the same kernel is right, and passes."""
    found = failing(run_one(kernel, make_scenario(tmp_path, block_gap=48), oracle=oracle))
    assert found, found
    assert all(f.startswith(cache) for fields in found.values() for f in fields), found
    assert failing(run_one(kernel, make_scenario(tmp_path), oracle=oracle)) == {}


def test_a_write_between_blocks_is_a_guard_band_write(tmp_path, oracle):
    found = failing(
        run_one(k.writes_between_blocks, make_scenario(tmp_path, block_gap=48), oracle=oracle)
    )
    assert found == {"guard_bands": {"mla_cache"}}, found


def test_a_correct_kernel_passes_with_blocks_apart(tmp_path, oracle):
    results = run_one(k.oracle_kernel, make_scenario(tmp_path, block_gap=48), (1, 2, 4), oracle)
    assert [r.status for r in results] == ["pass"] * 3, failing(results)


def test_one_rank_differing_is_caught(tmp_path, oracle):
    k.reset_call_count()
    results = run_one(k.one_rank_differs, make_scenario(tmp_path), oracle=oracle)
    found = failing(results)
    assert set(found) == {"ranks_agree"}, found
    finding = next(c for c in results[0].failed_checks).findings[0]
    assert (finding.field, finding.rank) == ("q_out", 1)


def test_padding_row_write_is_caught(tmp_path, oracle):
    found = failing(run_one(k.writes_padding_row, make_scenario(tmp_path), oracle=oracle))
    assert "padding_inert" in found, found


def test_prefix_overwrite_is_caught(tmp_path, oracle):
    scenario = make_scenario(tmp_path, indexer="none")
    found = failing(run_one(k.overwrites_prefix, scenario, oracle=oracle))
    assert "prefix_intact" in found, found


def test_modified_input_is_caught(tmp_path, oracle):
    found = failing(run_one(k.modifies_input, make_scenario(tmp_path), oracle=oracle))
    assert found.get("inputs_unmodified") == {"kv_c"}, found


def test_skipped_foreign_outputs_name_field_rank_and_ownership(tmp_path, oracle):
    results = run_one(k.skips_foreign_kv, make_scenario(tmp_path), dcp=(1, 4), oracle=oracle)
    dcp1, dcp4 = results
    assert dcp1.status == "pass"
    outputs = next(c for c in dcp4.failed_checks if c.check == "outputs")
    assert {f.field for f in outputs.findings} == {"kv_out", "kpe_out"}
    assert {f.ownership for f in outputs.findings} == {"foreign"}
    assert all(f.max_error == "NaN (unwritten)" for f in outputs.findings)


def test_kernel_exception_is_a_case_error_not_a_crash(tmp_path):
    results = run_one(k.raises, make_scenario(tmp_path))
    assert results[0].status == "error"
    assert "kernel exploded" in results[0].error


# ---------------------------------------------------------------------------------------
# Without the oracle: what the DCP1 run alone can say, and what it must not say


def test_without_the_oracle_an_unwritten_output_row_is_found_at_dcp1(tmp_path):
    results = run_one(k.skips_q_out_row_zero, make_scenario(tmp_path), dcp=(1, 4), oracle=False)
    for result in results:  # DCP1 too: the ranks agree, the row is still the poison
        outputs = next(c for c in result.failed_checks if c.check == "outputs")
        first = outputs.findings[0]
        assert (first.field, first.rank, first.token) == ("q_out", 0, 0)
        assert first.max_error == "NaN (unwritten)"
        assert "never written" in first.detail
    assert "ranks_agree" not in failing(results)


def test_without_the_oracle_an_unwritten_owned_entry_is_found_at_dcp1(tmp_path):
    scenario = make_scenario(tmp_path, indexer="none")
    results = run_one(k.skips_first_owned_entry, scenario, dcp=(1,), oracle=False)
    owned = next(c for c in results[0].failed_checks if c.check == "cache_owned")
    assert {f.field for f in owned.findings} == {"mla_cache.kv", "mla_cache.kpe"}
    assert {(f.rank, f.token, f.ownership, f.max_error) for f in owned.findings} == {
        (0, 0, "owned", "unwritten")
    }


def test_without_the_oracle_the_dcp1_run_names_a_foreign_write_in_the_kernels_encoding(
    tmp_path,
):
    """A stray entry is recognised by the kernel's own DCP1 entries, not the oracle's."""
    scenario = make_scenario(tmp_path, layout="fp8_ds_mla", indexer="none")
    kernel = k.doubles_ds_mla_scales_and_writes_foreign

    def foreign_writes(results: list[CaseResult]):
        [result] = results
        return next(c for c in result.failed_checks if c.check == "cache_foreign").findings

    by_oracle = run_one(kernel, scenario)
    assert set(failing(by_oracle)) == {"cache_owned", "cache_foreign"}
    assert {f.token for f in foreign_writes(by_oracle)} == {None}  # not the oracle's bytes
    by_dcp1 = run_one(kernel, scenario, oracle=False)
    assert set(failing(by_dcp1)) == {"cache_foreign"}
    findings = foreign_writes(by_dcp1)
    assert len(findings) == 4  # one stray entry on each rank
    for finding in findings:
        assert finding.ownership == "foreign"
        assert f"holds token {finding.token}'s encoding" in finding.detail


@pytest.mark.parametrize(
    ("kernel", "layout", "oracle_finds"),
    [
        (
            k.doubles_ds_mla_scales,
            "fp8_ds_mla",
            {"cache_owned": {"mla_cache.nope", "mla_cache.scales"}},
        ),
        (k.shifts_q_out, "auto", {"outputs": {"q_out"}}),
    ],
    ids=["ds-mla-scales-doubled", "q-out-shifted"],
)
def test_a_self_consistent_encoding_fails_the_oracle_and_passes_without_it(
    tmp_path, kernel, layout, oracle_finds
):
    """The point of --oracle off: a kernel that writes an encoding no oracle variant knows,
    the same way on every rank and at every DCP size, is gated on DCP correctness alone."""
    scenario = make_scenario(tmp_path, layout=layout)
    assert failing(run_one(kernel, scenario, dcp=(1, 4))) == oracle_finds
    results = run_one(kernel, scenario, dcp=(1, 4), oracle=False)
    assert [r.status for r in results] == ["pass", "pass"], failing(results)


def test_a_computed_nan_is_not_reported_as_unwritten(tmp_path, oracle):
    """The kernel wrote the row; one element is a NaN of its own (canonical bits, not the
    harness's poison): a numeric bug, reported as such, not as a skipped write."""

    def computes_a_nan(inputs, outputs, caches):
        k.oracle_kernel(inputs, outputs, caches)
        outputs.q_out[0, 3] = float("nan")

    results = run_one(computes_a_nan, make_scenario(tmp_path), oracle=oracle)
    outputs = [
        f for r in results for c in r.failed_checks if c.check == "outputs" for f in c.findings
    ]
    assert outputs and all(f.field == "q_out" and f.token == 0 for f in outputs)
    assert {f.max_error for f in outputs} == {"NaN (computed)"}


def test_an_unwritten_row_is_reported_as_unwritten(tmp_path, oracle):
    results = run_one(k.skips_q_out_row_zero, make_scenario(tmp_path), oracle=oracle)
    outputs = [
        f for r in results for c in r.failed_checks if c.check == "outputs" for f in c.findings
    ]
    assert outputs and {f.max_error for f in outputs} == {"NaN (unwritten)"}


def test_each_modified_input_is_named_and_restored_before_the_next_rank(tmp_path):
    """One snapshot holds every input (``input_snapshot``): inputs of other dtypes and
    odd byte counts are told apart, and each is put back before the next rank runs."""
    from dcpcheck.ops.fused_norm_rope.case import build_case
    from dcpcheck.ops.fused_norm_rope.input_snapshot import snapshot_inputs
    from dcpcheck.ops.fused_norm_rope.runner import launch_all

    scenario = make_scenario(tmp_path)
    case = build_case(scenario, 2, current_backend().device)
    seen = []

    def scribbles_on_rank_0(inputs, outputs, caches) -> None:
        seen.append(snapshot_inputs(inputs).bytes.clone())  # what this rank was given
        k.oracle_kernel(inputs, outputs, caches)
        if len(seen) == 1:
            inputs.positions[-1] += 1
            inputs.cos_sin[3, 1] = float("nan")
            inputs.slot_mapping[0] = -7

    before = [snapshot_inputs(rank.inputs).bytes.clone() for rank in case.ranks]
    changes = launch_all(scribbles_on_rank_0, case)
    assert {(c.field, c.rank) for c in changes} == {
        ("positions", 0),
        ("cos_sin", 0),
        ("slot_mapping", 0),
    }
    assert {c.field: c.detail for c in changes}["cos_sin"] == "input modified (first row 3)"
    assert torch.equal(seen[1], before[1]), "rank 1 ran on rank 0's scribbles"
    for rank, bytes_before in zip(case.ranks, before, strict=True):
        assert torch.equal(snapshot_inputs(rank.inputs).bytes, bytes_before)


def test_a_snapshot_reads_back_each_input_bitwise_whatever_byte_counts_precede_it():
    """Inputs of odd byte counts before wider dtypes: each reads back as it was, in its own
    dtype (its bytes start where that dtype may view them), and a change of one bit, a
    zero's sign, is a change."""
    from types import SimpleNamespace

    from dcpcheck.ops.fused_norm_rope.input_snapshot import snapshot_inputs

    inputs = SimpleNamespace(
        flags=torch.tensor([1, 0, 1], dtype=torch.uint8),
        scales=torch.tensor([0.0, float("nan"), -2.5], dtype=torch.float32),
        halves=torch.tensor([[1.5, float("-inf"), 3.0]], dtype=torch.bfloat16),
        slots=torch.tensor([7, -1, 3], dtype=torch.int64),
    )
    before = snapshot_inputs(inputs)
    for name, value in vars(inputs).items():
        original = before.original(name)
        assert (original.dtype, original.shape) == (value.dtype, value.shape)
        assert torch.equal(original.view(torch.uint8), value.view(torch.uint8))
    assert before.unchanged()
    inputs.scales[0] = -0.0
    assert not before.unchanged()


# -- activation_rows = "fused": inputs and outputs as vLLM's callers lay them out ---------

FUSED_DECODE, FUSED_BATCH = "fused-rows-decode-dcp4", "fused-rows-mixed-batch"


def shipped(name: str, rows: str):
    """Shipped scenario ``name`` with its activation rows ``rows``."""
    [scenario] = load_scenarios([name])
    return dataclasses.replace(scenario, activation_rows=rows)


def test_an_output_row_stride_taken_for_its_width_is_a_guard_band_write(oracle):
    """On one token an output made ``empty_like`` of a fused input keeps the fused row's
    stride; a kernel that writes that many elements writes the columns beside the output."""
    kernel = k.writes_kv_out_across_its_row_stride
    results = run_one(kernel, shipped(FUSED_DECODE, "fused"), dcp=(1, 4), oracle=oracle)
    assert failing(results) == {"guard_bands": {"kv_out"}}, failing(results)
    finding = next(c for c in results[0].failed_checks).findings[0]
    assert finding.detail == (
        f"{(832 - 512) * 2} byte(s) written beside the output's columns in its rows "
        "(guard columns; first at row 0)"
    )
    assert failing(run_one(kernel, shipped(FUSED_DECODE, "separate"), (1, 4), oracle)) == {}


def test_an_input_read_as_compact_fails_where_its_rows_are_fused():
    """Against the oracle only: such a kernel is wrong alike at every DCP size, so its own
    DCP1 run (``--oracle off``) agrees with it."""
    kernel = k.reads_kv_c_as_compact
    found = failing(run_one(kernel, shipped(FUSED_BATCH, "fused"), dcp=(1, 4)))
    cache_fields = {"mla_cache.nope", "mla_cache.scales"}  # fp8_ds_mla: kv's entry parts
    assert found == {"outputs": {"kv_out"}, "cache_owned": cache_fields}, found
    assert failing(run_one(kernel, shipped(FUSED_BATCH, "separate"), dcp=(1, 4))) == {}


@pytest.mark.parametrize("name", [FUSED_DECODE, FUSED_BATCH])
def test_the_fused_rows_are_column_slices_and_the_outputs_empty_like_of_them(name):
    """The inputs share one row per token as ``split`` makes them; each output has the
    strides ``torch.empty_like`` gives its input (asked here of torch, on the case's device)."""
    scenario = shipped(name, "fused")
    case = build_case(scenario, 4, current_backend().device)
    inputs, outputs = case.ranks[0].inputs, case.ranks[0].outputs
    preset, tokens = scenario.model, scenario.batch.num_tokens
    a_row = preset.q_lora_rank + preset.kv_lora_rank + preset.rope_dim
    index_row = preset.index_head_dim + INDEXER_WEIGHT_COLUMNS
    element = inputs.q_c.element_size()
    assert [t.stride() for t in (inputs.q_c, inputs.kv_c, inputs.k_pe)] == [(a_row, 1)] * 3
    assert inputs.index_k.stride() == (index_row, 1)
    assert inputs.kv_c.data_ptr() - inputs.q_c.data_ptr() == preset.q_lora_rank * element
    assert inputs.k_pe.data_ptr() - inputs.kv_c.data_ptr() == preset.kv_lora_rank * element
    for source, output in (
        (inputs.q_c, outputs.q_out),
        (inputs.kv_c, outputs.kv_out),
        (inputs.k_pe, outputs.kpe_out),
        (inputs.index_k, outputs.index_k_out),
    ):
        like = torch.empty_like(source)
        assert output.stride() == like.stride(), (tokens, output.stride(), like.stride())
    assert (outputs.kv_out.stride(0) == a_row) == (tokens == 1)


def test_the_kernel_is_handed_a_one_row_slice_with_its_row_stride():
    """``torch.Tensor.view_as`` of a ``[1, W]`` slice reports the row stride ``W``; the
    kernel must see the caller's, as vLLM's wrapper reads ``stride(0)``."""
    seen = []

    def records_strides(inputs, outputs, caches):
        seen.append((inputs.kv_c.stride(0), outputs.kv_out.stride(0)))
        k.oracle_kernel(inputs, outputs, caches)

    results = run_one(records_strides, shipped(FUSED_DECODE, "fused"), dcp=(1,))
    assert [r.status for r in results] == ["pass"]
    assert set(seen) == {(832, 832)}
