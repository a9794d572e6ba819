"""The sparse-topk-remap op: its oracle (``reference.sparse_topk_remap``) against slots
worked out by hand and against the write side's; the project's Triton kernel against the
oracle on every shipped scenario and on drawn batches; each contract check (``checks``)
failing a kernel that breaks it and only that way; each mutant of the catalogue caught by a
shipped scenario and found and shrunk by the property search; the scenario files and the
command line.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcpcheck.cases.scenario_files import NamedBatch, ScenarioError
from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops import package
from dcpcheck.ops.sparse_topk_remap import checks, mutants
from dcpcheck.ops.sparse_topk_remap.case import POISON, RemapBatch, build_case
from dcpcheck.ops.sparse_topk_remap.contract import NO_SLOT, RemapInputs
from dcpcheck.ops.sparse_topk_remap.kernel import remap
from dcpcheck.ops.sparse_topk_remap.scenario import (
    SCENARIOS,
    load_scenario,
    load_scenarios,
    scenario_to_toml,
)
from reference import slot_mapping
from reference import sparse_topk_remap as oracle
from tests.conftest import BACKEND

DEVICE = BACKEND.device
OP = package(SPARSE_TOPK_REMAP)

# -- the oracle --------------------------------------------------------------------------


def test_the_oracle_gives_each_pick_its_owners_local_slot_worked_out_by_hand():
    """Block size 4, two ranks, runs of 2: positions 0 1 | 2 3 | 4 5 go to ranks 0, 1, 0;
    rank 0 stores 0 1 4 5 at its local indices 0 1 2 3, rank 1 stores 2 3 at 0 1, all in
    the request's first block (id 7), so at slots 28 - 31."""
    picks = torch.tensor([[0, 1, 2, 3, 4, 5, -1]], dtype=torch.int32)
    table = torch.tensor([[7, 3]], dtype=torch.int32)
    row = torch.tensor([0], dtype=torch.int32)
    rank_0 = oracle.rank_slots(row, table, picks, 4, 2, 0, 2)
    rank_1 = oracle.rank_slots(row, table, picks, 4, 2, 1, 2)
    assert rank_0.tolist() == [[28, 29, -1, -1, 30, 31, -1]]
    assert rank_1.tolist() == [[-1, -1, 28, 29, -1, -1, -1]]
    # at DCP1 every pick in its own slot: block 7 holds 0 - 3, block 3 holds 4 - 7
    single = oracle.rank_slots(row, table, picks, 4, 1, 0, 2)
    assert single.tolist() == [[28, 29, 30, 31, 12, 13, -1]]


def test_the_oracle_numbers_slots_as_rows_of_the_flat_view_worked_out_by_hand():
    """As above, but another layer's 4-row page between consecutive blocks: block ``b``'s
    first row is ``8 * b``, so block 7's tokens are rows 56 - 59 and block 3's rows 24 -
    27; at the block size the same slots as without a stride."""
    picks = torch.tensor([[0, 1, 2, 3, 4, 5, -1]], dtype=torch.int32)
    table = torch.tensor([[7, 3]], dtype=torch.int32)
    row = torch.tensor([0], dtype=torch.int32)
    assert oracle.rank_slots(row, table, picks, 4, 2, 0, 2, 8).tolist() == [
        [56, 57, -1, -1, 58, 59, -1]
    ]
    assert oracle.rank_slots(row, table, picks, 4, 1, 0, 2, 8).tolist() == [
        [56, 57, 58, 59, 24, 25, -1]
    ]
    unstrided = oracle.rank_slots(row, table, picks, 4, 2, 1, 2)
    assert torch.equal(oracle.rank_slots(row, table, picks, 4, 2, 1, 2, 4), unstrided)


