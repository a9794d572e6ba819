"""The slot-mapping op: its oracle (``reference.slot_mapping``) against the layout the fused
op's cases are built from (``dcpcheck.cases.dcp``); the project's Triton kernel
(``dcpcheck.ops.slot_mapping.kernel``) against the oracle, slot for slot, on batches
Hypothesis draws (several cache groups with their own block sizes, sharded and replicated,
DCP 1 to 8, interleaves, prefixes, padding rows and requests that own no blocks); and each
contract check (``checks``) passing that kernel and failing a mutant that breaks it.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpcheck.cases.dcp import Batch, DcpLayout, Request, build_block_tables, slot_mappings
from dcpcheck.cases.scenario_files import NamedBatch, ScenarioError
from dcpcheck.cases.verdicts import format_finding
from dcpcheck.op_registry import OPS, SLOT_MAPPING
from dcpcheck.ops import op_cases, package, runner_ops
from dcpcheck.ops.slot_mapping import mutants, search, seq_lens
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch, build_case
from dcpcheck.ops.slot_mapping.checks import expected_slots, judge
from dcpcheck.ops.slot_mapping.contract import PAD_SLOT, EachRoutine, Routines, SlotMappingInputs
from dcpcheck.ops.slot_mapping.kernel import compute_local_seq_lens, compute_slot_mappings
from dcpcheck.ops.slot_mapping.scenario import (
    SCENARIOS,
    load_scenario,
    load_scenarios,
    scenario_to_toml,
)
from dcpcheck.ops.slot_mapping.vllm import CALLER_BLOCK, in_kernel_blocks
from reference import slot_mapping as oracle
from tests.conftest import BACKEND

POISON = 7_777_777
"""What the output holds before a launch: a row left so was never written."""

GUARD_COLUMNS = 16
"""Columns past ``max_num_tokens`` in the output's storage, which no launch may touch."""


def _batch_inputs(
    batch: Batch, tables: list[torch.Tensor], block_sizes, sharded, dcp_size, rank, interleave
) -> SlotMappingInputs:
    lengths = [r.new for r in batch.requests]
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    positions = [r.prefix + i for r in batch.requests for i in range(r.new)]
    positions += [1] * batch.padding
    width = max(t.shape[1] for t in tables)
    stacked = torch.stack([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tables])
    return SlotMappingInputs(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        positions=torch.tensor(positions, dtype=torch.int64),
        idx_mapping=torch.arange(len(lengths), dtype=torch.int32),
        block_tables=stacked.to(torch.int32),
        block_sizes=tuple(block_sizes),
        sharded=tuple(sharded),
        dcp_size=dcp_size,
        dcp_rank=rank,
        interleave=interleave,
    )


def _table(rows) -> torch.Tensor:
    """Block tables (one tuple of block ids per request) as one int32 matrix."""
    width = max(map(len, rows))
    return torch.tensor([[*row, *[0] * (width - len(row))] for row in rows], dtype=torch.int32)


BATCHES = [
    Batch((Request(prefix=0, new=1),)),
    Batch((Request(prefix=37, new=1),), padding=3),
    Batch((Request(prefix=5, new=40), Request(prefix=100, new=3), Request(prefix=0, new=17))),
]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize(
    ("block_size", "dcp_size", "interleave"), [(16, 1, 1), (16, 4, 1), (8, 2, 8), (16, 8, 4)]
)
def test_the_oracle_is_the_layout_the_cases_are_built_from(batch, block_size, dcp_size, interleave):
    layout = DcpLayout(block_size, dcp_size, interleave)
    tables = build_block_tables(batch, block_size, dcp_size, shuffle_seed=3)
    table = _table(tables)
    expected = slot_mappings(batch, layout, tables).per_rank
    for rank in range(dcp_size):
        inputs = _batch_inputs(batch, [table], [block_size], [True], dcp_size, rank, interleave)
        [got] = expected_slots(inputs, batch.num_tokens)
        assert torch.equal(got, expected[rank])


def test_a_replicated_group_gives_every_rank_the_global_slots():
    batch = BATCHES[2]
    tables = build_block_tables(batch, 16, 1, shuffle_seed=1)
    table = _table(tables)
    one = expected_slots(_batch_inputs(batch, [table], [16], [True], 1, 0, 1), batch.num_tokens)
    for rank in range(4):
        inputs = _batch_inputs(batch, [table], [16], [False], 4, rank, 1)
        assert torch.equal(expected_slots(inputs, batch.num_tokens), one)


