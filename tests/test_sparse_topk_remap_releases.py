"""vLLM's converters of top-k picks to slots (``dcpcheck.ops.sparse_topk_remap.vllm``),
judged in the releases where their API or their callers change, as ``dcpcheck run --op
sparse-topk-remap --kernel vllm==X`` judges them: 0.12.0 (the converter beside FlashMLA's
sparse backend, no counts), 0.17.0 (moved to ``sparse_utils.py``, counts; still no sparse
backend runs under DCP), 0.28.0 (the filter, which FlashInfer's sparse backend calls packed
with counts), 0.29.0 (FlashMLA's sparse backend calls it in place too), 0.33.0 (the
converter knows DCP, in a warm-up class), and for a prefill chunk over the DCP-gathered
workspace 0.29.0 (no caller passes DCP with a prefill workspace), 0.30.0 (FlashMLA's PCP + DCP
path, the first) and 0.34.0; for the mixed batch FlashMLA's sparse backend converts without
DCP (decode rows beside a prefill chunk's, in one call) 0.13.0 and 0.17.0 (in place, no
counts), 0.25.0 and 0.29.0 (in place, counts), 0.30.0 and 0.34.0 (packed, counts); for a
cache with other layers' pages between its blocks (``BLOCK_STRIDE_ROWS``) 0.28.0 (no such
parameter), 0.29.0 - 0.31.0 (FlashMLA's bf16 path, XPU's), 0.32.0 and 0.34.0 (its fp8 mixed
batch too; 0.34.0's bf16 path under DCP); and 0.34.0, where Kimi K3.1's decode calls the
converter itself under DCP (each function judged where it is called). The
wheels are the other ops' (one download keeps every op's files), skipped only where the
registry is unreachable and the release is not cached.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from dcpcheck.cases.scenario_files import NamedBatch
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.op_registry import SPARSE_TOPK_REMAP
from dcpcheck.ops import package
from dcpcheck.ops.sparse_topk_remap import checks, kernels
from dcpcheck.ops.sparse_topk_remap.case import RemapBatch, build_case
from dcpcheck.ops.sparse_topk_remap.vllm import (
    CALLER_FILE,
    CONVERT,
    DCP_CALLERS,
    FILTER,
    STRIDE_CALLS,
    PrefillCall,
    VllmRemap,
    converter_calls,
    prefill_calls,
)
from reference import sparse_topk_remap as oracle
from tests.conftest import BACKEND, registry_problem

run_scenario = package(SPARSE_TOPK_REMAP).run_scenario

PACKED = RemapBatch(
    requests=((900, 1), (40, 2)), topk=128, block_size=64, interleave=4, compact=True,
    count_valid=True, duplicates=1, padding=1, seed=21,
)  # fmt: skip
"""What FlashInfer's sparse backend asks under DCP: packed rows and their counts."""

IN_PLACE = dataclasses.replace(PACKED, compact=False, count_valid=False)
"""What FlashMLA's sparse backend asks under DCP (fp8, mixed batch): picks in place."""


@functools.cache
def release(spec: str) -> VllmRemap:
    """The kernel ``--kernel SPEC`` loads."""
    try:
        kernel = kernels.REGISTRY.load(spec)
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"{spec} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(f"the registry answers, yet {spec} did not load: {exc}") from exc
    assert isinstance(kernel, VllmRemap)
    return kernel


def judge(spec: str, batch: RemapBatch, size: int) -> CaseResult:
    scenario = NamedBatch("t", "a test batch", batch, (size,))
    [result] = run_scenario(release(spec), spec, scenario, (size,), BACKEND.device)
    return result


@pytest.mark.parametrize("version", ("0.12.0", "0.17.0"))
def test_before_0_25_no_sparse_backend_runs_under_dcp(version):
    for size in (2, 4):
        result = judge(f"vllm=={version}", IN_PLACE, size)
        assert result.status == "not_applicable"
        assert "runs no sparse MLA backend under DCP" in result.error
    assert judge(f"vllm=={version}", IN_PLACE, 1).status == "pass"