def test_the_oracle_reads_what_the_write_side_wrote():
    """Every position of a request, as the write side's slot mapping places it on its
    owner, is where the read side's oracle looks for it."""
    context, block, ranks, interleave = 300, 16, 4, 2
    table = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:19].view(1, 19)
    table = table.to(torch.int32)
    positions = torch.arange(context)
    for rank in range(ranks):
        written = slot_mapping.slot_mappings(
            torch.tensor([0, context], dtype=torch.int32), positions,
            torch.tensor([0], dtype=torch.int32), table[None], [block], [True], ranks, rank,
            interleave, context,
        )[0]  # fmt: skip
        read = oracle.rank_slots(
            torch.tensor([0], dtype=torch.int32), table, positions[None].to(torch.int32),
            block, ranks, rank, interleave,
        )[0]  # fmt: skip
        assert torch.equal(written, read)
        owned = oracle.owners(positions[None], ranks, interleave)[0] == rank
        assert bool((read[owned] >= 0).all()) and bool((read[~owned] == NO_SLOT).all())


def test_the_workspace_oracle_gives_each_pick_its_gathered_row_worked_out_by_hand():
    """Block size 4, two ranks, runs of 2, a table one block wide (8 positions): rank 0
    stores 0 1 4 5 at local 0 1 2 3, rank 1 stores 2 3 6 7 at 0 1 2 3. The row's request is
    entry 1, whose shard rows start at 6 in each rank's part of 10 rows: rank 0's tokens
    at 6 + local, rank 1's at 10 + 6 + local. Position 8 is past the table."""
    picks = torch.tensor([[0, 1, 2, 3, 4, 5, -1, 7, 8]], dtype=torch.int32)
    rows = oracle.workspace_rows(torch.tensor([1]), torch.tensor([0, 6]), picks, 10, 1, 4, 2, 2)
    assert rows.tolist() == [[6, 7, 16, 17, 8, 9, -1, 19, -1]]
    # at DCP1 one part: the request's start plus the position; past 3 blocks of 4, -1
    single = oracle.workspace_rows(
        torch.tensor([0]), torch.tensor([3]),
        torch.tensor([[0, 1, 2, 9, 12]], dtype=torch.int32), 10, 3, 4, 1, 2,
    )  # fmt: skip
    assert single.tolist() == [[3, 4, 5, 12, -1]]


