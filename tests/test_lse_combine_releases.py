"""vLLM's merge, ``cp_lse_ag_out_rs``, judged in the releases where its API shape or its
verdict changes, as ``dcpcheck run --op lse-combine --kernel vllm==X`` judges it
(``dcpcheck.ops.lse_combine.vllm``): 0.10.2 (no ``return_lse``, no base: a natural LSE
only), 0.12.0 (``return_lse`` and the base; still no zeroing of an empty shard's output),
0.28.0 (the lengths' empty-shard mask and the zeroing: fixed), 0.29.0 (moved to
``dcp.py``), 0.31.0 and 0.33.0 (a correction kernel class whose launch specification
vLLM's kernel launcher runs, stood in for). The wheels are the slot-mapping tests' (one
download keeps every op's files), skipped only where the registry is unreachable and the
release is not cached.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from dcpcheck.cases.scenario_files import NamedBatch
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops import package
from dcpcheck.ops.lse_combine import kernels
from dcpcheck.ops.lse_combine.case import CombineBatch
from dcpcheck.ops.lse_combine.vllm import DCP_ONLY, VllmMerge
from tests.conftest import BACKEND, registry_problem

run_scenario = package(LSE_COMBINE).run_scenario
search = package(LSE_COMBINE).search

LOADED = ("0.10.2", "0.12.0", "0.28.0", "0.29.0", "0.31.0", "0.33.0")
UNMASKED = ("0.10.2", "0.12.0")
FIXED = ("0.28.0", "0.29.0", "0.31.0", "0.33.0")


@functools.cache
def release(version: str) -> VllmMerge:
    """Release ``version``'s merge as ``--kernel vllm==X`` loads it."""
    try:
        kernel = kernels.REGISTRY.load(f"vllm=={version}")
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"vllm=={version} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(
            f"the registry answers, yet vllm=={version} did not load: {exc}"
        ) from exc
    assert isinstance(kernel, VllmMerge)
    return kernel


def judge(version: str, batch: CombineBatch, dcp_size: int) -> CaseResult:
    scenario = NamedBatch("t", "a test batch", batch, (dcp_size,))
    kernel = release(version)
    [result] = run_scenario(kernel, f"vllm=={version}", scenario, (dcp_size,), BACKEND.device)
    return result


FULL = CombineBatch(requests=((40, 1), (90, 2)), heads=8, head_dim=32, sink_logit=2.0, seed=5)
"""Requests every rank holds part of, at DCP 2 and 4: what every release merges right."""

EMPTY_NAN = dataclasses.replace(FULL, requests=((2, 1), (40, 1)), empty="neg-inf-nan")
"""A 2-token request: at DCP4 two ranks hold none of it and leave what vLLM's Triton decode
attention leaves for an empty shard, NaN with an LSE of -inf."""


@pytest.mark.parametrize("version", LOADED)
def test_every_release_merges_full_shards_right(version):
    for size in (2, 4):
        result = judge(version, FULL, size)
        assert result.status == "pass", [c.findings for c in result.failed_checks]


@pytest.mark.parametrize("version", LOADED)
def test_dcp1_is_not_applicable_as_no_caller_merges_without_dcp(version):
    result = judge(version, FULL, 1)
    assert result.status == "not_applicable" and result.error == DCP_ONLY


@pytest.mark.parametrize("version", UNMASKED)
def test_before_0_28_an_empty_shards_nan_output_poisons_the_merge(version):
    result = judge(version, EMPTY_NAN, 4)
    assert result.status == "fail"
    [check] = result.failed_checks
    assert check.check == "empty_shards"
    assert all(f.max_error == "NaN or inf" for f in check.findings)
    assert {f.rank for f in check.findings} == {0, 1, 2, 3}


@pytest.mark.parametrize("version", FIXED)
def test_from_0_28_empty_shards_weigh_nothing_whatever_they_hold(version):
    """And the all-to-all merge, run beside, masks them as the all-gather does."""
    for empty in ("neg-inf-nan", "pos-inf-zeros", "nan-nan", "zero-garbage"):
        result = judge(version, dataclasses.replace(EMPTY_NAN, empty=empty), 4)
        assert result.status == "pass", (empty, [c.findings for c in result.failed_checks])
        judged_pair = {c.check: c.skipped for c in result.checks if "agree" in c.check}
        assert judged_pair == {"paths_agree": None, "masks_agree": None}


def test_0_10_2_takes_no_base_so_a_base_2_lse_is_merged_as_natural():
    base_2 = dataclasses.replace(FULL, base_e=False)
    assert judge("0.10.2", base_2, 2).status == "fail"
    assert judge("0.12.0", base_2, 2).status == "pass"


