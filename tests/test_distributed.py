"""Real ranks (``dcpcheck.distributed``): one DCP rank per process over gloo, against the
simulated mode.

Each test launches its ranks with ``launcher.launch`` (``python -m dcpcheck`` in torchrun's
environment per rank, rendezvous on the loopback) and compares what rank 0 reports with the
simulated mode run in this process. This process is single-threaded (conftest) and so is every rank,
so fp32 reductions round alike on both sides: reports and token digests must be identical,
not merely agree in verdict. The kernels here are fixtures the ranks import by name
(``tests.test_distributed:...``): they crash or hang one rank to show how the run ends.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from dcpcheck.backend import Backend, BackendError
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.distributed import group, launcher
from dcpcheck.distributed.group import COLLECTIVE_TIMEOUT_MARGIN_S, DistributedUsageError
from dcpcheck.distributed.ranks import distributed_sizes
from dcpcheck.e2e.stream_case import token_stream_case
from dcpcheck.e2e.token_streams import compare_streams, stream_config_for
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK, EXIT_USAGE
from dcpcheck.kernels.loading import KernelLoadError
from dcpcheck.op_registry import FUSED_NORM_ROPE
from dcpcheck.ops.fused_norm_rope import indexer_groups
from dcpcheck.ops.fused_norm_rope.kernels import judged_files, load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from dcpcheck.output import report
from tests.conftest import BACKEND, registry_problem, requires_cuda
from tests.kernels_under_test import NoFp4Here, oracle_kernel, overwrites_prefix

requires_interpreter = pytest.mark.skipif(
    not BACKEND.interpreted,
    reason="gloo ranks run on the CPU interpreter; this process's simulated run is on CUDA",
)

SCENARIOS = ("decode-single-dcp4", "mixed-prefill-decode-padding")

LAUNCH_TIMEOUT_S = 120.0
"""Rank timeout of the launches expected to succeed: far above their few seconds of work,
so a slow shared machine never trips it."""

HANG_TIMEOUT_S = 10.0
"""Rank timeout of the hang test: above the ranks' start-up (importing torch, a few seconds
on two busy cores), which counts as no progress."""


def crashes_on_rank_2(inputs, outputs, caches) -> None:
    """A correct kernel, except that rank 2's process dies in it (a segfault, say)."""
    if os.environ.get("RANK") == "2":
        os._exit(9)
    oracle_kernel(inputs, outputs, caches)


def hangs_on_rank_1(inputs, outputs, caches) -> None:
    """A correct kernel, except that it never returns on rank 1 (a deadlocked launch)."""
    if os.environ.get("RANK") == "1":
        threading.Event().wait()
    oracle_kernel(inputs, outputs, caches)


def scenario_args() -> list[str]:
    return [arg for name in SCENARIOS for arg in ("--scenario", name)]


def simulated_report(kernel_name: str, dcp_size: int) -> dict:
    """What ``dcpcheck run --dcp N --json`` writes for ``SCENARIOS``, run in this process."""
    kernel = load_kernel(kernel_name)
    config = RunConfig(kernel_name, (dcp_size,))
    results = run(kernel, load_scenarios(list(SCENARIOS)), config, BACKEND)
    results.append(token_stream_case(kernel, config, BACKEND))
    text = report.to_json(
        results,
        kernel=kernel_name,
        backend="interpreter",
        partial=False,
        kernel_files=judged_files(kernel_name),
        op=FUSED_NORM_ROPE,
    )
    return json.loads(text)


def distributed_report(tmp_path: Path, world_size: int, kernel_name: str) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    argv = ["run", "--dcp", str(world_size), "--kernel", kernel_name, *scenario_args()]
    code = launcher.launch(world_size, [*argv, "--json", str(path)], LAUNCH_TIMEOUT_S)
    return code, json.loads(path.read_text())


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):  # ended while we looked
            continue
        if marker.encode() in command:
            found.append(int(entry.name))
    return found


@requires_interpreter
@pytest.mark.parametrize("world_size", [2, 4])
def test_real_ranks_report_what_simulated_ranks_report(tmp_path, world_size):
    code, real = distributed_report(tmp_path, world_size, "default")
    assert code == EXIT_OK
    assert real == simulated_report("default", world_size)
    assert (real["summary"]["cases"], real["summary"]["pass"]) == (3, 3)
    assert [c["dcp"] for c in real["cases"]] == [world_size] * 3


