"""vLLM's slot-mapping routines judged in the releases where their API shape or their
verdict changes, as ``dcpcheck run --op slot-mapping --kernel vllm==X[:NAME]`` judges them
(``dcpcheck.ops.slot_mapping.vllm``, ``vllm_v1``).

The GPU runner's kernel, one release per shape: 0.12.0 (no request mapping, no DCP),
0.15.0 (request mapping), 0.17.0 (DCP; pads from the rows its caller passes, which are
padded: the finding), 0.28.0 (pads from the scheduled tokens, as every release from 0.18.0:
fixed), 0.29.0 (kernel block sizes, groups without slots), 0.31.0 (sharded flags, requests
without blocks), 0.33.0 (kernel block sizes gone). The V1 runner's block table: 0.10.2
(numpy, no interleave), 0.12.0 - 0.17.0 (numpy, interleaved), 0.28.0 (Triton), 0.29.0
(Triton in a JIT warm-up class) and 0.31.0 (launched by vLLM's kernel launcher, which a
stand-in does as vLLM's does). Eight wheels, fetched as ``--kernel vllm==X`` fetches them
(pip, then the cache outside the checkout) and skipped only where the registry is
unreachable and the release is not cached.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dcpcheck.adapters.protocol import AdapterError
from dcpcheck.cases.scenario_files import NamedBatch
from dcpcheck.cases.verdicts import CaseResult
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.op_registry import SLOT_MAPPING
from dcpcheck.ops import op_cases, package
from dcpcheck.ops.slot_mapping import every_rank, kernels, vllm
from dcpcheck.ops.slot_mapping.case import SlotMappingBatch
from dcpcheck.ops.slot_mapping.checks import CHECKS as SLOT_CHECKS
from dcpcheck.ops.slot_mapping.contract import EachRoutine, LocalSeqLensInputs, Routines
from dcpcheck.ops.slot_mapping.runner import OP_CASES
from dcpcheck.ops.slot_mapping.scenario import load_scenarios
from dcpcheck.ops.slot_mapping.search import batches
from dcpcheck.ops.slot_mapping.seq_lens import CHECKS as LENGTH_CHECKS
from dcpcheck.ops.slot_mapping.vllm import (
    FUNCTION,
    KERNEL_BLOCKS_AS_SIZES,
    VllmSlotMappings,
    rows_the_caller_passes,
    torch_function,
)
from dcpcheck.ops.slot_mapping.vllm_v1 import VllmV1SlotMappings, rebuild_of, slotless_of
from tests.conftest import BACKEND, registry_problem

run_scenario = package(SLOT_MAPPING).run_scenario
search = package(SLOT_MAPPING).search

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("0.12.0", "0.15.0", "0.17.0", "0.28.0", "0.29.0", "0.31.0", "0.33.0")
WITH_DCP = ("0.17.0", "0.28.0", "0.29.0", "0.31.0", "0.33.0")
FIXED = ("0.28.0", "0.29.0", "0.31.0", "0.33.0")


@functools.cache
def release(version: str) -> Routines:
    """Release ``version``'s GPU model runner's slot kernel, with the local lengths as
    ``--kernel vllm==X`` loads them: ``vllm==X`` judges the V1 runner's table beside
    that kernel (``EachRoutine``), and the tests below that ask for the table name it."""
    try:
        loaded = kernels.REGISTRY.load(f"vllm=={version}")
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"vllm=={version} is not cached and the registry is unreachable: {problem}")
        raise AssertionError(
            f"the registry answers, yet vllm=={version} did not load: {exc}"
        ) from exc
    slots = loaded.slot_mappings
    if isinstance(slots, EachRoutine):
        slots = dict(slots.routines)[FUNCTION]
    assert isinstance(slots, VllmSlotMappings)
    return dataclasses.replace(loaded, slot_mappings=slots)


def judge(version: str, batch: SlotMappingBatch, dcp_size: int) -> CaseResult:
    scenario = NamedBatch("t", "a test batch", batch, (dcp_size,))
    kernel = release(version)
    [result] = run_scenario(kernel, f"vllm=={version}", scenario, (dcp_size,), BACKEND.device)
    return result


def shipped(name: str) -> NamedBatch:
    [scenario] = load_scenarios([name])
    return scenario


def failed(result: CaseResult) -> set[tuple[str, str, str | None]]:
    """(check, field, ownership of the first bad row) of every failing check."""
    return {(c.check, f.field, f.ownership) for c in result.failed_checks for f in c.findings}


SHARDED = SlotMappingBatch(((37, 1), (100, 40), (3, 2)), (16, 64), (True, True), 1)
"""Requests that own blocks, sharded groups, no padding: what every release's caller passes."""


@pytest.mark.parametrize("version", RELEASES)
def test_every_release_passes_at_dcp1_without_padding_rows(version):
    assert judge(version, SHARDED, 1).status == "pass"


@pytest.mark.parametrize("version", WITH_DCP)
@pytest.mark.parametrize(("dcp_size", "interleave"), [(2, 1), (4, 1), (4, 16), (8, 2)])
def test_every_release_with_dcp_shards_its_callers_groups(version, dcp_size, interleave):
    batch = SlotMappingBatch(
        ((1000, 33), (3, 70), (0, 5)), (16 * interleave, 64), (True, True), interleave, seed=2
    )
    result = judge(version, batch, dcp_size)
    assert result.status == "pass", failed(result)


@pytest.mark.parametrize("version", FIXED)
def test_the_fixed_releases_pad_every_row_after_the_scheduled_tokens(version):
    scenario = shipped("interleaved-prefix")  # two CUDA-graph padding rows
    for size in (1, 4):
        assert judge(version, scenario.batch, size).status == "pass"


