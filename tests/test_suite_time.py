"""``benchmarks/suite_time.py`` reads pytest's ``--durations`` lines into seconds per test
file, and names the files whose seconds moved most between two runs."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

DURATIONS = """\
============================== slowest durations ===============================
19.92s call     tests/test_readme.py::test_every_command_runs_as_written[dcpcheck run --dcp 4]
2.50s setup    tests/test_run_cli.py::test_token_streams_catch_the_regression
1.25s call     tests/test_readme.py::test_the_tour_has_commands
0.75s teardown tests/test_run_cli.py::test_token_streams_catch_the_regression
0.01s call     tests/test_bad_input.py::test_x[a::b]
(1912 durations < 0.005s hidden.  Use -vv to show these durations.)
============ 2814 passed, 55 skipped, 32 warnings in 637.23s (0:10:37) ============
"""


@pytest.fixture
def suite_time(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import suite_time

    return suite_time


def test_durations_are_summed_per_file_over_setup_call_and_teardown(suite_time):
    assert suite_time.worker_seconds_by_file(DURATIONS) == pytest.approx(
        {
            "tests/test_readme.py": 21.17,
            "tests/test_run_cli.py": 3.25,
            "tests/test_bad_input.py": 0.01,
        }
    )
    assert suite_time.SUMMARY.search(DURATIONS).group(1) == "2814 passed, 55 skipped, 32 warnings"


def test_the_files_that_moved_most_come_first(suite_time):
    def run(by_file):
        return suite_time.SuiteRun(Path("t"), 1.0, "", 0, by_file)

    before = run({"a.py": 10.0, "b.py": 5.0, "c.py": 1.0})
    after = run({"a.py": 9.0, "b.py": 1.0, "d.py": 2.0})
    assert suite_time.moved(before, after, 3) == [
        ("b.py", 5.0, 1.0), ("d.py", 0.0, 2.0), ("a.py", 10.0, 9.0)
    ]  # fmt: skip


def test_keep_writes_each_runs_whole_output(suite_time, tmp_path, monkeypatch):
    import subprocess

    def pytest_run(command, **kwargs):
        assert kwargs["cwd"] == tmp_path and "--durations=0" in command
        return subprocess.CompletedProcess(command, 0, DURATIONS, "a warning\n")

    monkeypatch.setattr(suite_time.subprocess, "run", pytest_run)
    log = tmp_path / "1-tree.log"
    run = suite_time.run_suite(tmp_path, 2, log)
    assert log.read_text() == DURATIONS + "a warning\n"
    assert run.summary == "2814 passed, 55 skipped, 32 warnings" and run.exit_code == 0
