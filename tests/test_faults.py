"""A kernel that crashes, hangs, raises or writes out of bounds costs its own case, never
the run, and never the results.

Every run here covers two scenarios, ``decode-single-dcp4`` (one row: where each fault
of ``tests/fixtures/faulty_kernels.py`` is keyed) and ``mixed-prefill-decode-padding``
(sixteen rows: the kernel is correct there), and asserts both that the fault is reported
with its status and that the other case still ran and passed. Crashes and hangs run under
isolation (``dcpcheck.harness.isolation``, a worker process); raising and out-of-bounds writes are
reported the same with or without it. The kernels are oracle-backed, so the whole file
runs in seconds on the CPU; most of its time is worker start-up (about 2 s each).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dcpcheck.cases.verdicts import CaseResult, RunConfig
from dcpcheck.cli import main
from dcpcheck.e2e.stream_case import token_stream_case
from dcpcheck.harness.isolation import IsolatedKernel
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import load_scenario, load_scenarios
from tests.conftest import BACKEND, requires_cuda
from tests.fixtures import faulty_kernels

REPO = Path(__file__).parents[1]
FAULT_HITS, FAULT_SPARES = "decode-single-dcp4", "mixed-prefill-decode-padding"
SCENARIOS = load_scenarios([FAULT_HITS, FAULT_SPARES])
MODULE = "tests.fixtures.faulty_kernels"
FILE = "tests/fixtures/faulty_kernels.py"

CASE_TIMEOUT_S = 5.0
"""Timeout of the hang tests: a healthy case of these scenarios takes well under a second
(oracle kernel), so 5 s is never reached by one, even on a busy 2-core machine."""


def kernel_name(function: str) -> str:
    return f"{MODULE}:{function}"


def statuses(results: list[CaseResult]) -> dict[str, str]:
    return {f"{r.scenario}[dcp{r.dcp_size}]": r.status for r in results}


def by_scenario(results: list[CaseResult]) -> dict[str, CaseResult]:
    return {r.scenario: r for r in results}


def run_isolated(
    function: str, case_timeout: float = 60.0, dcp_sizes=(4,), scenarios=SCENARIOS
) -> tuple[list[CaseResult], list[int]]:
    """The run's results and the ids of every worker process it used, in order."""
    config = RunConfig(kernel_name(function), dcp_sizes)
    with IsolatedKernel(config.kernel_name, "auto", BACKEND, case_timeout) as kernel:
        pids = [kernel.worker_pid]

        def note_worker(_: CaseResult) -> None:
            if kernel.worker_pid not in (None, pids[-1]):
                pids.append(kernel.worker_pid)

        results = run(kernel, scenarios, config, BACKEND, on_result=note_worker)
        return results, pids


def run_in_process(function: str) -> list[CaseResult]:
    kernel = getattr(faulty_kernels, function)
    return run(kernel, SCENARIOS, RunConfig(kernel_name(function), (4,)), BACKEND)


def process_gone(pid: int) -> bool:
    """No such process, or one that has exited and waits only to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def parents() -> dict[int, int]:
    """Each live process's parent, read from /proc (psutil is not a dependency)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def children_of(pid: int) -> list[int]:
    """Process ids whose parent is ``pid``."""
    return [child for child, parent in parents().items() if parent == pid]


def descendants_of(pid: int) -> list[int]:
    """Process ids below ``pid``: its children, theirs, and so on."""
    of = parents()
    below, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in of.items() if parent in frontier]
        below += frontier
    return below


# ---------------------------------------------------------------------------------------
# Crash, hang, raise


def test_a_segfault_is_a_crash_and_the_next_scenario_runs_in_a_fresh_worker():
    results, pids = run_isolated("segfaults_on_one_token")
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "crash", f"{FAULT_SPARES}[dcp4]": "pass"}
    crashed = by_scenario(results)[FAULT_HITS]
    assert crashed.error == "worker killed by SIGSEGV"
    assert crashed.checks == []
    assert crashed.replay.startswith(f"dcpcheck run --scenario {FAULT_HITS} --dcp 4 --kernel ")
    assert len(pids) == 2, "the crashed worker is replaced by a fresh one"
    assert process_gone(pids[0])


def test_cases_after_a_crash_in_the_same_scenario_are_reported_not_run():
    """``segfaults_always``: the DCP1 baseline dies, so DCP4 never starts; the token-stream
    case needs a third worker and crashes too; the run still ends with every case listed."""
    config = RunConfig(kernel_name("segfaults_always"), (1, 4))
    with IsolatedKernel(config.kernel_name, "auto", BACKEND) as kernel:
        results = run(kernel, SCENARIOS[:1], config, BACKEND)
        results.append(token_stream_case(kernel, config, BACKEND))
    assert statuses(results) == {
        f"{FAULT_HITS}[dcp1]": "crash",
        f"{FAULT_HITS}[dcp4]": "crash",
        "token-streams[dcp4]": "crash",
    }
    first, second, streams = results
    assert first.error == streams.error == "worker killed by SIGSEGV"
    assert second.error == "not run: the worker was lost earlier (worker killed by SIGSEGV)"
    assert streams.replay == f"dcpcheck hash --dcp 1,4 --kernel {config.kernel_name}"