@pytest.mark.parametrize("version", ["0.17.0"])
@pytest.mark.parametrize("dcp_size", [1, 2, 4, 8])
def test_0_17_leaves_exactly_the_padding_rows_unwritten(version, dcp_size):
    """Its caller passes the rows after CUDA-graph padding and its kernel pads from there,
    so the rows between the scheduled tokens and the padded count keep what they held
    (the previous step's slots, on the GPU): the finding, on every rank, padding only."""
    scenario = shipped("interleaved-prefix")
    result = judge(version, scenario.batch, dcp_size)
    assert result.status == "fail"
    assert failed(result) == {
        ("slots", "slot_mapping[0]", "padding"),
        ("slots", "slot_mapping[1]", "padding"),
        ("padding", "slot_mapping[0]", "padding"),
        ("padding", "slot_mapping[1]", "padding"),
    }
    rows = {row for c in result.failed_checks for f in c.findings for row in f.tokens}
    scheduled = sum(new for _, new in scenario.batch.requests)
    assert rows == set(range(scheduled, scheduled + scenario.batch.padding))


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0"])
def test_releases_with_sharded_flags_keep_replicated_groups_and_skip_requests_without_blocks(
    version,
):
    scenario = shipped("mixed-groups-padded")
    for size in scenario.dcp_sizes:
        result = judge(version, scenario.batch, size)
        assert result.status == "pass", (size, failed(result))


@pytest.mark.parametrize(
    ("version", "batch", "dcp_size", "words"),
    [
        ("0.15.0", SHARDED, 2, "takes no DCP rank"),
        ("0.12.0", SHARDED, 4, "takes no DCP rank"),
        ("0.28.0", SlotMappingBatch(((5, 3), (9, 1)), (16,), (True,), without_blocks=(1,)), 1,
         "without blocks"),
    ],
)  # fmt: skip
def test_what_a_releases_caller_never_asks_is_skipped_with_the_reason(
    version, batch, dcp_size, words
):
    """The slot-mapping checks are skipped, never passed; a case with nothing else to
    judge is not applicable as a whole."""
    result = judge(version, batch, dcp_size)
    slot_checks = [c for c in result.checks if c.check in SLOT_CHECKS]
    if result.status == "not_applicable":
        assert words in result.error
    else:
        assert len(slot_checks) == len(SLOT_CHECKS)
    assert all(words in c.skipped for c in slot_checks)


@pytest.mark.parametrize(
    ("version", "padded"), [("0.12.0", False), ("0.15.0", False), ("0.17.0", True)]
)
def test_the_rows_a_caller_passes_are_read_from_its_source(version, padded):
    slots = release(version).slot_mappings
    assert slots.caller is not None
    assert slots.caller.padded is padded
    assert "model_runner.py:" in slots.caller.evidence


def test_releases_whose_kernel_takes_no_row_count_need_no_caller():
    assert release("0.28.0").slot_mappings.caller is None


CALLER_SCHEDULED = """
class Runner:
    def prepare_inputs(self, scheduler_output, num_tokens_after_padding):
        num_tokens = scheduler_output.total_num_scheduled_tokens
        slot_mappings = self.block_tables.compute_slot_mappings(
            query_start_loc, self.input_buffers.positions[:num_tokens]
        )
"""

CALLER_PADDED = """
class Runner:
    def prepare_inputs(self, scheduler_output, num_tokens_after_padding):
        num_tokens = scheduler_output.total_num_scheduled_tokens
        input_batch = InputBatch(positions=self.input_buffers.positions[:num_tokens_after_padding])

    def prepare_attn(self, input_batch):
        return self.block_tables.compute_slot_mappings(
            input_batch.idx_mapping, input_batch.query_start_loc, input_batch.positions
        )
"""


@pytest.mark.parametrize(("source", "padded"), [(CALLER_SCHEDULED, False), (CALLER_PADDED, True)])
def test_the_caller_reading_tells_scheduled_rows_from_padded_ones(source, padded):
    rows = rows_the_caller_passes(source, "model_runner.py")
    assert rows.padded is padded
    assert rows.evidence.startswith("model_runner.py:")


def test_a_caller_that_does_not_say_is_refused():
    with pytest.raises(AdapterError, match="no compute_slot_mappings call"):
        rows_the_caller_passes("x = 1\n", "model_runner.py")


@pytest.mark.parametrize("version", ["0.17.0", "0.33.0"])
def test_a_file_by_path_is_judged_as_its_release(version):
    """A checkout's file (its caller beside it) is the release's kernel by another name."""
    kernel = release(version)
    path = Path(kernel.slot_mappings.kernel.fn.__code__.co_filename)  # the cached file
    by_path = kernels.REGISTRY.load(f"{path}:_compute_slot_mappings_kernel")
    scenario = shipped("interleaved-prefix")
    [mine] = run_scenario(by_path, "path", scenario, (4,), BACKEND.device)
    assert mine.status == judge(version, scenario.batch, 4).status


def test_the_search_finds_and_shrinks_0_17s_unwritten_padding():
    kernel = release("0.17.0")  # at DCP1, where its replicated groups are kept whole
    outcome = search(kernel, "vllm==0.17.0", 60, BACKEND.device, (1,), seed=1)
    assert not outcome.passed
    batch = outcome.failure.batch
    assert batch.padding == 1 and len(batch.requests) == 1
    assert {c.check for c in outcome.result.failed_checks} == {"slots", "padding"}


def test_the_search_finds_and_shrinks_51031_in_0_28():
    """Drawing sharded groups alone, as the release's own search does."""
    kernel = release("0.28.0")
    drawn = batches((1, 2, 4, 8), replicated=False, without_blocks=False)
    outcome = op_cases.search(OP_CASES, kernel, "k", drawn, 100, BACKEND.device, None)
    assert not outcome.passed
    batch = outcome.failure.batch
    assert batch.kernel_block_sizes and batch.kernel_block_sizes[0] < batch.interleave


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0"])
def test_the_search_passes_the_fixed_releases(version):
    outcome = search(release(version), f"vllm=={version}", 40, BACKEND.device, seed=1)
    assert outcome.passed
    assert outcome.examples_run - outcome.not_applicable > 0


