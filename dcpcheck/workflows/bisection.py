"""Find the commit that broke a kernel file, by bisecting that file's own history.

:func:`bisect` walks only the commits that changed the file (``git log <good>..<bad> --
<file>``) and checks out nothing: each revision's file is written to a temporary
directory (``git show REV:FILE``) and checked by a fresh ``python -m dcpcheck run
--kernel TMP/FILE:FUNCTION`` subprocess, so Triton's JIT state and module globals never
leak from one revision into the next, and a crash ends one run, not the bisection. Only
the file changes between revisions; the harness and everything the file imports come
from the current environment, which is what makes a kernel file bisectable without
building its project at every commit.

Verdicts follow ``dcpcheck run``'s exit codes: 0 good; 1 bad (a check failed or the
kernel raised; the JSON report names the failing check); 125 skip (the file cannot be
loaded or compiled), as is a revision whose file does not even parse (seen without
spending a run) or a run that crashes or times out. A skipped midpoint is replaced by
its nearest untested neighbour. 2 (bad options) stops the bisection.

The same with ``git bisect run``, which checks out whole commits of the kernel's
repository (dcpcheck must be importable from there, e.g. installed or on PYTHONPATH)::

    git bisect start BAD GOOD -- path/to/kernels.py
    git bisect run python -m dcpcheck run --kernel path/to/kernels.py:fused_norm_rope \\
        --scenario decode-single-dcp4 --dcp 4 -x
    git bisect reset

``git bisect run`` reads 0 as good, 125 as skip and any other code below 128 as bad, so
try the command once by hand first: a usage error (exit 2) would count as bad.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import dcpcheck
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK, EXIT_USAGE
from dcpcheck.harness.checks import Finding, format_finding

"""``dcpcheck run``'s exit codes (dcpcheck.cli), the interface this module reads."""

DCPCHECK_ROOT = Path(dcpcheck.__file__).resolve().parents[1]
"""Put on the subprocess's PYTHONPATH so it runs this dcpcheck, installed or not."""


class BisectError(RuntimeError):
    """The bisection cannot start or go on: unknown revision, file not in the history,
    or options ``dcpcheck run`` rejects."""


class NothingToFind(BisectError):
    """The newest revision has the old verdict, so no revision changed it."""


class Verdict(enum.Enum):
    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"


@dataclass(frozen=True)
class RunOptions:
    """The ``dcpcheck run`` options every revision is checked with.

    Small scenario subsets keep each run to a few seconds; ``fail_fast`` stops a bad
    revision's run at its first failing case, which is all a verdict needs.
    """

    scenarios: tuple[str, ...] = ()
    dcp: str | None = None
    seed: int | None = None
    device: str = "auto"
    scenario_dir: Path | None = None
    fail_fast: bool = True
    timeout_s: float = 600.0

    def _options(self, kernel: str) -> list[str]:
        """``run``'s arguments for ``kernel`` under these options (no device, no reports).
        Token streams add a model run per revision and say nothing the checks miss here."""
        words = ["run", "--no-tokens", "--kernel", kernel]
        for scenario in self.scenarios:
            words += ["--scenario", scenario]
        if self.dcp is not None:
            words += ["--dcp", self.dcp]
        if self.seed is not None:
            words += ["--seed", str(self.seed)]
        if self.scenario_dir is not None:
            words += ["--scenario-dir", str(self.scenario_dir.resolve())]
        return words

    def command(self, kernel: str, json_path: Path) -> list[str]:
        """The ``python -m dcpcheck run`` command line checking ``kernel``."""
        command = [sys.executable, "-m", "dcpcheck", *self._options(kernel)]
        command += ["--device", self.device, "--json", str(json_path)]
        return [*command, "-x"] if self.fail_fast else command

    def replay(self, kernel: str) -> str:
        """The ``dcpcheck run`` a user types to see ``kernel``'s verdict as the bisection
        saw it (shell-quoted; the options given, no report paths)."""
        device = ["--device", self.device] if self.device != "auto" else []
        return shlex.join(["dcpcheck", *self._options(kernel), *device])


