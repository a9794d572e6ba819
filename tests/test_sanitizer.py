"""``--sanitize``: compute-sanitizer's reports, read and filed by case, rank and kernel.

On the CPU (no compute-sanitizer, no GPU kernel to check):

* ``parse_report`` on output of each tool, written from compute-sanitizer's documented
  format (``tests/fixtures/sanitizer/*.txt``): recent releases (``at kernel+0x1b0 in
  file:line``), older ones (``at 0x1d0 in file:line:kernel``), device frames naming the
  kernel around an inlined function, and a copy that lost its indentation;
* cutting a worker's log at its markers: each report goes to the case it was printed
  during, and the rank whose kernel call it was printed in; one outside every call (the
  DCP1 baseline, PyTorch's own kernels) stays with its case, rank None, and says so;
* the refusals (a backend that is not CUDA, no executable) and the command line;
* the whole path through a worker, with a fake compute-sanitizer
  (``fake_compute_sanitizer.py``) and a kernel that prints a report where the real tool
  would: markers, one worker per scenario, findings in the results, nothing left running.

On a GPU with compute-sanitizer: a read one row past an input is caught by memcheck, a read
of a row nothing wrote by initcheck, each in the right case and rank; the default kernel is
clean under all four tools on ``decode-single-dcp4`` and ``fp8-ds-mla-cache``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import CaseResult, CheckResult, KernelError, RunConfig
from dcpcheck.harness import sanitizer
from dcpcheck.harness.isolation import IsolatedKernel
from dcpcheck.harness.sanitizer import (
    AFTER_LAST_CASE,
    LOST_DURING,
    PRINT_LIMIT,
    SanitizerUnavailable,
    attach,
    case_done_marker,
    error_summary,
    launch_marker,
    parse_report,
    split_by_markers,
)
from dcpcheck.ops.fused_norm_rope.runner import run
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from tests.conftest import BACKEND, requires_cuda
from tests.fixtures.sanitizer import kernels
from tests.test_faults import children_of, process_gone

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "sanitizer"
FAKE = FIXTURES / "fake_compute_sanitizer.py"
MODULE = "tests.fixtures.sanitizer.kernels"

FAULT_HITS, FAULT_SPARES = "decode-single-dcp4", "mixed-prefill-decode-padding"
OWNER = 1
"""The rank that owns ``decode-single-dcp4``'s one token (its description says so)."""

CASE = f"{FAULT_HITS}[dcp4]"
BASELINE = f"{FAULT_HITS}[dcp1]"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def sanitizer_findings(result: CaseResult) -> tuple:
    [check] = [c for c in result.checks if c.check == sanitizer.SANITIZER_CHECK]
    return check.findings


# ---------------------------------------------------------------------------------------
# Reading each tool's output


@pytest.mark.parametrize(
    ("name", "tool", "expected"),
    [
        (
            "memcheck_invalid_global_read.txt",
            "memcheck",
            [("Invalid __global__ read of size 8 bytes", "read_row_past_end")] * 2,
        ),
        (
            "initcheck_uninitialized_global_read.txt",
            "initcheck",
            [("Uninitialized __global__ memory read of size 4 bytes", "add_one_to_unwritten")],
        ),
        (
            "racecheck_shared_hazard.txt",
            "racecheck",
            [
                (
                    "Error: Race reported between Write access at row_sum_kernel+0x2f0 in "
                    "/work/kernels/row_sum.py:31",
                    "row_sum_kernel",
                ),
                (
                    "Warning: Race reported between Write access at row_sum_kernel+0x2f0 in "
                    "/work/kernels/row_sum.py:31",
                    "row_sum_kernel",
                ),
            ],
        ),
        (
            "synccheck_barrier_error.txt",
            "synccheck",
            # the outermost device frame names the kernel; "at" names the inlined function
            [("Barrier error detected. Divergent thread(s) in block", "tile_reduce_kernel")],
        ),
        (
            "unindented_copy.txt",
            "memcheck",
            [
                (
                    "Invalid __global__ read of size 8",
                    "void vector_projection<double>(double*, int)",
                ),
                ("Barrier error detected. Divergent thread(s) in warp", "test(int*, int*)"),
            ],
        ),
        ("clean.txt", "memcheck", []),
    ],
)
def test_parse_report_reads_each_tool(name, tool, expected):
    errors = parse_report(fixture(name), tool)
    assert [(e.kind, e.kernel) for e in errors] == expected
    assert all(e.tool == tool for e in errors)