@pytest.mark.parametrize(("dcp_size", "interleave"), [(1, 1), (2, 1), (4, 1), (4, 16), (8, 2)])
def test_local_sequence_lengths_count_the_owned_positions_and_sum_to_the_length(
    dcp_size, interleave
):
    lengths = torch.tensor([0, 1, 2, 15, 16, 17, 63, 64, 65, 1000, 4097])
    per_rank = [oracle.local_seq_lens(lengths, dcp_size, r, interleave) for r in range(dcp_size)]
    assert torch.equal(sum(p.to(torch.int64) for p in per_rank), lengths)
    for rank, counts in enumerate(per_rank):
        owned = [
            int((oracle.owner_of(torch.arange(n), dcp_size, interleave) == rank).sum())
            for n in lengths.tolist()
        ]
        assert counts.tolist() == owned


# -- the project's kernel against the oracle -----------------------------------------


@st.composite
def slot_mapping_launches(draw) -> tuple[SlotMappingInputs, int]:
    """One rank's launch of a batch the op's search draws (``search.batches``: several
    groups, sharded or replicated, interleaves, prefixes, padding, requests without
    blocks), its padding rows given drawn positions, which must not matter."""
    batch, dcp_size = draw(search.batches())
    case = build_case(batch, dcp_size, torch.device("cpu"))
    inputs = case.ranks[draw(st.integers(0, dcp_size - 1))]
    first_padding = batch.num_rows - batch.padding
    padding = draw(st.lists(st.integers(0, 4096), min_size=batch.padding, max_size=batch.padding))
    positions = inputs.positions.clone()
    positions[first_padding:] = torch.tensor(padding, dtype=torch.int64)
    return dataclasses.replace(inputs, positions=positions), batch.num_rows


def _launch(inputs: SlotMappingInputs, max_num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's mapping and the whole output storage (guard columns included)."""
    device = BACKEND.device
    on_device = SlotMappingInputs(
        **{
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in vars(inputs).items()
        }
    )
    groups = len(inputs.block_sizes)
    storage = torch.full((groups, max_num_tokens + GUARD_COLUMNS), POISON, device=device)
    out = storage[:, :max_num_tokens]
    compute_slot_mappings(on_device, out)
    return out.cpu(), storage.cpu()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot_mapping_launches())
def test_the_kernel_writes_the_oracles_slots_and_nothing_else(launch):
    inputs, max_num_tokens = launch
    got, storage = _launch(inputs, max_num_tokens)
    assert torch.equal(got, expected_slots(inputs, max_num_tokens))
    assert (storage[:, max_num_tokens:] == POISON).all()


def test_padding_rows_and_requests_without_blocks_get_no_slot():
    inputs = SlotMappingInputs(
        query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
        positions=torch.tensor([5, 6, 9, 1, 1], dtype=torch.int64),
        idx_mapping=torch.tensor([0, -1], dtype=torch.int32),
        block_tables=torch.tensor([[[4, 5], [6, 7]]], dtype=torch.int32),
        block_sizes=(16,),
        sharded=(True,),
        dcp_size=1,
        dcp_rank=0,
        interleave=1,
    )
    got, _ = _launch(inputs, 5)
    assert got.tolist() == [[4 * 16 + 5, 4 * 16 + 6, PAD_SLOT, PAD_SLOT, PAD_SLOT]]


@pytest.mark.parametrize(("dcp_size", "interleave"), [(2, 1), (4, 1), (4, 16), (8, 2)])
def test_every_sharded_token_has_its_slot_on_exactly_one_rank(dcp_size, interleave):
    batch = BATCHES[2]
    tables = build_block_tables(batch, 16, dcp_size, shuffle_seed=5)
    table = _table(tables)
    owners = torch.zeros(batch.num_tokens, dtype=torch.int64)
    for rank in range(dcp_size):
        inputs = _batch_inputs(batch, [table], [16], [True], dcp_size, rank, interleave)
        [got], _ = _launch(inputs, batch.num_tokens)
        owners += (got >= 0).to(torch.int64)
    assert owners.tolist() == [1] * batch.num_tokens


# -- the op's checks, each shown failing on a kernel that breaks it ---------------------

