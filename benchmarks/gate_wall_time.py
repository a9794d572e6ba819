"""How long dcpcheck takes as a gate: whole commands, timed from the outside.

* ``dcpcheck run --dcp 4`` over the shipped scenarios, with a cold Triton cache (a fresh
  ``TRITON_CACHE_DIR``) and then warm (the same directory again);
* the property search at DCP4 (``--property-only --stats``): examples per second, first
  with the Triton cache the run left (the search's own kernel variants compile then) and
  again warm;
* ``dcpcheck bisect`` over the kernel history of the bisect tests (16 revisions);
* a command's start, the floor under every command: ``run --dcp 4`` of a scenario name
  that names none, which loads Python, torch and the run command and exits 2 before any
  case; the best of ``START_RUNS`` runs, wall and CPU (user + sys) seconds.

    python3 benchmarks/gate_wall_time.py [--examples N] [--only run|property|bisect|start]
        [--tree DIR]

``--tree`` times another checkout (e.g. ``git worktree add OLD <rev>``) with this script,
so two trees are measured the same way (``side_by_side.sh``). After each command it prints
how many kernel binaries the Triton cache holds (``*.cubin``; none under the interpreter).

Runs on the CPU (Triton's interpreter) or a GPU, whichever ``--device auto`` picks.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures import kernel_history  # noqa: E402

KERNEL_FILE = "kernels.py"


def timed(args: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, str, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", *args],
        cwd=cwd or env["PYTHONPATH"],
        env=env,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - start, done.stdout, done.returncode


def binaries(env: dict[str, str]) -> str:
    """How many compiled kernel binaries the run's Triton cache holds."""
    return f"{len(list(Path(env['TRITON_CACHE_DIR']).rglob('*.cubin')))} binaries cached"


def run_times(env: dict[str, str]) -> None:
    for label in ("cold", "warm"):
        seconds, output, code = timed(["run", "--dcp", "4"], env)
        summary = output.strip().splitlines()[-1]
        print(
            f"run --dcp 4 ({label} Triton cache): {seconds:.1f} s, exit {code}: {summary} "
            f"({binaries(env)})"
        )


def property_rate(examples: int, profile: str, env: dict[str, str]) -> None:
    command = [
        "run",
        "--dcp",
        "4",
        "--property-only",
        "--examples",
        str(examples),
        "--profile",
        profile,
        "--stats",
    ]
    for label in ("first", "again, warm"):
        seconds, output, code = timed(command, env)
        rate = re.search(r"stats: property: .*", output)
        print(
            f"property --dcp 4 --examples {examples} --profile {profile} ({label}): "
            f"{seconds:.1f} s wall, exit {code}: {rate.group(0) if rate else output[-300:]} "
            f"({binaries(env)})"
        )


def bisect_time(scratch: Path, env: dict[str, str]) -> None:
    repo = scratch / "history"
    repo.mkdir()
    commits = kernel_history.build_repo(repo, KERNEL_FILE)
    command = [
        "bisect",
        f"{KERNEL_FILE}:fused",
        "--repo",
        str(repo),
        "--good",
        commits[0],
        "--scenario",
        "decode-single-dcp4",
        "--dcp",
        "4",
    ]
    seconds, output, code = timed(command, env)
    verdict = [
        line for line in output.splitlines() if "first bad commit" in line or "run(s) for" in line
    ]
    expected = commits[kernel_history.FLAWED_FROM]
    print(
        f"bisect over {kernel_history.REVISIONS} revisions: {seconds:.1f} s, exit {code}; "
        f"{'; '.join(verdict)} (expected {expected[:12]})"
    )


START_RUNS = 9
"""Runs of the start (module docstring); the best is the figure, the machine's noise the
rest."""


def start_time(env: dict[str, str]) -> None:
    walls, cpus = [], []
    for _ in range(START_RUNS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds, _, code = timed(["run", "--dcp", "4", "--scenario", "no-such-scenario"], env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(seconds)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    print(
        f"start (run --dcp 4 --scenario no-such-scenario, exit {code}), best of {START_RUNS}: "
        f"{min(walls):.2f} s wall, {min(cpus):.2f} s CPU; median {statistics.median(walls):.2f} "
        "s wall"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--profile", default="ci", help="property search profile")
    parser.add_argument(
        "--only",
        choices=["run", "property", "bisect", "start"],
        action="append",
        help="measure only these (repeatable; default: all)",
    )
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout to time")
    args = parser.parse_args()
    wanted = set(args.only or ("run", "property", "bisect", "start"))
    with tempfile.TemporaryDirectory() as scratch:
        env = {
            **os.environ,
            "TRITON_CACHE_DIR": str(Path(scratch) / "triton"),
            "DCPCHECK_HOME": str(Path(scratch) / "home"),
            "PYTHONPATH": str(args.tree.resolve()),
        }
        if "run" in wanted:
            run_times(env)
        if "property" in wanted:
            property_rate(args.examples, args.profile, env)
        if "bisect" in wanted:
            bisect_time(Path(scratch), env)
        if "start" in wanted:
            start_time(env)


if __name__ == "__main__":
    main()