def test_the_converter_that_does_not_know_dcp_reads_wrong_slots_on_exactly_those_rows():
    """0.17.0's converter called under DCP, as no caller of its release does: each rank
    reads every pick, at the slot one rank storing everything would have put it."""
    result = judge(f"vllm==0.17.0:{CONVERT}", IN_PLACE, 2)
    assert result.status == "fail"
    [slots] = [c for c in result.failed_checks if c.check == "slots"]
    case = build_case(IN_PLACE, 2, BACKEND.device)
    for finding in slots.findings:
        inputs = case.ranks[finding.rank]
        single = oracle.rank_slots(
            inputs.req_id, inputs.block_table, inputs.token_indices, inputs.block_size, 1, 0, 1
        )
        owned = oracle.rank_slots(
            inputs.req_id, inputs.block_table, inputs.token_indices, inputs.block_size, 2,
            finding.rank, inputs.interleave,
        )  # fmt: skip
        wrong = (single != owned).any(dim=1).nonzero().flatten().tolist()
        assert list(finding.tokens) == wrong


@pytest.mark.parametrize("version", ("0.28.0", "0.29.0", "0.33.0"))
def test_from_0_25_the_filter_reads_what_the_write_side_wrote(version):
    for size in (2, 4):
        result = judge(f"vllm=={version}", PACKED, size)
        assert result.status == "pass", [c.findings for c in result.failed_checks]


def test_picks_in_place_are_asked_under_dcp_from_0_29_when_flashmla_calls_the_filter():
    early = judge("vllm==0.28.0", IN_PLACE, 2)
    assert early.status == "not_applicable"
    assert "FlashInfer sparse MLA (packed, counts; flashinfer_mla_sparse.py:451" in early.error
    for version in ("0.29.0", "0.33.0"):
        assert judge(f"vllm=={version}", IN_PLACE, 2).status == "pass"


def test_from_0_30_the_converter_knows_dcp_itself():
    assert judge(f"vllm==0.33.0:{CONVERT}", PACKED, 4).status == "pass"
    assert judge(f"vllm==0.29.0:{CONVERT}", IN_PLACE, 4).status == "fail"


def test_what_the_api_cannot_be_asked_is_not_applicable_with_the_reason():
    narrow = dataclasses.replace(IN_PLACE, topk=64)
    assert "multiple of 128" in judge("vllm==0.33.0", narrow, 2).error
    assert (
        "has no counts"
        in judge("vllm==0.12.0", dataclasses.replace(IN_PLACE, count_valid=True), 1).error
    )
    assert (
        "does not pack"
        in judge("vllm==0.17.0", dataclasses.replace(PACKED, count_valid=False), 1).error
    )
    assert "only under DCP" in judge(f"vllm==0.33.0:{FILTER}", PACKED, 1).error


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (f"vllm==0.17.0:{FILTER}", f"defines {FILTER}"),
        ("vllm==0.10.2", f"defines {CONVERT}"),
    ],
)
def test_a_release_without_the_converter_says_so_in_one_line(spec, said):
    release("vllm==0.17.0")  # fetched (or skipped) as the other tests fetch it
    with pytest.raises(KernelLoadError, match=said) as error:
        kernels.REGISTRY.load(spec)
    assert "\n" not in str(error.value)


def test_read_write_through_a_release_runs_where_its_callers_run():
    """The end-to-end scenario read by a release: not applicable where no backend runs
    under DCP, judged (and right) where one does."""
    from dcpcheck.ops.sparse_topk_remap.scenario import load_scenarios

    [scenario] = load_scenarios(["reads-interleave-block"])
    [early] = run_scenario(release("vllm==0.17.0"), "e", scenario, (2,), BACKEND.device)
    assert early.status == "not_applicable" and "under DCP" in early.error
    [late] = run_scenario(release("vllm==0.29.0"), "l", scenario, (2,), BACKEND.device)
    assert late.status == "pass", [c.findings for c in late.failed_checks]


PREFILL = RemapBatch(
    requests=((700, 2), (90, 1), (1500, 1)), topk=128, block_size=64, interleave=8,
    compact=True, count_valid=True, unused=3, duplicates=1, seed=22, prefill=True,
    past_table=2, earlier_entries=2,
)  # fmt: skip
"""What FlashMLA's sparse backend asks under PCP and DCP: a prefill chunk's picks into the
gathered workspace, packed with counts."""


@pytest.mark.parametrize("version", ("0.30.0", "0.34.0"))
def test_from_0_30_a_prefill_chunk_maps_into_the_gathered_workspace(version):
    for size in (1, 2, 4):
        result = judge(f"vllm=={version}", PREFILL, size)
        assert result.status == "pass", [c.findings for c in result.failed_checks]
        judged = {c.check for c in result.checks if c.skipped is None}
        assert {"workspace", "partition", "valid_counts", "compaction"} <= judged


