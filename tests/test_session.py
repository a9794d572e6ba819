"""A run's session (``dcpcheck.workflows.session``) as the CLI drives it: what the reports say
when dcpcheck itself breaks mid-run or the device faults, and what they record of a
property search."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dcpcheck.backend import current_backend
from dcpcheck.cases.verdicts import TOKEN_STREAM_CASE, RunConfig
from dcpcheck.cli import cli
from dcpcheck.e2e import token_streams
from dcpcheck.harness import isolation, isolation_worker
from dcpcheck.ops import op_cases
from dcpcheck.ops.fused_norm_rope import fused_checks
from dcpcheck.ops.fused_norm_rope import search as fused_search
from dcpcheck.workflows import session
from tests.conftest import requires_cuda

REPO = Path(__file__).resolve().parents[1]
ONE_CASE = ("--scenario", "decode-single-dcp4", "--dcp", "2", "--no-tokens")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_an_internal_error_is_an_error_record_in_a_partial_report(tmp_path, monkeypatch):
    """A bug of dcpcheck's own (here: a check that raises) must not leave a clean-looking
    report: the JSON says partial, counts an error, and names where it was raised."""

    def broken(case, baseline, oracle=True):
        raise RuntimeError("a check that breaks")

    monkeypatch.setattr(fused_checks, "suspect_checks", broken)
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    result = invoke("run", *ONE_CASE, "--json", str(json_path), "--junit", str(junit_path))
    assert result.exit_code == 1, result.output
    assert "internal error: RuntimeError: a check that breaks" in result.output
    doc = json.loads(json_path.read_text())
    assert doc["partial"] is True
    assert doc["summary"]["error"] == 1 and doc["summary"]["cases"] == 1
    [record] = doc["cases"]
    assert record["scenario"] == session.INTERNAL_ERROR_CASE
    assert record["status"] == "error"
    assert "RuntimeError: a check that breaks at " in record["error"]
    suite = ET.parse(junit_path).getroot()
    assert suite.get("errors") == "1"


def test_a_device_fault_is_the_kernels_crash_not_an_internal_error(tmp_path, monkeypatch):
    """A CUDA fault surfaces at the next synchronising call, here a check's: the run stops
    with a crash record that says the device faulted and how to find the launch, exit 1,
    and prints no traceback of dcpcheck's (it is no bug of dcpcheck's)."""

    def faulted(case, baseline, oracle=True):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(fused_checks, "suspect_checks", faulted)
    json_path = tmp_path / "r.json"
    result = invoke("run", *ONE_CASE, "--json", str(json_path))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "internal error" not in result.output
    assert "the device faulted (CUDA error: an illegal memory access" in result.output
    doc = json.loads(json_path.read_text())
    assert doc["partial"] is True
    [record] = doc["cases"]
    assert record["scenario"] == session.DEVICE_FAULT_CASE
    assert record["status"] == "crash"
    assert "--sanitize memcheck" in record["error"]


def _lse_checks_breaking_on_the_second_case(monkeypatch, error: Exception) -> None:
    """The merge op's checks, raising ``error`` on the second case they judge."""
    from dcpcheck.ops.lse_combine import checks as lse_checks

    judge, calls = lse_checks.judge, []

    def breaks(case, merged):
        calls.append(case)
        if len(calls) == 2:
            raise error
        return judge(case, merged)

    monkeypatch.setattr(lse_checks, "judge", breaks)


def test_an_op_packages_run_that_breaks_keeps_its_cases_and_says_why(tmp_path, monkeypatch):
    """``run --op OP`` of an op package: an error of dcpcheck's own mid-run leaves the
    cases judged before it and an error record in a partial report, its traceback on
    stderr, exit 1; a device fault, a crash record and one line."""
    _lse_checks_breaking_on_the_second_case(monkeypatch, RuntimeError("a check that breaks"))
    json_path = tmp_path / "r.json"
    result = invoke("run", "--op", "lse-combine", "--dcp", "2", "--json", str(json_path))
    assert result.exit_code == 1, result.output
    assert "internal error: RuntimeError: a check that breaks" in result.output
    assert "Traceback" in result.output
    doc = json.loads(json_path.read_text())
    assert doc["partial"] is True
    first, record = doc["cases"]
    assert first["status"] == "pass"
    assert (record["scenario"], record["status"]) == (session.INTERNAL_ERROR_CASE, "error")

    fault = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    _lse_checks_breaking_on_the_second_case(monkeypatch, fault)
    result = invoke("run", "--op", "lse-combine", "--dcp", "2", "--json", str(json_path))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "the device faulted (CUDA error: an illegal memory access" in result.output
    record = json.loads(json_path.read_text())["cases"][-1]
    assert (record["scenario"], record["status"]) == (session.DEVICE_FAULT_CASE, "crash")


