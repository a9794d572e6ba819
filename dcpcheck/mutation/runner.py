"""Running mutants through the gate: each in a worker process of its own
(``python -m dcpcheck.mutation.worker``, which is ``dcpcheck run`` with the mutant loaded
where the kernel file would be), with a time limit, several at once. The workers are forked
from the run's fork server (``dcpcheck.fork_server``), which imported torch once for all of
them.

An outcome (``OUTCOMES``) is read from the worker's exit code and its JSON report:

* ``killed``: the gate failed (exit 1); the first failing case names the scenario and the
  check that killed it (``error`` when the kernel raised while running a case);
* ``timed_out`` and ``crashed`` (the worker died, exited with a code the gate never uses,
  or its run broke off on an internal error of dcpcheck's before any case failed): the
  mutant hung or broke the process, which a gate notices too, so both count as killed,
  said apart, so that a bug of the harness never reads as a check that saw the mutant;
* ``survived``: every check of every case passed (exit 0);
* ``not_compiled``: the mutated file does not load (exit 125), or every failing case is
  an error Triton or Python raises for code that does not compile; not counted.

A worker that exits 2 was refused its arguments: ``GateError``, which stops the run.

Outcomes are cached under ``HOME/mutants/`` by the mutated file's SHA256 and the gate's
(``Gate.fingerprint``), with the scenario files they were judged by (``Cache``): a rerun
runs only mutants whose outcome may have changed, and each outcome is written as it lands,
so an interrupted run keeps what finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dcpcheck import fork_server
from dcpcheck.cases.scenario_files import SCENARIO_DIR
from dcpcheck.files import write_atomic
from dcpcheck.kernels import ran
from dcpcheck.mutation.operators import Mutant
from dcpcheck.op_registry import OPS
from dcpcheck.workflows.session import INTERNAL_ERROR_CASE

KILLED, TIMED_OUT, CRASHED, SURVIVED, NOT_COMPILED = (
    "killed",
    "timed_out",
    "crashed",
    "survived",
    "not_compiled",
)
BASELINE = "baseline"  # the operator of the edit of nothing: the kernel as it is
OUTCOMES = (KILLED, TIMED_OUT, CRASHED, SURVIVED, NOT_COMPILED)
COUNTED_KILLED = (KILLED, TIMED_OUT, CRASHED)

NOT_COMPILING = (
    "CompilationError",
    "CompileTimeAssertionFailure",
    "SyntaxError",
    "NameError",
    "UnboundLocalError",
)
"""The errors of code that does not compile: a case that fails with one of them says the
mutant never ran."""


class GateError(RuntimeError):
    """The gate refused what it was asked (exit 2: its arguments, a scenario file): the
    harness's fault, never a mutant's outcome. One line."""


@dataclass(frozen=True)
class Gate:
    """What each mutant is judged by: ``dcpcheck run`` of the op's named scenarios (or
    ``scenarios``) at DCP1 and ``dcp`` (each scenario's own sizes when empty), and, when
    asked, a second pass of the property search over ``search`` drawn scenarios for the
    mutants the first lets through."""

    op: str
    kernel: str
    dcp: tuple[int, ...]
    scenarios: tuple[str, ...] = ()
    search: int = 0
    timeout: float = 600.0
    scenario_dir: Path | None = None

    def arguments(self, report: Path, home: Path, search: bool) -> list[str]:
        """The ``dcpcheck run`` arguments of one pass."""
        args = ["run", "--op", self.op, "--kernel", self.kernel]
        if self.dcp:  # else each scenario's own sizes, DCP1 among them
            args += ["--dcp", ",".join(str(s) for s in sorted({1, *self.dcp}))]
        if OPS[self.op].judged_by_session:  # the session's token streams: the model's
            args.append("--no-tokens")
        args += ["--json", str(report), "--home", str(home)]
        if search:  # drawn scenarios, not named ones
            return [*args, "--property-only", "--examples", str(self.search)]
        if self.scenario_dir is not None:
            args += ["--scenario-dir", str(self.scenario_dir)]
        for scenario in self.scenarios:
            args += ["--scenario", scenario]
        return args

    def fingerprint(self) -> str:
        """The SHA256 of what decides an outcome besides the mutated file and the
        scenarios: the gate's arguments and dcpcheck's own source (its checks)."""
        digest = hashlib.sha256(json.dumps(self.arguments(Path(), Path(), False)).encode())
        digest.update(str(self.search).encode())
        for path in sorted(Path(__file__).parents[1].rglob("*.py")):
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def scenario_paths(self) -> list[Path]:
        """Each scenario file the gate may read."""
        folder = self.scenario_dir or SCENARIO_DIR
        return sorted(folder.rglob("*.toml"))

    def scenario_files(self) -> dict[str, str]:
        """Each scenario file the gate may read, by its scenario's name (the file's stem),
        with the SHA256 of its bytes."""
        return {
            path.stem: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in self.scenario_paths()
        }


@dataclass
class Outcome:
    """What one mutant did under the gate."""

    name: str
    outcome: str
    scenario: str | None = None  # the first case that killed it
    check: str | None = None  # its first failing check, or "error"
    detail: str = ""  # the finding or error, one line
    by: str = "gate"  # "gate", or "search" when only the property search killed it
    seconds: float = 0.0
    failing: list[tuple[str, str]] = field(default_factory=list)  # every (scenario, check)
    ran: dict[str, list[str]] = field(default_factory=dict)  # baseline: file -> functions run


def _first_line(text: str) -> str:
    return next((line for line in reversed(text.strip().splitlines()) if line.strip()), "")


def classify(name: str, code: int | None, report: dict | None, stderr: str) -> Outcome:
    """The outcome of a worker that exited with ``code`` (None: timed out), its JSON
    ``report`` (None when it wrote none) and its ``stderr`` (module docstring)."""
    if code is None:
        return Outcome(name, TIMED_OUT, detail="the gate did not finish in its time limit")
    if code == 125:
        return Outcome(name, NOT_COMPILED, detail=_first_line(stderr))
    if code == 2:
        raise GateError(f"the gate refused its arguments: {_first_line(stderr)}")
    if code == 0 and report is not None:
        return Outcome(name, SURVIVED)
    if code != 1 or report is None:
        return Outcome(name, CRASHED, detail=f"exit {code}: {_first_line(stderr)}")
    failing: list[tuple[str, str]] = []
    errors: list[str] = []
    first: tuple[str, str, str] | None = None
    broke = ""  # the run's internal error, if it broke off on one
    for case in report["cases"]:
        if case["status"] in ("pass", "not_applicable"):
            continue
        if case["scenario"] == INTERNAL_ERROR_CASE:
            broke = case.get("error") or INTERNAL_ERROR_CASE
            continue
        scenario = f"{case['scenario']}[dcp{case['dcp']}]"
        if case["status"] in ("error", "crash", "timeout"):
            errors.append(case.get("error") or "")
            failing.append((scenario, "error"))
            first = first or (scenario, "error", case.get("error") or case["status"])
            continue
        for check in case["checks"]:
            if check["status"] == "fail":
                failing.append((scenario, check["check"]))
                if first is None:
                    finding = check["findings"][0] if check["findings"] else {}
                    first = (scenario, check["check"], finding.get("detail", ""))
    searched = report.get("search") or {}
    if first is None and searched.get("status") == "fail":
        check = (searched.get("failed_checks") or ["error"])[0]
        first = ("property search", check, searched.get("saved") or "")
        failing.append(("property search", check))
    if first is None:
        return Outcome(name, CRASHED, detail=broke or "exit 1 with no failing case in its report")
    if len(errors) == len(failing) and all(e.startswith(NOT_COMPILING) for e in errors):
        return Outcome(name, NOT_COMPILED, detail=errors[0])
    return Outcome(name, KILLED, first[0], first[1], first[2], failing=failing)


class Cache:
    """Outcomes under ``folder``, one JSON file per mutated file and gate (its
    ``fingerprint``), each with the scenario files it was judged by. A kill stands while
    the file of the scenario that killed it is unchanged: a scenario added or edited
    re-runs only the mutants it could change, the survivors and what that scenario had
    killed. A survivor, or a kill by the property search, stands only while every scenario
    file is unchanged."""

    def __init__(self, folder: Path, gate: Gate) -> None:
        self.folder = folder
        self.gate = gate.fingerprint()[:16]
        self.scenarios = gate.scenario_files()

    def _path(self, mutant: Mutant, search: bool) -> Path:
        source = hashlib.sha256(mutant.source.encode()).hexdigest()[:32]
        return self.folder / f"{source}-{self.gate}{'-search' if search else ''}.json"

    def _stands(self, outcome: Outcome, judged_by: dict[str, str]) -> bool:
        killer = (outcome.scenario or "").split("[")[0]
        if outcome.outcome in COUNTED_KILLED and killer in judged_by:
            return self.scenarios.get(killer) == judged_by[killer]
        return judged_by == self.scenarios

    def get(self, mutant: Mutant, search: bool = False) -> Outcome | None:
        path = self._path(mutant, search)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
            judged_by = record.pop("scenario_files")
            outcome = Outcome(**{**record, "name": mutant.name})
        except (ValueError, TypeError, KeyError):  # a file this version did not write
            return None
        if not self._stands(outcome, judged_by):
            return None
        outcome.failing = [tuple(pair) for pair in outcome.failing]  # type: ignore[misc]
        return outcome

    def put(self, mutant: Mutant, outcome: Outcome, search: bool = False) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {**asdict(outcome), "scenario_files": self.scenarios}
        write_atomic(self._path(mutant, search), json.dumps(record, sort_keys=True))


@dataclass
class _Running:
    mutant: Mutant
    process: fork_server.ForkedProcess
    report: Path
    started: float
    search: bool


ONE_THREAD_ENV = "OMP_NUM_THREADS"
"""Set to 1 for every worker of a run of several at once, unless already set: torch's
default is a CPU thread a core in each process, so ``--jobs 14`` on a 16-core GPU box ran
14 times as many threads as cores: no fused op's 300-example search finished inside 300 s
there, where on one thread a worker they take about a minute each (BENCHMARKS.md,
"Mutation testing")."""


def worker_environment(jobs: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a mutant's worker: ``base`` with this checkout first on
    ``PYTHONPATH``, and one torch thread where ``jobs`` workers share the CPUs
    (``ONE_THREAD_ENV``)."""
    root = str(Path(__file__).parents[2])  # this checkout, installed or not
    path = os.pathsep.join(p for p in (root, base.get("PYTHONPATH")) if p)
    env = {**base, "PYTHONPATH": path}
    if jobs > 1:
        env.setdefault(ONE_THREAD_ENV, "1")
    return env