@requires_interpreter
def test_real_ranks_report_a_case_the_kernel_cannot_run_as_not_applicable(tmp_path):
    """Every rank decides alike and launches nothing; the report is the simulated one, and
    a run that judged no case exits as the simulated one does (125, never 0)."""
    path = tmp_path / "report.json"
    kernel = "tests.kernels_under_test:no_fp4_here"
    argv = ["run", "--dcp", "2", "--kernel", kernel, "--scenario", "nvfp4-ds-mla-cache"]
    code = launcher.launch(2, [*argv, "--json", str(path), "--no-tokens"], LAUNCH_TIMEOUT_S)
    assert code == EXIT_KERNEL_LOAD
    [case] = json.loads(path.read_text())["cases"]
    assert (case["status"], case["error"]) == ("not_applicable", NoFp4Here.REASON)


@requires_interpreter
def test_real_ranks_report_what_a_releases_callers_never_pass_as_not_applicable(tmp_path):
    """The reason lies in the ranks' mappings (a replicated indexer beside a sharded MLA
    cache, ``indexer_groups``): every rank builds the same case, decides alike and launches
    nothing; DCP1, rank 0's alone, is still judged."""
    try:
        load_kernel("vllm==0.33.0")
    except KernelLoadError as exc:
        problem = registry_problem()
        if problem is None:
            raise
        pytest.skip(f"vllm==0.33.0 is not cached and the registry is unreachable: {exc}")
    path = tmp_path / "report.json"
    argv = ["run", "--dcp", "1,2", "--kernel", "vllm==0.33.0", "--scenario", "indexer-replicated"]
    code = launcher.launch(2, [*argv, "--json", str(path), "--no-tokens"], LAUNCH_TIMEOUT_S)
    assert code == EXIT_OK
    cases = {case["dcp"]: case for case in json.loads(path.read_text())["cases"]}
    assert cases[1]["status"] == "pass"
    reason = indexer_groups.apart_never_passed("0.33.0")
    assert (cases[2]["status"], cases[2]["error"]) == ("not_applicable", reason)


@requires_interpreter
def test_regression_fails_the_same_checks_on_real_ranks(tmp_path):
    code, real = distributed_report(tmp_path, 4, "regress/pre-54908")
    assert code == EXIT_FAIL
    assert real == simulated_report("regress/pre-54908", 4)
    failed = {
        (case["scenario"], c["check"], f["field"], f["rank"])
        for case in real["cases"]
        for c in case["checks"]
        for f in c["findings"]
    }
    # The one decode token of decode-single-dcp4 lives on rank 1: every other rank skipped
    # its kv/k_pe outputs, and they then differ from the DCP1 run.
    for rank in (0, 2, 3):
        for check in ("outputs", "ranks_agree"):
            assert ("decode-single-dcp4", check, "kv_out", rank) in failed
            assert ("decode-single-dcp4", check, "kpe_out", rank) in failed
    assert not any(s == "decode-single-dcp4" and r == 1 for s, _, _, r in failed)


@requires_interpreter
@pytest.mark.parametrize("world_size", [2, 4])
def test_token_digests_match_simulated_ranks(tmp_path, world_size):
    """A kernel that corrupts one cached entry per rank: decode attention reads wrong but
    finite values from each rank's shard, so the digests and the margin at the first
    divergence depend on every gathered partial and on the merge order."""
    path = tmp_path / "streams.json"
    argv = ["hash", "--kernel", "tests.kernels_under_test:overwrites_prefix"]
    code = launcher.launch(world_size, [*argv, "--json", str(path)], LAUNCH_TIMEOUT_S)
    real = json.loads(path.read_text())
    config = stream_config_for(BACKEND)
    simulated = compare_streams(overwrites_prefix, config, [world_size], BACKEND.device)
    assert code == EXIT_FAIL
    assert not simulated.identical
    assert real["digests"] == [
        {**asdict(d), "requests": list(d.requests)} for d in simulated.digests
    ]
    assert [d["dcp_size"] for d in real["digests"]] == [1] + [world_size] * world_size
    # json.dumps spells floats exactly (NaN included), so this compares margins bitwise.
    assert json.dumps(real["first_divergence"], sort_keys=True) == json.dumps(
        asdict(simulated.first_divergence), sort_keys=True
    )