def test_the_workspace_oracle_puts_every_rank_share_where_its_shard_lands():
    """Every position of a request, gathered from four ranks' shards (each the rank's
    tokens in its local order, the write side's), is found once, in its owner's part."""
    context, block, ranks, interleave = 300, 16, 4, 2
    positions = torch.arange(context, dtype=torch.int32)[None]
    width = -(-context // (block * ranks))
    shard = int(slot_mapping.local_seq_lens(torch.tensor([context]), ranks, 0, interleave)[0])
    rows = oracle.workspace_rows(
        torch.tensor([0]), torch.tensor([0]), positions, shard, width, block, ranks, interleave
    )[0]
    owners = oracle.owners(positions, ranks, interleave)[0]
    assert torch.equal(rows // shard, owners)
    for rank in range(ranks):
        local = rows[owners == rank] % shard
        assert local.tolist() == list(range(int((owners == rank).sum())))


def test_a_mixed_batch_oracle_gives_decode_rows_slots_and_prefill_rows_workspace_rows():
    """Block size 4, two ranks, runs of 2, a table one block wide per request (request 0:
    block 7, request 1: block 3). Row 0 is a decode row of request 0 (request id -1): rank
    0 stores 0 1 4 5 at slots 28 - 31, rank 1 stores 2 3 at 28 29. Row 1 is a prefill row of
    request 1, entry 0, starting at 2 in each rank's part of 6 rows: the same on both
    ranks, rank 0's tokens at 2 + local, rank 1's at 6 + 2 + local."""
    picks = torch.tensor([[0, 2, 5, -1], [0, 2, 5, 9]], dtype=torch.int32)
    table = torch.tensor([[7], [3]], dtype=torch.int32)
    args = (torch.tensor([0, 1]), table, torch.tensor([-1, 0]), torch.tensor([2]), picks, 6, 4, 2)
    rank_0 = oracle.prefill_call_entries(*args, 0, 2)
    rank_1 = oracle.prefill_call_entries(*args, 1, 2)
    assert rank_0.tolist() == [[28, -1, 31, -1], [2, 8, 5, -1]]
    assert rank_1.tolist() == [[-1, 28, -1, -1], [2, 8, 5, -1]]


# -- the project's kernel ----------------------------------------------------------------


def skipped_by_design(batch: RemapBatch) -> set[str]:
    """The checks a case skips whatever it asks: only a prefill chunk maps picks into the
    workspace, and its entries are no cache slots unless a mixed batch's decode rows sit
    beside them."""
    if not batch.prefill:
        return {"workspace"}
    return set() if batch.decode_requests else {"slots"}


@pytest.mark.parametrize("scenario", load_scenarios([]), ids=lambda s: s.name)
def test_the_projects_kernel_passes_every_shipped_scenario(scenario):
    for result in OP.run_scenario(remap, "default", scenario, scenario.dcp_sizes, DEVICE):
        assert result.status == "pass", [c.findings for c in result.failed_checks]
        skipped = {c.check for c in result.checks if c.skipped is not None}
        if isinstance(scenario.batch, RemapBatch):
            unasked = set() if scenario.batch.compact else {"compaction"}
            unasked |= set() if scenario.batch.count_valid else {"valid_counts"}
            assert skipped - unasked == skipped_by_design(scenario.batch)


def test_the_search_passes_the_projects_kernel():
    outcome = OP.search(remap, "default", 25, DEVICE)
    assert outcome.passed and outcome.examples_run == 25


# -- each check fails a kernel that breaks it --------------------------------------------

PACKED = RemapBatch(
    requests=((300, 1), (9, 2)), topk=32, block_size=16, interleave=2, compact=True,
    count_valid=True, duplicates=1, padding=1, seed=11,
)  # fmt: skip
IN_PLACE = dataclasses.replace(PACKED, compact=False)


def failed(kernel, batch: RemapBatch, size: int) -> dict[str, set]:
    """The checks ``kernel`` fails on ``batch`` at DCP ``size``, with the rows each names."""
    case = build_case(batch, size, DEVICE)
    return {
        c.check: {f.token for f in c.findings} for c in checks.judge(kernel, case) if c.findings
    }


def test_every_check_passes_the_projects_kernel_packed_and_in_place():
    for batch in (PACKED, IN_PLACE):
        for size in (1, 2, 4):
            assert failed(remap, batch, size) == {}


def test_slots_and_partition_fail_the_converter_that_does_not_know_dcp():
    found = failed(mutants.dcp_ignored, IN_PLACE, 2)
    assert {"slots", "partition"} <= found.keys()
    assert failed(mutants.dcp_ignored, IN_PLACE, 1) == {}  # at DCP1 it is the converter


def test_partition_names_the_rows_whose_picks_no_rank_reads():
    """The last tile dropped: the picks past the first 256 of a row are read by no rank."""
    wide = dataclasses.replace(IN_PLACE, requests=((600, 1), (40, 1)), topk=512, padding=0)
    found = failed(mutants.last_tile_dropped, wide, 2)
    assert found["partition"] == {0}  # the 40-token row's picks all lie in its first tile


def test_unused_fails_an_unused_pick_read_as_the_first_token():
    found = failed(mutants.unused_read_as_token_zero, IN_PLACE, 2)
    assert "unused" in found
    rows_with_unused = {1, 2, 3}  # the 9-token request's rows and the padding row
    assert found["unused"] <= rows_with_unused


def test_compaction_fails_rows_packed_one_entry_late_and_only_packed_ones():
    assert "compaction" in failed(mutants.compaction_one_late, PACKED, 2)
    assert failed(mutants.compaction_one_late, IN_PLACE, 2) == {}


def test_valid_counts_fail_counts_of_the_whole_row():
    found = failed(mutants.counts_of_the_row, PACKED, 2)
    assert found.keys() == {"valid_counts"}


STRIDED = dataclasses.replace(IN_PLACE, gap_rows=32)
"""Two other layers' 16-row pages between consecutive blocks of the cache."""


def test_every_check_passes_the_projects_kernel_with_other_layers_pages_between_blocks():
    for batch in (STRIDED, dataclasses.replace(STRIDED, compact=True)):
        for size in (1, 2, 4):
            assert failed(remap, batch, size) == {}


def test_slots_and_partition_fail_slots_numbered_a_block_apart_and_only_there():
    for size in (1, 2, 4):
        found = failed(mutants.block_stride_ignored, STRIDED, size)
        assert {"slots", "partition"} <= found.keys()
    assert failed(mutants.block_stride_ignored, IN_PLACE, 2) == {}  # blocks a block apart


def test_partition_reads_a_row_between_two_blocks_as_no_pick():
    """A row of another layer's page (past the block's own rows, before the next block's)
    holds no token of this cache."""
    inputs = build_case(STRIDED, 2, DEVICE).ranks[0]
    first = int(inputs.block_table[0, 0])
    stride = inputs.stride_rows
    assert stride == STRIDED.block_size + 32
    inside, between = first * stride + 3, first * stride + STRIDED.block_size + 3
    assert checks.ReadBack.of(inputs).slots(0, [inside, between]) == [5, None]


def _write_past_the_end(inputs: RemapInputs, out: torch.Tensor, counts) -> None:
    remap(inputs, out, counts)
    torch.as_strided(out, (out.shape[0] + 1, out.shape[1]), out.stride())[-1] = NO_SLOT


def _modify_the_picks(inputs: RemapInputs, out: torch.Tensor, counts) -> None:
    remap(inputs, out, counts)
    inputs.token_indices[0, 0] = 0


def _count_unasked(inputs: RemapInputs, out: torch.Tensor, counts) -> None:
    remap(inputs, out, counts)
    if counts is None:  # writes where the caller handed no count buffer: the next row's
        out[-1, 0] = POISON


@pytest.mark.parametrize(
    ("kernel", "field"),
    [(_write_past_the_end, "out"), (_modify_the_picks, "token_indices")],
)
def test_guard_fails_a_write_past_the_last_row_and_a_modified_input(kernel, field):
    case = build_case(PACKED, 2, DEVICE)
    results = {c.check: c for c in checks.judge(kernel, case)}
    assert field in {f.field for f in results["guard"].findings}


def test_a_row_never_written_is_named_so():
    def unwritten(inputs, out, counts):
        remap(inputs, out, counts)
        out[0] = POISON

    case = build_case(IN_PLACE, 2, DEVICE)
    [slots] = [c for c in checks.judge(unwritten, case) if c.check == "slots"]
    assert any("never written" in f.detail for f in slots.findings)


PREFILL = RemapBatch(
    requests=((120, 2), (35, 1), (300, 1)), topk=64, block_size=16, interleave=4, compact=True,
    count_valid=True, unused=3, duplicates=1, seed=12, prefill=True, past_table=2,
    earlier_entries=2,
)  # fmt: skip
"""A prefill chunk of three requests after an earlier chunk's two, with picks past the
table."""


def test_every_check_passes_the_projects_kernel_on_a_prefill_chunk():
    for size in (1, 2, 4):
        assert failed(remap, PREFILL, size) == {}


@pytest.mark.parametrize(
    "mutant",
    [
        mutants.workspace_rank_ignored,
        mutants.workspace_start_of_the_next_request,
        mutants.workspace_own_picks_only,
        mutants.workspace_past_the_table,
    ],
    ids=lambda m: m.__name__,
)
def test_workspace_and_partition_fail_each_wrong_prefill_mapping(mutant):
    for size in (2, 4):
        found = failed(mutant, PREFILL, size)
        assert {"workspace", "partition"} <= found.keys(), found
    assert failed(mutant, IN_PLACE, 2) == {}  # decode rows: as the project's kernel


def test_workspace_fails_a_chunk_read_as_one_rank_shard_only_under_dcp():
    assert failed(mutants.workspace_rank_ignored, PREFILL, 1) == {}  # one part at DCP1
    assert "workspace" in failed(mutants.workspace_rank_ignored, PREFILL, 2)


def test_partition_says_a_rank_leaves_another_rank_pick_of_a_prefill_chunk_unread():
    case = build_case(PREFILL, 2, DEVICE)
    [partition] = [
        c for c in checks.judge(mutants.workspace_own_picks_only, case) if c.check == "partition"
    ]
    assert {f.rank for f in partition.findings} == {0, 1}
    assert all("leave a pick unread" in f.detail for f in partition.findings)


def test_a_prefill_chunk_picks_past_the_table_come_back_minus_one():
    case = build_case(PREFILL, 2, DEVICE)
    inputs = case.ranks[0]
    capacity = inputs.block_table.shape[1] * inputs.block_size * 2
    past = (inputs.token_indices >= capacity).cpu()  # the oracle's entries are on the CPU
    assert int(past.sum(dim=1).min()) == 2 and bool((inputs.token_indices == capacity).any())
    assert bool((checks.expected_slots(inputs)[past] == NO_SLOT).all())


MIXED = dataclasses.replace(PREFILL, requests=((50, 2), *PREFILL.requests), decode_requests=1)
"""A mixed batch: a decode request (two rows, request id -1) before the prefill chunk."""


def test_every_check_passes_the_projects_kernel_on_a_mixed_batch_packed_and_in_place():
    for batch in (MIXED, dataclasses.replace(MIXED, compact=False, count_valid=False)):
        for size in (1, 2, 4):
            assert failed(remap, batch, size) == {}


def test_a_mixed_batchs_decode_rows_are_held_to_the_flat_view_beside_its_workspace_rows():
    strided = dataclasses.replace(MIXED, gap_rows=32)
    for size in (1, 2, 4):
        assert failed(remap, strided, size) == {}
        found = failed(mutants.block_stride_ignored, strided, size)
        assert found.keys() == {"slots", "partition"}, found
        assert found["slots"] == {0}  # the decode rows; the workspace rows are right
    assert failed(mutants.block_stride_ignored, PREFILL, 2) == {}  # no decode row


def test_slots_and_partition_fail_decode_rows_taken_for_prefill_rows_and_only_them():
    for size in (1, 2):
        found = failed(mutants.decode_rows_taken_for_prefill, MIXED, size)
        assert found.keys() == {"slots", "partition"}, found
        assert found["slots"] == {0}  # the decode rows, 0 and 1: the first named
    assert failed(mutants.decode_rows_taken_for_prefill, PREFILL, 2) == {}  # no decode row


def test_slots_judges_a_mixed_batch_decode_rows_only():
    """The decode rows of a mixed batch are held to their slots, the prefill rows to their
    workspace rows: a prefill row read from the cache fails workspace only."""

    def prefill_rows_read_from_the_cache(inputs, out, counts):
        ids = torch.full_like(inputs.workspace.request_ids, -1)
        workspace = dataclasses.replace(inputs.workspace, request_ids=ids)
        remap(dataclasses.replace(inputs, workspace=workspace), out, counts)

    found = failed(prefill_rows_read_from_the_cache, MIXED, 1)
    assert "slots" not in found and found["workspace"] == {2}  # the first prefill row


def test_guard_fails_a_kernel_that_modifies_the_workspace_starts():
    def moves_starts(inputs, out, counts):
        remap(inputs, out, counts)
        inputs.workspace.starts[0] += 1

    case = build_case(PREFILL, 2, DEVICE)
    [guard] = [c for c in checks.judge(moves_starts, case) if c.check == "guard"]
    assert "starts" in {f.field for f in guard.findings}


def test_slots_are_skipped_for_a_prefill_chunk_and_workspace_for_decode_rows():
    prefill = {c.check: c for c in checks.judge(remap, build_case(PREFILL, 2, DEVICE))}
    decode = {c.check: c for c in checks.judge(remap, build_case(PACKED, 2, DEVICE))}
    assert prefill["slots"].skipped and prefill["workspace"].skipped is None
    assert decode["workspace"].skipped and decode["slots"].skipped is None


def test_checks_the_caller_does_not_ask_are_skipped_not_passed():
    unasked = dataclasses.replace(IN_PLACE, count_valid=False)
    results = {c.check: c for c in checks.judge(remap, build_case(unasked, 2, DEVICE))}
    assert results["compaction"].skipped and results["valid_counts"].skipped


# -- the catalogue -----------------------------------------------------------------------


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.__name__)
def test_the_search_finds_and_shrinks_every_mutant(mutant):
    outcome = OP.search(mutant, mutant.__name__, 80, DEVICE)
    assert not outcome.passed, f"{mutant.__name__} survived 80 examples"
    shrunk = outcome.failure
    assert isinstance(shrunk, NamedBatch)
    if mutant is mutants.workspace_start_of_the_next_request:
        # a chunk's first request starts at 0: a second one is the least that moves
        assert shrunk.batch.prefill and len(shrunk.batch.requests) == 2
        return
    if mutant is mutants.decode_rows_taken_for_prefill:
        # a decode row beside the chunk's: a decode request, then a prefill one
        assert shrunk.batch.decode_requests == 1 and len(shrunk.batch.requests) == 2
        return
    if mutant is mutants.block_stride_ignored:
        # a slot of block 0 is the same at any stride: the least that moves is a token in
        # another block, a second request's (or one past the first block of a longer one)
        batch = shrunk.batch
        assert batch.gap_rows > 0 and not batch.prefill and len(batch.requests) <= 2
        assert batch.num_rows == len(batch.requests)
        return
    assert len(shrunk.batch.requests) == 1 and shrunk.batch.num_rows == 1
    if mutant in mutants.WORKSPACE_MUTANTS:
        assert shrunk.batch.prefill
    if mutant is mutants.last_tile_dropped:
        assert shrunk.batch.topk == 257  # the smallest width with a second tile
    if mutant is mutants.interleave_ignored:
        assert shrunk.batch.interleave > 1


# -- scenario files ----------------------------------------------------------------------


def test_a_scenario_file_reads_back_as_written(tmp_path):
    for scenario in load_scenarios([]):
        path = tmp_path / f"{scenario.name}.toml"
        path.write_text(scenario_to_toml(scenario))
        assert load_scenario(path) == scenario


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (("topk = 128", "topk = 5000"), "key 'topk': must be in 1..4096"),
        (("block_size = 16", "block_size = 2048"), "key 'block_size': must be in 1..1024"),
        (("unused = 0", "unused = 129"), "key 'unused': must be in 0..topk (128)"),
        (("context = 1\nrows = 1", "context = 1\nrows = 2"), "key 'requests[0].rows'"),
        (("seed = 1", "seed = 1\ncolour = 3"), "colour"),
        (("seed = 1", "seed = 1\npast_table = 2"), "key 'past_table': is a prefill chunk's"),
        (("padding = 0", "padding = 1\nprefill = true"), "key 'padding': a prefill chunk"),
        (("seed = 1", "seed = 1\ndecode_requests = 1"), "key 'decode_requests': is a prefill"),
        (("seed = 1", "seed = 1\ngap_rows = 5000"), "key 'gap_rows': must be in 0..4096"),
        (
            ("seed = 1", "seed = 1\nprefill = true\ngap_rows = 16"),
            "key 'gap_rows': moves no entry of a prefill chunk's own rows (each is a workspace",
        ),
        (
            ("seed = 1", "seed = 1\nprefill = true\ndecode_requests = 4"),
            "key 'decode_requests': must be in 0..3, leaving the chunk a prefill request",
        ),
    ],
)
def test_a_bad_scenario_file_is_one_line_naming_the_key(tmp_path, change, said):
    text = (SCENARIOS / "decode-short-contexts.toml").read_text()
    old, new = change
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert said in str(error.value) and "\n" not in str(error.value)