MIXED = SlotMappingBatch(
    requests=((0, 1), (37, 1), (5, 40), (100, 3), (0, 17)),
    block_sizes=(16, 64),
    sharded=(True, False),  # an MLA cache and a replicated indexer cache
    interleave=4,
    padding=3,
    without_blocks=(3,),
    seed=11,
)


def _verdicts(kernel, batch: SlotMappingBatch, dcp_size: int) -> dict[str, tuple]:
    case = build_case(batch, dcp_size, BACKEND.device)
    return {result.check: result.findings for result in judge(kernel, case)}


@pytest.mark.parametrize("dcp_size", [1, 2, 4, 8])
def test_the_projects_kernel_passes_every_check(dcp_size):
    assert _verdicts(compute_slot_mappings, MIXED, dcp_size) == {
        "slots": (),
        "ownership": (),
        "padding": (),
        "guard": (),
    }


@pytest.mark.parametrize(
    ("mutant", "failed"),
    [
        (mutants.dcp_ignored, {"slots", "ownership"}),
        (mutants.interleave_ignored, {"slots"}),
        (mutants.rank_shifted, {"slots"}),
        (mutants.replicated_as_sharded, {"slots", "ownership"}),
        (mutants.padding_left_alone, {"slots", "padding"}),
        (mutants.one_row_past_the_end, {"guard"}),
    ],
)
def test_each_mutant_fails_the_checks_its_bug_breaks(mutant, failed):
    verdicts = _verdicts(mutant, MIXED, 4)
    assert {check for check, findings in verdicts.items() if findings} == failed


class _NeverAsked:
    """A routine its release never asks a case under DCP (an adapter's ``not_applicable``)."""

    def __init__(self, routine, reason: str) -> None:
        self.routine, self.reason = routine, reason

    def not_applicable(self, inputs) -> str | None:
        return self.reason if inputs.dcp_size > 1 else None

    def __call__(self, inputs, out) -> None:
        self.routine(inputs, out)


def _judged_each(slots, lengths, dcp_size: int):
    scenario = NamedBatch("t", "a test batch", MIXED, (dcp_size,))
    kernel = Routines(slots, lengths)
    [result] = package(SLOT_MAPPING).run_scenario(
        kernel, "t", scenario, (dcp_size,), BACKEND.device
    )
    return {check.check: check for check in result.checks}


def test_every_routine_of_a_release_is_judged_and_a_finding_names_its_routine():
    """A release computes the slot mappings in two runners (``EachRoutine``): a bug in
    either fails the case, the finding led by that routine's name, and the other's
    verdict does not hide it."""
    slots = EachRoutine((("good", compute_slot_mappings), ("shifted", mutants.rank_shifted)))
    lengths = EachRoutine(
        (("lengths", compute_local_seq_lens), ("global", mutants.seq_lens_global))
    )
    checks = _judged_each(slots, lengths, 4)
    assert {name for name, c in checks.items() if c.findings} == {
        "slots", "local_seq_lens", "seq_lens_sum"
    }  # fmt: skip
    assert all(f.detail.startswith("shifted: ") for f in checks["slots"].findings)
    assert all(f.detail.startswith("global: ") for f in checks["local_seq_lens"].findings)
    alone = _judged_each(compute_slot_mappings, compute_local_seq_lens, 4)
    assert all(c.passed for c in alone.values())


def test_a_routine_never_asked_a_case_leaves_it_to_the_others_and_all_unasked_is_skipped():
    """One routine not asked (its reason) and another judged: the other's verdict, a bug
    of it still failing; every routine not asked: each check skipped, every reason led by
    its routine's name, never passed."""
    unasked = _NeverAsked(compute_slot_mappings, "takes no DCP rank")
    one_judged = EachRoutine((("runner", unasked), ("table", mutants.rank_shifted)))
    checks = _judged_each(one_judged, compute_local_seq_lens, 4)
    assert checks["slots"].findings and checks["slots"].skipped is None
    none_judged = EachRoutine(
        (("runner", unasked), ("table", _NeverAsked(mutants.rank_shifted, "no interleave")))
    )
    checks = _judged_each(none_judged, compute_local_seq_lens, 4)
    assert checks["slots"].skipped == "runner: takes no DCP rank; table: no interleave"
    assert not checks["slots"].passed
    assert checks["local_seq_lens"].passed