def test_a_report_keeps_the_sanitizers_own_text_line_for_line():
    text = fixture("racecheck_shared_hazard.txt")
    first = parse_report(text, "racecheck")[0]
    assert first.text == "\n".join(text.splitlines()[1:3])
    assert first.text.endswith("[124 hazards]")
    memcheck = parse_report(fixture("memcheck_invalid_global_read.txt"), "memcheck")[0]
    assert memcheck.location == (
        "at read_row_past_end+0x1b0 in /work/main/tests/fixtures/sanitizer/kernels.py:52"
    )
    assert memcheck.text.splitlines()[-1].endswith("of size 8 bytes")


def test_pytorch_kernels_are_told_apart():
    [error] = parse_report(fixture("initcheck_pytorch_kernel.txt"), "initcheck")
    assert error.kernel.startswith("void at::native::vectorized_elementwise_kernel<4, ")
    assert error.from_pytorch
    [own] = parse_report(fixture("initcheck_uninitialized_global_read.txt"), "initcheck")
    assert not own.from_pytorch


def test_error_summary_counts_what_was_printed_and_what_was_not():
    assert error_summary(fixture("clean.txt")) == 0
    assert error_summary(fixture("memcheck_invalid_global_read.txt")) == 2
    assert error_summary(fixture("memcheck_print_limit.txt")) == 1500
    assert error_summary(fixture("racecheck_shared_hazard.txt")) is None


def test_lines_that_are_not_the_sanitizers_are_not_reports():
    log = (
        "a kernel's own print\n"
        + launch_marker(CASE, 0, True)
        + fixture("initcheck_uninitialized_global_read.txt")
        + launch_marker(CASE, 0, False)
    )
    assert len(parse_report(log, "initcheck")) == 1
    assert sanitizer.other_output(log) == "a kernel's own print\n"


# ---------------------------------------------------------------------------------------
# Marking the calls


def test_the_watcher_synchronizes_then_marks_each_call(monkeypatch, capfd):
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", synchronized.append)
    watch = sanitizer.launch_watcher(torch.device("cuda"))
    watch(CASE, 3, True)
    watch(CASE, 3, False)
    assert len(synchronized) == 2
    assert capfd.readouterr().out == launch_marker(CASE, 3, True) + launch_marker(CASE, 3, False)


def test_a_kernel_the_sanitizer_stopped_is_its_ranks_error_and_its_call_still_ends(
    monkeypatch, capfd
):
    def fails(device):
        raise RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors ...")

    monkeypatch.setattr(torch.cuda, "synchronize", fails)
    with pytest.raises(KernelError) as stopped:
        sanitizer.launch_watcher(torch.device("cuda"))(CASE, 1, False)
    assert str(stopped.value) == (
        "rank 1: CUDA error: unspecified launch failure (synchronizing after its kernel "
        "call, under compute-sanitizer)"
    )
    assert capfd.readouterr().out == launch_marker(CASE, 1, False)


# ---------------------------------------------------------------------------------------
# Cutting the log at the markers


def _call(case: str, rank: int, report: str) -> str:
    return launch_marker(case, rank, True) + report + launch_marker(case, rank, False)