@dataclass(frozen=True)
class Commit:
    """A revision bisected: a commit of the kernel file's history, or a release (``sha``
    holds its version, ``subject`` names it)."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]


@dataclass(frozen=True)
class Step:
    """One revision looked at: its verdict, why, and whether a dcpcheck run was spent."""

    commit: Commit
    verdict: Verdict
    detail: str  # the failing check, the reason for a skip, or "all checks passed"
    ran: bool


@dataclass(frozen=True)
class BisectResult:
    """Where the bisection ended.

    ``first_bad`` is the first revision of ``file`` that fails, with ``failing_check``
    (one line); when skipped revisions hide it, ``first_bad`` is None and ``undecided``
    lists every commit it could be, oldest first.
    """

    file: str
    function: str
    good: str
    bad: str
    revisions: int  # commits that changed the file in good..bad
    steps: tuple[Step, ...]
    first_bad: Commit | None
    failing_check: str | None
    undecided: tuple[Commit, ...] = ()
    find: Find | None = None  # set when bisecting releases
    replay: str = ""  # the shell command that runs the revision found (exit 1 if it fails)

    @property
    def runs(self) -> int:
        """How many ``dcpcheck run`` subprocesses the bisection spent."""
        return sum(step.ran for step in self.steps)


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        )
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or "").strip().splitlines()
        raise BisectError(f"git {' '.join(args)}: {lines[0] if lines else 'failed'}") from exc
    return done.stdout


def _file_at(repo: Path, commit: Commit, path: str) -> bytes | None:
    """``path``'s bytes as of ``commit``; None where the commit deleted it."""
    done = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit.sha}:{path}"], capture_output=True
    )
    return done.stdout if done.returncode == 0 else None


def _repo_path(repo: Path, file: str) -> str:
    """``file`` relative to the repository's top level, as ``git show REV:PATH`` wants it."""
    top = Path(_git(repo, "rev-parse", "--show-toplevel").strip())
    path = Path(file)
    absolute = path if path.is_absolute() else (repo / path)
    try:
        return absolute.resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        raise BisectError(f"{file} is not inside the repository {top}") from None


def file_history(repo: Path, file: str, good: str, bad: str) -> list[Commit]:
    """Commits in ``good..bad`` that changed ``file`` (repository-relative), oldest first."""
    for rev in (good, bad):
        known = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            capture_output=True,
        )
        if known.returncode != 0:
            raise BisectError(f"{rev}: not a commit of {repo}")
    log = _git(repo, "log", "--format=%H%x00%s", f"{good}..{bad}", "--", file)
    commits = [Commit(*line.split("\0", 1)) for line in log.splitlines() if line]
    return commits[::-1]


def _failing_check(json_path: Path) -> str:
    """The first failure of a run's JSON report, as one line."""
    if not json_path.is_file():
        return "a check failed (no JSON report was written)"
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    for case in doc["cases"]:
        label = f"{case['scenario']}[dcp{case['dcp']}]"
        if case["status"] == "error":
            return f"{label}: kernel raised: {case['error']}"
        for check in case["checks"]:
            if check["status"] == "fail":
                finding = Finding(**check["findings"][0])
                return f"{label} {format_finding(check['check'], finding)}"
    return "a check failed"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def check_revision(
    repo: Path, path: str, commit: Commit, function: str, options: RunOptions, workdir: Path
) -> Step:
    """Write ``path`` as of ``commit`` under ``workdir`` and judge it (module docstring)."""
    source = _file_at(repo, commit, path)
    if source is None:
        return Step(commit, Verdict.SKIP, f"{path} does not exist at this revision", False)
    kernel_file = workdir / commit.short / Path(path).name
    kernel_file.parent.mkdir(parents=True, exist_ok=True)
    kernel_file.write_bytes(source)
    try:
        compile(source, str(kernel_file), "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Step(commit, Verdict.SKIP, f"line {exc.lineno}: syntax error: {exc.msg}", False)
    return _run_verdict(commit, f"{kernel_file}:{function}", options, kernel_file.parent)


def _run_verdict(revision: Commit, kernel: str, options: RunOptions, workdir: Path) -> Step:
    """Run ``dcpcheck run --kernel KERNEL`` in a fresh process; its exit code is the verdict
    (module docstring)."""
    json_path = workdir / f"{revision.short}.report.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(DCPCHECK_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    command = options.command(kernel, json_path)
    try:
        done = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=options.timeout_s
        )
    except subprocess.TimeoutExpired:
        return Step(revision, Verdict.SKIP, f"timed out after {options.timeout_s:g} s", True)
    if done.returncode == EXIT_OK:
        return Step(revision, Verdict.GOOD, "all checks passed", True)
    if done.returncode == EXIT_FAIL:
        return Step(revision, Verdict.BAD, _failing_check(json_path), True)
    if done.returncode == EXIT_KERNEL_LOAD:
        why = _last_line(done.stderr).removeprefix("dcpcheck: error: ")
        return Step(revision, Verdict.SKIP, why or "kernel not loadable", True)
    if done.returncode == EXIT_USAGE:
        raise BisectError(f"dcpcheck run rejected the options: {_last_line(done.stderr)}")
    return Step(
        revision, Verdict.SKIP, f"dcpcheck run exited with {done.returncode} (crashed?)", True
    )