@requires_interpreter
def test_a_crashed_rank_is_named_and_no_process_is_left(tmp_path, capfd):
    marker = str(tmp_path / "crash.json")
    argv = ["run", "--scenario", "decode-single-dcp4", "--no-tokens", "--json", marker,
            "--kernel", "tests.test_distributed:crashes_on_rank_2"]
    code = launcher.launch(4, argv, LAUNCH_TIMEOUT_S)
    err = capfd.readouterr().err
    assert code == EXIT_FAIL
    assert "rank 2 died (exit code 9) at: launching decode-single-dcp4[dcp4]" in err
    assert processes_mentioning(marker) == []
    assert not Path(marker).exists()


@requires_interpreter
def test_a_hung_rank_is_named_within_the_timeout(tmp_path, capfd):
    marker = str(tmp_path / "hang.json")
    argv = ["run", "--scenario", "decode-single-dcp4", "--no-tokens", "--json", marker,
            "--kernel", "tests.test_distributed:hangs_on_rank_1"]
    start = time.monotonic()
    code = launcher.launch(2, argv, HANG_TIMEOUT_S)
    elapsed = time.monotonic() - start
    err = capfd.readouterr().err
    assert code == EXIT_FAIL
    assert "rank 1 hung (no rank made progress for" in err
    assert "at: launching decode-single-dcp4[dcp2]" in err
    assert "rank 0: waiting for every rank at the gathering of decode-single-dcp4[dcp2]" in err
    # Start-up, the hang's timeout, then the kill: well before the collective timeout
    # (HANG_TIMEOUT_S + COLLECTIVE_TIMEOUT_MARGIN_S) would have ended it.
    assert elapsed < HANG_TIMEOUT_S + COLLECTIVE_TIMEOUT_MARGIN_S
    assert processes_mentioning(marker) == []


@requires_interpreter
def test_a_usage_error_on_every_rank_is_the_run_exit_code(capfd):
    code = launcher.launch(2, ["run", "--dcp", "4"], LAUNCH_TIMEOUT_S)
    err = capfd.readouterr().err
    assert code == EXIT_USAGE
    assert "--dcp 4 on 2 rank(s)" in err


@pytest.mark.parametrize(
    ("requested", "world_size", "expected"),
    [(None, 4, (4,)), ((4,), 4, (4,)), ((1, 4), 4, (1, 4)), ((4, 1), 4, (4, 1)), ((1,), 1, (1,))],
)
def test_a_group_checks_its_own_size_and_dcp1(requested, world_size, expected):
    assert distributed_sizes(requested, world_size) == expected


@pytest.mark.parametrize(("requested", "world_size"), [((2,), 4), ((1,), 4), ((2, 4), 4)])
def test_other_dcp_sizes_are_a_usage_error(requested, world_size):
    with pytest.raises(DistributedUsageError, match="the DCP size is the number"):
        distributed_sizes(requested, world_size)


def test_a_rank_without_a_cuda_device_of_its_own_is_refused_in_one_line(monkeypatch):
    """Rank 1 of 2 on a box whose torch sees one CUDA device: refused before it joins, in
    a line that names the way out (gloo ranks on the CPU)."""
    cuda = Backend(torch.device("cuda"), interpreted=False)
    monkeypatch.setattr(group, "select_backend", lambda device: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rank_1_of_2 = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    for name, value in {**rank_1_of_2, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(BackendError) as refused, group.rank_group():
        pass
    assert str(refused.value) == (
        "LOCAL_RANK 1, but torch sees 1 CUDA device(s): each rank needs a device of its own "
        "(--device cpu runs the ranks on the CPU over gloo)"
    )


@requires_cuda
def test_one_nccl_rank_reports_what_the_simulated_run_reports(tmp_path):
    """World size 1 on cuda:0: the NCCL path (object gather, all-gather) end to end."""
    path = tmp_path / "report.json"
    argv = ["run", "--dcp", "1", *scenario_args(), "--json", str(path)]
    code = launcher.launch(1, argv, LAUNCH_TIMEOUT_S)
    kernel = load_kernel("default")
    config = RunConfig("default", (1,))
    results = run(kernel, load_scenarios(list(SCENARIOS)), config, BACKEND)
    results.append(token_stream_case(kernel, config, BACKEND))
    simulated = json.loads(
        report.to_json(
            results,
            kernel="default",
            backend="cuda",
            partial=False,
            kernel_files=judged_files("default"),
            op=FUSED_NORM_ROPE,
        )
    )
    assert code == EXIT_OK
    assert json.loads(path.read_text()) == simulated