def test_markers_file_each_report_under_its_case_and_rank():
    memcheck = fixture("memcheck_invalid_global_read.txt").split("========= ERROR SUMMARY")[0]
    log = (
        "========= COMPUTE-SANITIZER\n"
        + _call(BASELINE, 0, memcheck)  # the DCP1 baseline, run before the DCP4 case
        + fixture("initcheck_pytorch_kernel.txt")  # between calls: the harness's own work
        + "".join(_call(CASE, rank, memcheck if rank == OWNER else "") for rank in range(4))
        + case_done_marker(CASE)
        + _call(f"{FAULT_SPARES}[dcp1]", 0, "")
        + case_done_marker(f"{FAULT_SPARES}[dcp4]")
        + "========= ERROR SUMMARY: 5 errors\n"
    )
    windows = split_by_markers(log, "memcheck")
    assert [w.case for w in windows] == [CASE, f"{FAULT_SPARES}[dcp4]", None]
    assert [(e.case, e.rank) for e in windows[0].errors] == [
        (BASELINE, 0),
        (BASELINE, 0),
        (None, None),
        (CASE, OWNER),
        (CASE, OWNER),
    ]

    results = [CaseResult(FAULT_HITS, 4, "pass"), CaseResult(FAULT_SPARES, 4, "pass")]
    hit, spared = attach(results, log, "memcheck")
    assert (hit.status, spared.status) == ("fail", "pass")
    assert sanitizer_findings(spared) == ()
    found = {(f.field, f.rank, f.count): f.detail for f in sanitizer_findings(hit)}
    pytorch_kernel = parse_report(fixture("initcheck_pytorch_kernel.txt"), "memcheck")[0].kernel
    assert set(found) == {
        ("read_row_past_end", OWNER, 2),  # two threads, one finding
        ("read_row_past_end", None, 2),
        (pytorch_kernel, None, 1),
    }
    in_call = found[("read_row_past_end", OWNER, 2)]
    assert in_call.startswith(
        "memcheck: Invalid __global__ read of size 8 bytes, in rank 1's kernel call; "
        "2 such reports (other threads, blocks or launches):\n"
        "========= Invalid __global__ read of size 8 bytes\n"
    )
    assert (
        f"in rank 0's kernel call of {BASELINE} (the DCP1 baseline"
        in (found[("read_row_past_end", None, 2)])
    )
    outside = found[(pytorch_kernel, None, 1)]
    assert sanitizer.OUTSIDE_CALLS in outside
    assert "[a PyTorch kernel]" in outside


def test_a_report_while_the_worker_was_lost_goes_to_the_case_it_was_on():
    """The worker died in DCP4 (no ``done`` marker for it): the reports after the DCP1
    case's marker are the crashed case's, and its error names the first of them."""
    report = fixture("synccheck_barrier_error.txt")
    log = (
        _call(BASELINE, 0, "")
        + case_done_marker(BASELINE)
        + launch_marker(CASE, 2, True)
        + report  # the worker dies inside rank 2's call: no end marker
    )
    results = [
        CaseResult(FAULT_HITS, 1, "pass"),
        CaseResult(FAULT_HITS, 4, "crash", error="worker killed by SIGKILL"),
    ]
    dcp1, dcp4 = attach(results, log, "synccheck")
    assert dcp1.status == "pass"
    assert dcp4.status == "crash"
    [finding] = sanitizer_findings(dcp4)
    assert (finding.field, finding.rank) == ("tile_reduce_kernel", 2)
    assert dcp4.error == (
        "worker killed by SIGKILL; compute-sanitizer: synccheck: Barrier error detected. "
        "Divergent thread(s) in block, in rank 2's kernel call:"
    )
    # outside every call and after every marker: the case the worker was lost on
    [late] = sanitizer_findings(
        attach(results, log.replace(launch_marker(CASE, 2, True), ""), "synccheck")[1]
    )
    assert LOST_DURING in late.detail


def test_a_report_after_the_last_result_goes_to_the_last_case():
    log = case_done_marker(CASE) + fixture("initcheck_uninitialized_global_read.txt")
    [result] = attach([CaseResult(FAULT_HITS, 4, "pass")], log, "initcheck")
    assert result.status == "fail"
    [finding] = sanitizer_findings(result)
    assert AFTER_LAST_CASE in finding.detail