def _next_index(low: int, high: int, skipped: set[int]) -> int | None:
    """The midpoint of the open range (low, high), else its nearest untested neighbour."""
    pending = [i for i in range(low + 1, high) if i not in skipped]
    if not pending:
        return None
    middle = (low + high) // 2
    return min(pending, key=lambda i: (abs(i - middle), i))


def _search(
    count: int, judge: Callable[[int], Step], new: Verdict
) -> tuple[int, int, set[int], dict[int, str]]:
    """Bisect revisions ``0..count-1``, where revision -1 (the old end) is taken to have the
    old verdict and ``count - 1`` the ``new`` one, as ``git bisect`` takes its old and new
    ends. Returns ``(low, high, skipped, detail)``: the last old and the first new revision
    found, the skipped ones, and the detail of each revision judged ``new``. The newest
    revision is judged only when no midpoint decided the range."""
    low, high = -1, count - 1
    skipped: set[int] = set()
    detail: dict[int, str] = {}
    old = Verdict.GOOD if new is Verdict.BAD else Verdict.BAD
    while (index := _next_index(low, high, skipped)) is not None:
        step = judge(index)
        if step.verdict is old:
            low = index
        elif step.verdict is new:
            high, detail[index] = index, step.detail
        else:
            skipped.add(index)
    if not any(low < i < high for i in skipped) and high not in detail:
        last = judge(high)
        if last.verdict is old:
            raise NothingToFind(
                f"the newest revision is {old.value}, not {new.value}: nothing to find"
            )
        if last.verdict is new:
            detail[high] = last.detail
    return low, high, skipped, detail


def bisect(
    repo: Path, file: str, good: str, bad: str, function: str, run_options: RunOptions
) -> BisectResult:
    """The first revision of ``file`` in ``good..bad`` whose ``function`` fails
    ``dcpcheck run`` with ``run_options`` (module docstring).

    ``good`` is taken as passing and ``bad`` as failing, as ``git bisect`` does; the
    newest revision is run only when no midpoint told its failing check.
    """
    path = _repo_path(repo, file)
    history = file_history(repo, path, good, bad)
    if not history:
        raise BisectError(f"{path} did not change in {good}..{bad}: nothing to bisect")
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="dcpcheck-bisect-") as tmp:
        workdir = Path(tmp)

        def judge(index: int) -> Step:
            step = check_revision(repo, path, history[index], function, run_options, workdir)
            steps.append(step)
            return step

        try:
            low, high, skipped, failing = _search(len(history), judge, Verdict.BAD)
        except NothingToFind:
            raise BisectError(
                f"the bad revision {bad} passes: {path} is not broken there"
            ) from None
    result = _result(path, function, good, bad, history, steps, low, high, skipped, failing)
    if result.first_bad is None:
        return result
    # The file as it was at that commit, written beside the user, then checked.
    sha = result.first_bad.sha
    copy = f"kernel-{result.first_bad.short}.py"
    show = shlex.join(["git", "-C", str(repo.resolve()), "show", f"{sha}:{path}"])
    replay = f"{show} > {copy} && {run_options.replay(f'{copy}:{function}')}"
    return dataclasses.replace(result, replay=replay)