@pytest.mark.parametrize(
    ("find", "versions", "named"),
    [("first-bad", RELEASES[0:3], "0.17.0"), ("first-fixed", RELEASES[2:5], "0.28.0")],
)
def test_bisecting_the_releases_names_the_one_that_broke_and_the_one_that_fixed(
    tmp_path, find, versions, named
):
    """``dcpcheck bisect --op slot-mapping --releases ...``, as a user runs it."""
    for version in versions:
        release(version)  # cached (or skipped) before the bisection's subprocesses
    command = [sys.executable, "-m", "dcpcheck", "bisect", "--op", "slot-mapping"]
    command += ["--releases", ",".join(versions), "--find", find]
    command += ["--scenario", "interleaved-prefix", "--dcp", "1"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"vllm {named}" in done.stdout


# -- the local sequence lengths ----------------------------------------------------------

LONG = SlotMappingBatch(((1000, 33), (3, 70), (0, 5), (77, 1)), (64,), (True,), 1, padding=3)


@pytest.mark.parametrize("version", ["0.17.0", "0.28.0", "0.33.0"])
@pytest.mark.parametrize(("dcp_size", "interleave"), [(2, 1), (4, 16), (8, 2)])
def test_the_runners_lengths_kernel_counts_each_ranks_positions(version, dcp_size, interleave):
    batch = dataclasses.replace(LONG, interleave=interleave, block_sizes=(16 * interleave,))
    result = judge(version, batch, dcp_size)
    lengths = {c.check: c for c in result.checks if c.check in LENGTH_CHECKS}
    assert set(lengths) == set(LENGTH_CHECKS)
    assert all(c.passed for c in lengths.values()), failed(result)


def test_the_runners_lengths_kernel_is_not_asked_at_dcp1():
    """Named alone, the GPU runner's lengths kernel is skipped at DCP1 (its caller does
    not launch it there); ``vllm==X`` judges the lengths there by the backends' function."""
    release("0.33.0")
    alone = kernels.REGISTRY.load(f"vllm==0.33.0:{vllm.SEQ_LENS_KERNEL}")
    scenario = NamedBatch("t", "a test batch", LONG, (1,))
    [result] = run_scenario(alone, "k", scenario, (1,), BACKEND.device)
    assert result.status == "not_applicable"  # no check of either routine ran
    assert "only under DCP" in (result.error or "")
    result = judge("0.33.0", LONG, 1)
    assert result.status == "pass"
    assert {c.check: c for c in result.checks}["local_seq_lens"].passed


def test_a_release_before_the_runners_lengths_kernel_judges_the_backends_function():
    """0.15.0's GPU runner computes no local lengths; ``vllm==0.15.0`` judges those of its
    attention backends."""
    assert isinstance(release("0.15.0").local_seq_lens, vllm.VllmLocalSeqLens)
    result = judge("0.15.0", SHARDED, 1)
    assert {c.check: c for c in result.checks}["local_seq_lens"].passed


@functools.cache
def backends_function(version: str) -> Routines:
    release(version)  # fetched (or skipped) as the other tests fetch it
    return kernels.REGISTRY.load(f"vllm=={version}:get_dcp_local_seq_lens")


@pytest.mark.parametrize("version", ["0.12.0", "0.28.0", "0.33.0"])
@pytest.mark.parametrize(("dcp_size", "interleave"), [(1, 1), (2, 1), (4, 16), (8, 2)])
def test_the_backends_lengths_function_counts_each_ranks_positions(version, dcp_size, interleave):
    """Called as the runners call it; the padded requests are its callers', not its own."""
    batch = dataclasses.replace(LONG, interleave=interleave, block_sizes=(16 * interleave,))
    scenario = NamedBatch("t", "a test batch", batch, (dcp_size,))
    kernel = backends_function(version)
    [result] = run_scenario(kernel, "f", scenario, (dcp_size,), BACKEND.device)
    assert result.status == "pass", failed(result)
    verdicts = {c.check: c for c in result.checks}
    assert "callers fill the padded requests" in verdicts["seq_lens_padding"].skipped
    assert all(verdicts[name].passed for name in LENGTH_CHECKS if name != "seq_lens_padding")
    assert all("alone" in verdicts[name].skipped for name in SLOT_CHECKS)


# -- the function asked for every rank at once ---------------------------------------------

LENGTHS_FUNCTION = """\
import torch


def get_dcp_local_seq_lens(seq_lens, dcp_size=1, dcp_rank=None, interleave=1):
    every = dcp_rank is None
    ranks = torch.arange(dcp_size) if every else torch.tensor([dcp_rank])
    ranks = RANKS
    tiled = seq_lens.to(torch.int32).unsqueeze(-1)
    base = tiled // interleave // dcp_size * interleave
    local = base + torch.clip(tiled - base * dcp_size - ranks * interleave, 0, interleave)
    return SHAPED
"""
"""A local-length function with the releases' signature, written here; its ``RANKS`` and
``SHAPED`` lines are what a test breaks."""

GUARDED = every_rank.EveryRankCallers(("mla/common.py:868",), under_dcp_only=True)


def lengths_function(tmp_path, ranks="ranks", shaped="local if every else local[:, 0]"):
    path = tmp_path / "utils.py"
    path.write_text(LENGTHS_FUNCTION.replace("RANKS", ranks).replace("SHAPED", shaped))
    return torch_function(path, "get_dcp_local_seq_lens", "t")


def judge_function(function, callers, dcp_size: int) -> CaseResult:
    routine = vllm.VllmLocalSeqLens.of_function(function, "t", callers)
    scenario = NamedBatch("t", "a test batch", LONG, (dcp_size,))
    kernel = Routines(None, routine, "the local lengths alone")
    [result] = run_scenario(kernel, "t", scenario, (dcp_size,), BACKEND.device)
    return result


def length_details(result: CaseResult) -> list[str]:
    return [f.detail for c in result.checks if c.check == "local_seq_lens" for f in c.findings]


@pytest.mark.parametrize("dcp_size", [1, 4])
def test_a_function_asked_both_ways_passes_both_ways(tmp_path, dcp_size):
    result = judge_function(lengths_function(tmp_path), GUARDED, dcp_size)
    assert result.status == "pass", failed(result)


@pytest.mark.parametrize(
    ("ranks", "way"),
    [
        ("ranks.flip(0) if every else ranks", "asked for every rank at once (mla/common.py:868)"),
        ("ranks if every else ranks + 1", "asked for one rank"),
    ],
)
def test_a_function_wrong_one_way_fails_that_way_only(tmp_path, ranks, way):
    result = judge_function(lengths_function(tmp_path, ranks), GUARDED, 4)
    assert result.status == "fail"
    details = length_details(result)
    assert details and all(detail.startswith(f"{way}: ") for detail in details)


def test_a_function_is_asked_for_every_rank_at_dcp1_only_where_a_caller_asks_so(tmp_path):
    one_ranks_shape = lengths_function(tmp_path, shaped="local[:, 0]")  # wrong, asked so
    assert judge_function(one_ranks_shape, GUARDED, 1).status == "pass"
    unguarded = dataclasses.replace(GUARDED, under_dcp_only=False)
    assert judge_function(one_ranks_shape, unguarded, 1).status == "error"


def test_a_function_asked_for_every_rank_that_returns_one_ranks_shape_is_an_error(tmp_path):
    result = judge_function(lengths_function(tmp_path, shaped="local[:, 0]"), GUARDED, 4)
    assert result.status == "error"
    assert "dcp_rank=None) returned shape [4], not [requests, dcp_size] = [4, 4]" in result.error


def test_a_function_no_caller_asks_for_every_rank_is_asked_for_one(tmp_path):
    wrong_every_way = lengths_function(tmp_path, "ranks.flip(0) if every else ranks")
    assert judge_function(wrong_every_way, every_rank.every_rank_callers({}), 4).status == "pass"


CALLERS = """\
def build(self, lens):
    if self.dcp_world_size > 1:
        a = get_dcp_local_seq_lens(lens, self.dcp_world_size, None, 1)
    b = utils.get_dcp_local_seq_lens(lens, dcp_size=4)
    c = get_dcp_local_seq_lens(lens, 4, self.dcp_rank, 1)
    d = get_dcp_local_seq_lens(lens, 4, dcp_rank=0)
"""


def test_the_calls_that_ask_every_rank_are_read_with_whether_they_run_under_dcp_only():
    assert every_rank.every_rank_callers({"f.py": CALLERS}) == every_rank.EveryRankCallers(
        ("f.py:3", "f.py:4"), under_dcp_only=False
    )
    guarded_only = "\n".join(CALLERS.splitlines()[:3])
    assert every_rank.every_rank_callers({"f.py": guarded_only}) == every_rank.EveryRankCallers(
        ("f.py:3",), under_dcp_only=True
    )


MLA_BUILDER = "vllm/model_executor/layers/attention/mla_attention.py"
INDEXER = "vllm/v1/attention/backends/mla/indexer.py"


@pytest.mark.parametrize(
    ("version", "callers"),
    [
        ("0.12.0", ("vllm/v1/attention/backends/mla/common.py:859",)),
        ("0.13.0", ("vllm/v1/attention/backends/mla/common.py:868",)),
        ("0.34.0", (f"{MLA_BUILDER}:2321", f"{INDEXER}:1976")),
    ],
)
def test_the_calls_for_every_rank_are_read_from_the_release(version, callers):
    routine = backends_function(version).local_seq_lens
    assert kernels.every_rank_callers(version) == every_rank.EveryRankCallers(callers, True)
    assert [label for label, _ in routine.asks] == [
        "asked for one rank", f"asked for every rank at once ({', '.join(callers)})"
    ]  # fmt: skip
    judged = kernels.REGISTRY.judged_files(f"vllm=={version}:get_dcp_local_seq_lens")
    files = [f.path for f in judged]
    assert all(any(f.endswith(c.rsplit(":", 1)[0]) for f in files) for c in callers)


def test_a_function_that_needs_more_than_torch_is_refused(tmp_path):
    source = tmp_path / "utils.py"
    source.write_text(
        "import torch\n\ndef get_dcp_local_seq_lens(x, n, r, i):\n    return cdiv(x)\n"
    )
    with pytest.raises(AdapterError, match="uses cdiv, not torch alone"):
        torch_function(source, "get_dcp_local_seq_lens", "t")


# -- the V1 runner's block table ---------------------------------------------------------


@functools.cache
def v1_table(version: str) -> Routines:
    try:
        return kernels.REGISTRY.load(f"vllm=={version}:compute_slot_mapping")
    except KernelLoadError:
        problem = registry_problem()
        if problem is not None:
            pytest.skip(f"vllm=={version} is not cached and the registry is unreachable: {problem}")
        raise


def judge_v1(version: str, batch: SlotMappingBatch, dcp_size: int) -> CaseResult:
    scenario = NamedBatch("t", "a test batch", batch, (dcp_size,))
    kernel = v1_table(version)
    [result] = run_scenario(kernel, "v1", scenario, (dcp_size,), BACKEND.device)
    return result


REBUILT_WITHOUT_INTERLEAVE = ("0.11.1", "0.12.0", "0.17.0", "0.18.0", "0.25.1")
"""Releases whose V1 runner builds its block tables again without the interleave when the
cache groups are not one at the configured block size (vLLM #45528)."""


def mismatched(result: CaseResult, *lines: int) -> bool:
    """Whether only the slots fail, each finding quoting the runner's rebuild ``lines``."""
    details = [f.detail for c in result.failed_checks for f in c.findings]
    return (
        {c.check for c in result.failed_checks} == {"slots"}
        and bool(details)
        and all(
            "rebuilds its block tables for these cache groups at interleave 1" in d for d in details
        )
        and all(f"gpu_model_runner.py:{line}" in d for d in details for line in lines)
    )


@pytest.mark.parametrize("version", ["0.10.2", "0.12.0", "0.17.0", "0.28.0", "0.29.0"])
@pytest.mark.parametrize(("dcp_size", "interleave"), [(1, 1), (2, 1), (4, 1), (8, 1), (4, 16)])
def test_the_v1_block_table_maps_every_rank_as_its_runner_asks(version, dcp_size, interleave):
    """From DCP's first release on; the rows after the scheduled tokens are the runner's.
    Two cache groups: a runner that rebuilds its tables without the interleave maps them
    at interleave 1, against lengths at the configured one."""
    batch = SlotMappingBatch(
        ((1000, 33), (3, 70), (0, 5)), (16 * interleave, 64), (True, True), interleave, padding=3
    )
    result = judge_v1(version, batch, dcp_size)
    if version == "0.10.2" and interleave > 1:
        assert result.status == "not_applicable" and "no interleave setting" in result.error
        assert "block_table.py:16: BlockTable(block_size, " in result.error  # the line says so
        return
    if version in REBUILT_WITHOUT_INTERLEAVE and interleave > 1:
        assert result.status == "fail" and mismatched(result), failed(result)
        return
    assert result.status == "pass", failed(result)
    verdicts = {c.check: c for c in result.checks}
    assert all(verdicts[name].passed for name in ("slots", "ownership"))
    assert "fills the rows after them with -1" in verdicts["padding"].skipped
    assert "a buffer of its own" in verdicts["guard"].skipped


@pytest.mark.parametrize(
    ("batch", "words"),
    [
        (SlotMappingBatch(((5, 3), (9, 1)), (16,), (True,), without_blocks=(1,)), "row i"),
        (SlotMappingBatch(((5, 3),), (16, 16), (True, False)), "no replicated cache group"),
    ],
)
def test_what_the_v1_runner_never_asks_its_table_is_not_applicable(batch, words):
    result = judge_v1("0.28.0", batch, 2)
    assert result.status == "not_applicable" and words in result.error


@pytest.mark.parametrize("dcp_size", [1, 4])
def test_the_v1_table_launched_through_vllms_kernel_launcher_maps_every_rank(dcp_size):
    """0.31.0's class returns a launch specification; the launcher's stand-in runs it."""
    release("0.31.0")  # fetched (or skipped) as the other tests fetch it
    batch = SlotMappingBatch(((1000, 33), (3, 70)), (32, 64), (True, True), 2, padding=3)
    result = judge_v1("0.31.0", batch, dcp_size)
    assert result.status == "pass", failed(result)
    verdicts = {c.check: c for c in result.checks}
    assert verdicts["slots"].passed and verdicts["ownership"].passed


@pytest.mark.parametrize("version", ["0.10.2", "0.28.0"])
def test_the_search_passes_the_v1_table_drawing_only_what_it_can_be_asked(version):
    kernel = v1_table(version)
    outcome = search(kernel, f"vllm=={version}", 40, BACKEND.device, seed=1)
    assert outcome.passed and outcome.not_applicable == 0


# -- kernel blocks smaller than the cache's ------------------------------------------------


@pytest.mark.parametrize("version", ["0.22.0", "0.28.0", "0.29.0", "0.31.0"])
@pytest.mark.parametrize("dcp_size", [1, 2, 4, 8])
def test_the_gpu_runners_that_take_kernel_blocks_map_through_them(version, dcp_size):
    """The table in kernel blocks, as their runner writes it; the slots the cache's."""
    result = judge(version, shipped("kernel-blocks").batch, dcp_size)
    slot_checks = {c.check: c for c in result.checks if c.check in SLOT_CHECKS}
    assert result.status == "pass", failed(result)
    assert all(check.passed for check in slot_checks.values())


@pytest.mark.parametrize(("version", "line"), [("0.21.0", 86), ("0.33.0", 114)])
def test_a_gpu_runner_without_kernel_blocks_is_not_asked_them(version, line):
    """Its BlockTables hands the kernel the cache's block sizes, its tables in cache
    blocks: the line that says so is quoted."""
    result = judge(version, shipped("kernel-blocks").batch, 4)
    slot_checks = [c for c in result.checks if c.check in SLOT_CHECKS]
    assert slot_checks and all("is given no kernel block size" in c.skipped for c in slot_checks)
    assert all(f"block_table.py:{line}: self.block_sizes_tensor" in c.skipped for c in slot_checks)


@pytest.mark.parametrize("version", ["0.12.0", "0.28.0", "0.29.0"])
@pytest.mark.parametrize("dcp_size", [1, 4, 8])
def test_the_v1_table_maps_each_cache_block_to_its_kernel_blocks_itself(version, dcp_size):
    """At interleave 4 from 0.26.0 on; before, the runner rebuilds these tables at 1."""
    result = judge_v1(version, shipped("kernel-blocks").batch, dcp_size)
    if version in REBUILT_WITHOUT_INTERLEAVE and dcp_size > 1:
        assert result.status == "fail" and mismatched(result), failed(result)
        return
    assert result.status == "pass", failed(result)


def test_the_first_v1_table_has_no_kernel_blocks_to_be_asked():
    result = judge_v1("0.10.2", shipped("kernel-blocks").batch, 1)
    assert result.status == "not_applicable" and "no kernel block size" in result.error


# -- vLLM #45528: the V1 runner's rebuild drops the interleave (0.11.1 - 0.25.1) ------------

REBUILD_LINES = {
    "0.11.1": (False, (4675, 4683, 1433)),
    "0.18.0": (False, (6178, 6189, 1979)),
    "0.25.1": (False, (7050, 7056, 2399)),
    "0.26.0": (True, (7224,)),
}
"""Per release: whether the runner's rebuild passes the interleave, and the lines that say
(the rebuild's condition, its InputBatch, the local lengths' call; or the interleave
passed), as read from the wheels."""


@pytest.mark.parametrize(("version", "facts"), REBUILD_LINES.items())
def test_which_interleave_the_v1_runner_rebuilds_its_tables_with_is_read_from_it(version, facts):
    keeps, lines = facts
    rebuild = v1_table(version).slot_mappings.rebuild
    assert rebuild.keeps_interleave is keeps
    assert all(f"gpu_model_runner.py:{line}:" in rebuild.evidence for line in lines)


@pytest.mark.parametrize("dcp_size", [2, 4, 8])
def test_45528_0_25_s_v1_table_under_kernel_blocks_is_rebuilt_at_interleave_1(dcp_size):
    result = judge_v1("0.25.1", shipped("interleave-over-kernel-block").batch, dcp_size)
    assert result.status == "fail" and mismatched(result, 7050, 7056, 2399), failed(result)


@pytest.mark.parametrize("dcp_size", [1, 2, 4, 8])
def test_45528_0_26_rebuilds_its_v1_table_at_the_configured_interleave(dcp_size):
    result = judge_v1("0.26.0", shipped("interleave-over-kernel-block").batch, dcp_size)
    assert result.status == "pass", failed(result)


def test_45528_one_group_at_its_cache_block_is_not_rebuilt():
    """The runner keeps the tables it built with the interleave: they map right."""
    batch = SlotMappingBatch(((1000, 33), (3, 70)), (64,), (True,), 16)
    assert judge_v1("0.25.1", batch, 4).status == "pass"


@pytest.mark.parametrize("dcp_size", [2, 4, 8])
def test_45528_vllm_0_11_1_judged_whole_fails_its_slots_against_its_lengths(dcp_size):
    """The slots at the rebuilt interleave, the local lengths at the configured one."""
    result = judge_whole("0.11.1", shipped("interleave-over-kernel-block").batch, dcp_size)
    assert result.status == "fail" and mismatched(result, 4675, 4683, 1433), failed(result)
    assert any(c.passed for c in result.checks if c.check == "local_seq_lens")


RUNNER = """
class Runner:
    def may_reinitialize_input_batch(self, kv_cache_config, kernel_block_sizes):
        if {test}:
            self.input_batch = InputBatch(block_sizes=block_sizes{extra})

    def _prepare_inputs(self):
        x = get_dcp_local_seq_lens(lens, size, rank, self.config.interleave_size)
"""


@pytest.mark.parametrize(
    ("test", "extra", "words"),
    [
        ("block_sizes != self._init_block_sizes", "", "without the interleave on block_sizes"),
        ("True", "", "without the interleave on True"),
        ("block_sizes != a and kernel_block_sizes != b", "", "on block_sizes != a and"),
        (
            "block_sizes != a or kernel_block_sizes != b",
            ", x=1)\n        InputBatch(y=2",
            "2 InputBatch",
        ),
    ],
)
def test_a_runner_whose_rebuild_the_adapter_cannot_read_is_refused(test, extra, words):
    with pytest.raises(AdapterError, match=words):
        rebuild_of(RUNNER.format(test=test, extra=extra), "gpu_model_runner.py")


def test_a_runner_that_rebuilds_without_saying_its_lengths_interleave_is_refused():
    source = RUNNER.format(test="block_sizes != a or kernel_block_sizes != b", extra="")
    with pytest.raises(AdapterError, match="no get_dcp_local_seq_lens"):
        rebuild_of(source.replace("self.config.interleave_size", "1"), "r.py")


def test_a_v1_table_that_takes_an_interleave_needs_its_runner():
    table = v1_table("0.25.1").slot_mappings.table_class
    with pytest.raises(AdapterError, match="read from the runner"):
        VllmV1SlotMappings(table, "vllm==0.25.1", None)


# -- vLLM #51031: localized by the kernel block (0.22.0 - 0.28.0) ---------------------------

KERNEL_BLOCK_AS_SIZE = ("0.22.0", "0.25.0", "0.28.0")
"""BlockTables hands the kernel the kernel blocks' sizes as its block sizes."""


@pytest.mark.parametrize("version", KERNEL_BLOCK_AS_SIZE)
def test_kernel_block_sizes_are_passed_as_the_runner_passes_them(version):
    blocks = release(version).slot_mappings.blocks
    assert blocks.kind == KERNEL_BLOCKS_AS_SIZES
    assert "= torch.tensor(self.kernel_block_sizes" in blocks.evidence


@pytest.mark.parametrize("version", KERNEL_BLOCK_AS_SIZE)
@pytest.mark.parametrize("dcp_size", [2, 4, 8])
def test_51031_an_interleave_above_the_kernel_block_gets_wrong_slots(version, dcp_size):
    """Localized by the kernel block, a rank's run of 32 tokens is split at 16: the
    sharded group's slots are wrong on its ranks, and only they."""
    result = judge(version, shipped("interleave-over-kernel-block").batch, dcp_size)
    assert result.status == "fail"
    assert {(check, field) for check, field, _ in failed(result)} == {("slots", "slot_mapping[0]")}


@pytest.mark.parametrize("version", [*KERNEL_BLOCK_AS_SIZE, "0.29.0", "0.31.0"])
def test_51031_the_same_tables_at_dcp1_map_right(version):
    assert judge(version, shipped("interleave-over-kernel-block").batch, 1).status == "pass"


@pytest.mark.parametrize("version", ["0.29.0", "0.30.0", "0.31.0"])
@pytest.mark.parametrize("dcp_size", [2, 4, 8])
def test_51031_the_releases_that_take_both_block_sizes_localize_by_the_cache_block(
    version, dcp_size
):
    result = judge(version, shipped("interleave-over-kernel-block").batch, dcp_size)
    assert result.status == "pass", failed(result)


# -- replicated groups before the sharded flags (0.17.0 - 0.30.0) ---------------------------

MANAGER = "single_type_kv_cache_manager.py"
NEVER_HANDED_A_REPLICATED_GROUP = {
    "0.17.0": (MANAGER + ":54", "kv_cache_interface.py:252"),
    "0.18.0": (MANAGER + ":54", "kv_cache_interface.py:252"),
    "0.22.0": (MANAGER + ":64", "kv_cache_interface.py:486"),
    "0.28.0": (MANAGER + ":79", "mamba_attn.py:811", "kv_cache_interface.py:575"),
    "0.29.0": (MANAGER + ":83", "mamba_attn.py:811", "kv_cache_interface.py:733"),
    "0.30.0": (MANAGER + ":110", "mamba_attn.py:880", "kv_cache_interface.py:845"),
}  # fmt: skip
"""Releases whose kernel shards every group it is handed, and the lines that show their
runner hands it no replicated group whose slots are read (``kept_whole``)."""


@pytest.mark.parametrize("version", sorted(NEVER_HANDED_A_REPLICATED_GROUP))
@pytest.mark.parametrize("dcp_size", [2, 8])
def test_a_replicated_group_is_never_handed_to_the_kernels_without_sharded_flags(version, dcp_size):
    """Not applicable, the lines quoted: the manager shards every group (from 0.26.0 but
    a recurrent state's, whose slots its reader leaves unread) and refuses sliding windows."""
    result = judge(version, shipped("replicated-groups").batch, dcp_size)
    [reason] = {c.skipped for c in result.checks if c.check in ("slots", "ownership")}
    assert reason is not None and "no replicated group whose slots are read" in reason
    for line in NEVER_HANDED_A_REPLICATED_GROUP[version]:
        assert line in reason, reason
    assert release(version).slot_mappings.askable.replicated is False  # nor drawn


def test_the_kernel_by_its_file_is_judged_on_a_replicated_group_and_shards_it():
    """With no release's callers to say what it is handed, 0.30.0's kernel is asked a
    replicated group, and sharding it fails in that group alone (the search shrinks it)."""
    path = Path(release("0.30.0").slot_mappings.kernel.fn.__code__.co_filename)
    by_path = kernels.REGISTRY.load(f"{path}:_compute_slot_mappings_kernel")
    [result] = run_scenario(by_path, "path", shipped("replicated-groups"), (2,), BACKEND.device)
    rows = {(check, field) for check, field, ownership in failed(result) if ownership != "padding"}
    assert rows == {("slots", "slot_mapping[1]"), ("ownership", "slot_mapping[1]")}
    outcome = search(by_path, "path", 100, BACKEND.device)
    assert not outcome.passed
    assert outcome.failure.batch.sharded == (False,) and len(outcome.failure.batch.requests) == 1


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0"])
@pytest.mark.parametrize("dcp_size", [1, 2, 4, 8])
def test_the_releases_with_sharded_flags_keep_a_replicated_group_whole(version, dcp_size):
    result = judge(version, shipped("replicated-groups").batch, dcp_size)
    assert result.status == "pass", failed(result)


def test_a_replicated_group_at_dcp1_is_kept_whole():
    assert judge("0.30.0", shipped("replicated-groups").batch, 1).status == "pass"


V1_NEVER_ASKED = {
    "0.11.1": (MANAGER + ":46: ", "kv_cache_interface.py:221: "),
    "0.17.0": (MANAGER + ":54: ", "kv_cache_interface.py:252: "),
    "0.25.1": (MANAGER + ":71: ", "kv_cache_interface.py:569: "),
    "0.28.0": (
        "gpu_model_runner.py:7401: SlotMappingMode.NONE if kv_cache_spec_kind == "
        "KVCacheSpecKind.MAMBA",
        "kv_cache_interface.py:575: ",
    ),
    "0.33.0": (
        "gpu_model_runner.py:6859: SlotMappingMode.NONE if kv_cache_spec_kind == "
        "KVCacheSpecKind.MAMBA",
        "indexer.py:880: compute_kpool_tail_slot_mapping",
        "kv_cache_interface.py:947: ",
    ),
}
"""What each V1 release's reason quotes (``vllm_v1`` module docstring): up to 0.25.1 the KV
cache manager's line that shards every group; from 0.26.0 the runner's line that builds a
recurrent state's table without slots (read from the cached runner), from 0.32.0 the line
where a replicated ring's builder replaces its table's slots; in every release the line that
refuses a sliding-window group under DCP."""


@pytest.mark.parametrize("version", sorted(V1_NEVER_ASKED))
@pytest.mark.parametrize("dcp_size", [2, 8])
def test_the_v1_runner_never_asks_its_table_a_replicated_groups_slots(version, dcp_size):
    """The V1 table shards every group it is built for, and no V1 release asks it for a
    replicated group's slots under DCP: not applicable, the lines that show it quoted."""
    result = judge_v1(version, shipped("replicated-groups").batch, dcp_size)
    assert result.status == "not_applicable", failed(result)
    assert all(line in result.error for line in V1_NEVER_ASKED[version]), result.error


@pytest.mark.parametrize("version", ["0.17.0", "0.28.0"])
def test_the_v1_table_keeps_a_replicated_group_whole_at_dcp1(version):
    assert judge_v1(version, shipped("replicated-groups").batch, 1).status == "pass"


def test_a_v1_release_whose_replicated_groups_are_not_declared_is_refused():
    slots = v1_table("0.28.0").slot_mappings
    undeclared = VllmV1SlotMappings(slots.table_class, "vllm==0.99.0", slots.runner_file, "0.99.0")
    with pytest.raises(AdapterError, match=r"declared for the releases 0\.10\.2 - 0\.33\.0"):
        assert undeclared.replicated


def test_the_runner_that_builds_no_slotless_table_says_so():
    assert (
        slotless_of("def f(a):\n    a.append(SlotMappingMode.TOKEN_TO_KV_SLOT)\n", "r.py") is None
    )
    with pytest.raises(AdapterError, match="unguarded"):
        slotless_of("def f(a):\n    a.append(SlotMappingMode.NONE)\n", "r.py")


# -- vLLM #27518: the MLA builder's local lengths (0.10.2, 0.11.0) ---------------------------


@functools.cache
def before_gpu_runner(version: str) -> Routines:
    """Release ``version`` (no GPU runner) as ``--kernel vllm==X`` loads it."""
    v1_table(version)  # fetched (or skipped) as the other tests fetch it
    return kernels.REGISTRY.load(f"vllm=={version}")


EVEN = SlotMappingBatch(((7, 1), (8, 1), (3, 1), (0, 4)), (16,), (True,), 1)
"""Requests of lengths 8, 9, 4 and 4: three that DCP2 and DCP4 divide, one that neither does."""


def judge_whole(version: str, batch: SlotMappingBatch, dcp_size: int) -> CaseResult:
    """``batch`` judged by a release before the GPU runner, as ``--kernel vllm==X``."""
    scenario = NamedBatch("t", "a test batch", batch, (dcp_size,))
    kernel = before_gpu_runner(version)
    [result] = run_scenario(kernel, f"vllm=={version}", scenario, (dcp_size,), BACKEND.device)
    return result


@pytest.mark.parametrize("version", ["0.10.2", "0.11.0"])
@pytest.mark.parametrize("dcp_size", [2, 4])
def test_27518_the_mla_builder_gives_one_too_many_where_the_length_divides(version, dcp_size):
    result = judge_whole(version, EVEN, dcp_size)
    assert {c.check for c in result.failed_checks} == {"local_seq_lens", "seq_lens_sum"}
    wrong = {f.token for c in result.failed_checks for f in c.findings}
    lengths = [cached + new for cached, new in EVEN.requests]
    divided = [i for i, length in enumerate(lengths) if length % dcp_size == 0]
    assert wrong == {divided[0]}  # the first bad request is the first divided one
    [sums] = [c for c in result.failed_checks if c.check == "seq_lens_sum"]
    assert sums.findings[0].count == len(divided)
    assert all(c.passed for c in result.checks if c.check in ("slots", "ownership"))


def _lengths(interleave: int) -> LocalSeqLensInputs:
    lengths = torch.tensor([8, 9], dtype=torch.int32)
    return LocalSeqLensInputs(lengths, 2, dcp_size=2, dcp_rank=0, interleave=interleave)


@pytest.mark.parametrize("version", ["0.10.2", "0.11.0"])
def test_27518_what_the_builder_is_never_asked_is_not_applicable(version):
    kernel = before_gpu_runner(version).local_seq_lens
    assert "common.py:" in kernel.not_applicable(dataclasses.replace(_lengths(1), dcp_size=1))
    assert "no interleave setting" in kernel.not_applicable(_lengths(4))


@pytest.mark.parametrize("version", ["0.11.1", "0.11.2"])
@pytest.mark.parametrize("dcp_size", [2, 4])
def test_27518_the_function_that_replaced_it_counts_right(version, dcp_size):
    result = judge_whole(version, EVEN, dcp_size)
    assert result.status == "pass", failed(result)
    assert all(c.passed for c in result.checks if c.check == "local_seq_lens")


@pytest.mark.parametrize(
    ("version", "members"),
    [
        ("0.10.2", ("vllm/v1/attention/backends/mla/common.py",)),
        (  # the function, and the MLA builder that asks it for every rank at once
            "0.11.1",
            ("vllm/v1/attention/backends/utils.py", "vllm/v1/attention/backends/mla/common.py"),
        ),
    ],
)
def test_a_release_before_the_gpu_runner_is_judged_whole_by_its_version(version, members):
    """``--kernel vllm==X`` alone: the V1 runner's table and the lengths its backends use,
    from the files it names."""
    before_gpu_runner(version)
    files = [f.path for f in kernels.REGISTRY.judged_files(f"vllm=={version}")]
    assert len(files) == 2 + len(members)
    assert files[0].endswith("vllm/v1/worker/block_table.py")
    assert files[1].endswith("vllm/v1/worker/gpu_model_runner.py")
    assert all(f.endswith(m) for f, m in zip(files[2:], members, strict=True))
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", "run", "--op", "slot-mapping", "--kernel",
         f"vllm=={version}", "--scenario", "decode-single", "--dcp", "2"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
    )  # fmt: skip
    expected = 1 if version == "0.10.2" else 0
    assert done.returncode == expected, done.stdout + done.stderr
    if expected:
        replay = "dcpcheck run --op slot-mapping --scenario decode-single --dcp 2 --kernel"
        assert f"{replay} vllm=={version}" in done.stdout