def test_past_the_print_limit_no_later_case_is_called_clean():
    """compute-sanitizer counted 1,500 errors and printed one: the cases from the one that
    printed it on cannot pass, whatever they printed themselves."""
    log = (
        case_done_marker(f"{FAULT_HITS}[dcp1]")
        + fixture("memcheck_print_limit.txt").split("========= ERROR SUMMARY")[0]
        + case_done_marker(f"{FAULT_HITS}[dcp2]")
        + case_done_marker(CASE)
        + "".join(fixture("memcheck_print_limit.txt").splitlines(keepends=True)[-2:])
    )
    results = [CaseResult(FAULT_HITS, size, "pass") for size in (1, 2, 4)]
    statuses = [r.status for r in attach(results, log, "memcheck")]
    assert statuses == ["pass", "fail", "fail"]
    unprinted = sanitizer_findings(attach(results, log, "memcheck")[2])[0]
    assert unprinted.count == 1499
    assert f"(--print-limit {PRINT_LIMIT})" in unprinted.detail


def test_a_case_the_sanitizer_found_nothing_in_passes_its_check():
    [result] = attach(
        [CaseResult(FAULT_HITS, 4, "pass", checks=[CheckResult("outputs")])],
        _call(CASE, 0, "") + case_done_marker(CASE) + fixture("clean.txt"),
        "racecheck",
    )
    assert result.status == "pass"
    assert [(c.check, c.passed) for c in result.checks] == [("outputs", True), ("sanitizer", True)]


# ---------------------------------------------------------------------------------------
# The command, and where it cannot run


def test_the_command_line_names_the_tool_and_the_options_the_log_needs():
    assert sanitizer.sanitizer_command("/cuda/bin/compute-sanitizer", "racecheck") == [
        "/cuda/bin/compute-sanitizer",
        "--tool",
        "racecheck",
        "--print-limit",
        str(PRINT_LIMIT),
        "--show-backtrace",
        "device",
        "--report-api-errors",
        "no",
        "--destroy-on-device-error",
        "kernel",
        "--target-processes",
        "application-only",
        "--racecheck-report",
        "analysis",
    ]
    memcheck = sanitizer.sanitizer_command("cs", "memcheck")
    assert memcheck[:3] == ["cs", "--tool", "memcheck"]
    assert "--racecheck-report" not in memcheck
    with pytest.raises(ValueError, match="unknown compute-sanitizer tool 'leakcheck'"):
        sanitizer.sanitizer_command("cs", "leakcheck")


def test_the_worker_runs_under_the_sanitizer_behind_a_guard_that_dies_with_dcpcheck():
    worker = [sys.executable, "-m", "dcpcheck.harness.isolation_worker", "5", "6", "7"]
    argv = sanitizer.launched_under(["cs", "--tool", "memcheck"], worker)
    assert argv[:2] == [sys.executable, "-c"]
    assert "PR_SET_PDEATHSIG" in argv[2]
    assert argv[3:] == [str(os.getpid()), "cs", "--tool", "memcheck", *worker]


def test_the_executable_is_found_on_path_then_cuda_home_then_usr_local_cuda(tmp_path, monkeypatch):
    def install(directory: Path) -> str:
        directory.mkdir(parents=True)
        path = directory / "compute-sanitizer"
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return str(path)

    default = install(tmp_path / "usr-local-cuda" / "bin")
    monkeypatch.setattr(sanitizer, "CUDA_BIN_DIRS", (str(tmp_path / "usr-local-cuda" / "bin"),))
    on_path = install(tmp_path / "path")
    in_home = install(tmp_path / "home" / "bin")
    empty = str(tmp_path / "empty")
    both = {"PATH": str(tmp_path / "path"), "CUDA_HOME": str(tmp_path / "home")}
    assert sanitizer.find_executable(both) == on_path
    assert sanitizer.find_executable({"PATH": empty, "CUDA_HOME": str(tmp_path / "home")}) == (
        in_home
    )
    assert sanitizer.find_executable({"PATH": empty}) == default