def test_before_0_30_no_caller_passes_dcp_with_a_prefill_workspace():
    """0.29.0's only call with a prefill workspace passes no DCP, and its converter takes
    no rank stride: not applicable, with the call's line."""
    for size in (2, 4):
        result = judge("vllm==0.29.0", PREFILL, size)
        assert result.status == "not_applicable"
        assert "takes no prefill_workspace_rank_stride" in result.error
        assert "flashmla_sparse.py:694" in result.error


def test_the_prefill_calls_are_read_from_the_callers_file():
    """Each call with a prefill workspace, whether it passes DCP and whether it counts."""
    calls = {
        "0.13.0": (PrefillCall(782, False, False),),
        "0.17.0": (PrefillCall(628, False, False),),
        "0.25.0": (PrefillCall(660, False, True),),
        "0.29.0": (PrefillCall(694, False, True),),
        "0.30.0": (PrefillCall(860, True, True), PrefillCall(946, False, True)),
        "0.34.0": (PrefillCall(997, True, True), PrefillCall(1089, False, True)),
    }
    for version, expected in calls.items():
        assert prefill_calls(release(f"vllm=={version}").caller_file) == expected, version


MIXED = dataclasses.replace(
    PREFILL, requests=((400, 2), (60, 1), *PREFILL.requests), decode_requests=2, seed=23
)
"""FlashMLA sparse's separate prefill/decode call without DCP: the batch's decode rows
(request id -1) beside a prefill chunk's, in one call."""

MIXED_AS_CALLED = {
    "0.13.0": dataclasses.replace(MIXED, compact=False, count_valid=False),
    "0.17.0": dataclasses.replace(MIXED, compact=False, count_valid=False),
    "0.25.0": dataclasses.replace(MIXED, compact=False),
    "0.29.0": dataclasses.replace(MIXED, compact=False),
    "0.30.0": MIXED,
    "0.34.0": MIXED,
}
"""The mixed batch as each release's call asks it: in place without counts before 0.24.0,
in place with counts to 0.29.0, packed with counts from 0.30.0."""


@pytest.mark.parametrize("version", MIXED_AS_CALLED)
def test_a_mixed_batch_is_judged_at_dcp1_as_the_release_calls_it(version):
    asked = MIXED_AS_CALLED[version]
    result = judge(f"vllm=={version}", asked, 1)
    assert result.status == "pass", [c.findings for c in result.failed_checks]
    judged = {c.check for c in result.checks if c.skipped is None}
    assert {"slots", "workspace", "partition"} <= judged
    for other in {*MIXED_AS_CALLED.values()} - {asked}:
        unasked = judge(f"vllm=={version}", other, 1)
        assert unasked.status == "not_applicable"
        assert "calls with a prefill workspace without DCP ask its rows" in unasked.error


@pytest.mark.parametrize("version", ("0.17.0", "0.34.0"))
def test_a_converter_handed_decode_rows_as_prefill_rows_fails_slots(version):
    """The release's converter, handed the decode rows' request ids as the first prefill
    request's (as a caller that did not mark them -1 would): slots and partition fail."""
    converter = release(f"vllm=={version}")

    def ids_unmarked(inputs, out, counts):
        ids = inputs.workspace.request_ids.clamp(min=0)
        workspace = dataclasses.replace(inputs.workspace, request_ids=ids)
        converter(dataclasses.replace(inputs, workspace=workspace), out, counts)

    case = build_case(MIXED_AS_CALLED[version], 1, BACKEND.device)
    assert not any(c.findings for c in checks.judge(converter, case))
    failed = {c.check for c in checks.judge(ids_unmarked, case) if c.findings}
    assert {"slots", "partition"} <= failed


def test_no_caller_converts_decode_rows_under_dcp_with_a_prefill_workspace():
    """The gathered chunk's call converts the chunk's prefill rows only (its rows sliced
    by the chunk's tokens); the converter alone is judged on them all the same."""
    result = judge("vllm==0.34.0", MIXED, 2)
    assert result.status == "not_applicable"
    assert "converts decode rows under DCP" in result.error
    assert "flashmla_sparse.py:997" in result.error
    alone = judge(f"vllm==0.34.0:{CONVERT}", MIXED, 2)
    assert alone.status == "pass", [c.findings for c in alone.failed_checks]