def _launch(
    mutant: Mutant,
    gate: Gate,
    scratch: Path,
    search: bool,
    jobs: int,
    files: Sequence[Path] = (),
) -> _Running:
    folder = Path(tempfile.mkdtemp(prefix="mutant-", dir=scratch))
    mutated = folder / mutant.path.name
    mutated.write_text(mutant.source, encoding="utf-8")
    report = folder / "report.json"
    arguments = [str(mutant.path), str(mutated), *gate.arguments(report, folder / "home", search)]
    env = worker_environment(jobs, os.environ)
    if mutant.operator == BASELINE:  # what of the file the gate runs (``campaign``)
        env["TRITON_CACHE_DIR"] = str(folder / "triton")  # every binary compiled: ``ran``
        (folder / "ran").mkdir()
        env[ran.RAN_DIR_ENV] = str(folder / "ran")
        env[ran.RAN_FILES_ENV] = os.pathsep.join(str(f.resolve()) for f in files)
    with (folder / "stderr.txt").open("w") as stderr:  # a file: a pipe could fill and stall
        process = fork_server.start(
            "dcpcheck.mutation.worker",
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr.fileno(),
            env=env,
            start_new_session=True,  # a timeout kills the worker and whatever it started
        )
    return _Running(mutant, process, report, time.monotonic(), search)