# -- the command line --------------------------------------------------------------------


def invoke(*args: str):
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("function", ["flash_mla", "fused_norm_rope"])
def test_a_function_the_op_does_not_judge_is_refused_in_one_line(function):
    """The fused op's own function too: not taken for this op's default."""
    done = invoke("run", "--op", "sparse-topk-remap", "--kernel", f"vllm==0.33.0:{function}")
    assert done.exit_code == 2
    assert "judges triton_convert_req_index_to_global_index and" in done.output


# -- read agrees with write, end to end --------------------------------------------------

READ_SCENARIOS = ("reads-interleave-block", "reads-near-max-packed")


def read_write_fails(reader, writer_name: str, name: str, size: int = 2):
    """The end-to-end check of shipped scenario ``name`` at DCP ``size``, ``reader``
    reading what the fused op's ``writer_name`` wrote."""
    from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
    from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS as FUSED_SCENARIOS
    from dcpcheck.ops.fused_norm_rope.scenario import load_scenario as load_fused
    from dcpcheck.ops.sparse_topk_remap import read_write

    [scenario] = load_scenarios([name])
    batch = scenario.batch
    written = load_fused(FUSED_SCENARIOS / f"{batch.write_side}.toml")
    check = read_write.read_agrees_with_write(
        reader, load_kernel(writer_name), written, size, DEVICE, batch.topk, batch.seed,
        batch.compact, batch.count_valid,
    )  # fmt: skip
    return check.findings