def test_a_finding_names_the_group_rank_row_and_its_ownership():
    [finding, *_] = _verdicts(mutants.interleave_ignored, MIXED, 4)["slots"]
    assert finding.field == "slot_mapping[0]"  # the sharded group: the replicated one is right
    assert finding.rank is not None and finding.ownership in ("owned", "foreign")
    assert format_finding("slots", finding).startswith("slots: slot_mapping[0] on rank ")


def test_an_unwritten_row_is_told_apart():
    def writes_nothing(inputs, out):
        pass

    [finding, *_] = _verdicts(writes_nothing, MIXED, 2)["slots"]
    assert "never written" in finding.detail


def test_a_kernel_that_modifies_an_input_fails_the_guard():
    def scribbles(inputs, out):
        compute_slot_mappings(inputs, out)
        inputs.positions.add_(1)

    [finding, *_] = _verdicts(scribbles, MIXED, 2)["guard"]
    assert (finding.field, finding.detail) == ("positions", "an input was modified")


# -- the local sequence lengths ---------------------------------------------------------


def _length_verdicts(kernel, batch: SlotMappingBatch, dcp_size: int) -> dict[str, tuple]:
    case = seq_lens.build_case(batch, dcp_size, BACKEND.device)
    return {result.check: result.findings for result in seq_lens.judge(kernel, case)}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=8),
    padded=st.integers(0, 200),
    dcp_size=st.sampled_from([1, 2, 4, 8]),
    interleave=st.sampled_from([1, 2, 8, 16, 64]),
)
def test_the_lengths_kernel_writes_the_oracles_lengths_and_zero_past_them(
    lengths, padded, dcp_size, interleave
):
    """Beyond the shipped scenarios: up to 200 padded requests (more than one program)."""
    batch = SlotMappingBatch(
        tuple((n, 0) for n in lengths), (16 * interleave,), (True,), interleave, padding=padded
    )
    verdicts = _length_verdicts(compute_local_seq_lens, batch, dcp_size)
    assert verdicts == dict.fromkeys(seq_lens.CHECKS, ())


@pytest.mark.parametrize(
    ("mutant", "failed"),
    [
        (mutants.seq_lens_interleave_ignored, {"local_seq_lens"}),  # still a partition
        (mutants.seq_lens_padding_kept, {"seq_lens_padding"}),
        (mutants.seq_lens_global, {"local_seq_lens", "seq_lens_sum"}),
    ],
)
def test_each_lengths_mutant_fails_the_checks_its_bug_breaks(mutant, failed):
    verdicts = _length_verdicts(mutant, MIXED, 4)
    assert {check for check, findings in verdicts.items() if findings} == failed


def test_a_lengths_kernel_writing_past_the_end_or_into_its_input_fails_the_guard():
    def past_the_end(inputs, out):
        compute_local_seq_lens(inputs, torch.as_strided(out, (out.shape[0] + 1,), (1,)))

    def scribbles(inputs, out):
        compute_local_seq_lens(inputs, out)
        inputs.seq_lens.zero_()

    [past] = _length_verdicts(past_the_end, MIXED, 2)["seq_lens_guard"][:1]
    assert "written past the last request" in past.detail
    fields = {f.field for f in _length_verdicts(scribbles, MIXED, 2)["seq_lens_guard"]}
    assert fields == {"seq_lens"}


def test_an_unwritten_length_is_told_apart():
    [finding, *_] = _length_verdicts(lambda inputs, out: None, MIXED, 2)["local_seq_lens"]
    assert "never written" in finding.detail and finding.token == 0


# -- the command line ------------------------------------------------------------------


def invoke(*args: str):
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_the_default_run_judges_every_op_and_one_report_tells_them_apart(tmp_path):
    report = tmp_path / "r.json"
    done = invoke(
        "run", "--dcp", "4", "--no-tokens", "--json", str(report), "--home", str(tmp_path)
    )
    assert done.exit_code == 0, done.output
    written = json.loads(report.read_text())
    assert written["op"] == ",".join(OPS)
    names = [case["scenario"] for case in written["cases"]]
    others = [
        f"{op}/{path.stem}"
        for op in runner_ops()
        for path in sorted((SCENARIOS.parent / op).glob("*.toml"))
    ]
    fused = names[: len(names) - len(others)]
    assert fused and not any("/" in name for name in fused)  # the fused op's cases first
    assert names[len(fused) :] == others  # then each op's, in the registry's order
    assert any(f["path"].endswith("ops/slot_mapping/kernel.py") for f in written["kernel_files"])


