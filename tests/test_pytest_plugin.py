"""The pytest plugin, driven the way a kernel repository uses it (``pytester``).

Runs are in-process (fast: torch and Triton are already imported) except one that checks,
in a fresh interpreter, that the backend is fixed before a repository's conftest loads.
Scenario runs use one decode token (``decode-single-dcp4``) so each case costs well under
a second on Triton's CPU interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from dcpcheck import pytest_plugin
from dcpcheck.cases.verdicts import CaseResult, CheckResult, Finding, RunConfig
from dcpcheck.ops.fused_norm_rope import adapters, runner, session
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario
from dcpcheck.pytest_plugin import verdict_of
from tests.conftest import BACKEND

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]

INSTALLED = any(
    ep.name == "dcpcheck" and ep.value == "dcpcheck.pytest_plugin"
    for ep in importlib.metadata.entry_points(group="pytest11")
)
PLUGIN_ARGS = () if INSTALLED else ("-p", "dcpcheck.pytest_plugin")
"""Load the plugin by hand where the project is not pip-installed (loading it both ways
would register it twice)."""

ONE_TOKEN = ("--dcpcheck-scenario=decode-single-dcp4", "--dcpcheck-no-tokens")

KV_FOREIGN_RANK0 = (
    "outputs: kv_out on rank 0, first bad token 0 (foreign), max error NaN (unwritten): "
    "1 token row(s) differ from the oracle"
)


# fnmatch reads "[" as a character class: "[[]" below is a literal "[".


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An in-process run of pytest in ``pytester.path`` with the plugin loaded (it is
    already imported here, which pytest's assertion rewriting would warn about)."""
    return pytester.runpytest(
        *PLUGIN_ARGS, "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
    )


@pytest.fixture(autouse=True, scope="module")
def _triton_imported_once() -> None:
    """pytester's in-process runs drop the modules they imported when they end, and
    Triton's bindings do not survive being imported twice in one process (an abort, or
    leaked objects at exit). Import Triton and everything its first launch pulls in
    here, before any in-process run, by running the project's kernel once."""
    scenario = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
    kernel = load_kernel("default")
    [result] = runner.run_scenario(kernel, scenario, RunConfig("default", (1,)), BACKEND)
    assert result.status == "pass"


def test_entry_point_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["entry-points"]["pytest11"] == {"dcpcheck": "dcpcheck.pytest_plugin"}


def test_inert_without_a_kernel(pytester):
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run(pytester, "-v")
    result.assert_outcomes(passed=1)
    assert "dcpcheck::" not in result.stdout.str()
    assert "--dcpcheck-kernel=SPEC" in run(pytester, "--help").stdout.str()


def test_items_have_readable_ids_and_select_with_k(pytester):
    args = (
        "--dcpcheck-kernel=default",
        "--dcpcheck-dcp=1,4",
        "--dcpcheck-scenario=decode-single-dcp4",
        "--dcpcheck-scenario=glm5-*",
        "--collect-only",
        "-q",
    )
    result = run(pytester, *args)
    assert result.ret == 0
    ids = [line for line in result.outlines if line.startswith("dcpcheck::")]
    assert ids == [
        "dcpcheck::decode-single-dcp4[dcp1]",
        "dcpcheck::decode-single-dcp4[dcp4]",
        "dcpcheck::glm5-prefill-1536-prefix[dcp1]",
        "dcpcheck::glm5-prefill-1536-prefix[dcp4]",
        "dcpcheck::glm5-prefill-512[dcp1]",
        "dcpcheck::glm5-prefill-512[dcp4]",
        "dcpcheck::token-streams[dcp4]",
    ]
    result.stdout.fnmatch_lines(["7 tests collected*"])
    selected = run(pytester, *args, "-k", "glm5-prefill-512[dcp4]")
    assert [line for line in selected.outlines if line.startswith("dcpcheck::")] == [
        "dcpcheck::glm5-prefill-512[dcp4]"
    ]


def test_scenarios_own_dcp_sizes_by_default(pytester):
    result = run(
        pytester, "--dcpcheck-kernel=default", "--dcpcheck-scenario=fp8-cache", "--co", "-q"
    )
    ids = [line for line in result.outlines if line.startswith("dcpcheck::")]
    assert ids == [
        "dcpcheck::fp8-cache[dcp1]",
        "dcpcheck::fp8-cache[dcp2]",
        "dcpcheck::fp8-cache[dcp4]",
        "dcpcheck::token-streams[dcp4]",  # TOKEN_STREAM_DCP, as the CLI
    ]


