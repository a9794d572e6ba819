"""What the release matrices share: one process per release row, ``dcpcheck`` commands run
inside it, and reading one release's verdict over an op's shipped scenarios from its JSON
report.

Why a process per row, and commands inside it: a command's own process spends seconds
importing torch and Triton, creating a CUDA context and hashing Triton's cache key before
it judges anything, and a row is several commands (an op's routines, its property search,
its shape). A row's commands share one process, so each release's files are loaded once
per matrix; rows still get a process each, so a release that crashes or hangs takes only
its own row. Each matrix script runs itself with ``--row VERSION`` for a row and prints the
lines that process prints, in release order.

How many rows run at once: ``--jobs`` per matrix, and, when ``$MATRIX_SLOTS`` is set, at
most that many row processes across every matrix that shares the variable (a lock file
per slot in the temporary folder), so the runbook's matrices side by side keep a 16-core
box busy without starving its other jobs (``gpu_releases.sh``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_JOBS = max(1, (os.cpu_count() or 1) // 2)
"""Rows one matrix judges at once when ``$MATRIX_SLOTS`` does not bound them all."""

SLOTS_VARIABLE = "MATRIX_SLOTS"
"""Row processes allowed at once across the matrices that share it (module docstring)."""

ROW_VARIABLE = "MATRIX_ROW"
"""Set in a row process, which judges its row and starts no rows of its own."""

LOST_ROWS: list[str] = []
"""The versions whose row process ended without its row, in this matrix process: the
matrix prints a line for each and exits 1 (:func:`end`), so a runbook never reads a table
with a lost row as a finished one."""

SLOT_POLL_S = 0.2
"""How often a row waiting for a slot tries the slots again."""

COST_PREFIX = "row cost:"
"""Starts the stderr line in which a row process states its CPU seconds; the matrix prints
them with the row's wall time to its own stderr, so a runbook side by side shows which
rows wait (wall over CPU). What each process holds of the GPU is the runbook's monitor's
to say: a row's cases may run in worker processes of their own."""


def add_row_options(parser: argparse.ArgumentParser) -> None:
    """``--jobs`` and ``--row`` (module docstring)."""
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="rows judged at once (module doc)"
    )
    parser.add_argument(
        "--row", metavar="VERSION", help="judge VERSION's row in this process and print it"
    )


