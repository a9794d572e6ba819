"""`dcpcheck run` end to end on the project's Triton kernel: verdicts, reports, exit codes.

Runs through click's test runner in this process (the backend is already fixed by
conftest), plus a few real subprocesses for the one-line error format of ``main``.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from dcpcheck.cli import cli
from dcpcheck.exit_codes import EXIT_KERNEL_LOAD

REPO = Path(__file__).parents[1]
SMALL = ["--scenario", "decode-single-dcp4", "--scenario", "mixed-prefill-decode-padding"]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def run_json(tmp_path: Path, *args: str) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    result = invoke("run", *args, "--json", str(path))
    return result.exit_code, json.loads(path.read_text())


def failing_findings(report: dict) -> list[dict]:
    return [
        {**f, "check": c["check"], "scenario": case["scenario"]}
        for case in report["cases"]
        for c in case["checks"]
        if c["status"] == "fail"
        for f in c["findings"]
    ]


def test_default_kernel_passes(tmp_path):
    code, report = run_json(tmp_path, "--dcp", "1,4", *SMALL)
    assert code == 0
    assert report["oracle"] == "on"
    assert all(c["without_oracle"] is None for case in report["cases"] for c in case["checks"])
    assert report["summary"] == {
        "cases": 5,
        "pass": 5,
        "fail": 0,
        "error": 0,
        "crash": 0,
        "timeout": 0,
        "nondeterministic": 0,
        "not_applicable": 0,
    }
    assert [c["scenario"] for c in report["cases"]][-1] == "token-streams"


def test_no_tokens_skips_the_token_stream_case(tmp_path):
    _, report = run_json(tmp_path, "--dcp", "4", "--no-tokens", *SMALL)
    assert "token-streams" not in {c["scenario"] for c in report["cases"]}


@pytest.fixture(scope="module")
def regression_runs(tmp_path_factory) -> list[tuple[int, Path, Path]]:
    """``run --dcp 4 --kernel regress/pre-54908`` over SMALL with the token streams, twice
    with the same arguments: each run's exit code, JSON and JUnit report. The reports,
    the token-stream verdict and the identity of two runs are read from these two."""
    folder = tmp_path_factory.mktemp("regression-runs")
    runs = []
    for name in ("a", "b"):
        json_path, junit_path = folder / f"{name}.json", folder / f"{name}.xml"
        result = invoke(
            "run", "--dcp", "4", "--kernel", "regress/pre-54908", *SMALL,
            "--json", str(json_path), "--junit", str(junit_path),
        )  # fmt: skip
        runs.append((result.exit_code, json_path, junit_path))
    return runs


def test_token_streams_catch_the_regression(regression_runs):
    code, json_path, _ = regression_runs[0]
    assert code == 1
    report = json.loads(json_path.read_text())
    tokens = next(c for c in report["cases"] if c["scenario"] == "token-streams")
    assert tokens["status"] == "fail"
    assert "genuine divergence" in tokens["checks"][0]["findings"][0]["detail"]


@pytest.mark.parametrize(
    ("kernel", "fields"),
    [("regress/pre-54908", {"kv_out", "kpe_out"}), ("regress/pre-50005", {"q_out"})],
)
def test_regressions_fail_at_dcp4_on_foreign_tokens_and_pass_at_dcp1(tmp_path, kernel, fields):
    # The checks' findings only: both regressions' token streams are
    # tests/test_token_streams.py's (DCP1 digest equal to the default kernel's, DCP4 diverging).
    code, report = run_json(tmp_path, "--dcp", "4", "--kernel", kernel, "--no-tokens", *SMALL)
    assert code == 1
    outputs = [f for f in failing_findings(report) if f["check"] == "outputs"]
    assert {f["field"] for f in outputs} == fields
    assert {f["ownership"] for f in outputs} == {"foreign"}
    # decode-single-dcp4: one token, so the three ranks without it are the failing ones
    decode = {f["rank"] for f in outputs if f["scenario"] == "decode-single-dcp4"}
    assert len(decode) == 3
    assert all(f["max_error"] == "NaN (unwritten)" for f in outputs)
    replay = next(c["replay"] for c in report["cases"] if c["status"] == "fail")
    assert replay.startswith("dcpcheck run --scenario ") and f"--kernel {kernel}" in replay

    code, _ = run_json(tmp_path, "--dcp", "1", "--kernel", kernel, "--no-tokens", *SMALL)
    assert code == 0


ORACLE_OFF = ["--oracle", "off", "--no-tokens"]
"""A run judged without the oracle, its case checks alone (the token streams never use it)."""


def test_without_the_oracle_the_default_kernel_passes_and_the_reports_say_so(tmp_path):
    junit = tmp_path / "junit.xml"
    code, report = run_json(tmp_path, *ORACLE_OFF, "--dcp", "1,4", *SMALL, "--junit", str(junit))
    assert code == 0
    assert report["oracle"] == "off"
    assert report["summary"]["pass"] == report["summary"]["cases"] == 4
    for case in report["cases"]:
        replaced = {c["check"]: c["without_oracle"] for c in case["checks"] if c["without_oracle"]}
        assert set(replaced) == {"outputs", "cache_owned"}
        assert "DCP1 run" in replaced["outputs"] and "DCP1 run" in replaced["cache_owned"]
    suite = ET.parse(junit).getroot()
    properties = [(p.get("name"), p.get("value")) for p in suite.find("properties")]
    assert [value for name, value in properties if name == "oracle"] == ["off"]
    assert {name for name, _ in properties} == {"op", "oracle", "kernel_file"}
    assert ("op", "fused-norm-rope") in properties
    outputs = next(case for case in suite.iter("testcase") if case.get("name") == "outputs")
    assert outputs.find("properties/property").get("name") == "without_oracle"


@pytest.mark.parametrize(
    ("kernel", "fields"),
    [("regress/pre-54908", {"kv_out", "kpe_out"}), ("regress/pre-50005", {"q_out"})],
)
def test_without_the_oracle_regressions_fail_at_dcp4_and_pass_at_dcp1(tmp_path, kernel, fields):
    code, report = run_json(tmp_path, *ORACLE_OFF, "--dcp", "4", "--kernel", kernel, *SMALL)
    assert code == 1
    found = failing_findings(report)
    assert {f["check"] for f in found} == {"outputs", "ranks_agree"}
    for check in ("outputs", "ranks_agree"):
        mine = [f for f in found if f["check"] == check]
        assert {f["field"] for f in mine} == fields
        assert {f["ownership"] for f in mine} == {"foreign"}
    outputs = [f for f in found if f["check"] == "outputs"]
    assert all(f["max_error"] == "NaN (unwritten)" for f in outputs)
    decode = {f["rank"] for f in outputs if f["scenario"] == "decode-single-dcp4"}
    assert len(decode) == 3  # one token: the three ranks without it
    replay = next(c["replay"] for c in report["cases"] if c["status"] == "fail")
    assert replay.endswith("--oracle off")

    code, _ = run_json(tmp_path, *ORACLE_OFF, "--dcp", "1", "--kernel", kernel, *SMALL)
    assert code == 0


def test_without_the_oracle_a_kernel_that_zeroes_every_output_passes(tmp_path):
    """What --oracle off cannot see (README, "A gate without the oracle"): outputs wrong
    the same way at every DCP size pass it, token streams included; the oracle fails them."""
    kernel = "tests.kernels_under_test:zeroes_every_output"
    args = ["--dcp", "4", "--kernel", kernel, "--scenario", "decode-single-dcp4"]
    code, report = run_json(tmp_path, *args, "--oracle", "off")
    assert code == 0
    assert [case["scenario"] for case in report["cases"]] == ["decode-single-dcp4", "token-streams"]
    code, report = run_json(tmp_path, *args, "--no-tokens")
    assert code == 1
    assert "q_out" in {f["field"] for f in failing_findings(report)}


def test_repro_takes_the_oracle_option(tmp_path):
    scenario = str(REPO / "scenarios" / "fused-norm-rope" / "decode-single-dcp4.toml")
    args = ["repro", scenario, "--dcp", "4", "--kernel", "regress/pre-50005", "--oracle", "off"]
    result = invoke(*args)
    assert result.exit_code == 1
    assert "q_out on rank 0, first bad token 0 (foreign)" in result.output
    assert "never written" in result.output


def test_repro_writes_the_json_its_findings_point_to(tmp_path):
    """A replay that shows some findings says the rest are in --json: repro has it too."""
    scenario = str(REPO / "scenarios" / "fused-norm-rope" / "decode-single-dcp4.toml")
    path = tmp_path / "repro.json"
    args = ["repro", scenario, "--dcp", "4", "--kernel", "regress/pre-54908"]
    result = invoke(*args, "--json", str(path))
    assert result.exit_code == 1
    report = json.loads(path.read_text())
    assert report["kernel"] == "regress/pre-54908" and report["partial"] is False
    [case] = report["cases"]
    assert (case["scenario"], case["dcp"], case["status"]) == ("decode-single-dcp4", 4, "fail")
    assert {f["field"] for f in failing_findings(report)} == {"kv_out", "kpe_out"}
    assert all(len(f["sha256"]) == 64 for f in report["kernel_files"])


def test_identical_runs_write_identical_json(regression_runs):
    (_, first, _), (_, second, _) = regression_runs
    assert first.read_bytes() == second.read_bytes()


def test_junit_lists_every_check_and_the_failures(regression_runs):
    code, _, path = regression_runs[0]
    assert code == 1
    suite = ET.parse(path).getroot()
    assert int(suite.get("failures")) > 0
    names = {case.get("name") for case in suite.iter("testcase")}
    assert {"outputs", "cache_owned", "ranks_agree", "shards_reassemble"} <= names


def test_list_kernels_names_default_and_both_regressions():
    result = invoke("list", "kernels")
    assert result.exit_code == 0
    for name in ("default", "regress/pre-50005", "regress/pre-54908"):
        assert name in result.output


def test_list_scenarios():
    result = invoke("list", "scenarios")
    assert "decode-single-dcp4" in result.output


NEW_FORMATS = ("indexer-mx-scales", "indexer-shuffled", "nvfp4-ds-mla-cache")
"""The shipped scenarios of the newer cache formats."""


def test_the_project_kernel_passes_each_new_cache_format_at_every_dcp_size(tmp_path):
    args = [a for name in NEW_FORMATS for a in ("--scenario", name)]
    code, report = run_json(tmp_path, *args, "--dcp", "1,2,4,8", "--no-tokens")
    assert code == 0
    assert [(c["scenario"], c["dcp"], c["status"]) for c in report["cases"]] == [
        (name, n, "pass") for name in NEW_FORMATS for n in (1, 2, 4, 8)
    ]
    checks = {
        c["check"] for case in report["cases"] for c in case["checks"] if c["status"] == "pass"
    }
    assert {"cache_owned", "cache_foreign", "shards_reassemble"} <= checks


def test_list_layouts_shows_bytes_per_token():
    result = invoke("list", "layouts")
    assert result.exit_code == 0
    sizes = dict(line.split()[:2] for line in result.output.splitlines())
    assert sizes == {
        "auto": "1152",
        "fp8": "576",
        "fp8_ds_mla": "656",
        "nvfp4_ds_mla": "352",
        **{f"index:{name}": "132" for name in ("plain", "plain+mx", "shuffled", "shuffled+mx")},
    }


@pytest.mark.parametrize(
    "args",
    [
        ("--kernel", "tests.kernels_under_test:no_fp4_here", "--scenario", "nvfp4-ds-mla-cache",
         "--no-tokens"),
        ("--op", "lse-combine", "--kernel", "vllm==0.29.0", "--scenario", "decode-empty-ranks"),
    ],
    ids=["fused", "lse-combine"],
)  # fmt: skip
def test_a_run_whose_every_case_is_not_applicable_judged_nothing_and_is_not_0(tmp_path, args):
    """Nothing was launched: one line and 125 (no check calls the revision good or bad),
    the report written with the cases as they are."""
    path = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["run", *args, "--dcp", "1", "--json", str(path)])
    assert result.exit_code == EXIT_KERNEL_LOAD, result.output
    assert "no case was judged: 1 case(s), every one not applicable here" in result.output
    assert [c["status"] for c in json.loads(path.read_text())["cases"]] == ["not_applicable"]


def test_a_case_the_kernel_cannot_run_here_is_not_applicable_not_passed(tmp_path):
    """Reported N/A with its reason in the console, JSON and JUnit (skipped), never
    launched; it fails nothing, and the summary does not count it as passed."""
    junit = tmp_path / "report.xml"
    kernel = "tests.kernels_under_test:no_fp4_here"
    args = ["--kernel", kernel, "--scenario", "nvfp4-ds-mla-cache", "--scenario", "fp8-cache"]
    code, report = run_json(tmp_path, *args, "--dcp", "1,2", "--no-tokens", "--junit", str(junit))
    assert code == 0
    statuses = {(c["scenario"], c["dcp"]): (c["status"], c["error"]) for c in report["cases"]}
    reason = "not applicable on this GPU: no e2m1 conversion instruction"
    assert statuses == {
        ("fp8-cache", 1): ("pass", None),
        ("fp8-cache", 2): ("pass", None),
        ("nvfp4-ds-mla-cache", 1): ("not_applicable", reason),
        ("nvfp4-ds-mla-cache", 2): ("not_applicable", reason),
    }
    assert report["summary"]["pass"] == 2 and report["summary"]["not_applicable"] == 2
    xml = junit.read_text()
    assert xml.count(f'<skipped message="{reason}"') == 2
    result = invoke("run", *args, "--dcp", "1", "--no-tokens")
    assert "1 passed, 0 failed, 0 error(s), 1 not applicable" in result.output
    assert f"N/A nvfp4-ds-mla-cache[dcp1]: {reason}" in result.output


def test_a_replay_repeats_the_case_timeout(tmp_path):
    """A case judged under ``--case-timeout`` is replayed under it: its replay line dropped
    it, so a case that timed out within it could pass the default's 300 s."""
    code, report = run_json(
        tmp_path, "--kernel", "regress/pre-54908", "--case-timeout", "120.5",
        "--scenario", "decode-single-dcp4", "--dcp", "4", "--no-tokens",
    )  # fmt: skip
    assert code == 1
    [failed] = [c for c in report["cases"] if c["status"] == "fail"]
    assert failed["replay"].endswith(" --case-timeout 120.5"), failed["replay"]