def test_the_filter_takes_no_prefill_workspace():
    result = judge(f"vllm==0.34.0:{FILTER}", PREFILL, 2)
    assert result.status == "not_applicable" and "takes no prefill workspace" in result.error


STRIDED_IN_PLACE = dataclasses.replace(IN_PLACE, block_size=128, gap_rows=128)
"""Blocks of 128 tokens, another layer's page between consecutive ones, in place without
counts: FlashMLA sparse's fp8 mixed batch passes its stride from 0.32.0."""

STRIDED_PACKED = dataclasses.replace(PACKED, gap_rows=128)
"""Blocks of 64 tokens, two other layers' pages between, packed with counts: FlashMLA
sparse's bf16 path passes its stride without DCP from 0.29.0 (which packs from 0.30.0),
under DCP from 0.34.0; FlashInfer's sparse MLA under DCP from 0.29.0."""

STRIDE_JUDGED = {
    "0.30.0": {("packed", 1), ("packed", 2), ("packed", 4), ("in place", 1)},
    "0.31.0": {("packed", 1), ("packed", 2), ("packed", 4), ("in place", 1)},
    "0.32.0": {(rows, size) for rows in ("packed", "in place") for size in (1, 2, 4)},
    "0.34.0": {(rows, size) for rows in ("packed", "in place") for size in (1, 2, 4)},
}
"""The strided cases each release's callers ask (``STRIDE_CALLS``): packed under DCP from
FlashInfer's sparse MLA's filter call (0.29.0 on), packed without DCP from FlashMLA
sparse's bf16 path once the converter packs (0.30.0), in place without DCP from XPU's
sparse MLA (0.29.0), under DCP with FlashMLA sparse's fp8 mixed batch (0.32.0)."""


@pytest.mark.parametrize("version", STRIDE_JUDGED)
def test_a_block_stride_is_judged_where_a_caller_passes_it_and_only_there(version):
    for rows, batch in (("packed", STRIDED_PACKED), ("in place", STRIDED_IN_PLACE)):
        for size in (1, 2, 4):
            result = judge(f"vllm=={version}", batch, size)
            if (rows, size) in STRIDE_JUDGED[version]:
                assert result.status == "pass", [c.findings for c in result.failed_checks]
                assert {"slots", "partition"} <= {
                    c.check for c in result.checks if c.skipped is None
                }
            else:
                assert result.status == "not_applicable", (rows, size)
                assert "passes a block stride for this call" in result.error


def test_0_29_0s_bf16_call_is_asked_its_stride_in_place_with_counts():
    """0.29.0's converter counts without packing (it packs when it counts from 0.30.0), so
    its bf16 path's stride call is the in-place counted one, and only there at DCP1; under
    DCP FlashInfer's sparse MLA asks the filter its stride packed with counts."""
    counted = dataclasses.replace(STRIDED_PACKED, compact=False)
    result = judge("vllm==0.29.0", counted, 1)
    assert result.status == "pass", [c.findings for c in result.failed_checks]
    assert judge("vllm==0.29.0", STRIDED_PACKED, 1).status == "not_applicable"
    later = judge("vllm==0.30.0", counted, 1)
    assert later.status == "not_applicable" and "packs exactly when it counts" in later.error
    for size in (2, 4):  # FlashInfer's sparse MLA: the filter under DCP, packed, counted
        under_dcp = judge("vllm==0.29.0", STRIDED_PACKED, size)
        assert under_dcp.status == "pass", [c.findings for c in under_dcp.failed_checks]


def test_at_block_size_64_the_fp8_mixed_batch_passes_no_stride():
    """``_fp8_kv_pages`` hands the fp8 kernel the paged cache itself at its page size: the
    entries are block-size slots there, so a stride is asked only of the bf16 path."""
    at_64 = dataclasses.replace(STRIDED_IN_PLACE, block_size=64)
    result = judge("vllm==0.34.0", at_64, 2)
    assert result.status == "not_applicable"
    assert "block sizes other than 64" in result.error


def test_before_0_29_no_converter_takes_a_block_stride():
    result = judge(f"vllm==0.28.0:{CONVERT}", STRIDED_IN_PLACE, 1)
    assert result.status == "not_applicable" and "takes no BLOCK_STRIDE_ROWS" in result.error
    alone = judge(f"vllm==0.29.0:{FILTER}", STRIDED_IN_PLACE, 2)  # the API takes it
    assert alone.status == "pass", [c.findings for c in alone.failed_checks]