def test_no_executable_is_a_one_line_refusal(tmp_path, monkeypatch):
    monkeypatch.setattr(sanitizer, "CUDA_BIN_DIRS", (str(tmp_path / "nowhere"),))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    cuda = Backend(torch.device("cuda"), interpreted=False)  # never touched: refused first
    before = children_of(os.getpid())
    with pytest.raises(SanitizerUnavailable) as refused:
        IsolatedKernel("default", "auto", cuda, sanitizer="memcheck")
    assert str(refused.value) == (
        "--sanitize needs NVIDIA's compute-sanitizer (part of the CUDA toolkit); not found in "
        f"PATH, {tmp_path / 'nowhere'}: put it on PATH or set CUDA_HOME"
    )
    assert children_of(os.getpid()) == before


def test_a_backend_that_is_not_cuda_is_refused():
    interpreted = Backend(torch.device("cpu"), interpreted=True)
    with pytest.raises(SanitizerUnavailable) as refused:
        IsolatedKernel("default", "auto", interpreted, sanitizer="initcheck")
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith("--sanitize initcheck needs a CUDA device")


# ---------------------------------------------------------------------------------------
# Through a worker, under a fake compute-sanitizer


def fake_prefix(tool: str, backend: Backend) -> list[str]:
    """The real options, run by the fake instead of compute-sanitizer."""
    return [sys.executable, str(FAKE), *sanitizer.sanitizer_command("unused", tool)[1:]]


def test_reports_reach_the_results_through_the_worker(monkeypatch, capfd):
    monkeypatch.setattr(sanitizer, "worker_prefix", fake_prefix)
    config = RunConfig(f"{MODULE}:reports_like_a_sanitizer_when_owned", (4,))
    scenarios = load_scenarios([FAULT_HITS, FAULT_SPARES])
    with IsolatedKernel(config.kernel_name, "auto", BACKEND, 60.0, "memcheck") as kernel:
        fake = kernel.worker_pid  # the process started is the (fake) compute-sanitizer
        pids = [fake, *children_of(fake)]  # and the worker its child
        assert len(pids) == 2
        hit, spared = run(kernel, scenarios, config, BACKEND)
        assert kernel.worker_pid is None, "a sanitized worker answers one job and exits"
    assert (hit.status, spared.status) == ("fail", "pass")
    assert [c.check for c in hit.failed_checks] == ["sanitizer"]
    assert {(f.field, f.rank) for f in sanitizer_findings(hit)} == {
        ("fake_read_past_end", OWNER),  # rank 1's call
        ("fake_read_past_end", None),  # the DCP1 baseline's
    }
    assert sanitizer_findings(spared) == ()
    assert kernels.KERNEL_SAYS in capfd.readouterr().err  # the worker's own stdout
    assert all(process_gone(pid) for pid in pids)


def test_closing_kills_compute_sanitizer_and_its_worker_as_one_group(monkeypatch):
    """Ctrl-C, a timeout or the end of the run kill the process group of the process
    started: compute-sanitizer's, which its worker is in."""
    monkeypatch.setattr(sanitizer, "worker_prefix", fake_prefix)
    kernel = IsolatedKernel(
        "tests.kernels_under_test:oracle_kernel", "auto", BACKEND, 60.0, "memcheck"
    )
    kernel.start()
    fake = kernel.worker_pid
    [worker] = children_of(fake)
    assert os.getpgid(worker) == fake
    kernel.close()
    assert process_gone(fake)
    deadline = time.monotonic() + 10
    while not process_gone(worker):  # SIGKILLed with its group; reaped by init
        assert time.monotonic() < deadline, "the worker outlived its process group's kill"
        time.sleep(0.05)