def _whole(version: str) -> Routines:
    """``--kernel vllm==X`` as it loads (every routine the release has)."""
    release(version)  # skips when the release is not cached and cannot be fetched
    return kernels.REGISTRY.load(f"vllm=={version}")


def test_a_release_with_both_runners_is_judged_on_each_and_fails_on_the_v1_table():
    """0.13.0's GPU model runner takes no DCP rank, its V1 runner's table is built at
    interleave 1 (vLLM #45528): ``vllm==0.13.0`` judges both, so the case its GPU kernel
    cannot be asked fails on the table, the finding naming it; named alone, the GPU kernel
    is not applicable there."""
    whole = _whole("0.13.0")
    assert isinstance(whole.slot_mappings, EachRoutine)
    assert [name for name, _ in whole.slot_mappings.routines] == [
        FUNCTION, vllm.V1_FUNCTION
    ]  # fmt: skip
    assert whole.local_seq_lens is not None and not whole.absent  # the backends' function
    scenario = shipped("kernel-blocks")
    [result] = run_scenario(whole, "vllm==0.13.0", scenario, (4,), BACKEND.device)
    assert result.status == "fail"
    [slots] = [c for c in result.failed_checks if c.check == "slots"]
    assert all(f.detail.startswith(f"{vllm.V1_FUNCTION}: ") for f in slots.findings)
    alone = kernels.REGISTRY.load(f"vllm==0.13.0:{FUNCTION}")
    [result] = run_scenario(alone, f"vllm==0.13.0:{FUNCTION}", scenario, (4,), BACKEND.device)
    assert result.status == "not_applicable"