class Find(enum.Enum):
    """What a bisection over releases looks for, as ``git bisect --term-old/--term-new``:
    the first release that fails (the oldest passes), or the first that passes (the
    oldest fails: the release that fixed a bug)."""

    FIRST_BAD = "first-bad"
    FIRST_FIXED = "first-fixed"


def check_release(version: str, function: str, options: RunOptions, workdir: Path) -> Step:
    """Judge release ``version`` of vLLM's kernel in a fresh ``dcpcheck run``."""
    release = Commit(version, f"vllm {version}")
    return _run_verdict(release, f"vllm=={version}:{function}", options, workdir)


def bisect_releases(
    versions: Sequence[str], find: Find, function: str, run_options: RunOptions
) -> BisectResult:
    """The first of ``versions`` (oldest first) that fails (``Find.FIRST_BAD``) or passes
    (``Find.FIRST_FIXED``); the oldest is taken to be the other way round, unrun, as
    ``git bisect`` takes its old end."""
    if len(versions) < 2:
        raise BisectError("bisecting releases needs at least two versions, oldest first")
    history = [Commit(v, f"vllm {v}") for v in versions[1:]]
    new = Verdict.BAD if find is Find.FIRST_BAD else Verdict.GOOD
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="dcpcheck-bisect-") as tmp:

        def judge(index: int) -> Step:
            step = check_release(history[index].sha, function, run_options, Path(tmp))
            steps.append(step)
            return step

        low, high, skipped, found = _search(len(history), judge, new)
    result = _result(
        "vllm releases",
        function,
        versions[0],
        versions[-1],
        history,
        steps,
        low,
        high,
        skipped,
        found,
    )
    replay = ""
    if result.first_bad is not None:
        replay = run_options.replay(f"vllm=={result.first_bad.sha}:{function}")
    return dataclasses.replace(result, find=find, replay=replay)


def _result(
    file: str,
    function: str,
    good: str,
    bad: str,
    history: Sequence[Commit],
    steps: list[Step],
    low: int,
    high: int,
    skipped: set[int],
    found: dict[int, str],
) -> BisectResult:
    decided = high in found and not any(low < i < high for i in skipped)
    undecided = tuple(history[i] for i in range(low + 1, high + 1) if i in skipped or i == high)
    return BisectResult(
        file=file,
        function=function,
        good=good,
        bad=bad,
        revisions=len(history),
        steps=tuple(steps),
        first_bad=history[high] if decided else None,
        failing_check=found[high] if decided else None,
        undecided=() if decided else undecided,
    )


def render(result: BisectResult) -> list[str]:
    """The result as text lines: one per step, then the verdict."""
    fixed = result.find is Find.FIRST_FIXED
    target = "first fixed" if fixed else "first bad"
    kind = "release" if result.find is not None else "commit"
    lines = [
        f"bisecting {result.file}:{result.function} over {result.revisions} revision(s) "
        f"in {result.good}..{result.bad}, looking for the {target} {kind}"
    ]
    for step in result.steps:
        how = "" if step.ran else " (no run)"
        lines.append(
            f"  {step.commit.short} {step.verdict.value:4}{how} {step.commit.subject}: "
            f"{step.detail}"
        )
    if result.first_bad is not None:
        lines.append(f"{target} {kind}: {result.first_bad.sha} {result.first_bad.subject}")
        if not fixed:
            lines.append(f"failing check: {result.failing_check}")
        lines.append(f"replay (exit {0 if fixed else 1}): {result.replay}")
    else:
        lines.append(f"skipped revisions hide the {target} {kind}; it is one of:")
        lines += [f"  {c.sha} {c.subject}" for c in result.undecided]
    lines.append(f"{result.runs} dcpcheck run(s) for {result.revisions} revision(s)")
    return lines