@pytest.mark.parametrize(
    "narrowed", [("--op", "fused-norm-rope"), ("--scenario", "decode-single-dcp4")]
)
def test_a_run_that_names_the_fused_op_or_its_scenarios_judges_it_alone(tmp_path, narrowed):
    report = tmp_path / "r.json"
    args = ("run", "--dcp", "4", "--no-tokens", "--json", str(report), *narrowed)
    assert invoke(*args, "--scenario", "decode-single-dcp4").exit_code == 0
    written = json.loads(report.read_text())
    assert written["op"] == "fused-norm-rope"
    assert not [c for c in written["cases"] if c["scenario"].startswith("slot-mapping/")]


def test_the_default_run_fails_when_another_ops_kernel_does(tmp_path, monkeypatch):
    from dcpcheck.ops.slot_mapping.kernels import REGISTRY

    broken = REGISTRY.kernels["mutant/padding-left-alone"]
    monkeypatch.setitem(REGISTRY.kernels, "default", broken)
    done = invoke("run", "--dcp", "4", "--no-tokens", "--home", str(tmp_path))
    assert done.exit_code == 1
    assert "FAIL slot-mapping/mixed-groups-padded[dcp4] slots" in done.output
    assert "replay: dcpcheck run --op slot-mapping --scenario mixed-groups-padded" in done.output


def test_list_ops_names_both_ops():
    listed = invoke("list", "ops").output.split()
    assert "fused-norm-rope" in listed and "slot-mapping" in listed


def test_run_judges_every_shipped_scenario_of_the_op(tmp_path):
    report = tmp_path / "r.json"
    done = invoke("run", "--op", "slot-mapping", "--json", str(report))
    assert done.exit_code == 0, done.output
    written = json.loads(report.read_text())
    assert written["op"] == "slot-mapping"
    assert {case["scenario"] for case in written["cases"]} == {
        path.stem for path in SCENARIOS.glob("*.toml")
    }
    assert {check["check"] for check in written["cases"][0]["checks"]} == {
        "slots", "ownership", "padding", "guard",
        "local_seq_lens", "seq_lens_sum", "seq_lens_padding", "seq_lens_guard",
    }  # fmt: skip


def test_a_mutant_fails_is_saved_and_its_replay_fails_until_the_kernel_is_right(tmp_path):
    home = tmp_path / "home"
    args = ["--op", "slot-mapping", "--scenario", "mixed-groups-padded", "--dcp", "4"]
    report = tmp_path / "r.json"
    mutant = ["--kernel", "mutant/padding-left-alone"]
    done = invoke("run", *args, *mutant, "--home", str(home), "--json", str(report))
    assert done.exit_code == 1
    assert "failed: slots, padding" in done.output
    assert "slot_mapping[0] on rank 0, first bad token 63 (padding): 5 row(s) never written" in (
        done.output
    )
    [case] = json.loads(report.read_text())["cases"]
    padding = next(c["findings"] for c in case["checks"] if c["check"] == "padding")
    assert {(f["rank"], f["token"], f["count"]) for f in padding} == {
        (rank, 63, 5) for rank in range(4)
    }
    [saved] = (home / "failures").glob("*.toml")
    assert invoke("repro", str(saved), "--kernel", "mutant/padding-left-alone").exit_code == 1
    assert invoke("repro", str(saved)).exit_code == 0


def test_options_of_the_fused_ops_harness_are_refused():
    done = invoke("run", "--op", "slot-mapping", "--ds-mla-scale", "pow2", "--oracle", "off")
    assert done.exit_code == 2
    assert "--op slot-mapping does not take --ds-mla-scale, --oracle" in done.output


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ('op = "slot-mapping"', 'op = "fused-norm-rope"', "key 'op': expected 'slot-mapping'"),
        ("interleave = 1", "interleave = 3", "a multiple of the interleave 3"),
        ("sharded = [true, false]", "sharded = [true]", "one flag per group (2), got 1"),
        ("padding = 5", "paddding = 5", "key 'paddding': unknown key"),
        ("without_blocks = [3]", "without_blocks = [9]", "must index the 5 requests"),
        (
            "interleave = 1",
            "interleave = 1\nkernel_block_sizes = [12, 64]",
            "key 'kernel_block_sizes': kernel block sizes (12, 64) must divide",
        ),
    ],
)
def test_a_bad_scenario_file_is_one_line_naming_the_key(tmp_path, old, new, words):
    text = (SCENARIOS / "mixed-groups-padded.toml").read_text()
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ScenarioError, match=re.escape(words)):
        load_scenario(path)