def test_default_kernel_passes_and_names_checks_that_did_not_apply(pytester):
    result = run(pytester, "--dcpcheck-kernel=default", "--dcpcheck-dcp=1,4", *ONE_TOKEN, "-rA")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ dcpcheck decode-single-dcp4[[]dcp1] _*",
            "not applicable: padding_inert (no padding rows in this batch); ranks_agree "
            "(DCP1 is the baseline); shards_reassemble (DCP1 is the baseline)",
            "*_ dcpcheck decode-single-dcp4[[]dcp4] _*",
            "not applicable: padding_inert (no padding rows in this batch)",
            "PASSED dcpcheck::decode-single-dcp4[dcp1]",
            "PASSED dcpcheck::decode-single-dcp4[dcp4]",
        ]
    )


def test_pre_54908_fails_with_the_cli_text_and_replay(pytester):
    result = run(
        pytester,
        "--dcpcheck-kernel=regress/pre-54908",
        "--dcpcheck-dcp=1,4",
        *ONE_TOKEN,
        "--junitxml=junit.xml",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ dcpcheck decode-single-dcp4[[]dcp4] _*",
            "decode-single-dcp4[dcp4]: FAIL on kernel regress/pre-54908: outputs, ranks_agree",
            KV_FOREIGN_RANK0,
            "outputs: kpe_out on rank 0, first bad token 0 (foreign), *",
            "ranks_agree: kv_out on rank 0, first bad token 0 (foreign), max error NaN "
            "(unwritten): 1 row(s) differ bitwise from the DCP1 run",
            "replay: dcpcheck run --scenario decode-single-dcp4 --dcp 4 --kernel regress/pre-54908",
            "FAILED dcpcheck::decode-single-dcp4[[]dcp4]*",
        ]
    )
    output = result.stdout.str()
    assert "rank 1, first bad token" not in output  # the owner rank wrote its rows
    assert "Traceback" not in output and "def runtest" not in output
    suite = ET.parse(pytester.path / "junit.xml").getroot()
    properties = {
        (case.get("name"), prop.get("name")): prop.get("value")
        for case in suite.iter("testcase")
        for prop in case.iter("property")
    }
    assert properties[("decode-single-dcp4[dcp4]", "dcpcheck_replay")] == (
        "dcpcheck run --scenario decode-single-dcp4 --dcp 4 --kernel regress/pre-54908"
    )


def test_oracle_off_judges_against_the_dcp1_run_and_its_replay_says_so(pytester):
    result = run(
        pytester,
        "--dcpcheck-kernel=regress/pre-54908",
        "--dcpcheck-dcp=4",
        "--dcpcheck-oracle=off",
        *ONE_TOKEN,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "outputs: kv_out on rank 0, first bad token 0 (foreign), max error NaN "
            "(unwritten): 1 token row(s) still hold the harness's NaN poison: never written",
            "replay: dcpcheck run --scenario decode-single-dcp4 --dcp 4 --kernel "
            "regress/pre-54908 --oracle off",
        ]
    )
    assert "differ from the oracle" not in result.stdout.str()


def _write_kernel_file(pytester: pytest.Pytester, body: str) -> str:
    pytester.makepyfile(repo_kernels=body)
    return f"{pytester.path / 'repo_kernels.py'}:fused"


DELEGATING_KERNEL = """
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel

_project_kernel = load_kernel("default")


def fused(inputs, outputs, caches):
    _project_kernel(inputs, outputs, caches)
"""


def _repository_scenario(name: str) -> str:
    shipped = (SCENARIOS / "decode-single-dcp4.toml").read_text(encoding="utf-8")
    return shipped.replace('name = "decode-single-dcp4"', f'name = "{name}"').replace(
        "dcp = [4]", "dcp = [1, 2]"
    )


def test_repository_scenarios_from_the_ini_option(pytester):
    kernel = _write_kernel_file(pytester, DELEGATING_KERNEL)
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\ndcpcheck_scenario_dirs = ["dcp_scenarios"]\n'
    )
    scenarios = pytester.mkdir("dcp_scenarios")
    (scenarios / "repo-decode.toml").write_text(_repository_scenario("repo-decode"))
    result = run(
        pytester,
        f"--dcpcheck-kernel={kernel}",
        "--dcpcheck-scenario=repo-*",
        "--dcpcheck-scenario=decode-single-dcp4",
        "--dcpcheck-no-tokens",
        "-v",
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "dcpcheck::decode-single-dcp4[[]dcp4] PASSED*",
            "dcpcheck::repo-decode[[]dcp1] PASSED*",
            "dcpcheck::repo-decode[[]dcp2] PASSED*",
        ]
    )


