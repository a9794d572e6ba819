"""``dcpcheck.workflows.bisection`` on a throwaway repository whose kernel file picks up the
PR-54908 flaw at a known commit (tests/fixtures/kernel_history.py), and ``git bisect run`` with
``dcpcheck run`` on the same history: both must name that commit.

Each revision costs one ``python -m dcpcheck run`` subprocess (~2 s: a tiny scenario and
an oracle-based kernel, no Triton interpreter), so the runs are counted and bounded.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dcpcheck.workflows import bisection
from dcpcheck.workflows.bisection import BisectError, RunOptions, Step, Verdict, bisect, render
from tests.conftest import registry_problem
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
    assert tested[:2] == [commits[kernel_history.REVISIONS], commits[0]]  # the ends, first
    assert tested[2:4] == [commits[8], commits[7]]  # midpoint skipped, then its neighbour


def test_skips_next_to_the_first_bad_commit_leave_it_undecided(history, verdicts):
    repo, commits = history
    verdicts.update(_table(first_bad=5, skipped={4}))
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.first_bad is None
    assert [c.sha for c in result.undecided] == [commits[4], commits[5]]
    assert "skipped revisions hide the first bad commit; it is one of:" in render(result)


def test_the_newest_revision_is_run_first_then_the_old_end(history, verdicts):
    repo, commits = history
    verdicts.update(_table(first_bad=kernel_history.REVISIONS, skipped=set()))
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.first_bad.sha == commits[kernel_history.REVISIONS]
    newest, old_end = result.steps[:2]
    assert newest.commit.sha == commits[kernel_history.REVISIONS]
    assert (old_end.commit.sha, old_end.verdict, old_end.ran) == (commits[0], Verdict.GOOD, True)
    assert not any(line.startswith("assumed") for line in render(result))


@pytest.mark.parametrize(
    ("first_bad", "both"),
    [(kernel_history.REVISIONS + 1, "good"), (0, "bad")],
    ids=["bad-end-passes", "good-end-fails"],
)
def test_ends_alike_are_both_run_and_said_not_to_differ(history, verdicts, first_bad, both):
    """``--good`` is judged, never assumed: where it fails as ``--bad`` does (or ``--bad``
    passes as ``--good`` does), no commit is named."""
    repo, commits = history
    verdicts.update(_table(first_bad=first_bad, skipped=set()))
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.first_bad is None and result.nothing_to_find
    assert [s.commit.sha for s in result.steps] == [commits[kernel_history.REVISIONS], commits[0]]
    lines = render(result)
    said = f"the endpoints do not differ ({commits[0]} is {both}, HEAD is {both}): nothing to find"
    assert said in lines
    assert sum(line.startswith("  ") for line in lines) == 2  # both step lines shown
    assert not any(line.startswith("assumed") for line in lines)


def test_endpoints_the_other_way_round_are_named(history, verdicts):
    repo, commits = history
    verdicts.update({n: Verdict.BAD if n == 0 else Verdict.GOOD for n in commits})
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.nothing_to_find
    assert any("differ the other way round" in line for line in render(result))


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


def test_an_old_end_that_cannot_be_judged_is_said_so(history, verdicts):
    repo, commits = history
    verdicts.update({n: Verdict.SKIP if n == 0 else Verdict.GOOD for n in commits})
    result = bisect(repo, KERNEL, commits[0], "HEAD", "fused", DECODE_DCP4)
    assert result.nothing_to_find
    said = "could not be judged (fake skip): nothing to find"
    assert any(said in line for line in render(result))


# -- bisecting releases: the list is checked before any run ----------------------------

PUBLISHED = ["0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]


@pytest.fixture
def release_verdicts(monkeypatch, tmp_path):
    """Release runs replaced by a table (version -> verdict), an empty release cache, and
    a package index that publishes PUBLISHED (``None`` in the list: it cannot be asked)."""
    monkeypatch.setenv("DCPCHECK_CACHE", str(tmp_path / "cache"))
    index: list[list[str] | None] = [PUBLISHED]
    monkeypatch.setattr(bisection.releases, "published_versions", lambda: index[0])
    table: dict[str, Verdict] = {}

    def fake_check(version, function, options, workdir):
        return Step(bisection.Commit(version, f"vllm {version}"), table[version], "fake", True)

    monkeypatch.setattr(bisection, "check_release", fake_check)
    return table, index


def _bisect_releases(text: str, find: str = "first-fixed"):
    versions = text.split(",")
    return bisection.bisect_releases(
        versions, bisection.Find(find), "fused_norm_rope", RunOptions()
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.33.0,0.28.0,0.31.0,0.29.0", "not oldest first (0.33.0 before 0.28.0); sorted: "
         "0.28.0,0.29.0,0.31.0,0.33.0"),
        ("0.28.0,0.3O.0,0.33.0", "'0.3O.0' is not a version"),
        ("0.28.0,0.30,0.30.0,0.33.0", "0.30.0 given more than once"),
        ("0.28.0,0.31.5,0.33.0", "vllm==0.31.5: no such release on the package index "
         "(nearest published: 0.31.0, 0.32.0)"),
        ("0.33.0", "needs at least two versions"),
    ],
)  # fmt: skip
def test_a_release_list_is_checked_before_any_run(release_verdicts, text, message):
    with pytest.raises(BisectError) as raised:
        _bisect_releases(text)  # the empty table: any run would raise KeyError
    assert message in str(raised.value)


def test_an_uncached_release_with_no_index_to_ask_is_refused(release_verdicts):
    _, index = release_verdicts
    index[0] = None
    with pytest.raises(BisectError, match=r"0\.28\.0, 0\.33\.0 not in dcpcheck's cache"):
        _bisect_releases("0.28.0,0.33.0")


def test_first_fixed_names_the_release_after_running_both_ends(release_verdicts):
    table, _ = release_verdicts
    table.update({v: Verdict.BAD for v in ("0.28.0", "0.29.0")})
    table.update({v: Verdict.GOOD for v in ("0.30.0", "0.31.0")})
    result = _bisect_releases("0.28.0,0.29.0,0.30.0,0.31.0")
    assert result.first_bad.sha == "0.30.0"
    assert [s.commit.sha for s in result.steps[:2]] == ["0.31.0", "0.28.0"]  # the newest first
    assert "first fixed release: 0.30.0 vllm 0.30.0" in render(result)


@pytest.mark.parametrize(
    ("find", "verdicts", "ends"),
    [
        ("first-bad", "bad,bad,bad", "0.27.0 is bad, 0.29.0 is bad"),
        ("first-fixed", "good,good,good", "0.27.0 is good, 0.29.0 is good"),
    ],
)
def test_an_oldest_release_with_the_verdict_looked_for_names_none(
    release_verdicts, find, verdicts, ends
):
    """``bisect --releases 0.27.0,0.28.0,0.29.0 --dcp 4`` named 0.28.0 first bad while
    0.27.0 fails too, and ``--dcp 1 --find first-fixed`` named a release though the oldest
    passes: the oldest is run, and the CLI exits 1 with both verdicts."""
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    table, _ = release_verdicts
    versions = ["0.27.0", "0.28.0", "0.29.0"]
    table.update(zip(versions, map(Verdict, verdicts.split(",")), strict=True))
    done = CliRunner().invoke(cli, ["bisect", "--releases", ",".join(versions), "--find", find])
    assert done.exit_code == 1, done.output
    assert f"the endpoints do not differ ({ends}): nothing to find" in done.output
    assert "release:" not in done.output and "assumed" not in done.output


@pytest.mark.parametrize("find", list(bisection.Find))
def test_a_release_named_was_run_and_so_was_the_one_before_it(release_verdicts, find):
    """Over every verdict of four releases: both ends are run, and a release named has the
    verdict looked for and the release before it, run too, the other one."""
    table, _ = release_verdicts
    versions = PUBLISHED[:4]
    new = Verdict.BAD if find is bisection.Find.FIRST_BAD else Verdict.GOOD
    old = Verdict.GOOD if new is Verdict.BAD else Verdict.BAD
    for verdicts in itertools.product(list(Verdict), repeat=len(versions)):
        table.clear()
        table.update(zip(versions, verdicts, strict=True))
        result = _bisect_releases(",".join(versions), find.value)
        seen = {step.commit.sha: step.verdict for step in result.steps if step.ran}
        assert seen.get(versions[0]) == verdicts[0], verdicts  # both ends, run
        assert seen.get(versions[-1]) == verdicts[-1], verdicts
        if result.first_bad is None:
            continue
        named = versions.index(result.first_bad.sha)
        assert seen[versions[named]] is new, verdicts
        assert seen.get(versions[named - 1]) is old, verdicts


def test_endpoints_with_the_same_verdict_run_only_the_endpoints_and_say_so(release_verdicts):
    table, _ = release_verdicts
    table.update(dict.fromkeys(PUBLISHED[1:], Verdict.GOOD))
    result = _bisect_releases("0.28.0,0.29.0,0.30.0,0.31.0,0.32.0,0.33.0", find="first-bad")
    assert [s.commit.sha for s in result.steps] == ["0.33.0", "0.28.0"]
    lines = render(result)
    assert "the endpoints do not differ (0.28.0 is good, 0.33.0 is good): nothing to find" in lines
    assert sum(line.startswith("  ") for line in lines) == 2


def test_the_cli_prints_the_steps_and_exits_1_when_nothing_is_found(release_verdicts):
    from click.testing import CliRunner

    from dcpcheck.cli import cli

    table, _ = release_verdicts
    table.update({"0.28.0": Verdict.BAD, "0.33.0": Verdict.BAD})
    done = CliRunner().invoke(
        cli, ["bisect", "--releases", "0.28.0,0.33.0", "--find", "first-fixed"]
    )
    assert done.exit_code == 1, done.output
    assert "0.33.0 bad  vllm 0.33.0: fake" in done.output
    assert "0.28.0 bad  vllm 0.28.0: fake" in done.output
    assert "the endpoints do not differ (0.28.0 is bad, 0.33.0 is bad)" in done.output


def test_a_real_oldest_release_that_fails_too_is_run_and_names_none(tmp_path):
    """0.27.0 and 0.28.0 both fail decode-single-dcp4 at DCP4 (0.27.0's kernel skips every
    output of a foreign row, as 0.28.0's does): ``bisect`` runs both, names no release and
    exits 1."""
    for version in ("0.27.0", "0.28.0"):
        try:
            bisection.releases.fetch(version)
        except bisection.releases.ReleaseError as exc:
            problem = registry_problem()
            if problem is None:
                raise
            pytest.skip(f"vllm=={version} is not cached ({exc}) and the registry: {problem}")
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", "bisect", "--releases", "0.27.0,0.28.0",
         "--scenario", "decode-single-dcp4", "--dcp", "4", "--device", "cpu"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "  0.27.0 bad  vllm 0.27.0: decode-single-dcp4[dcp4] outputs:" in done.stdout
    assert "the endpoints do not differ (0.27.0 is bad, 0.28.0 is bad): nothing to find" in (
        done.stdout
    )
    assert "first bad release:" not in done.stdout


def test_steps_get_absolute_paths_in_their_environment(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DCPCHECK_CACHE", "cache")
    monkeypatch.setenv("DCPCHECK_HOME", "home")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["src", "/abs"]))
    env = bisection.step_environment()
    assert env["DCPCHECK_CACHE"] == str(tmp_path / "cache")
    assert env["DCPCHECK_HOME"] == str(tmp_path / "home")
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(bisection.DCPCHECK_ROOT),
        str(tmp_path / "src"),
        "/abs",
    ]


@pytest.mark.parametrize(
    ("status", "said"),
    [("crash", "kernel crashed"), ("timeout", "timed out"), ("error", "kernel raised")],
)
def test_a_step_whose_case_never_ran_its_checks_says_how_it_ended(tmp_path, status, said):
    """A revision judged bad because its kernel crashed, hung or raised says so, with the
    case's error, never "a check failed"."""
    report = tmp_path / "r.json"
    case = {"scenario": "s", "dcp": 4, "status": status, "error": "rank 2: died", "checks": []}
    report.write_text(json.dumps({"cases": [case]}), encoding="utf-8")
    assert bisection._failing_check(report) == f"s[dcp4]: {said}: rank 2: died"