def _finish(running: _Running, timed_out: bool) -> Outcome:
    process = running.process
    if timed_out:
        fork_server.kill_session(process, signal.SIGKILL)
    process.wait()
    stderr = (running.report.parent / "stderr.txt").read_text(errors="replace")
    code = None if timed_out else process.returncode
    report = None
    if running.report.is_file():
        try:
            report = json.loads(running.report.read_text())
        except ValueError:
            report = None
    outcome = classify(running.mutant.name, code, report, stderr)
    outcome.seconds = round(time.monotonic() - running.started, 1)
    if (running.report.parent / "ran").is_dir():
        outcome.ran = {p: sorted(n) for p, n in ran.read(running.report.parent / "ran").items()}
    return outcome


def run_mutants(
    mutants: Sequence[Mutant],
    gate: Gate,
    cache: Cache,
    jobs: int,
    on_outcome: Callable[[Mutant, Outcome], None] = lambda m, o: None,
    search: bool = False,
    watched: Sequence[Path] = (),
) -> dict[str, Outcome]:
    """Each of ``mutants``' outcome under ``gate`` (by name), from the cache or run
    ``jobs`` at a time (the property-search pass when ``search``; the baseline records
    what of ``watched`` it ran, ``dcpcheck.kernels.ran``). A Ctrl-C stops the
    workers and propagates; what finished is cached."""
    outcomes: dict[str, Outcome] = {}
    pending = []
    for mutant in mutants:
        cached = cache.get(mutant, search)
        if cached is not None:
            outcomes[mutant.name] = cached
            on_outcome(mutant, cached)
        else:
            pending.append(mutant)
    pending.reverse()
    running: list[_Running] = []
    with tempfile.TemporaryDirectory(prefix="dcpcheck-mutate-") as scratch:
        try:
            while pending or running:
                while pending and len(running) < jobs:
                    mutant = pending.pop()
                    running.append(_launch(mutant, gate, Path(scratch), search, jobs, watched))
                time.sleep(0.05)
                for job in list(running):
                    late = time.monotonic() - job.started > gate.timeout
                    if job.process.poll() is None and not late:
                        continue
                    running.remove(job)
                    outcome = _finish(job, timed_out=job.process.poll() is None)
                    if search:
                        outcome.by = "search"
                    outcomes[job.mutant.name] = outcome
                    cache.put(job.mutant, outcome, search)
                    on_outcome(job.mutant, outcome)
        finally:
            for job in running:  # interrupted: no worker outlives the run
                if job.process.poll() is None:
                    fork_server.kill_session(job.process, signal.SIGKILL)
                job.process.wait()
    return outcomes