@pytest.mark.parametrize("version", ("0.29.0", "0.34.0"))
def test_a_release_converter_not_told_the_stride_fails_slots_and_partition(version):
    """The release's converter called without ``BLOCK_STRIDE_ROWS`` on a strided cache (as
    the caller's block-size default would): its slots land in the other layers' pages."""
    converter = release(f"vllm=={version}:{CONVERT}")

    def unstrided(inputs, out, counts):
        converter(dataclasses.replace(inputs, block_stride_rows=None), out, counts)

    batch = dataclasses.replace(STRIDED_IN_PLACE, count_valid=version == "0.29.0")
    case = build_case(batch, 1, BACKEND.device)
    assert not any(c.findings for c in checks.judge(converter, case))
    failed = {c.check for c in checks.judge(unstrided, case) if c.findings}
    assert {"slots", "partition"} <= failed


def _stride_calls_in(path) -> list[tuple[int, str, bool]]:
    """The calls in a caller's file that pass ``BLOCK_STRIDE_ROWS``, by line, with the
    function called and whether it passes a prefill workspace."""
    return sorted(
        (node.lineno, name, "HAS_PREFILL_WORKSPACE" in keywords)
        for node, name, keywords in converter_calls(path)
        if "BLOCK_STRIDE_ROWS" in keywords
    )


def test_the_stride_calls_are_the_ones_in_the_callers_files():
    """Each release's calls that pass a block stride, and each FlashMLA entry of
    ``STRIDE_CALLS`` a call in its first release (FlashInfer's file is not kept)."""
    expected = {
        "0.28.0": [],
        "0.29.0": [(644, CONVERT, False)],
        "0.31.0": [(862, CONVERT, False)],
        "0.32.0": [
            (905, CONVERT, False), (1038, CONVERT, True), (1213, FILTER, False),
            (1241, CONVERT, False),
        ],
        "0.34.0": [
            (928, FILTER, False), (948, CONVERT, False), (1089, CONVERT, True),
            (1268, FILTER, False), (1304, CONVERT, False),
        ],
    }  # fmt: skip
    for version, calls in expected.items():
        assert _stride_calls_in(release(f"vllm=={version}").caller_file) == calls, version
    for call in (c for c in STRIDE_CALLS if c.where.startswith(f"{CALLER_FILE}:")):
        line = int(call.where.removeprefix(f"{CALLER_FILE}:"))
        assert (line, call.function, call.workspace) in expected[call.since], call


def test_a_mixed_batch_decode_rows_are_read_through_the_stride_from_0_32():
    """The separate prefill/decode call passes the stride with its workspace from 0.32.0
    at a block size other than 64: the decode rows' entries are rows of the flat view."""
    strided = dataclasses.replace(MIXED, block_size=128, gap_rows=128)
    result = judge("vllm==0.34.0", strided, 1)
    assert result.status == "pass", [c.findings for c in result.failed_checks]
    assert {"slots", "workspace"} <= {c.check for c in result.checks if c.skipped is None}
    early = judge("vllm==0.31.0", strided, 1)
    assert early.status == "not_applicable" and "passes a block stride" in early.error


def test_flashmlas_callers_under_dcp_are_filter_calls_in_their_first_release():
    """Each FlashMLA entry of ``DCP_CALLERS`` names a call of the filter in its first
    release's caller file, with the packing and counting the entry says; 0.34.0's bf16
    path is one (it runs under DCP from then: only an fp8 cache is refused there)."""
    flashmla = [c for c in DCP_CALLERS if c.where.startswith(f"{CALLER_FILE}:")]
    assert {c.since for c in flashmla} == {"0.29.0", "0.34.0"}
    for caller in flashmla:
        line = int(caller.where.removeprefix(f"{CALLER_FILE}:"))
        calls = {
            node.lineno: keywords
            for node, name, keywords in converter_calls(
                release(f"vllm=={caller.since}").caller_file
            )
            if name == FILTER
        }
        assert line in calls, caller
        assert ("return_valid_counts" in calls[line]) == caller.count, caller


