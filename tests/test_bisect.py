"""``dcpcheck.workflows.bisection`` on a throwaway repository whose kernel file picks up the
PR-54908 flaw at a known commit (tests/fixtures/kernel_history.py), and ``git bisect run`` with
``dcpcheck run`` on the same history: both must name that commit.

Each revision costs one ``python -m dcpcheck run`` subprocess (~2 s: a tiny scenario and
an oracle-based kernel, no Triton interpreter), so the runs are counted and bounded.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dcpcheck.workflows import bisection
from dcpcheck.workflows.bisection import BisectError, RunOptions, Step, Verdict, bisect, render
from tests.fixtures import kernel_history

REPO = Path(__file__).parents[1]
KERNEL = "kernel.py"
DECODE_DCP4 = RunOptions(scenarios=("decode-single-dcp4",), dcp="4", device="cpu")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, dict[int, str]]:
    """The throwaway repository and the commit of each kernel revision."""
    repo = tmp_path_factory.mktemp("kernel-repo")
    commits = kernel_history.build_repo(repo, KERNEL)
    return repo, commits


def test_bisect_names_the_flawed_commit_in_few_runs(history):
    repo, commits = history
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    flawed = commits[kernel_history.FLAWED_FROM]
    assert result.revisions == kernel_history.REVISIONS  # NOTES.md commits are not walked
    assert result.first_bad is not None
    assert result.first_bad.sha == flawed
    assert result.first_bad.subject == "skip KV outputs for tokens without a local slot"
    assert result.failing_check.startswith(
        "decode-single-dcp4[dcp4] outputs: kv_out on rank 0, first bad token 0 (foreign)"
    )
    assert result.runs <= math.log2(result.revisions) + 2
    skips = [s for s in result.steps if s.verdict is Verdict.SKIP]
    assert any(s.ran for s in skips), "an unloadable revision (exit 125) was run and skipped"
    assert all("dcpcheck_fixture_missing_module" in s.detail for s in skips if s.ran)
    lines = render(result)
    assert f"first bad commit: {flawed} {result.first_bad.subject}" in lines
    assert lines[-1] == f"{result.runs} dcpcheck run(s) for {result.revisions} revision(s)"


def test_git_bisect_run_with_dcpcheck_finds_the_same_commit(history):
    repo, commits = history
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    git(repo, "bisect", "start", "HEAD", commits[0], "--", KERNEL)
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "bisect", "run", sys.executable, "-m", "dcpcheck", "run",
             "--no-tokens", "--kernel", f"{KERNEL}:fused", "--scenario", "decode-single-dcp4",
             "--dcp", "4", "--device", "cpu", "-x"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
    finally:
        git(repo, "bisect", "reset")
    found = re.search(r"^([0-9a-f]{40}) is the first bad commit", done.stdout, re.MULTILINE)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    assert found.group(1) == commits[kernel_history.FLAWED_FROM]


@pytest.fixture
def verdicts(monkeypatch, history):
    """Replace the dcpcheck runs with a table: revision number -> verdict."""
    _, commits = history
    number_of = {sha: number for number, sha in commits.items()}
    table: dict[int, Verdict] = {}

    def fake_check(repo, path, commit, function, options, workdir):
        verdict = table[number_of[commit.sha]]
        return Step(commit, verdict, f"fake {verdict.value}", ran=True)

    monkeypatch.setattr(bisection, "check_revision", fake_check)
    return table


def _table(first_bad: int, skipped: set[int]) -> dict[int, Verdict]:
    return {
        n: Verdict.SKIP if n in skipped else Verdict.BAD if n >= first_bad else Verdict.GOOD
        for n in range(kernel_history.REVISIONS + 1)
    }


def test_a_skipped_midpoint_is_replaced_by_a_neighbour(history, verdicts):
    repo, commits = history
    verdicts.update(_table(first_bad=5, skipped={8, 7, 9}))
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.first_bad.sha == commits[5]
    assert result.failing_check == "fake bad"
    tested = [s.commit.sha for s in result.steps]
    assert tested[:2] == [commits[8], commits[7]]  # midpoint skipped, then its neighbour


def test_skips_next_to_the_first_bad_commit_leave_it_undecided(history, verdicts):
    repo, commits = history
    verdicts.update(_table(first_bad=5, skipped={4}))
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.first_bad is None
    assert [c.sha for c in result.undecided] == [commits[4], commits[5]]
    assert "skipped revisions hide the first bad commit; it is one of:" in render(result)


def test_the_newest_revision_is_run_to_name_its_failing_check(history, verdicts):
    repo, commits = history
    verdicts.update(_table(first_bad=kernel_history.REVISIONS, skipped=set()))
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.first_bad.sha == commits[kernel_history.REVISIONS]
    assert result.steps[-1].commit.sha == commits[kernel_history.REVISIONS]


def test_a_bad_revision_that_passes_is_an_error(history, verdicts):
    repo, commits = history
    verdicts.update(_table(first_bad=kernel_history.REVISIONS + 1, skipped=set()))
    with pytest.raises(BisectError, match="passes"):
        bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ("no-such-revision", "HEAD", "no-such-revision: not a commit"),
        ("HEAD", "HEAD", "did not change"),
    ],
)
def test_bisect_refuses_ranges_it_cannot_walk(history, good, bad, message):
    repo, _ = history
    with pytest.raises(BisectError, match=message):
        bisect(repo, KERNEL, good, bad, "fused", DECODE_DCP4)