def test_the_gate_reports_an_op_package_that_broke_off(tmp_path, monkeypatch):
    """The plain gate judges the op packages after the fused op: one that breaks off
    ends the gate with its record in the report, which is partial, exit 1."""
    from dcpcheck.cli import run as run_command

    monkeypatch.setattr(run_command, "run_session", lambda *args, **kwargs: session.RunOutcome([]))
    monkeypatch.setattr(run_command, "runner_ops", lambda: ("lse-combine", "slot-mapping"))
    fault = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    _lse_checks_breaking_on_the_second_case(monkeypatch, fault)
    json_path = tmp_path / "r.json"
    result = invoke("run", "--dcp", "2", "--json", str(json_path))
    assert result.exit_code == 1, result.output
    assert "the device faulted" in result.output
    doc = json.loads(json_path.read_text())
    assert doc["partial"] is True
    scenarios = [c["scenario"] for c in doc["cases"]]
    assert scenarios[-1] == session.DEVICE_FAULT_CASE
    assert not any(name.startswith("slot-mapping/") for name in scenarios)  # it stopped there


@requires_cuda
def test_a_real_device_fault_ends_the_run_with_its_record(tmp_path):
    """A merge that stores far outside any buffer, in a process of its own: exit 1, the
    report partial and ending with the device fault's crash record, no traceback."""
    json_path = tmp_path / "r.json"
    kernel = f"{REPO / 'tests' / 'fixtures' / 'faulty_merge.py'}:illegal_address"
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", "run", "--op", "lse-combine", "--kernel", kernel,
         "--dcp", "2", "--json", str(json_path), "--home", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads(json_path.read_text())
    assert doc["partial"] is True
    record = doc["cases"][-1]
    assert (record["scenario"], record["status"]) == (session.DEVICE_FAULT_CASE, "crash")
    assert "illegal memory access" in record["error"]