def test_a_scenario_file_reads_back_as_it_was_written(tmp_path):
    for original in load_scenarios([]):
        path = tmp_path / f"{original.name}.toml"
        path.write_text(scenario_to_toml(original))
        assert load_scenario(path) == original


def test_a_scenario_file_of_the_fused_op_may_name_it_and_one_of_another_op_is_sent_there(
    tmp_path,
):
    from dcpcheck.ops.fused_norm_rope import scenario as fused

    shipped = (fused.SCENARIOS / "decode-single-dcp4.toml").read_text()
    named = tmp_path / "named.toml"
    named.write_text('op = "fused-norm-rope"\n' + shipped)
    assert fused.load_scenario(named) == fused.load_scenario(
        fused.SCENARIOS / "decode-single-dcp4.toml"
    )
    with pytest.raises(ScenarioError, match="run it with --op slot-mapping"):
        fused.load_scenario(SCENARIOS / "decode-single.toml")


# -- the selftest ------------------------------------------------------------------------


def test_selftest_of_the_op_from_the_command_line():
    done = invoke("selftest", "--op", "slot-mapping")
    assert done.exit_code == 0, done.output
    assert "9 of 9 mutants caught" in done.output
    refused = invoke("selftest", "--op", "slot-mapping", "--mutant", "mutant/pre-54908")
    assert refused.exit_code == 2


# -- the property search -----------------------------------------------------------------


@pytest.mark.parametrize(
    "mutant", (*mutants.MUTANTS, *mutants.SEQ_LENS_MUTANTS), ids=lambda m: m.__name__
)
def test_the_search_finds_and_shrinks_each_mutant(mutant):
    name = f"mutant/{mutant.__name__.replace('_', '-')}"
    op = package(SLOT_MAPPING)
    outcome = op.search(op.kernel(name), name, 100, BACKEND.device)
    assert not outcome.passed
    shrunk = outcome.failure
    assert len(shrunk.batch.requests) == 1 and shrunk.batch.num_rows <= 4
    assert len(shrunk.batch.block_sizes) <= 2
    [replayed] = op.run_scenario(
        op.kernel("default"), "default", shrunk, shrunk.dcp_sizes, BACKEND.device
    )
    assert replayed.status == "pass"  # the failure is the mutant's, not the harness's


