"""How long the test suite takes, tree beside tree: the README's test command's pytest run
(``python -m pytest -q -n WORKERS -p no:cacheprovider``, with ``--durations=0``) in each
checkout named, one after the other, and what each run's durations say.

    python3 benchmarks/suite_time.py --tree OLD [--tree NEW ...] [--workers 2] [--files 12]
                                     [--keep DIR]

Per tree: the wall time, pytest's summary line and the worker-seconds its durations sum
to (setup, call and teardown of every test; pytest leaves out those under 5 ms). Then the
files whose worker-seconds moved the most between the first tree and each other, so a
change that slows or speeds the suite shows where. ``--keep DIR`` writes each run's whole
pytest output there (``1-<tree>.log`` ...), its durations test by test. Run on an
otherwise idle machine: two runs of one tree differ by several percent here (2 cores).

A tree is any checkout or ``git archive`` copy; it is run with ``PYTHONPATH`` set to it and
from inside it, as ``.ci/run`` runs a clean clone. The release cache is whatever
``DCPCHECK_CACHE`` says (the release tests skip a release it lacks only without a network).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

DURATION = re.compile(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S+?)::", re.MULTILINE)
SUMMARY = re.compile(r"^=*\s*(\d+ passed.*?) in [0-9.]+s", re.MULTILINE)


@dataclass(frozen=True)
class SuiteRun:
    tree: Path
    wall_s: float
    summary: str
    exit_code: int
    by_file: dict[str, float]

    @property
    def worker_seconds(self) -> float:
        return sum(self.by_file.values())


def worker_seconds_by_file(output: str) -> dict[str, float]:
    """The seconds pytest's ``--durations`` lines give each test file, summed."""
    totals: dict[str, float] = defaultdict(float)
    for seconds, path in DURATION.findall(output):
        totals[path] += float(seconds)
    return dict(totals)


def run_suite(tree: Path, workers: int, keep: Path | None = None) -> SuiteRun:
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run(
        [*command, "--durations=0"], cwd=tree, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if keep is not None:
        keep.write_text(done.stdout + done.stderr)
    summary = SUMMARY.search(done.stdout)
    return SuiteRun(
        tree,
        wall,
        summary.group(1) if summary else f"no summary line (exit {done.returncode})",
        done.returncode,
        worker_seconds_by_file(done.stdout),
    )


def moved(first: SuiteRun, other: SuiteRun, files: int) -> list[tuple[str, float, float]]:
    """The ``files`` files whose worker-seconds differ most between the two runs (a tie by
    name)."""
    names = first.by_file.keys() | other.by_file.keys()
    rows = [(n, first.by_file.get(n, 0.0), other.by_file.get(n, 0.0)) for n in names]
    return sorted(rows, key=lambda row: (-abs(row[2] - row[1]), row[0]))[:files]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--keep", type=Path, help="folder for each run's pytest output")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    runs = []
    for number, tree in enumerate(args.tree, start=1):
        log = None if args.keep is None else args.keep / f"{number}-{tree.resolve().name}.log"
        run = run_suite(tree.resolve(), args.workers, log)
        runs.append(run)
        print(
            f"{run.tree}: {run.wall_s:.1f} s wall, {run.summary}, "
            f"{run.worker_seconds:,.0f} worker-seconds, exit {run.exit_code}",
            flush=True,
        )
    for other in runs[1:]:
        print(f"\nworker-seconds by file, {runs[0].tree} -> {other.tree}:")
        for name, before, after in moved(runs[0], other, args.files):
            print(f"  {before:7.1f} {after:7.1f} {after - before:+7.1f}  {name}")
    return max(run.exit_code for run in runs)


if __name__ == "__main__":
    sys.exit(main())