def test_a_hang_is_a_timeout_and_its_worker_is_killed():
    start = time.perf_counter()
    results, pids = run_isolated("hangs_on_one_token", case_timeout=CASE_TIMEOUT_S)
    assert statuses(results) == {
        f"{FAULT_HITS}[dcp4]": "timeout",
        f"{FAULT_SPARES}[dcp4]": "pass",
    }
    hung = by_scenario(results)[FAULT_HITS]
    assert hung.error == "no result within 5 s (--case-timeout); the worker was killed"
    assert hung.seconds >= CASE_TIMEOUT_S
    assert process_gone(pids[0])
    assert time.perf_counter() - start < faulty_kernels.HANG_S / 10


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_a_kernel_that_raises_fails_its_case_with_the_exception_text(isolated):
    function = "raises_on_one_token"
    results = run_isolated(function)[0] if isolated else run_in_process(function)
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "error", f"{FAULT_SPARES}[dcp4]": "pass"}
    # The kernel's own words, and the rank whose launch said them.
    assert by_scenario(results)[FAULT_HITS].error == (
        "rank 0: ValueError: expected at least 2 tokens, got 1"
    )


def test_sys_exit_in_a_kernel_is_its_error_not_the_end_of_the_run():
    results = run_in_process("exits_on_one_token")
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "error", f"{FAULT_SPARES}[dcp4]": "pass"}
    assert by_scenario(results)[FAULT_HITS].error == "rank 0: SystemExit: 3"


def test_rebinding_an_output_leaves_the_harness_buffer_unwritten_and_the_checks_whole():
    """The kernel gets its own tensor handles: rebinding ``outputs.kv_out`` or resizing an
    input changes nothing the checks read, so the case fails as unwritten, not crashes."""
    results = run_in_process("rebinds_output_on_one_token")
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "fail", f"{FAULT_SPARES}[dcp4]": "pass"}
    hit = by_scenario(results)[FAULT_HITS]
    [outputs] = [c for c in hit.failed_checks if c.check == "outputs"]
    assert {(f.field, f.max_error) for f in outputs.findings} == {("kv_out", "NaN (unwritten)")}


def test_hash_with_a_raising_kernel_is_one_line_and_exit_1(monkeypatch, capsys):
    argv = ["dcpcheck", "hash", "--kernel", "tests.kernels_under_test:raises", "--steps", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == ["dcpcheck: error: the kernel raised: RuntimeError: kernel exploded"]


# ---------------------------------------------------------------------------------------
# Out-of-bounds writes that crash nothing


def guard_findings(result: CaseResult) -> list:
    [guard] = [c for c in result.checks if c.check == "guard_bands"]
    return list(guard.findings)


def test_a_byte_past_the_cache_end_fails_guard_bands():
    results = run_in_process("writes_past_cache_end_on_one_token")
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "fail", f"{FAULT_SPARES}[dcp4]": "pass"}
    hit = by_scenario(results)[FAULT_HITS]
    assert [c.check for c in hit.failed_checks] == ["guard_bands"]
    fields = {(f.field, f.rank) for f in guard_findings(hit)}
    assert fields == {("mla_cache", rank) for rank in range(4)}  # every rank's launch wrote it
    assert all("(guard after)" in f.detail for f in guard_findings(hit))


@pytest.mark.parametrize(
    ("function", "field", "side", "row"),
    [
        ("writes_past_output_end_on_one_token", "kv_out", "after the output's end", 1),
        ("writes_before_output_start_on_one_token", "q_out", "before the output's start", -1),
    ],
)
def test_a_write_outside_an_output_fails_guard_bands_naming_the_output(
    function, field, side, row
):
    results = run_in_process(function)
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "fail", f"{FAULT_SPARES}[dcp4]": "pass"}
    hit = by_scenario(results)[FAULT_HITS]
    # The output rows themselves are right: only the guard check fails.
    assert [c.check for c in hit.failed_checks] == ["guard_bands"]
    findings = guard_findings(hit)
    assert {(f.field, f.rank) for f in findings} == {(field, rank) for rank in range(4)}
    element_bytes = 2  # one bf16 element
    for f in findings:
        assert f.detail == (
            f"{element_bytes} byte(s) written {side} (guard rows; first at row {row})"
        )


# ---------------------------------------------------------------------------------------
# The command line: reports, saved failures, Ctrl-C