def tail_filled_one_step(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """Planted: the padding filled for one loop step of vLLM's slot kernels only."""
    end = int(inputs.query_start_loc[-1]) + CALLER_BLOCK
    kept = out[:, end:].clone()
    compute_slot_mappings(inputs, out)
    out[:, end:] = kept


def localized_by_the_kernel_block(inputs: SlotMappingInputs, out: torch.Tensor) -> None:
    """Planted: vLLM #51031, a sharded group's positions dealt to the ranks in virtual
    blocks of its kernel block (its table in kernel blocks), not of its cache block."""
    compute_slot_mappings(inputs, out)
    size, rank, interleave = inputs.dcp_size, inputs.dcp_rank, inputs.interleave
    starts = inputs.query_start_loc.tolist()
    sizes = zip(inputs.block_sizes, inputs.kernel_blocks, strict=True)
    for group, (block, kernel) in enumerate(sizes):
        if size == 1 or not inputs.sharded[group]:
            continue
        table = in_kernel_blocks(inputs.block_tables[group], block // kernel).long()
        for request, row in enumerate(inputs.idx_mapping.tolist()):
            if row < 0:
                continue
            rows = slice(starts[request], starts[request + 1])
            offsets = inputs.positions[rows] % (kernel * size)
            local = offsets // (interleave * size) * interleave + offsets % interleave
            slots = table[row, inputs.positions[rows] // (kernel * size)] * kernel + local
            mine = offsets // interleave % size == rank
            out[group, rows] = torch.where(mine, slots, torch.full_like(slots, PAD_SLOT))


@pytest.mark.parametrize(
    ("planted", "drawn"),
    [
        (tail_filled_one_step, lambda batch: batch.padding > CALLER_BLOCK),
        (
            localized_by_the_kernel_block,
            lambda batch: min(batch.kernel_block_sizes) < batch.interleave,
        ),
    ],
    ids=["tail-filled-one-step", "localized-by-the-kernel-block"],
)
def test_the_search_draws_what_shipped_bugs_needed(planted, drawn):
    """Padding past one loop step of vLLM's slot kernels (0.17.x's tail), interleaves
    above the kernel block (#51031): each planted bug is found within the default
    examples, on the input it needs."""
    from dcpcheck.cli.op_run import SEARCH_EXAMPLES
    from dcpcheck.ops.slot_mapping.contract import Routines

    kernel = Routines(planted, compute_local_seq_lens)
    outcome = package(SLOT_MAPPING).search(kernel, "planted", SEARCH_EXAMPLES, BACKEND.device)
    assert not outcome.passed
    assert drawn(outcome.failure.batch)


def test_the_search_passes_the_projects_kernel():
    op = package(SLOT_MAPPING)
    outcome = op.search(op.kernel("default"), "default", 60, BACKEND.device)
    assert outcome.passed and outcome.examples_run == 60


def test_a_search_from_the_command_line_saves_a_replayable_shrunk_failure(tmp_path):
    home = tmp_path / "home"
    mutant = ["--kernel", "mutant/rank-shifted"]
    done = invoke("run", "--op", "slot-mapping", "--property-only", *mutant, "--home", str(home))
    assert done.exit_code == 1
    assert "property: FAIL at example" in done.output
    [saved] = (home / "failures").glob("shrunk-slot-mapping-mutant-rank-shifted-*.toml")
    assert invoke("repro", str(saved), *mutant).exit_code == 1
    assert invoke("repro", str(saved)).exit_code == 0
    assert invoke("run", "--op", "slot-mapping", "--property-only").exit_code == 0


# -- bisect ------------------------------------------------------------------------------

KERNEL_REVISIONS = [
    ("the kernel", "compute_slot_mappings(inputs, out)"),
    ("a comment", "compute_slot_mappings(inputs, out)  # the project's kernel"),
    ("deal tokens one at a time", "mutants.interleave_ignored(inputs, out)"),
    ("a later edit", "mutants.interleave_ignored(inputs, out)  # still"),
]


def test_bisect_names_the_commit_that_broke_a_slot_mapping_kernel(tmp_path):
    import subprocess

    from dcpcheck.workflows.bisection import RunOptions, bisect

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    commits = []
    for subject, call in KERNEL_REVISIONS:
        (tmp_path / "slots.py").write_text(
            "from dcpcheck.ops.slot_mapping import mutants\n"
            "from dcpcheck.ops.slot_mapping.kernel import compute_slot_mappings\n\n\n"
            f"def slots(inputs, out):\n    {call}\n"
        )
        git("add", "slots.py")
        git("commit", "-q", "-m", subject)
        commits.append(git("rev-parse", "HEAD"))
    options = RunOptions(
        scenarios=("interleaved-prefix",), dcp="2", device="cpu", op="slot-mapping"
    )
    result = bisect(tmp_path, "slots.py", commits[0], "HEAD", "slots", options)
    assert result.first_bad is not None and result.first_bad.sha == commits[2]
    assert result.failing_check.startswith("interleaved-prefix[dcp2] slots: slot_mapping[0]")


def test_a_home_that_cannot_be_written_costs_one_warning_not_the_run(monkeypatch):
    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(op_cases, "save_failed_case", unwritable)
    done = invoke("run", "--op", "slot-mapping", "--kernel", "mutant/dcp-ignored", "--dcp", "2")
    assert done.exit_code == 1
    assert done.output.count("cannot save failing cases under") == 1


def test_a_seed_without_the_search_is_refused():
    done = invoke("run", "--op", "slot-mapping", "--seed", "3")
    assert done.exit_code == 2
    assert "it seeds the property search" in done.output


def test_list_kernels_names_the_ops_kernels_too():
    listed = invoke("list", "kernels").output
    assert "--op slot-mapping:" in listed
    for name in ("default", *(f"mutant/{m.__name__.replace('_', '-')}" for m in mutants.MUTANTS)):
        assert name in listed.split("--op slot-mapping:")[1]