def test_a_head_dim_not_a_power_of_two_is_not_applicable_as_the_kernel_cannot_tile_it():
    result = judge("0.33.0", dataclasses.replace(FULL, head_dim=24), 2)
    assert result.status == "not_applicable" and "tl.arange(0, HEAD_DIM)" in result.error


def test_0_10_2_cannot_be_asked_the_merged_lse():
    result = judge("0.10.2", dataclasses.replace(FULL, return_lse=True), 2)
    assert result.status == "not_applicable" and "cannot return the merged LSE" in result.error
    assert judge("0.12.0", dataclasses.replace(FULL, return_lse=True), 2).status == "pass"


def test_a_merge_that_needs_more_than_its_file_and_the_stand_ins_is_refused(tmp_path):
    from dcpcheck.adapters.protocol import AdapterError
    from dcpcheck.ops.lse_combine.vllm import routine_of

    source = tmp_path / "dcp.py"
    source.write_text(
        "def cp_lse_ag_out_rs(cp_attn_out, cp_attn_lse, cp_group):\n"
        "    return get_dcp_group().all_reduce(cp_attn_out)\n"
    )
    with pytest.raises(AdapterError, match="uses get_dcp_group, not torch"):
        routine_of(source, "cp_lse_ag_out_rs", "t")


def test_a_merge_that_takes_its_buffers_from_vllms_workspace_gets_stale_ones(tmp_path):
    """The all-to-all of 0.21.0 - 0.23.0 asks vLLM's workspace manager for its buffers."""
    from dcpcheck.ops.lse_combine.vllm import routine_of

    source = tmp_path / "dcp_alltoall.py"
    source.write_text(
        "from vllm.v1.worker.workspace import (\n"
        "    current_workspace_manager, is_workspace_manager_initialized)\n"
        "def dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group):\n"
        "    assert is_workspace_manager_initialized()\n"
        "    wanted = ((2, 3), torch.float32)\n"
        "    return current_workspace_manager().get_simultaneous(wanted, wanted)\n"
    )
    send, receive = routine_of(source, "dcp_a2a_lse_reduce", "t")(None, None, None)
    assert send.shape == receive.shape == (2, 3)
    assert send.isnan().all() and receive.isnan().all()
    assert send.data_ptr() != receive.data_ptr()


# -- the all-to-all merge ----------------------------------------------------------------


@functools.cache
def a2a(version: str) -> VllmMerge:
    """Release ``version``'s all-to-all merge as ``--kernel vllm==X:dcp_a2a_lse_reduce``
    loads it."""
    release(version)  # fetched (or skipped) as the other tests fetch it
    kernel = kernels.REGISTRY.load(f"vllm=={version}:dcp_a2a_lse_reduce")
    assert isinstance(kernel, VllmMerge)
    return kernel


@pytest.mark.parametrize("version", ("0.28.0", "0.29.0", "0.33.0"))
def test_the_all_to_all_merge_agrees_with_the_oracle_whatever_empty_shards_hold(version):
    """0.28.0's lives in dcp_alltoall.py and takes its empty-shard mask from common.py."""
    kernel = a2a(version)
    for batch in (FULL, EMPTY_NAN, dataclasses.replace(EMPTY_NAN, empty="zero-garbage")):
        scenario = NamedBatch("t", "a test batch", batch, (4,))
        [result] = run_scenario(kernel, "a2a", scenario, (4,), BACKEND.device)
        assert result.status == "pass", [c.findings for c in result.failed_checks]
    if version == "0.28.0":
        files = [
            Path(f.path).name
            for f in kernels.REGISTRY.judged_files("vllm==0.28.0:dcp_a2a_lse_reduce")
        ]
        assert files == ["dcp_alltoall.py", "common.py"]


def test_a_release_without_the_all_to_all_merge_says_so_in_one_line():
    release("0.12.0")
    with pytest.raises(KernelLoadError, match="defines dcp_a2a_lse_reduce") as error:
        kernels.REGISTRY.load("vllm==0.12.0:dcp_a2a_lse_reduce")
    assert "\n" not in str(error.value)


def test_the_triton_mla_backends_bf16_lse_breaks_the_bound_whichever_merge_runs():
    """The replay of the finding: the LSE the backend hands over is already off."""
    from dcpcheck.ops.lse_combine.scenario import SCENARIOS, load_scenario

    finding = load_scenario(SCENARIOS / "findings" / "triton-mla-bf16-lse.toml")
    fp32 = dataclasses.replace(finding.batch, lse_dtype="float32")
    for kernel in (release("0.33.0"), kernels.REGISTRY.load("default")):
        for batch, status in ((finding.batch, "fail"), (fp32, "pass")):
            scenario = NamedBatch("t", "a test batch", batch, (2,))
            [result] = run_scenario(kernel, "k", scenario, (2,), BACKEND.device)
            assert result.status == status
            if status == "fail":
                assert {c.check for c in result.failed_checks} == {"merged_out"}


