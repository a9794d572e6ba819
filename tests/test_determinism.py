"""Determinism as a check: a kernel whose two runs of one launch differ is reported
``nondeterministic`` with what moved, not as a DCP divergence; the property search survives
it; ``repro --runs`` says when a verdict is not stable."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

import tests.kernels_under_test as k
from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.cli import cli
from dcpcheck.ops.fused_norm_rope import determinism, search
from dcpcheck.ops.fused_norm_rope.case import build_case
from dcpcheck.ops.fused_norm_rope.contract import SMALL_PRESETS
from dcpcheck.ops.fused_norm_rope.runner import launch, run
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS, load_scenario
from tests.conftest import BACKEND

SCENARIO = load_scenario(SCENARIOS / "decode-single-dcp4.toml")
KERNELS = "tests.kernels_under_test"


def test_two_runs_of_a_deterministic_kernel_leave_the_same_bytes():
    cases = [build_case(SCENARIO, 4, BACKEND.device) for _ in range(2)]
    for case in cases:
        assert launch(k.oracle_kernel, case).error is None
    assert determinism.launch_differences(*cases) == []


def test_a_moved_output_row_and_cache_entry_are_located():
    cases = [build_case(SCENARIO, 2, BACKEND.device) for _ in range(2)]
    for case in cases:
        launch(k.oracle_kernel, case)
    cases[1].ranks[1].outputs.q_out.view(-1)[0] += 1
    cases[1].ranks[0].mla.view.view(-1)[3] ^= 1
    moved = determinism.launch_differences(*cases)
    assert [(f.field, f.rank) for f in moved] == [("mla_cache", 0), ("q_out", 1)]
    assert "first at slot 0" in moved[0].detail
    assert moved[1].tokens == (0,) and "decode-single-dcp4[dcp2]" in moved[1].detail


def test_a_flaky_kernel_is_nondeterministic_not_a_dcp_divergence():
    k.reset_call_count()
    [dcp1, dcp4] = run(k.flaky_q_out, [SCENARIO], RunConfig("flaky", (1, 4)), BACKEND)
    for result in (dcp1, dcp4):
        assert result.status == "nondeterministic", result
        [deterministic] = [c for c in result.checks if c.check == determinism.CHECK]
        assert [(f.field, f.rank) for f in deterministic.findings] == [("q_out", 0)]
        assert "not deterministic" in result.error


def test_a_one_in_ten_kernel_is_nondeterministic_and_never_a_dcp_divergence():
    """The one-in-ten kernel (one ulp, one call in ten) over every shipped scenario of a small
    preset and at most 64 tokens (the real presets' widths and the long prefills cost most of
    the time and add nothing here) at DCP 1 and 4, ten tries with ``--seed`` fixed: each try
    reports it nondeterministic and no case as a DCP failure. One confirming rerun was not
    enough: a rerun repeats the nudge of the first run often enough that most tries reported
    a false divergence somewhere."""
    scenarios = [load_scenario(path) for path in sorted(SCENARIOS.glob("*.toml"))]
    small = [s for s in scenarios if s.preset in SMALL_PRESETS and s.batch.num_real_tokens <= 64]
    assert len(small) == 23
    for attempt in range(10):
        results = run(k.OneInTen(attempt), small, RunConfig("one-in-ten", (1, 4), seed=0), BACKEND)
        statuses = {r.status for r in results}
        assert "nondeterministic" in statuses, (attempt, statuses)
        assert statuses <= {"pass", "nondeterministic"}, [
            (r.scenario, r.dcp_size, r.failed_checks) for r in results if r.status == "fail"
        ]


def test_a_deterministic_kernel_passes_the_check():
    [result] = run(k.oracle_kernel, [SCENARIO], RunConfig("oracle", (4,)), BACKEND)
    assert result.status == "pass"
    assert next(c for c in result.checks if c.check == determinism.CHECK).passed


def test_a_failing_case_that_fails_only_once_is_nondeterministic():
    """The baseline is stable; the DCP4 case fails on its first run only: run once more
    before it is reported, it is nondeterministic, not a rank divergence."""
    calls = {"n": 0}

    def fails_once_at_dcp4(inputs, outputs, caches):
        k.oracle_kernel(inputs, outputs, caches)
        calls["n"] += 1
        if calls["n"] == 3:  # DCP1, DCP1 again, then rank 0 of DCP4's first run
            outputs.q_out.view(torch.int16)[0] += 1

    [result] = run(fails_once_at_dcp4, [SCENARIO], RunConfig("once", (4,)), BACKEND)
    assert result.status == "nondeterministic"
    [deterministic] = [c for c in result.checks if c.check == determinism.CHECK]
    assert [(f.field, f.rank) for f in deterministic.findings] == [("q_out", 0)]


def test_the_property_search_survives_a_flaky_kernel(tmp_path):
    """Hypothesis raises Flaky when a failing example passes on replay; the search saves
    the failure it saw and says it is not deterministic, with a replay that runs it N times."""
    k.reset_call_count()
    config = search.SearchConfig(
        f"{KERNELS}:flaky_q_out", search.PROFILES["smoke"], 5, (2,), home=tmp_path
    )
    result = search.search(k.flaky_q_out, config, BACKEND)
    assert not result.passed
    assert result.saved_path is not None and result.saved_path.is_file()
    assert "deterministic" in result.failed_checks or "flaky" in result.failed_checks
    assert result.replay_command.startswith(f"dcpcheck repro {result.saved_path}")


def test_the_property_search_names_a_one_in_ten_kernel_nondeterministic(tmp_path):
    """The one-in-ten kernel, ten tries of the search with its seed fixed: every try fails,
    names the kernel not deterministic (``deterministic`` failed, or Hypothesis saw the
    failure vanish), and prints a replay that runs the saved case ten times."""
    for attempt in range(10):
        config = search.SearchConfig(
            "one-in-ten", search.PROFILES["smoke"], 20, (4,), seed=0, home=tmp_path / str(attempt)
        )
        result = search.search(k.OneInTen(attempt), config, BACKEND)
        assert not result.passed, attempt
        assert {"deterministic", "flaky"} & set(result.failed_checks), result.failed_checks
        assert f"--runs {search.REPLAY_RUNS_FLAKY}" in result.replay_command


def write_kernel(tmp_path: Path) -> str:
    """A file kernel failing every other replay (its own counter): ``repro --runs``."""
    path = tmp_path / "alternating.py"
    path.write_text(
        "import torch\n"
        "from tests.kernels_under_test import oracle_kernel\n"
        "CALLS = [0]\n"
        "def kernel(inputs, outputs, caches):\n"
        "    oracle_kernel(inputs, outputs, caches)\n"
        "    CALLS[0] += 1\n"
        "    if (CALLS[0] - 1) // 3 % 2 == 1 and inputs.slot_mapping is not None and "
        "(inputs.slot_mapping >= 0).sum() == 0:\n"
        "        outputs.kv_out.view(torch.int16)[0] += 1\n"
    )
    return f"{path}:kernel"


def test_repro_runs_says_when_the_verdict_is_not_stable(tmp_path):
    """Each replay of decode-single at DCP2 launches 3 times (DCP1 twice, then the two
    ranks); the kernel breaks a foreign row in every other replay, so the verdict flips."""
    spec = write_kernel(tmp_path)
    scenario = SCENARIOS / "decode-single-dcp4.toml"
    args = ["repro", str(scenario), "--dcp", "2", "--kernel", spec, "--no-isolate"]
    result = CliRunner().invoke(cli, [*args, "--runs", "4"])
    assert result.exit_code == 1, result.output
    assert "NONDETERMINISTIC: failed 2 of 4 runs, passed 2" in result.output
    stable = CliRunner().invoke(
        cli, ["repro", str(scenario), "--dcp", "2", "--runs", "2", "--kernel", "default"]
    )
    assert stable.exit_code == 0, stable.output
    assert "stable over 2 runs" in stable.output


def test_nondeterministic_is_counted_in_the_json_summary(tmp_path):
    report = tmp_path / "r.json"
    k.reset_call_count()
    args = [
        "run", "--scenario", "decode-single-dcp4", "--dcp", "2", "--no-tokens",
        "--kernel", f"{KERNELS}:flaky_q_out", "--no-isolate", "--json", str(report),
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "NONDETERMINISTIC" in result.output
    summary = json.loads(report.read_text())["summary"]
    assert summary["nondeterministic"] == 1 and summary["pass"] == 0


def test_a_failure_that_does_not_repeat_on_replay_is_saved_unshrunk(tmp_path):
    """The kernel is wrong for its first example only (stable within it, so each case is
    an ordinary failure); Hypothesis' replay passes and it raises Flaky. The search saves
    the failure it saw, unshrunk, marked flaky, and exits through its result."""
    calls = {"n": 0}

    def wrong_at_first(inputs, outputs, caches):
        calls["n"] += 1
        if calls["n"] <= 6:  # DCP1 twice, two ranks, the two ranks again: one example
            k.skips_foreign_kv(inputs, outputs, caches)
        else:
            k.oracle_kernel(inputs, outputs, caches)

    config = search.SearchConfig("wrong-at-first", search.PROFILES["smoke"], 5, (2,), home=tmp_path)
    result = search.search(wrong_at_first, config, BACKEND)
    assert not result.passed
    assert "flaky" in result.failed_checks
    assert result.saved_path.name.startswith("flaky-wrong-at-first")
    assert "not shrunk" in result.saved_path.read_text()
    assert " --runs 10 " in result.replay_command
    assert all(r.status == "pass" for r in result.replay)  # it passes now