def _converter_broken_under_dcp(version: str, broken):
    """Release ``version``'s kernel with its converter replaced by ``broken(converter,
    args, kwargs)``, the filter as shipped."""
    shipped = release(f"vllm=={version}")

    @functools.wraps(shipped.convert)
    def convert(*args, **kwargs):
        return broken(shipped.convert, args, kwargs)

    return dataclasses.replace(shipped, convert=convert)


def _judged(kernel, batch, size):
    scenario = NamedBatch("t", "a test batch", batch, (size,))
    [result] = run_scenario(kernel, "edited", scenario, (size,), BACKEND.device)
    return result


def _one_entry_moved_under_dcp(convert, args, kwargs):
    returned = convert(*args, **kwargs)
    if kwargs.get("dcp_size", 1) > 1:
        out = kwargs["out"] if kwargs.get("out") is not None else returned[0]
        out[0, 0] += 1
    return returned


def test_from_0_34_the_converter_is_judged_under_dcp_where_kimis_decode_calls_it():
    """0.34.0's Kimi K3.1 decode on FlashInfer calls the converter itself under DCP, packed
    with counts (``attn_fi.py:241``): a converter wrong only under DCP fails 0.34.0's DCP
    case, its findings naming the converter, while 0.33.0, whose callers under DCP call
    only the filter, passes it; the filter's way is judged beside it."""
    for size in (2, 4):
        result = _judged(
            _converter_broken_under_dcp("0.34.0", _one_entry_moved_under_dcp), PACKED, size
        )
        assert result.status == "fail"
        details = [f.detail for c in result.failed_checks for f in c.findings]
        assert details and all(d.startswith(f"{CONVERT}: ") for d in details), details
        earlier = _judged(
            _converter_broken_under_dcp("0.33.0", _one_entry_moved_under_dcp), PACKED, size
        )
        assert earlier.status == "pass", [c.findings for c in earlier.failed_checks]
    at_dcp1 = _judged(_converter_broken_under_dcp("0.34.0", _one_entry_moved_under_dcp), PACKED, 1)
    assert at_dcp1.status == "pass", [c.findings for c in at_dcp1.failed_checks]
    assert [w for w, _ in release("vllm==0.34.0").asks] == [CONVERT, FILTER]
    assert [w for w, _ in release("vllm==0.33.0").asks] == [""]


def test_under_dcp_0_34_0s_converter_is_read_through_the_callers_buffers():
    """Kimi's decode reads the buffers it hands the converter (``out``,
    ``valid_counts_out``), not what the call returns: a converter that leaves them
    unwritten fails, though what it returns is right."""

    def ignores_the_buffers(convert, args, kwargs):
        kwargs = {**kwargs, "out": None, "valid_counts_out": None}
        return convert(*args, **kwargs)

    result = _judged(_converter_broken_under_dcp("0.34.0", ignores_the_buffers), PACKED, 2)
    assert result.status == "fail"
    assert {"slots"} <= {c.check for c in result.failed_checks}
    assert _judged(release("vllm==0.34.0"), PACKED, 2).status == "pass"


def test_0_34_0s_picks_in_place_under_dcp_are_the_filters_alone():
    """No caller asks the converter under DCP in place: that way says so, and the case is
    the filter's (FlashMLA sparse's fp8 mixed batch)."""
    result = judge("vllm==0.34.0", IN_PLACE, 2)
    assert result.status == "pass", [c.findings for c in result.failed_checks]
    broken = _judged(_converter_broken_under_dcp("0.34.0", _one_entry_moved_under_dcp), IN_PLACE, 2)
    assert broken.status == "pass"
    assert CONVERT in release("vllm==0.34.0").asks[0][1].not_applicable(
        build_case(IN_PLACE, 2, BACKEND.device).ranks[0]
    )


def test_0_34_0s_read_side_is_checked_end_to_end_each_way():
    """The end-to-end read check (``read_write``) of a packed scenario under DCP asks
    0.34.0's converter too: one wrong under DCP fails it, naming the converter."""
    op = package(SPARSE_TOPK_REMAP)
    [scenario] = op.load_scenarios(["reads-near-max-packed"], op.scenarios)
    kernel = _converter_broken_under_dcp("0.34.0", _one_entry_moved_under_dcp)
    [result] = run_scenario(kernel, "edited", scenario, (2,), BACKEND.device)
    assert result.status == "fail"
    [check] = result.failed_checks
    assert check.check == "read_write"
    assert all(f.detail.startswith(f"{CONVERT}: ") for f in check.findings)
