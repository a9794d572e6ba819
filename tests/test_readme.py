"""Every command in the README runs as written.

The ``$ dcpcheck ...`` lines of its console blocks run in order, each in a scratch
directory of its own but a ``repro`` line, which runs in its run's (that run saved the file
it replays), each expected to exit with the code its trailing ``# ... exit N`` comment
gives (0 when none). The two
set-up commands at the top are CI's own job: ``.ci/run`` must be exactly the test one.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from dcpcheck import gpu_fit
from dcpcheck.backend import current_backend
from tests.forked_commands import run_module

REPO = Path(__file__).parents[1]
README = (REPO / "README.md").read_text()
BACKEND = current_backend()

PROMPT = re.compile(r"^\$ (dcpcheck .*?)\s*(?:#.*?exit (\d+))?\s*$", re.MULTILINE)
COMMANDS = [(command, int(code or 0)) for command, code in PROMPT.findall(README)]


def test_the_readme_opens_with_the_run_and_test_commands_and_ci_runs_the_test_one():
    fenced = re.search(r"```bash\n(.*?)```", README, re.DOTALL).group(1)
    run, test = [line for line in fenced.splitlines() if line and not line.startswith("#")]
    assert run.endswith("dcpcheck run --dcp 4")
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == test


def test_the_tour_has_commands():
    assert len(COMMANDS) >= 6


def _sessions(commands: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """The commands in runs that share a directory: a ``repro`` of a saved failure joins
    the run before it, which saved the file; every other command starts a run of its own."""
    sessions: list[list[tuple[str, int]]] = []
    for command, code in commands:
        if command.startswith("dcpcheck repro .dcpcheck/") and sessions:
            sessions[-1].append((command, code))
        else:
            sessions.append([(command, code)])
    return sessions


SESSIONS = _sessions(COMMANDS)


def test_a_repro_of_a_saved_failure_runs_after_the_command_that_saved_it():
    assert [
        len(s) for s in _sessions([("dcpcheck run", 1), ("dcpcheck repro .dcpcheck/f", 1)])
    ] == [2]
    assert sum(map(len, SESSIONS)) == len(COMMANDS)


GATE = "dcpcheck run --dcp 4"


@pytest.mark.parametrize("session", SESSIONS, ids=lambda s: s[0][0][:60])
def test_every_command_runs_as_written(session, tmp_path):
    """In order, in a directory of their own (``_sessions``), which sees the checkout's
    ``scenarios/`` as a user at the checkout's root does; each ``python -m dcpcheck ...``
    (forked: ``tests.forked_commands``). Every launch the plain gate makes
    is in the list a GPU run of it compiles ahead (``gpu_fit.GATE_LAUNCHES``, which holds
    its token streams' launches at a GPU's widths too)."""
    (tmp_path / "scenarios").symlink_to(REPO / "scenarios")
    env = {k: v for k, v in os.environ.items() if k != "DCPCHECK_HOME"}
    env["PYTHONPATH"] = str(REPO)
    gate = [command for command, _ in session] == [GATE]
    if gate and BACKEND.interpreted:  # launches are recorded under the interpreter
        env[gpu_fit.RECORD_ENV] = str(tmp_path / "launches")
        (tmp_path / "launches").mkdir()
    for command, code in session:
        module, *args = shlex.split(command)
        done = run_module(module, args, cwd=tmp_path, env=env, timeout=600)
        said = f"$ {command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert done.returncode == code, said
        assert "Traceback" not in done.stderr, said
    if gate and BACKEND.interpreted:
        launched = {gpu_fit.json_key(c) for c in gpu_fit.recorded(tmp_path / "launches")}
        listed = {gpu_fit.json_key(c) for c in gpu_fit.read_manifest(gpu_fit.GATE_LAUNCHES)}
        assert launched <= listed, (
            f"{len(launched - listed)} of the gate's launches are not in "
            f"{gpu_fit.GATE_LAUNCHES.name}: {gpu_fit.RECORD_COMMAND}"
        )
        for record in (tmp_path / "launches").iterdir():  # for the session's unlisted check
            shutil.copy(record, Path(os.environ[gpu_fit.RECORD_ENV]) / record.name)
