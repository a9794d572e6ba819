"""The lse-combine op: its oracle, its simulated collectives, every check failing on a
merge that breaks it, the project's merge passing, the property search shrinking a
mutant, scenario files, and the command line."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpcheck.cases.collectives import CollectiveError, run_ranks
from dcpcheck.cases.scenario_files import NamedBatch, ScenarioError
from dcpcheck.exit_codes import EXIT_KERNEL_LOAD
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops import package
from dcpcheck.ops.lse_combine import checks, mutants
from dcpcheck.ops.lse_combine.case import EMPTY_SHARDS, CombineBatch, build_case, launch_all
from dcpcheck.ops.lse_combine.contract import Merged
from dcpcheck.ops.lse_combine.kernel import combine
from dcpcheck.ops.lse_combine.scenario import (
    SCENARIOS,
    load_scenario,
    load_scenarios,
    scenario_to_toml,
)
from reference import lse_combine as oracle
from tests.conftest import BACKEND

DEVICE = BACKEND.device

BATCH = CombineBatch(
    requests=((1, 1), (6, 2), (40, 1)),
    heads=8,
    head_dim=16,
    return_lse=True,
    empty="neg-inf-nan",
    interleave=2,
    padding=2,
    sink_logit=1.0,
    seed=3,
)


def judged(kernel, batch: CombineBatch = BATCH, size: int = 4) -> dict[str, checks.CheckResult]:
    case = build_case(batch, size, DEVICE)
    return {result.check: result for result in checks.judge(case, launch_all(kernel, case))}


# -- the oracle --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    context=st.integers(1, 60),
    dcp_size=st.sampled_from((1, 2, 3, 4, 8)),
    interleave=st.sampled_from((1, 2, 5)),
    seed=st.integers(0, 1000),
)
def test_the_merge_of_the_shards_is_the_whole_context(context, dcp_size, interleave, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=generator) for s in ((3, 8), (context, 8), (context, 4)))
    bias = torch.randn(context, generator=generator) * 5
    whole, whole_lse = oracle.attention(q, k, v, bias, 0.3)
    parts = [
        oracle.shard_attention(q, k, v, bias, 0.3, context, dcp_size, rank, interleave)
        for rank in range(dcp_size)
    ]
    merged, lse = oracle.merge(
        torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    )
    torch.testing.assert_close(merged, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, whole_lse, rtol=1e-12, atol=1e-12)


def test_an_empty_shard_is_the_empty_sum_and_weighs_nothing_whatever_it_holds():
    out, lse = oracle.attention(
        torch.ones(2, 4), torch.ones(0, 4), torch.ones(0, 3), torch.ones(0), 1.0
    )
    assert out.eq(0).all() and torch.isneginf(lse).all()
    outputs = torch.tensor([[[1.0, 2.0]], [[math.nan, math.nan]]])
    merged, merged_lse = oracle.merge(outputs, torch.tensor([[0.5], [-math.inf]]))
    assert merged.tolist() == [[1.0, 2.0]] and merged_lse.tolist() == [0.5]
    assert oracle.to_base(torch.tensor([math.log(8.0)]), False).item() == pytest.approx(3.0)


# -- the simulated collectives -----------------------------------------------------------


def test_the_collectives_meet_every_rank_in_rank_order():
    def work(group):
        rank = group.rank_in_group
        mine = torch.full((2, 6), float(rank))
        gathered = group.all_gather(mine[:1], dim=0)
        scattered = group.reduce_scatter(mine, dim=1)
        exchanged = group.all_to_all(torch.arange(3) + 10 * rank)
        return gathered, scattered, exchanged, group.all_reduce(torch.tensor([rank]))

    for rank, (gathered, scattered, exchanged, total) in enumerate(run_ranks(3, work)):
        assert gathered[:, 0].tolist() == [0.0, 1.0, 2.0]
        assert scattered.tolist() == [[3.0, 3.0], [3.0, 3.0]]
        assert exchanged.tolist() == [rank, 10 + rank, 20 + rank]
        assert total.tolist() == [3]


def test_reduce_scatter_sums_and_gives_each_rank_its_slice():
    results = run_ranks(2, lambda g: g.reduce_scatter(torch.arange(4.0) * (g.rank_in_group + 1), 0))
    assert [r.tolist() for r in results] == [[0.0, 3.0], [6.0, 9.0]]


def test_ranks_that_call_different_collectives_are_an_error_not_a_hang():
    def mismatched(group):
        if group.rank_in_group == 0:
            return group.all_gather(torch.ones(1), dim=0)
        return group.all_reduce(torch.ones(1))

    with pytest.raises(CollectiveError, match="rank 1 called all_reduce"):
        run_ranks(2, mismatched)

    def one_rank_leaves(group):
        if group.rank_in_group == 1:
            return None
        return group.all_gather(torch.ones(1), dim=0)

    with pytest.raises(CollectiveError, match="rank 1 finished without joining it"):
        run_ranks(2, one_rank_leaves)


def test_a_rank_that_raises_raises_in_the_caller_with_its_own_error():
    def broken(group):
        if group.rank_in_group == 1:
            raise ValueError("kernel bug")
        return group.all_gather(torch.ones(1), dim=0)

    with pytest.raises(ValueError, match="kernel bug"):
        run_ranks(2, broken)


# -- the checks, each failing on a merge that breaks it ---------------------------------


def test_the_projects_merge_passes_every_encoding_of_an_empty_shard_and_both_bases():
    for empty in EMPTY_SHARDS:
        for base_e in (True, False):
            batch = dataclasses.replace(BATCH, empty=empty, base_e=base_e)
            for size in (1, 2, 8):
                results = judged(combine, batch, size)
                assert not any(r.findings for r in results.values()), (empty, base_e, size)


def test_merged_out_fails_on_a_partial_weighed_by_another_ranks_lse():
    results = judged(mutants.own_lse_of_next_rank)
    assert results["merged_out"].findings
    assert results["merged_out"].findings[0].field == "out"


def test_empty_shards_fails_when_an_lse_of_zero_is_given_weight():
    batch = dataclasses.replace(BATCH, empty="zero-garbage")
    results = judged(mutants.lengths_ignored, batch)
    assert results["empty_shards"].findings and not results["merged_out"].findings
    assert results["empty_shards"].findings[0].ownership == "a rank holds none of it"


def test_merged_lse_fails_on_the_wrong_heads_and_on_no_lse_at_all():
    assert judged(mutants.lse_of_first_heads)["merged_lse"].findings

    def without_lse(inputs):
        return Merged(combine(inputs).out)

    [finding] = judged(without_lse, size=1)["merged_lse"].findings
    assert "no LSE returned" in finding.detail


def test_a_merge_that_keeps_every_head_fails_on_its_shape():
    finding = judged(mutants.all_reduced)["merged_out"].findings[0]
    assert "shape (6, 8, 16) where (6, 2, 16)" in finding.detail


def test_base_2_lses_merged_as_natural_ones_fail():
    results = judged(mutants.base_ignored, dataclasses.replace(BATCH, base_e=False))
    assert results["merged_out"].findings and results["merged_lse"].findings


def test_lses_rounded_to_bf16_break_the_fp32_bound_once_they_are_large():
    batch = dataclasses.replace(BATCH, logit_shift=100.0, sink_logit=0.0, empty="neg-inf-zeros")
    assert judged(mutants.lse_in_output_dtype, batch)["merged_out"].findings
    assert not judged(combine, batch)["merged_out"].findings


def test_checks_not_asked_are_skipped_with_the_reason():
    results = judged(combine, dataclasses.replace(BATCH, return_lse=False), size=1)
    assert results["merged_lse"].skipped == "the caller does not ask for the LSE"
    assert results["empty_shards"].skipped == "every rank holds part of every row"


# -- scenarios, selftest, search ---------------------------------------------------------


def test_shipped_scenarios_round_trip_through_their_toml(tmp_path):
    for scenario in load_scenarios([]):
        path = tmp_path / f"{scenario.name}.toml"
        path.write_text(scenario_to_toml(scenario))
        assert load_scenario(path) == scenario


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("heads = 8", "key 'dcp': every DCP size must divide the 6 heads"),
        ('empty = "pos-inf-zeros"', "key 'empty': must be one of"),
        ('base = "2"', "key 'base': must be one of 2, e"),
        ("padding = 0", "unknown key"),
    ],
)
def test_a_bad_scenario_is_one_line_naming_the_key(tmp_path, edit, message):
    text = (SCENARIOS / "base2-sink-speculative.toml").read_text()
    bad = {
        "heads = 8": text.replace("heads = 8", "heads = 6"),
        'empty = "pos-inf-zeros"': text.replace('"pos-inf-zeros"', '"zeros"'),
        'base = "2"': text.replace('base = "2"', 'base = "10"'),
        "padding = 0": text.replace("padding = 2", "padding = 2\npadd = 1"),
    }[edit]
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(ScenarioError, match=message) as error:
        load_scenario(path)
    assert "\n" not in str(error.value)


def test_an_lse_of_zero_without_lengths_is_refused_as_no_merge_can_meet_it(tmp_path):
    text = (SCENARIOS / "empty-lse-zero.toml").read_text()
    path = tmp_path / "unmaskable.toml"
    path.write_text(
        text.replace('empty = "zero-garbage"', 'empty = "zero-garbage"\nmasked = false')
    )
    with pytest.raises(ScenarioError, match="unless its caller passes the lengths"):
        load_scenario(path)


def _attention_key(inputs) -> bytes:
    """A digest of everything an attention's result depends on: each tensor's dtype, shape
    and bytes, the latent width and the scale."""
    digest = hashlib.sha256(repr((inputs.kv_lora_rank, inputs.scale)).encode())
    for tensor in (inputs.q, inputs.kv_cache, inputs.block_table, inputs.seq_lens):
        digest.update(repr((tensor.dtype, tuple(tensor.shape))).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.digest()


@pytest.fixture(scope="module")
def _attention_results() -> dict[bytes, tuple[torch.Tensor, torch.Tensor]]:
    return {}


@pytest.fixture
def shared_attention(_attention_results, monkeypatch):
    """For the test that asks: the project's decode attention (the partials of the
    ``chain`` check) run once per distinct input over this module's searches. Every search
    draws from the same seed, so the searches of different merges run the same first
    examples and many of the same shrinking steps, whose attention inputs are the same
    whatever merge follows; the attention is a deterministic function of its inputs, so a
    repeated call gets copies of the first call's outputs. An attention mutant's own
    attention is not shared."""
    from dcpcheck.ops.lse_combine import attention

    project = attention.mla_decode_attention

    @functools.wraps(project)
    def once(inputs):
        key = _attention_key(inputs)
        if key not in _attention_results:
            out, lse = project(inputs)
            _attention_results[key] = (out.clone(), lse.clone())
        out, lse = _attention_results[key]
        return out.clone(), lse.clone()

    monkeypatch.setattr(attention, "mla_decode_attention", once)


EVERY_MUTANT = (*mutants.MUTANTS, *map(mutants.ProducedBy, mutants.ATTENTION_MUTANTS))


def _mutant_id(mutant) -> str:
    return mutant.attention.__name__ if isinstance(mutant, mutants.ProducedBy) else mutant.__name__


@pytest.mark.parametrize("mutant", EVERY_MUTANT, ids=_mutant_id)
def test_the_search_finds_and_shrinks_every_mutant(mutant, shared_attention):
    outcome = package(LSE_COMBINE).search(mutant, _mutant_id(mutant), 60, DEVICE)
    assert not outcome.passed, f"{_mutant_id(mutant)} survived 60 examples"
    shrunk = outcome.failure
    assert isinstance(shrunk, NamedBatch)
    assert len(shrunk.batch.requests) == 1 and shrunk.batch.num_rows <= 2
    if mutant is mutants.base_ignored:
        assert not shrunk.batch.base_e


def test_the_search_passes_the_projects_merge(shared_attention):
    outcome = package(LSE_COMBINE).search(combine, "default", 30, DEVICE)
    assert outcome.passed and outcome.examples_run == 30


# -- the command line --------------------------------------------------------------------


def invoke(*args: str):
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_run_replays_a_saved_failure_and_refuses_a_function_it_does_not_judge(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DCPCHECK_HOME", str(tmp_path))
    done = invoke("run", "--op", "lse-combine", "--scenario", "empty-lse-zero", "--dcp", "2")
    assert done.exit_code == 0, done.output
    done = invoke(
        "run",
        "--op",
        "lse-combine",
        "--scenario",
        "empty-lse-zero",
        "--dcp",
        "2",
        "--kernel",
        "mutant/lengths-ignored",
    )
    assert done.exit_code == 1 and "empty_shards" in done.output
    [saved] = (tmp_path / "failures").glob("*.toml")
    replay = invoke("repro", str(saved), "--kernel", "mutant/lengths-ignored")
    assert replay.exit_code == 1
    refused = invoke("run", "--op", "lse-combine", "--kernel", "vllm==0.33.0:correct_attn_out")
    assert refused.exit_code == 2
    assert "judges cp_lse_ag_out_rs, dcp_a2a_lse_reduce, merge_attn_states only" in refused.output


def test_a_dcp_size_that_does_not_divide_the_heads_is_not_applicable_with_the_reason():
    """The reason is printed; a run of nothing but such cases judged nothing, and says so
    (125: no check could call the kernel good or bad)."""
    done = invoke("run", "--op", "lse-combine", "--scenario", "unmasked-nan", "--dcp", "3")
    assert done.exit_code == EXIT_KERNEL_LOAD, done.output
    assert "3 ranks cannot share the 8 heads" in done.output
    assert "no case was judged" in done.output


def test_all_to_all_single_over_the_simulated_group_sends_slice_r_to_rank_r():
    from dcpcheck.cases.collectives import TorchDistributed

    def work(group):
        sent = torch.arange(4.0) + 10 * group.rank_in_group
        received = torch.empty(4)
        TorchDistributed.all_to_all_single(
            received, sent, group=group.device_group, async_op=True
        ).wait()
        return received.tolist()

    assert run_ranks(2, work) == [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]]


def test_the_property_search_from_the_command_line_shrinks_and_saves_a_replay(
    tmp_path, shared_attention
):
    done = invoke(
        "run", "--op", "lse-combine", "--kernel", "mutant/base-ignored", "--property-only",
        "--examples", "40", "--home", str(tmp_path),
    )  # fmt: skip
    assert done.exit_code == 1, done.output
    assert "property: FAIL at example" in done.output
    assert "shrunk to 1 request(s) of context" in done.output
    [saved] = (tmp_path / "failures").glob("shrunk-lse-combine-*.toml")
    assert invoke("repro", str(saved), "--kernel", "mutant/base-ignored").exit_code == 1


# -- real ranks --------------------------------------------------------------------------

REAL_JOBS = [
    (kernel, SCENARIOS / f"{name}.toml")
    for kernel in ("default", "mutant/heads-rolled", "mutant/lengths-ignored")
    for name in ("decode-empty-ranks", "empty-lse-zero", "base2-sink-speculative")
]


def _verdicts(results) -> list[tuple[str, str, list[tuple[str, str, int | None]]]]:
    return [
        (
            r.scenario,
            r.status,
            sorted((c.check, f.field, f.rank) for c in r.failed_checks for f in c.findings),
        )
        for r in results
    ]


@pytest.mark.parametrize("world_size", [2, 4])
def test_real_ranks_over_gloo_give_the_simulated_groups_verdicts(world_size):
    from dcpcheck.ops.lse_combine.real_ranks import run_on_real_ranks

    op = package(LSE_COMBINE)

    real = run_on_real_ranks(world_size, REAL_JOBS)
    simulated = [
        result
        for spec, path in REAL_JOBS
        for result in op.run_scenario(
            op.kernel(spec), spec, load_scenario(path), (world_size,), DEVICE
        )
    ]
    assert _verdicts(real) == _verdicts(simulated)
    assert {r.status for r in real} == {"pass", "fail"}


def test_a_speculative_row_empty_on_a_rank_that_holds_its_request_is_the_empty_sum():
    """The lengths are per request: rank 1 holds position 1 of a 2-token request, so its
    kernel ran, over no key for the row that sees position 0 alone; only a request the
    rank holds nothing of can be left with an LSE of 0 (the property search's find)."""
    batch = CombineBatch(requests=((2, 2),), heads=8, head_dim=16, empty="zero-zeros")
    case = build_case(batch, 2, DEVICE)
    assert case.empty_rank.tolist() == [True, False]
    assert torch.isneginf(case.partial_lse[1][0]).all()
    results = judged(combine, batch, 2)
    assert not any(r.findings for r in results.values())


# -- the chain: each rank's decode attention, then the merge ----------------------------


def test_the_projects_decode_attention_over_a_rank_shard_is_the_oracles():
    from dcpcheck.ops.lse_combine.attention import mla_decode_attention
    from dcpcheck.ops.lse_combine.chain import _rank_partials

    batch = dataclasses.replace(BATCH, dtype="float32", sink_logit=0.0)
    case = build_case(batch, 4, DEVICE)
    for rank in range(4):
        out, lse = _rank_partials(case, rank, DEVICE, mla_decode_attention)
        real = case.real
        empty = torch.isneginf(lse[real]).all(dim=1)
        torch.testing.assert_close(empty, torch.isneginf(case.partial_lse[rank][real]).all(dim=1))
        assert (out[real][empty] == 0).all()  # the empty sum: zeros, never NaN
        full = ~empty
        torch.testing.assert_close(
            out[real][full], case.partial_out[rank][real][full], rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(
            lse[real][full], case.partial_lse[rank][real][full], rtol=1e-5, atol=1e-5
        )


def test_chain_fails_on_a_merge_that_breaks_it_and_is_skipped_with_a_bias():
    from dcpcheck.ops.lse_combine.chain import chain

    unbiased = dataclasses.replace(BATCH, sink_logit=0.0)
    case = build_case(unbiased, 4, DEVICE)
    assert not chain(combine, case, DEVICE).findings
    assert chain(mutants.heads_rolled, case, DEVICE).findings
    biased = build_case(BATCH, 4, DEVICE)
    assert chain(combine, biased, DEVICE).skipped == "a decode kernel takes no logit bias"


@dataclasses.dataclass(frozen=True)
class TwoPaths:
    """A merge with another path, as a release with both merges is loaded."""

    merge: object
    counterpart: object

    def __call__(self, inputs):
        return self.merge(inputs)


def test_paths_agree_and_masks_agree_fail_on_a_path_that_differs_where_it_differs():
    from dcpcheck.ops.lse_combine.paths import ONE_PATH, judge_paths

    case = build_case(dataclasses.replace(BATCH, empty="zero-garbage"), 4, DEVICE)
    merged = launch_all(combine, case)

    def verdicts(other):
        results = judge_paths(TwoPaths(combine, other), case, merged, launch_all)
        return {r.check: r for r in results}

    same = verdicts(combine)
    assert not same["paths_agree"].findings and not same["masks_agree"].findings
    assert same["paths_agree"].skipped is None and same["masks_agree"].skipped is None
    rolled = verdicts(mutants.heads_rolled)
    assert rolled["paths_agree"].findings and rolled["masks_agree"].findings
    # the other path gives an empty shard's LSE of 0 weight: only the rows it holds differ
    unmasked = verdicts(mutants.lengths_ignored)
    assert not unmasked["paths_agree"].findings
    [*found] = unmasked["masks_agree"].findings
    assert found and all(f.ownership == "a rank holds none of it" for f in found)
    assert all(r.skipped == ONE_PATH for r in judge_paths(combine, case, merged, launch_all))


def test_launcher_torchrun_runs_the_named_scenarios_on_a_process_per_rank(tmp_path):
    report = tmp_path / "report.json"
    done = invoke(
        "run", "--op", "lse-combine", "--launcher", "torchrun", "--dcp", "2",
        "--scenario", "base2-sink-speculative", "--scenario", "decode-empty-ranks",
        "--kernel", "mutant/base-ignored", "--json", str(report), "--home", str(tmp_path),
    )  # fmt: skip
    assert done.exit_code == 1, done.output
    assert "2 processes, one per rank" in done.output
    cases = json.loads(report.read_text())["cases"]
    assert [(c["scenario"], c["status"]) for c in cases] == [
        ("base2-sink-speculative", "fail"),
        ("decode-empty-ranks", "pass"),
    ]
    assert len(list((tmp_path / "failures").glob("base2-sink-speculative-*.toml"))) == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--dcp", "1,4"), "--dcp must name one size N > 1"),
        (("--dcp", "4", "--property-only"), "the property search does not"),
        (("--dcp", "4", "--op", "slot-mapping"), "the slot-mapping op has no real-rank mode"),
    ],
)
def test_launcher_torchrun_refuses_what_real_ranks_cannot_do(args, said):
    done = invoke("run", "--op", "lse-combine", "--launcher", "torchrun", *args)
    assert done.exit_code == 2 and said in done.output


def test_a_rank_that_dies_makes_every_case_of_the_real_rank_run_a_crash(monkeypatch):
    from dcpcheck.cli.op_run import RealRanks, judge_cases
    from dcpcheck.ops.lse_combine import real_ranks

    def died(size, jobs, timeout_s):
        raise RuntimeError(f"{size} real ranks: rank(s) 1 did not finish cleanly")

    monkeypatch.setattr(real_ranks, "run_on_real_ranks", died)
    op = package(LSE_COMBINE)
    scenarios = op.load_scenarios(["decode-empty-ranks", "empty-lse-zero"], SCENARIOS)
    cases = judge_cases(
        op, scenarios, "default", (2,), DEVICE, None, False, real_ranks=RealRanks(2, None)
    )
    assert [(r.scenario, r.status) for r in cases.results] == [
        ("decode-empty-ranks", "crash"),
        ("empty-lse-zero", "crash"),
    ]
    assert all("rank(s) 1 did not finish" in r.error for r in cases.results)