def test_every_routine_not_asked_a_case_says_each_ones_reason():
    """A replicated group under DCP in 0.13.0: its GPU kernel takes no rank, and no V1
    runner hands its table one; the slot checks are skipped with both reasons, each led
    by its routine's name, and only the local lengths are judged."""
    scenario = shipped("replicated-groups")
    [result] = run_scenario(_whole("0.13.0"), "vllm==0.13.0", scenario, (4,), BACKEND.device)
    by_check = {c.check: c for c in result.checks}
    for check in SLOT_CHECKS:
        reason = by_check[check].skipped or ""
        assert reason.startswith(f"{FUNCTION}: "), reason
        assert f"; {vllm.V1_FUNCTION}: " in reason, reason
    assert by_check["local_seq_lens"].passed and by_check["seq_lens_sum"].passed


def test_the_newest_release_has_one_slot_routine_and_two_of_the_lengths():
    """0.34.0's wheel has no V1 runner: its slots are the GPU kernel's alone; its lengths
    the GPU runner's kernel and the backends' function, both judged."""
    whole = _whole("0.34.0")
    assert isinstance(whole.slot_mappings, VllmSlotMappings)
    assert isinstance(whole.local_seq_lens, EachRoutine)
    assert [name for name, _ in whole.local_seq_lens.routines] == [
        vllm.SEQ_LENS_KERNEL, vllm.SEQ_LENS_FUNCTION
    ]  # fmt: skip
    files = [f.path for f in kernels.REGISTRY.judged_files("vllm==0.34.0")]
    assert any(f.endswith(vllm.SEQ_LENS_FUNCTION_MEMBER) for f in files)
    assert not any(f.endswith(vllm.V1_MEMBER) for f in files)


def test_a_decode_stage_of_a_release_with_several_routines_runs_its_default_runners():
    """A decode step runs one routine of each kind: ``--stage slot-mapping=vllm==X`` of a
    release with two is the V1 runner's table and the backends' function, as ``hash
    --kernel vllm==X`` picks them; ``vllm==X`` alone judges every routine's files."""
    from dcpcheck.ops.slot_mapping import decode_chain

    _whole("0.20.0")
    stage = decode_chain.load("vllm==0.20.0")
    assert stage.spec == (
        f"vllm==0.20.0:{vllm.V1_FUNCTION} + vllm==0.20.0:{vllm.SEQ_LENS_FUNCTION}"
    )
    assert isinstance(stage.kernel.slot_mappings, VllmV1SlotMappings)
    files = [f.path for f in kernels.REGISTRY.judged_files("vllm==0.20.0")]
    for member in (vllm.MEMBER, vllm.V1_MEMBER, vllm.SEQ_LENS_KERNEL_MEMBER):
        assert any(f.endswith(member) for f in files), member