def start(
    doc: str,
    out: str,
    releases: Sequence[str],
    row: Callable[[argparse.Namespace], Sequence[str]],
    **options: int | str,
) -> argparse.Namespace:
    """A release matrix's arguments: ``--out`` (default ``out``), each of ``options``
    (``--NAME``, its type its default's), the versions (default ``releases``) and the row
    options; its ``--out`` folder made. In a row process (``--row``), the lines ``row(args)``
    makes are printed and the process leaves."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(out))
    for name, default in options.items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    parser.add_argument("versions", nargs="*", default=list(releases))
    add_row_options(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.row:
        finish_row(*row(args))
    return args


@contextlib.contextmanager
def _slot() -> Iterator[None]:
    """Hold one of ``$MATRIX_SLOTS`` slots (none when it is unset) while the block runs."""
    count = int(os.environ.get(SLOTS_VARIABLE) or 0)
    if count <= 0:
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"dcpcheck-matrix-slots-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    while True:
        for index in range(count):
            with open(folder / str(index), "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                yield  # the lock goes with the file's closing, or the process's end
                return
        time.sleep(SLOT_POLL_S)


def _row_process(version: str) -> list[str]:
    """This script's row of ``version`` from its own process (module docstring): the lines
    it printed, or one line saying how it ended without them."""
    # --row first: after a ``--`` it would be one of the script's passed-on arguments
    command = [sys.executable, sys.argv[0], "--row", version, *sys.argv[1:]]
    with _slot():
        env = {**os.environ, ROW_VARIABLE: version}
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
    costs = [line for line in done.stderr.splitlines() if line.startswith(COST_PREFIX)]
    cost = costs[-1].removeprefix(COST_PREFIX).strip() if costs else "no cost line"
    print(f"row {version}: {wall:.1f} s wall, {cost}", file=sys.stderr, flush=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return lines
    said = (done.stderr.strip().splitlines() or ["?"])[-1][-200:]
    LOST_ROWS.append(version)
    return [f"| {version} | row process exit {done.returncode}: {said} |"]


def rows(versions: Sequence[str], jobs: int) -> Iterator[list[str]]:
    """Each version's row lines, in ``versions``' order, each as soon as it and every row
    before it are done; ``jobs`` row processes at once."""
    if os.environ.get(ROW_VARIABLE):
        raise SystemExit(f"the row process of {os.environ[ROW_VARIABLE]} was not given --row")
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        yield from pool.map(_row_process, versions)


def print_rows(versions: Sequence[str], jobs: int) -> None:
    """:func:`rows` of a one-line-per-row table, printed as they come, then :func:`end`."""
    for lines in rows(versions, jobs):
        print("\n".join(lines), flush=True)
    end()


def end() -> None:
    """Leave 1 with the lost rows named on stderr when any row process ended without its
    row (:data:`LOST_ROWS`); return otherwise."""
    if LOST_ROWS:
        raise SystemExit(f"{len(LOST_ROWS)} row(s) lost: {', '.join(LOST_ROWS)}")


def finish_row(*lines: str) -> None:
    """Print a row process's lines and leave without torch's interpreter teardown (which
    costs more than some rows' commands; ``dcpcheck.cli.command_line`` says why)."""
    print("\n".join(lines), flush=True)
    used = os.times()
    cpu = used.user + used.system + used.children_user + used.children_system
    print(f"{COST_PREFIX} {cpu:.1f} s CPU", file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)


def dcpcheck(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``dcpcheck ARGS`` in this process, as its own process would end: the exit code,
    stdout and stderr (a traceback included); and the wall time."""
    from dcpcheck.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except Exception:  # as the process would have died: a traceback, exit 1
            traceback.print_exc()
            code = 1
    done = subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())
    return done, time.perf_counter() - start


ROUTINE_LABEL = re.compile(r"[A-Za-z_]\w*(, asked for .*)?|asked for .*")
"""What leads a reason of one of several routines, or of one way of asking one: its name
(``get_dcp_local_seq_lens, asked for one rank``)."""


def _reasons(said: str) -> list[str]:
    """The reasons ``said`` joins with "; ", each whole: a "; " inside parentheses (a
    reason's list of callers) does not split one."""
    reasons, depth, start = [], 0, 0
    for at, char in enumerate(said):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and said.startswith("; ", at):
            reasons.append(said[start:at])
            start = at + 2
    return [*reasons, said[start:]]


def _short(reason: str) -> str:
    """A skip reason's first clause, without the routine's name or the label of the
    routine (or the way) it is of."""
    clauses = reason.split(": ")
    while len(clauses) > 1 and ROUTINE_LABEL.fullmatch(clauses[0]):
        clauses.pop(0)
    return clauses[0].split(" of this release ", 1)[-1]


def verdict(op: str, spec: str, out: Path) -> tuple[str, float]:
    """``spec`` over ``op``'s shipped scenarios at DCP 1, 2, 4, 8: passed / failed / not
    applicable cases, the findings, and why checks were skipped; and the wall time."""
    report = out / f"{spec.replace('==', '-').replace(':', '-')}.json"
    done, seconds = dcpcheck(
        "run", "--op", op, "--kernel", spec, "--dcp", "1,2,4,8",
        "--json", str(report), "--home", str(out / "home"),
    )  # fmt: skip
    from dcpcheck.workflows.session import KERNEL_LOAD_CASE

    cases = json.loads(report.read_text())["cases"] if report.is_file() else []
    if not cases or [c["scenario"] for c in cases] == [KERNEL_LOAD_CASE]:
        said = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"not loaded (exit {done.returncode}): {said}", seconds
    counts = [sum(c["status"] == s for c in cases) for s in ("pass", "fail", "not_applicable")]
    found: dict[str, dict[str, set]] = {}
    skipped: set[str] = set()
    for case in cases:
        if case["status"] == "not_applicable":
            skipped.update(_short(why) for why in _reasons(case["error"]))
        for check in case["checks"]:
            if check["skipped"]:
                skipped.update(_short(why) for why in _reasons(check["skipped"]))
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


def property_search(op: str, spec: str, examples: int, out: Path) -> tuple[str, float]:
    """``spec``'s property search over ``examples`` examples: the ``property:`` line of its
    ``--property-only`` run, without its label; and the wall time."""
    searched, seconds = dcpcheck(
        "run", "--op", op, "--kernel", spec, "--property-only",
        "--examples", str(examples), "--home", str(out / "home"),
    )  # fmt: skip
    line = next(
        (line for line in searched.stdout.splitlines() if line.startswith("property:")),
        f"(no property line, exit {searched.returncode})",
    )
    return line.removeprefix("property: "), seconds