# -- merge_attn_states, folded as MLA's prefill folds context chunks ----------------------

STATE_MERGE_VERSIONS = ("0.10.2", "0.12.0", "0.26.0", "0.28.0", "0.33.0")
"""0.10.2 (head strides assumed), 0.12.0 (strides read), 0.26.0 (its callers mask an empty
chunk with the file's ``mask_empty_context``), 0.28.0 and 0.33.0 (they neutralize a request
no chunk covers)."""


@functools.cache
def state_merge(version: str):
    """Release ``version``'s ``merge_attn_states`` as ``--kernel vllm==X:merge_attn_states``
    loads it."""
    from dcpcheck.ops.lse_combine.vllm_state_merge import VllmStateMerge

    release(version)  # fetched (or skipped) as the other tests fetch it
    kernel = kernels.REGISTRY.load(f"vllm=={version}:merge_attn_states")
    assert isinstance(kernel, VllmStateMerge)
    return kernel


def judge_state_merge(version: str, batch: CombineBatch, dcp_size: int) -> CaseResult:
    scenario = NamedBatch("t", "a test batch", batch, (dcp_size,))
    [result] = run_scenario(state_merge(version), "m", scenario, (dcp_size,), BACKEND.device)
    return result


def test_each_release_runs_what_its_callers_do_to_an_empty_chunk():
    from dcpcheck.ops.lse_combine.vllm_state_merge import EMPTIES

    said = {version: state_merge(version).empties for version in STATE_MERGE_VERSIONS}
    assert said == {
        "0.10.2": EMPTIES[0],
        "0.12.0": EMPTIES[0],
        "0.26.0": EMPTIES[1],
        "0.28.0": EMPTIES[2],
        "0.33.0": EMPTIES[2],
    }


@pytest.mark.parametrize("version", STATE_MERGE_VERSIONS)
def test_every_merge_attn_states_folds_full_chunks_right(version):
    for size in (2, 4):
        for batch in (FULL, dataclasses.replace(FULL, return_lse=True, head_dim=24)):
            result = judge_state_merge(version, batch, size)
            assert result.status == "pass", [c.findings for c in result.failed_checks]


@pytest.mark.parametrize("version", ("0.10.2", "0.12.0"))
def test_before_0_26_an_empty_chunks_nan_poisons_exactly_its_requests_rows(version):
    result = judge_state_merge(version, EMPTY_NAN, 4)
    assert result.status == "fail"
    [check] = result.failed_checks
    assert check.check == "empty_shards"
    assert {f.token for f in check.findings} == {0}  # the 2-token request's row
    assert all(f.max_error == "NaN or inf" for f in check.findings)


@pytest.mark.parametrize("version", ("0.26.0", "0.28.0", "0.33.0"))
def test_from_0_26_an_empty_chunk_weighs_nothing_whatever_it_holds(version):
    for empty in ("neg-inf-nan", "pos-inf-zeros", "nan-nan", "zero-garbage"):
        result = judge_state_merge(version, dataclasses.replace(EMPTY_NAN, empty=empty), 4)
        assert result.status == "pass", (empty, [c.findings for c in result.failed_checks])


@pytest.mark.parametrize(
    ("batch", "size", "reason"),
    [
        (FULL, 1, "at DCP1 there is one"),
        (dataclasses.replace(FULL, base_e=False), 2, "cannot be told an LSE's base"),
        (dataclasses.replace(FULL, masked=False), 2, "always know each chunk's context lengths"),
        (dataclasses.replace(FULL, requests=((3, 3),)), 4, "sees none of a rank's positions"),
    ],
)
def test_what_merge_attn_states_callers_never_hand_it_is_not_applicable(batch, size, reason):
    result = judge_state_merge("0.33.0", batch, size)
    assert result.status == "not_applicable" and reason in result.error


def test_speculative_rows_that_see_every_rank_are_judged():
    result = judge_state_merge("0.33.0", dataclasses.replace(FULL, requests=((40, 3),)), 4)
    assert result.status == "pass"


def test_the_search_draws_only_what_merge_attn_states_callers_ask():
    """Every drawn example is judged: none is a base-2, unmasked, speculative or DCP1 case."""
    outcome = search(state_merge("0.33.0"), "m", 6, BACKEND.device)
    assert outcome.passed and outcome.examples_run == 6 and outcome.not_applicable == 0