def test_a_scenario_defined_twice_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\ndcpcheck_scenario_dirs = dcp_scenarios\n")
    scenarios = pytester.mkdir("dcp_scenarios")
    (scenarios / "decode-single-dcp4.toml").write_text(_repository_scenario("decode-single-dcp4"))
    result = run(pytester, "--dcpcheck-kernel=default", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'decode-single-dcp4' is defined twice*"])


def test_a_failing_case_is_saved_and_replays_as_it_failed(pytester):
    """The plugin saves a failing case as ``dcpcheck run`` does (the session API), under
    ``--dcpcheck-home``; ``dcpcheck repro`` on the saved file fails the same way."""
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    home = pytester.path / "home"
    result = run(
        pytester,
        "--dcpcheck-kernel=regress/pre-54908",
        "--dcpcheck-dcp=1,4",
        f"--dcpcheck-home={home}",
        *ONE_TOKEN,
    )
    result.assert_outcomes(passed=1, failed=1)
    saved = sorted((home / "failures").glob("*.toml"))
    assert len(saved) == 1, saved
    assert saved[0].name.startswith("decode-single-dcp4-regress-pre-54908-dcp4-")
    scenario = load_scenario(saved[0])
    assert scenario.dcp_sizes == (4,)
    replay = CliRunner().invoke(cli, ["repro", str(saved[0]), "--kernel", "regress/pre-54908"])
    assert replay.exit_code == 1, replay.output
    assert "ranks_agree" in replay.output
    fixed = CliRunner().invoke(cli, ["repro", str(saved[0]), "--kernel", "default"])
    assert fixed.exit_code == 0, fixed.output


def test_a_kernel_that_raises_fails_its_item_with_the_error(pytester):
    kernel = _write_kernel_file(
        pytester, "def fused(inputs, outputs, caches):\n    raise RuntimeError('boom')\n"
    )
    result = run(pytester, f"--dcpcheck-kernel={kernel}", "--dcpcheck-dcp=1", *ONE_TOKEN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "decode-single-dcp4[[]dcp1]: ERROR on kernel *repo_kernels.py:fused: "
            "rank 0: RuntimeError: boom",
            "replay: dcpcheck run --scenario decode-single-dcp4 --dcp 1 --kernel *",
        ]
    )