def wait_for_hang(proc: subprocess.Popen, marker: Path, timeout: float = 60.0) -> None:
    """Until a ``slow_then_hangs_on_profiling_call`` kernel has written ``marker`` (it
    hangs from then on), while its command still runs."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the kernel never reached its hang"
        time.sleep(0.05)


def _interruptible() -> None:
    """Ctrl-C as a terminal delivers it: a suite started in the background by a shell
    without job control inherits SIGINT ignored, and so would the command it tests."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def dcpcheck(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dcpcheck", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
        **popen,
    )


def test_a_crash_reaches_every_report_and_its_scenario_is_saved(tmp_path):
    json_path, junit_path, home = tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "home"
    proc = dcpcheck(
        "run", "--kernel", f"{FILE}:segfaults_on_one_token", "--dcp", "4",
        "--scenario", FAULT_HITS, "--scenario", FAULT_SPARES, "--no-tokens",
        "--json", str(json_path), "--junit", str(junit_path), "--home", str(home),
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr

    report = json.loads(json_path.read_text())
    assert report["partial"] is False
    assert report["summary"] == {
        "cases": 2, "pass": 1, "fail": 0, "error": 0, "crash": 1, "timeout": 0,
        "nondeterministic": 0, "not_applicable": 0,
    }  # fmt: skip
    crashed = next(c for c in report["cases"] if c["status"] == "crash")
    assert crashed["error"] == "worker killed by SIGSEGV"

    [error] = ET.parse(junit_path).getroot().iter("error")
    assert (error.get("type"), error.get("message")) == ("crash", "worker killed by SIGSEGV")

    assert f"CRASH {FAULT_HITS}[dcp4]: worker killed by SIGSEGV" in stdout
    assert "1 passed, 0 failed, 0 error(s), 1 crash(es)" in stdout
    [saved] = (home / "failures").glob("*.toml")
    assert f"saved: {saved}" in stdout
    scenario = load_scenario(saved)
    assert scenario.dcp_sizes == (4,)
    assert scenario.batch == SCENARIOS[0].batch
    assert f"--kernel {FILE}:segfaults_on_one_token" in scenario.description


@pytest.mark.parametrize(
    ("isolate", "stop", "code", "how"),
    [
        ("--isolate", signal.SIGINT, 130, "interrupted"),
        ("--no-isolate", signal.SIGINT, 130, "interrupted"),
        ("--isolate", signal.SIGTERM, 143, "terminated"),  # a CI job's timeout
    ],
)
def test_ctrl_c_writes_the_partial_report_and_leaves_no_worker(
    tmp_path, isolate, stop, code, how
):
    """``slow_then_hangs_on_profiling_call`` passes ``mixed-prefill-decode-padding`` and
    hangs on ``profiling-call``; Ctrl-C (or SIGTERM) then must keep the first case."""
    json_path, marker = tmp_path / "r.json", tmp_path / "hanging"
    proc = dcpcheck(
        "run", "--kernel", f"{FILE}:slow_then_hangs_on_profiling_call", isolate,
        "--dcp", "2", "--scenario", FAULT_SPARES, "--scenario", "profiling-call",
        "--no-tokens", "--json", str(json_path), "--home", str(tmp_path / "home"),
        env={**os.environ, faulty_kernels.HANG_MARKER_ENV: str(marker)},
    )  # fmt: skip
    wait_for_hang(proc, marker)
    # The command's child is its fork server (an --isolate run's worker, a --no-isolate
    # run's import probe, which has exited by now); the server's children run the kernel.
    running = descendants_of(proc.pid)
    workers = [pid for pid in running if pid not in children_of(proc.pid)]
    assert len(workers) == (1 if isolate == "--isolate" else 0)

    proc.send_signal(stop)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"dcpcheck: {how} after 1 case(s); partial report(s): {json_path}"
    )
    report = json.loads(json_path.read_text())
    assert report["partial"] is True
    assert [(c["scenario"], c["dcp"], c["status"]) for c in report["cases"]] == [
        (FAULT_SPARES, 2, "pass")
    ]
    # The server leaves as soon as the command's end of its socket closes.
    deadline = time.monotonic() + 10
    while not all(process_gone(pid) for pid in running):
        assert time.monotonic() < deadline, [pid for pid in running if not process_gone(pid)]
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------
# On a GPU (run by hand on one: the CPU interpreter has no illegal address to hit)


@requires_cuda
def test_an_illegal_memory_access_is_a_crash_and_the_run_goes_on():
    results, pids = run_isolated("illegal_address_on_one_token")
    assert statuses(results) == {f"{FAULT_HITS}[dcp4]": "crash", f"{FAULT_SPARES}[dcp4]": "pass"}
    assert "illegal memory access" in by_scenario(results)[FAULT_HITS].error
    assert len(pids) == 2
