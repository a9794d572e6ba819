"""What the release matrices share: running ``python -m dcpcheck``, reading one release's
verdict over an op's shipped scenarios from its JSON report, and judging the releases
several at a time.

Why several at a time: a row is a few ``dcpcheck`` processes, each spending most of its
seconds on one core (imports, Triton's compiler, the interpreter) and little on the GPU;
one release after another leaves a 16-core GPU box idle and took the runbook past ten
minutes. Rows are still printed in release order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_JOBS = max(1, (os.cpu_count() or 1) // 4)
"""Releases judged at once by one matrix: a quarter of the cores, since the runbook runs
its matrices side by side (``gpu_releases.sh``)."""


def add_jobs_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="releases judged at once (module doc)"
    )


def print_rows(judge: Callable[[str], str], versions: Sequence[str], jobs: int) -> None:
    """``judge(version)`` of every version, ``jobs`` at a time on threads (each row runs
    its own processes), each row printed in ``versions``' order as soon as it and every
    row before it are done."""
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for row in pool.map(judge, versions):
            print(row, flush=True)


def dcpcheck(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dcpcheck", *args], capture_output=True, text=True)
    return done, time.perf_counter() - start


def _short(reason: str) -> str:
    """A skip reason's first clause, without the routine's name."""
    return reason.split(": ", 1)[0].split(" of this release ", 1)[-1]


def verdict(op: str, spec: str, out: Path) -> tuple[str, float]:
    """``spec`` over ``op``'s shipped scenarios at DCP 1, 2, 4, 8: passed / failed / not
    applicable cases, the findings, and why checks were skipped; and the wall time."""
    report = out / f"{spec.replace('==', '-').replace(':', '-')}.json"
    done, seconds = dcpcheck(
        "run", "--op", op, "--kernel", spec, "--dcp", "1,2,4,8",
        "--json", str(report), "--home", str(out / "home"),
    )  # fmt: skip
    if not report.is_file():
        said = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"not loaded (exit {done.returncode}): {said}", seconds
    cases = json.loads(report.read_text())["cases"]
    counts = [sum(c["status"] == s for c in cases) for s in ("pass", "fail", "not_applicable")]
    found: dict[str, dict[str, set]] = {}
    skipped: set[str] = set()
    for case in cases:
        if case["status"] == "not_applicable":
            skipped.update(_short(why) for why in case["error"].split("; "))
        for check in case["checks"]:
            if check["skipped"]:
                skipped.add(_short(check["skipped"]))
            for finding in check["findings"]:
                seen = found.setdefault(case["scenario"], {"dcp": set(), "what": set()})
                seen["dcp"].add(case["dcp"])
                seen["what"].add(f"{check['check']} {finding['field']} ({finding['ownership']})")
    failing = [
        f"{name} at DCP {','.join(map(str, sorted(seen['dcp'])))}: "
        + ", ".join(sorted(seen["what"]))
        for name, seen in sorted(found.items())
    ]
    errors = [
        f"{c['scenario']} at DCP {c['dcp']}: {(c['error'] or '').splitlines()[0][:80]}"
        for c in cases
        if c["status"] not in ("pass", "fail", "not_applicable")
    ]
    text = f"{counts[0]} / {counts[1]} / {counts[2]}"
    text += f"; ERROR {'; '.join(errors)}" if errors else ""
    text += f"; FAIL {'; '.join(failing)}" if failing else ""
    text += f"; skipped: {'; '.join(sorted(skipped))}" if skipped else ""
    return text, seconds


def property_verdict(searched: subprocess.CompletedProcess) -> str:
    """The ``property:`` line of a ``--property-only`` run, without its label."""
    return next(
        (line for line in searched.stdout.splitlines() if line.startswith("property:")),
        f"(no property line, exit {searched.returncode})",
    ).removeprefix("property: ")