GUARDED_PARENT = f"""
import sys, time
from dcpcheck.backend import current_backend
from dcpcheck.harness import sanitizer
from dcpcheck.harness.isolation import IsolatedKernel
sanitizer.worker_prefix = lambda tool, backend: [
    sys.executable, {str(FAKE)!r}, *sanitizer.sanitizer_command("unused", tool)[1:]
]
kernel = IsolatedKernel(
    "tests.kernels_under_test:oracle_kernel", "auto", current_backend(), sanitizer="memcheck"
)
kernel.start()
print(kernel.worker_pid, flush=True)
time.sleep(3600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_dcpcheck_takes_the_sanitizer_and_its_worker_with_it():
    """dcpcheck SIGKILLed (no chance to kill the process group): compute-sanitizer dies
    with it, and the worker, whose parent compute-sanitizer is, dies with that."""
    parent = subprocess.Popen(
        [sys.executable, "-c", GUARDED_PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    fake = int(parent.stdout.readline())
    [worker] = children_of(fake)
    parent.send_signal(signal.SIGKILL)
    parent.wait(30)
    deadline = time.monotonic() + 30
    while not (process_gone(fake) and process_gone(worker)):
        assert time.monotonic() < deadline, "compute-sanitizer or its worker outlived dcpcheck"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------
# On a GPU, under the real compute-sanitizer (run by hand on one)


def _missing_sanitizer() -> bool:
    try:
        sanitizer.find_executable()
    except SanitizerUnavailable:
        return True
    return False


requires_sanitizer = pytest.mark.skipif(
    _missing_sanitizer(), reason="needs NVIDIA's compute-sanitizer (CUDA toolkit)"
)

GPU_CASE_TIMEOUT_S = 600.0
"""A sanitized case runs its kernels instrumented, tens of times slower than bare."""


def run_sanitized(function: str, tool: str, scenarios: list[str]) -> list[CaseResult]:
    config = RunConfig(function, (4,))
    with IsolatedKernel(config.kernel_name, "auto", BACKEND, GPU_CASE_TIMEOUT_S, tool) as kernel:
        return run(kernel, load_scenarios(scenarios), config, BACKEND)


@requires_sanitizer
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("function", "tool", "kernel", "kind"),
    [
        (
            "reads_past_input_when_owned",
            "memcheck",
            "read_row_past_end",
            "Invalid __global__ read of size 8 bytes",
        ),
        (
            "reads_scratch_before_writing_when_owned",
            "initcheck",
            "add_one_to_unwritten",
            "Uninitialized __global__ memory read of size",
        ),
    ],
)
def test_the_fault_is_caught_in_its_case_and_rank(function, tool, kernel, kind):
    """``fail`` if the faulting kernel's launch looks clean to the process; ``error`` if
    compute-sanitizer's stop of it shows as a failed synchronization (that rank's error).
    Either way the sanitizer's reports are filed under rank 1 and the DCP1 baseline."""
    hit, spared = run_sanitized(f"{MODULE}:{function}", tool, [FAULT_HITS, FAULT_SPARES])
    assert (hit.status, spared.status) in {("fail", "pass"), ("error", "pass")}, (hit, spared)
    if hit.status == "fail":
        assert [c.check for c in hit.failed_checks] == ["sanitizer"]
    findings = sanitizer_findings(hit)
    # Triton names the GPU function after the Python one (older releases add a suffix)
    assert {f.rank for f in findings if f.field.startswith(kernel)} == {OWNER, None}
    assert all(f.detail.startswith(f"{tool}: {kind}") for f in findings), findings
    assert sanitizer_findings(spared) == ()


@requires_sanitizer
@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("tool", sanitizer.TOOLS)
def test_the_default_kernel_is_clean_under_every_tool(tool):
    results = run_sanitized("default", tool, ["decode-single-dcp4", "fp8-ds-mla-cache"])
    assert [r.status for r in results] == ["pass", "pass"], [
        (r.scenario, r.error, sanitizer_findings(r) if r.checks else ()) for r in results
    ]
    assert all(sanitizer_findings(r) == () for r in results)
