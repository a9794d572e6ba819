"""Every replay command dcpcheck prints runs as printed, from where the user stands.

Each test runs the installed ``dcpcheck`` console script in a fresh process from a scratch
working directory, takes the command it printed, runs that through a shell from the same
place, and checks its exit code: 1 where the printed case failed. The pytest plugin's
replay is run the same way in ``tests/test_replay_from_working_directory.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dcpcheck.exit_codes import EXIT_FAIL
from dcpcheck.ops.fused_norm_rope.scenario import SCENARIOS
from dcpcheck.workflows.bisection import bisect, render
from tests.fixtures import kernel_history
from tests.test_bisect import DECODE_DCP4, KERNEL

DCPCHECK = Path(sys.executable).with_name("dcpcheck")

pytestmark = pytest.mark.skipif(
    not DCPCHECK.is_file(), reason=f"the dcpcheck console script is not installed ({DCPCHECK})"
)

REPO = Path(__file__).resolve().parents[1]

BROKEN = ("--kernel", "regress/pre-54908", "--no-tokens")


def environment(home: Path) -> dict[str, str]:
    """The console script first on PATH, failures saved under ``home``."""
    env = dict(os.environ, DCPCHECK_HOME=str(home))
    env["PATH"] = f"{DCPCHECK.parent}{os.pathsep}{env['PATH']}"
    return env


def dcpcheck(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DCPCHECK), *args],
        cwd=cwd,
        env=environment(cwd / "home"),
        capture_output=True,
        text=True,
    )


def printed(output: str, prefix: str = "replay: ") -> list[str]:
    """The commands printed after ``prefix`` (rich may wrap nothing: soft_wrap lines)."""
    return [
        line.strip()[len(prefix) :]
        for line in output.splitlines()
        if line.strip().startswith(prefix)
    ]


def run_as_printed(command: str, cwd: Path, **env: str) -> int:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**environment(cwd / "home"), **env},
        capture_output=True,
    )
    return done.returncode


def test_a_named_scenarios_replay_fails_again(tmp_path):
    done = dcpcheck(tmp_path, "run", *BROKEN, "--scenario", "decode-single-dcp4", "--dcp", "4",
                    "--seed", "7")  # fmt: skip
    assert done.returncode == EXIT_FAIL, done.stderr
    [command] = printed(done.stdout)
    assert command.startswith("dcpcheck run --scenario decode-single-dcp4 --dcp 4 ")
    assert "--seed 7" in command
    assert run_as_printed(command, tmp_path) == EXIT_FAIL


def test_a_scenario_files_replay_fails_again(tmp_path):
    """A scenario from the user's own directory replays by its file, with seed and size."""
    own = tmp_path / "my scenarios"  # a space: the printed path must be quoted
    own.mkdir()
    shutil.copy(SCENARIOS / "decode-single-dcp4.toml", own)
    done = dcpcheck(tmp_path, "run", *BROKEN, "--scenario-dir", "my scenarios", "--dcp", "2",
                    "--seed", "3")  # fmt: skip
    assert done.returncode == EXIT_FAIL, done.stderr
    [command] = printed(done.stdout)
    assert command.startswith("dcpcheck repro 'my scenarios/decode-single-dcp4.toml' --dcp 2")
    assert run_as_printed(command, tmp_path) == EXIT_FAIL


def test_the_property_searchs_replay_fails_again(tmp_path):
    done = dcpcheck(tmp_path, "run", "--kernel", "regress/pre-54908", "--property-only",
                    "--profile", "smoke", "--dcp", "2", "--home", "home")  # fmt: skip
    assert done.returncode == EXIT_FAIL, done.stderr
    commands = printed(done.stdout)
    assert commands and commands[0].startswith("dcpcheck repro home/failures/shrunk-")
    for command in dict.fromkeys(commands):  # the search's own, then its replay's cases
        assert run_as_printed(command, tmp_path) == EXIT_FAIL, command


def test_a_bisections_replay_fails_again(tmp_path):
    repo = tmp_path / "kernel-repo"
    repo.mkdir()
    commits = kernel_history.build_repo(repo, KERNEL)
    # The last good revision and the flawed one: the replay a bisection prints is the same
    # at any length (tests/test_bisect.py walks the whole history), at a run's cost here.
    flawed = kernel_history.FLAWED_FROM
    result = bisect(repo, KERNEL, commits[flawed - 1], commits[flawed], "fused", DECODE_DCP4)
    assert result.first_bad is not None and result.first_bad.sha == commits[flawed]
    [line] = [line for line in render(result) if line.startswith("replay (exit 1): ")]
    command = line.removeprefix("replay (exit 1): ")
    assert command == result.replay
    work = tmp_path / "elsewhere"
    work.mkdir()
    # The fixture's kernel file imports this repository's tests package (as a real kernel
    # file imports its own project, which the user's environment provides).
    assert run_as_printed(command, work, PYTHONPATH=str(REPO)) == EXIT_FAIL