@pytest.mark.parametrize(
    "mutant",
    [m for m in mutants.MUTANTS if m not in (*mutants.WORKSPACE_MUTANTS, *mutants.STRIDE_MUTANTS)],
    ids=lambda m: m.__name__,
)
def test_read_write_catches_every_reader_mutant(mutant):
    """Every mutant but those of a prefill chunk's workspace, which read decode rows right
    (the end-to-end check reads cache slots), and those of a block stride, which read a
    cache whose blocks lie a block apart right (the fused op's cache is one)."""
    assert any(read_write_fails(mutant, "default", name) for name in READ_SCENARIOS)


@pytest.mark.parametrize(
    "writer",
    [
        "mutant/block-offset-off-by-one",
        "mutant/block-offset-swapped",
        "mutant/foreign-rows-write-cache",
    ],
)
def test_read_write_catches_a_writer_that_puts_an_owned_entry_elsewhere(writer):
    findings = read_write_fails(remap, writer, "reads-interleave-block")
    assert any("not their pick's" in f.detail for f in findings)


def test_read_write_passes_a_writer_whose_cache_is_right_whatever_else_it_misses():
    """PR 54908's regression leaves outputs unwritten; what it writes to the cache is right."""
    assert read_write_fails(remap, "regress/pre-54908", "reads-interleave-block") == ()


def test_a_read_write_scenario_must_name_a_scenario_of_the_fused_op(tmp_path):
    text = (SCENARIOS / "reads-interleave-block.toml").read_text()
    path = tmp_path / "bad.toml"
    path.write_text(text.replace('write_side = "interleave-block"', 'write_side = "nowhere"'))
    with pytest.raises(ScenarioError, match="key 'write_side': 'nowhere' is not a scenario"):
        load_scenario(path)