def _dead_after_the_first_example(monkeypatch, module) -> list[object]:
    """``module.run_scenario`` as on a device that faults in the search's second example
    and runs nothing after it: every later call raises the fault again, from one of two
    places in turn, as a dead device's error surfaces at whichever call synchronises next."""
    real, calls = module.run_scenario, []
    said = "CUDA error: an illegal memory access was encountered"

    def surfaced_elsewhere() -> None:
        raise torch.AcceleratorError(said)

    def run_scenario(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            return real(*args, **kwargs)
        if len(calls) % 2:
            raise torch.AcceleratorError(said)
        surfaced_elsewhere()

    monkeypatch.setattr(module, "run_scenario", run_scenario)
    return calls


@pytest.mark.parametrize(
    ("op_args", "module"),
    [(("--op", "lse-combine"), op_cases), (("--no-isolate", "--no-tokens"), fused_search)],
    ids=["op-package", "fused-op"],
)
def test_a_device_fault_ends_the_property_search_unshrunk(tmp_path, monkeypatch, op_args, module):
    """Hypothesis would replay and shrink a failing example, on a device that can run
    nothing more, and call the differing places its fault surfaced flaky: the search
    stops at the fault instead, and the run ends with the fault's crash record."""
    calls = _dead_after_the_first_example(monkeypatch, module)
    json_path = tmp_path / "r.json"
    result = invoke(
        "run", *op_args, "--property-only", "--examples", "5", "--dcp", "2",
        "--home", str(tmp_path / "home"), "--json", str(json_path),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert "the device faulted (CUDA error: an illegal memory access" in result.output
    record = json.loads(json_path.read_text())["cases"][-1]
    assert (record["scenario"], record["status"]) == (session.DEVICE_FAULT_CASE, "crash")
    assert f"{Path(__file__).name}:" in record["error"]  # where it surfaced, not Hypothesis
    assert len(calls) == 2  # neither replayed nor shrunk


def search_reports(tmp_path, *args: str):
    """A smoke-profile property search at DCP2 with both reports: its exit code, the JSON's
    ``"search"`` record and the JUnit ``property-search`` testcase and suite."""
    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    result = invoke(
        "run", "--property-only", "--profile", "smoke", "--dcp", "2", *args,
        "--home", str(tmp_path / "home"), "--json", str(json_path), "--junit", str(junit_path),
    )  # fmt: skip
    record = json.loads(json_path.read_text())["search"]
    suite = ET.parse(junit_path).getroot()
    [case] = [c for c in suite.iter("testcase") if c.get("classname") == "property-search"]
    return result, record, case, suite


def test_a_passing_property_search_is_recorded_in_both_reports(tmp_path):
    result, record, case, suite = search_reports(tmp_path, "--examples", "2")
    assert result.exit_code == 0, result.output
    assert record["profile"] == "smoke"
    assert record["seed"] == 0
    assert record["dcp"] == [2]
    assert record["examples_requested"] == 2
    assert record["examples_run"] >= 2
    assert record["status"] == "pass"
    assert record["saved"] is None
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["profile"] == "smoke" and props["seed"] == "0"
    assert int(props["examples_run"]) >= 2
    assert suite.get("tests") == "1" and suite.get("failures") == "0"


def test_a_failing_search_is_a_failure_in_both_reports(tmp_path):
    result, record, case, _ = search_reports(tmp_path, "--kernel", "regress/pre-54908")
    assert result.exit_code == 1, result.output
    assert record["status"] == "fail"
    assert record["failed_checks"]
    assert record["saved"].startswith(str(tmp_path / "home" / "failures"))
    assert case.find("failure") is not None


@pytest.mark.parametrize("home_writable", [True, False])
def test_session_saves_failing_cases_once_home_allows(tmp_path, home_writable):
    """``Session.case`` saves a failing case under HOME/failures/; a HOME that cannot be
    written costs one warning, and the verdict stands."""
    from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
    from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario
    from tests.conftest import BACKEND

    home = tmp_path / "home"
    if not home_writable:
        home.write_text("a file where HOME should be")
    warnings: list[str] = []
    kernel = load_kernel("regress/pre-54908")
    config = RunConfig("regress/pre-54908", None)
    run = session.Session(kernel, config, BACKEND, home, on_warning=warnings.append)
    scenario = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    first = run.case(scenario, 4)
    second = run.case(scenario, 4)
    assert first.status == second.status == "fail"
    if home_writable:
        assert not warnings
        assert list(run.saved) == [("decode-single-dcp4", 4)]
        assert run.saved[("decode-single-dcp4", 4)].parent == home / "failures"
    else:
        assert len(warnings) == 1 and str(home) in warnings[0]
        assert run.saved == {}


def model_builds(monkeypatch) -> list[str]:
    """The names of the threads that build a token-stream model from now on."""
    threads = []
    build = token_streams.build_model

    def recorded(config, device):
        threads.append(threading.current_thread().name)
        return build(config, device)

    monkeypatch.setattr(token_streams, "build_model", recorded)
    return threads


def test_the_token_stream_model_is_built_once_when_its_case_runs(monkeypatch):
    """In process, the token-stream case builds its model once, in the run's own thread:
    drawn on the device by ``seeded``, a full-width model takes too little time to hide
    behind the named scenarios (measured on the H200)."""
    threads = model_builds(monkeypatch)
    result = invoke("run", "--scenario", "decode-single-dcp4", "--dcp", "2", "--no-isolate")
    assert result.exit_code == 0, result.output
    assert "token-streams[dcp2]" in result.output
    assert threads == [threading.current_thread().name]


def test_an_isolated_kernels_worker_builds_the_model_for_its_token_stream_job(monkeypatch):
    """The worker builds the model once, for the token-stream job, where it answers the
    job (the worker's loop, run here on a thread over two pipes)."""
    threads = model_builds(monkeypatch)
    worker_reads, parent_writes = multiprocessing.Pipe(duplex=False)
    parent_reads, worker_writes = multiprocessing.Pipe(duplex=False)
    worker = threading.Thread(target=isolation_worker.serve, args=(worker_reads, worker_writes))
    worker.start()
    device = "cpu" if current_backend().interpreted else "cuda"
    parent_writes.send(isolation.Setup("default", "auto", device, torch.get_num_threads()))
    assert isinstance(parent_reads.recv(), isolation.Loading)
    assert isinstance(parent_reads.recv(), isolation.Ready)
    parent_writes.send(isolation.TokenStreamJob(RunConfig("default", (2,))))
    result = parent_reads.recv()
    assert isinstance(parent_reads.recv(), isolation.JobDone)
    parent_writes.close()  # the worker's loop ends
    worker.join(60)
    assert result.scenario == TOKEN_STREAM_CASE and result.status == "pass", result
    assert threads == [worker.name]


@pytest.mark.parametrize("compile_ahead", [True, False])
def test_a_plan_whose_binaries_are_loaded_skips_the_dry_pass(monkeypatch, compile_ahead):
    """The plain gate on a GPU loads every binary its list holds before its cases
    (``gate_binaries``); its plan then asks no dry pass, which would compile nothing. Any
    other plan keeps it."""
    from dcpcheck.ops.fused_norm_rope import session as fused_session
    from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
    from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario
    from tests.conftest import BACKEND

    dry: list[list[str]] = []
    cases = fused_session.SESSION_CASES
    monkeypatch.setattr(
        fused_session,
        "SESSION_CASES",
        dataclasses.replace(
            cases, compile_ahead=lambda _k, scenarios, *_: dry.append([s.name for s in scenarios])
        ),
    )
    scenario = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    run = session.Session(load_kernel("default"), RunConfig("default", (2,)), BACKEND)
    plan = session.RunPlan([scenario], token_streams=False, compile_ahead=compile_ahead)
    outcome = session.run_session(run, plan)
    assert [r.status for r in outcome.results] == ["pass"]
    assert dry == ([["decode-single-dcp4"]] if compile_ahead else [])