def test_a_case_where_no_check_applies_is_skipped_not_passed(pytester, monkeypatch):
    def nothing_applies(kernel, scenario, config, backend):
        yield CaseResult(
            scenario.name,
            config.dcp_sizes[0],
            "pass",
            [CheckResult("outputs", skipped="the API has no output buffers")],
            replay="r",
        )

    nothing = dataclasses.replace(session.SESSION_CASES, run_scenario=nothing_applies)
    monkeypatch.setattr(session, "SESSION_CASES", nothing)
    result = run(pytester, "--dcpcheck-kernel=default", "--dcpcheck-dcp=4", *ONE_TOKEN, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*decode-single-dcp4[[]dcp4]: no check applies: outputs (the API has no output buffers)"]
    )


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--dcpcheck-dcp=1,x", "--dcpcheck-dcp: 'x' is not an integer*"),
        ("--dcpcheck-dcp=0", "--dcpcheck-dcp: DCP size must be >= 1, got 0"),
        ("--dcpcheck-scenario=no-such-*", "--dcpcheck-scenario: no scenario matches no-such-*"),
    ],
)
def test_bad_options_are_usage_errors(pytester, option, message):
    result = run(pytester, "--dcpcheck-kernel=default", option, "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_an_unknown_adapter_is_refused_under_the_adapter_option(pytester):
    """Not under ``--dcpcheck-kernel``, as when the kernel's load refused it."""
    result = run(pytester, "--dcpcheck-kernel=default", "--dcpcheck-adapter=magic", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*error: argument --dcpcheck-adapter: invalid choice: 'magic'*"])
    assert "--dcpcheck-kernel" not in result.stderr.str()


def test_the_adapter_choices_are_the_adapters():
    assert pytest_plugin.ADAPTER_NAMES == adapters.ADAPTER_NAMES


def test_unknown_kernel_is_a_usage_error(pytester):
    result = run(pytester, "--dcpcheck-kernel=no/such-kernel", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --dcpcheck-kernel: unknown kernel 'no/such-kernel'*"])


def test_backend_is_fixed_before_the_repository_conftest_loads(pytester, monkeypatch):
    """In a fresh interpreter a conftest importing its Triton kernels must already see the
    interpreter choice (TRITON_INTERPRET=1 on a machine without CUDA)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # importable even where not pip-installed
    pytester.makeconftest(
        "import os\n"
        "SEEN = os.environ.get('TRITON_INTERPRET')\n"
        "def pytest_report_header(config):\n"
        "    return f'conftest saw TRITON_INTERPRET={SEEN}'\n"
    )
    result = pytester.runpytest_subprocess(
        *PLUGIN_ARGS, "--dcpcheck-kernel=default", *ONE_TOKEN, "--co", "-q", "-v"
    )
    expected = "None" if torch.cuda.is_available() else "1"
    result.stdout.fnmatch_lines([f"conftest saw TRITON_INTERPRET={expected}", "*[[]dcp4]*"])


def _finding(field: str, rank: int) -> Finding:
    return Finding(field, rank, "1 token row(s) differ from the oracle", 0, "foreign", "2 ulp")


def test_judge_fails_on_findings_with_one_line_each_and_the_replay():
    result = CaseResult(
        "s",
        4,
        "fail",
        [
            CheckResult("outputs", (_finding("kv_out", 0), _finding("kpe_out", 2))),
            CheckResult("padding_inert", skipped="no padding rows in this batch"),
        ],
        replay="dcpcheck run --scenario s --dcp 4 --kernel k",
    )
    verdict = verdict_of(result, "k")
    assert verdict.outcome == "failed"
    assert verdict.text.splitlines() == [
        "s[dcp4]: FAIL on kernel k: outputs",
        "outputs: kv_out on rank 0, first bad token 0 (foreign), max error 2 ulp: "
        "1 token row(s) differ from the oracle",
        "outputs: kpe_out on rank 2, first bad token 0 (foreign), max error 2 ulp: "
        "1 token row(s) differ from the oracle",
        "replay: dcpcheck run --scenario s --dcp 4 --kernel k",
    ]


@pytest.mark.parametrize("status", ["error", "crash", "timeout"])
def test_judge_fails_every_status_other_than_pass(status):
    result = CaseResult("s", 2, status, error="rank 1: killed after 60 s", replay="r")
    verdict = verdict_of(result, "k")
    assert verdict.outcome == "failed"
    assert (
        verdict.text
        == f"s[dcp2]: {status.upper()} on kernel k: rank 1: killed after 60 s\nreplay: r"
    )


def test_judge_never_passes_a_case_whose_checks_were_all_skipped():
    skipped = [CheckResult("outputs", skipped="a"), CheckResult("topk", skipped="b")]
    assert verdict_of(CaseResult("s", 1, "pass", skipped), "k") == pytest_plugin.Verdict(
        "skipped", "s[dcp1]: no check applies: outputs (a); topk (b)"
    )
    assert verdict_of(CaseResult("s", 1, "pass", []), "k").outcome == "skipped"
    passing = [CheckResult("outputs"), CheckResult("topk", skipped="b")]
    assert verdict_of(CaseResult("s", 1, "pass", passing), "k") == pytest_plugin.Verdict(
        "passed", "not applicable: topk (b)"
    )


def test_a_hanging_kernel_times_out_its_item_and_the_run_goes_on(pytester):
    """Items run isolated by default: a kernel that never returns fails its own item as
    TIMEOUT within --dcpcheck-case-timeout, the next item still runs (and passes), and
    the timed-out case is saved like any failing case."""
    home = pytester.path / "home"
    result = run(
        pytester,
        "--dcpcheck-kernel=tests.fixtures.faulty_kernels:hangs_on_one_token",
        "--dcpcheck-dcp=1",
        "--dcpcheck-scenario=decode-single-dcp4",  # one token: hangs
        "--dcpcheck-scenario=mixed-prefill-decode-padding",  # many: passes
        "--dcpcheck-no-tokens",
        "--dcpcheck-case-timeout=10",
        f"--dcpcheck-home={home}",
    )
    result.assert_outcomes(passed=1, failed=1)
    timed_out = "*decode-single-dcp4[[]dcp1]: TIMEOUT on kernel *: no result within 10 s*"
    replay = "*replay: *dcpcheck run --scenario decode-single-dcp4 --dcp 1 *--case-timeout 10.0*"
    result.stdout.fnmatch_lines([timed_out, replay])
    [saved] = (home / "failures").glob("*.toml")
    assert saved.name.startswith("decode-single-dcp4-")


def test_a_case_timeout_without_isolation_is_a_usage_error(pytester):
    result = run(
        pytester,
        "--dcpcheck-kernel=default",
        "--dcpcheck-isolate=off",
        "--dcpcheck-case-timeout=5",
        "--co",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dcpcheck-case-timeout needs --dcpcheck-isolate=on*"])


def test_items_run_in_a_worker_process_by_default(pytester):
    """The kernel records the process it ran in: not pytest's own."""
    marker = pytester.path / "pid"
    kernel = _write_kernel_file(
        pytester,
        "import os\n"
        "from tests.kernels_under_test import oracle_kernel\n"
        "def fused(inputs, outputs, caches):\n"
        f"    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "    oracle_kernel(inputs, outputs, caches)\n",
    )
    result = run(pytester, f"--dcpcheck-kernel={kernel}", "--dcpcheck-dcp=1", *ONE_TOKEN)
    result.assert_outcomes(passed=1)
    assert int(marker.read_text()) != os.getpid()


@pytest.mark.parametrize(("exits", "status"), [("sys.exit(0)", "ERROR"), ("os._exit(0)", "CRASH")])
def test_a_kernel_whose_import_exits_fails_every_item_never_passes(
    pytester, monkeypatch, exits, status
):
    """Its worker, not pytest's process, imports the module; no item is judged, each
    fails saying why, and the JUnit report says so (a run of its own: the import would
    end this one)."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    body = f"import os, sys\nfrom tests.kernels_under_test import oracle_kernel as fused\n{exits}\n"
    kernel = _write_kernel_file(pytester, body)
    result = pytester.runpytest_subprocess(
        *PLUGIN_ARGS, f"--dcpcheck-kernel={kernel}", "--dcpcheck-dcp=1", *ONE_TOKEN,
        "--junitxml=report.xml",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"{status}: the kernel did not load: *; no case was judged"])
    assert "the kernel did not load" in (pytester.path / "report.xml").read_text()


def test_without_isolation_an_import_that_ends_its_process_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    body = "import os\nfrom tests.kernels_under_test import oracle_kernel as fused\nos._exit(0)\n"
    kernel = _write_kernel_file(pytester, body)
    result = pytester.runpytest_subprocess(
        *PLUGIN_ARGS, f"--dcpcheck-kernel={kernel}", "--dcpcheck-isolate=off", *ONE_TOKEN
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dcpcheck-kernel: *its import ended the process running it*"])


def test_the_slot_mapping_op_as_test_items(pytester):
    """One item per scenario of the op and DCP size it names, the same verdicts as
    ``dcpcheck run --op slot-mapping``, failing cases saved."""
    home = pytester.path / "home"
    op = ("--dcpcheck-op=slot-mapping", f"--dcpcheck-home={home}")
    passing = run(pytester, "--dcpcheck-kernel=default", *op)
    passing.assert_outcomes(passed=26)  # 6 scenarios at DCP 1, 2, 4, 8; many-requests at 1, 4
    mutant = run(pytester, "--dcpcheck-kernel=mutant/interleave-ignored", *op, "-k", "dcp4")
    # the three scenarios with an interleave above 1 fail
    mutant.assert_outcomes(passed=4, failed=3)
    mutant.stdout.fnmatch_lines(["*interleaved-prefix[[]dcp4]: FAIL on kernel*: slots*"])
    [saved] = (home / "failures").glob("interleaved-prefix-*-dcp4-*.toml")
    assert saved.read_text().startswith('op = "slot-mapping"')


def test_the_merge_op_as_test_items(pytester):
    """Every op the registry names is an item source alike: the merge's scenarios at
    their DCP sizes, a mutant failing the ones that catch it."""
    op = ("--dcpcheck-op=lse-combine", f"--dcpcheck-home={pytester.path / 'home'}")
    passing = run(pytester, "--dcpcheck-kernel=default", *op, "-k", "dcp2")
    passing.assert_outcomes(passed=5)  # the shipped scenarios that name DCP2 (odd-shapes: 3, 6)
    mutant = run(pytester, "--dcpcheck-kernel=mutant/lengths-ignored", *op, "-k", "dcp2")
    mutant.assert_outcomes(passed=4, failed=1)
    mutant.stdout.fnmatch_lines(["*empty-lse-zero[[]dcp2]: FAIL on kernel*: empty_shards*"])


def test_the_fused_ops_options_are_refused_for_the_slot_mapping_op(pytester):
    result = run(
        pytester, "--dcpcheck-kernel=default", "--dcpcheck-op=slot-mapping",
        "--dcpcheck-oracle=off", "--co",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dcpcheck-op slot-mapping does not take --dcpcheck-oracle*"])
