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

Both ends are judged before any midpoint, the newest first, and nothing is assumed of
either: only when the old end has the old verdict and the newest the new one do
midpoints narrow the range, so the revision named and the one before it (a midpoint or
the old end) both had their verdicts observed. Otherwise the result gives both ends'
verdicts: they do not differ, differ the other way round, or one could not be judged, so
there is nothing to find.

:func:`bisect_releases` checks its list of versions before any run
(:func:`check_versions`): each a version, oldest first, none twice, each cached or
published. Every step runs in a temporary folder, so the paths the environment hands it
(``DCPCHECK_CACHE``, ``DCPCHECK_HOME``, ``PYTHONPATH``) are made absolute first.

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
from dcpcheck.cases.verdicts import Finding, format_finding
from dcpcheck.exit_codes import EXIT_FAIL, EXIT_KERNEL_LOAD, EXIT_OK, EXIT_USAGE
from dcpcheck.kernels import releases
from dcpcheck.op_registry import DEFAULT_OP, OPS

"""``dcpcheck run``'s exit codes (dcpcheck.cli), the interface this module reads."""

DCPCHECK_ROOT = Path(dcpcheck.__file__).resolve().parents[1]
"""Put on the subprocess's PYTHONPATH so it runs this dcpcheck, installed or not."""


class BisectError(RuntimeError):
    """The bisection cannot start or go on: unknown revision, file not in the history,
    or options ``dcpcheck run`` rejects."""


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
    op: str = DEFAULT_OP

    def _options(self, kernel: str) -> list[str]:
        """``run``'s arguments for ``kernel`` under these options (no device, no reports).
        Token streams (the session's, ``Op.judged_by_session``) add a model run per revision
        and say nothing the checks miss here; another op is named, and has none."""
        session = OPS[self.op].judged_by_session
        words = ["run", *(["--no-tokens"] if session else ["--op", self.op]), "--kernel", kernel]
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
    old_end: Step  # the old end's own step, judged second (the newest's is ``steps[0]``)
    undecided: tuple[Commit, ...] = ()
    find: Find | None = None  # set when bisecting releases
    replay: str = ""  # the shell command that runs the revision found (exit 1 if it fails)
    old_verdict: Verdict = Verdict.GOOD  # the verdict the old end must have

    @property
    def new_verdict(self) -> Verdict:
        """The verdict looked for: the one the newest revision must have."""
        return _opposite(self.old_verdict)

    @property
    def nothing_to_find(self) -> bool:
        """The ends were judged and do not have the old verdict (the old end) and the new
        one (the newest): no revision in the range can be said to have changed it."""
        newest = self.steps[0]
        return not (self.old_end.verdict is self.old_verdict and newest.verdict is self.new_verdict)

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


_UNCHECKED = {"error": "kernel raised", "crash": "kernel crashed", "timeout": "timed out"}
"""A case whose checks never ran, by its report status (``output.report``), as a step's
line says it."""


def _failing_check(json_path: Path) -> str:
    """The first failure of a run's JSON report, as one line."""
    if not json_path.is_file():
        return "a check failed (no JSON report was written)"
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    for case in doc["cases"]:
        label = f"{case['scenario']}[dcp{case['dcp']}]"
        if case["status"] in _UNCHECKED:
            return f"{label}: {_UNCHECKED[case['status']]}: {case['error']}"
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


PATH_VARIABLES = ("DCPCHECK_CACHE", "DCPCHECK_HOME")
"""Environment variables holding one path that a step, run in a temporary folder, reads."""


def step_environment() -> dict[str, str]:
    """This process's environment for a step's ``dcpcheck run``: this dcpcheck first on
    ``PYTHONPATH``, and every path it reads absolute (a step runs in a temporary folder)."""
    env = dict(os.environ)
    for name in PATH_VARIABLES:
        if env.get(name):
            env[name] = os.path.abspath(env[name])
    given = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(DCPCHECK_ROOT), *given])
    return env


def _run_verdict(revision: Commit, kernel: str, options: RunOptions, workdir: Path) -> Step:
    """Run ``dcpcheck run --kernel KERNEL`` in a fresh process; its exit code is the verdict
    (module docstring)."""
    json_path = workdir / f"{revision.short}.report.json"
    command = options.command(kernel, json_path)
    try:
        done = subprocess.run(
            command,
            cwd=workdir,
            env=step_environment(),
            capture_output=True,
            text=True,
            timeout=options.timeout_s,
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


def _opposite(verdict: Verdict) -> Verdict:
    """The other verdict of a bisection: good for bad, bad for good."""
    return Verdict.GOOD if verdict is Verdict.BAD else Verdict.BAD


OLD_END = -1
"""The index :func:`_search` asks its judge for the old end by (``--good``, the oldest
release), below revision 0."""


@dataclass(frozen=True)
class Search:
    """Where a search over revisions ``0..count-1`` ended: the last revision with the old
    verdict and the first with the new one (``low``, ``high``), the skipped ones, the
    detail of each revision judged new; ``newest`` and ``old_end``, the ends' own steps,
    judged first."""

    low: int
    high: int
    skipped: frozenset[int]
    detail: dict[int, str]
    newest: Step
    old_end: Step


def _search(count: int, judge: Callable[[int], Step], new: Verdict) -> Search:
    """Bisect revisions ``0..count-1`` whose old end is revision ``OLD_END``: the newest
    (``count - 1``) is judged first, then the old end; when they have the old verdict and
    the ``new`` one, midpoints narrow the range, and ``low`` is always a revision judged
    old (module docstring). Otherwise nothing is searched (``high`` is ``count - 1``)."""
    old = _opposite(new)
    newest = judge(count - 1)
    old_end = judge(OLD_END)
    low, high = OLD_END, count - 1
    skipped: set[int] = set()
    detail: dict[int, str] = {}
    if newest.verdict is not new or old_end.verdict is not old:
        return Search(low, high, frozenset(), detail, newest, old_end)
    detail[high] = newest.detail
    while (index := _next_index(low, high, skipped)) is not None:
        step = judge(index)
        if step.verdict is old:
            low = index
        elif step.verdict is new:
            high, detail[index] = index, step.detail
        else:
            skipped.add(index)
    return Search(low, high, frozenset(skipped), detail, newest, old_end)


def bisect(
    repo: Path, file: str, good: str, bad: str, function: str, run_options: RunOptions
) -> BisectResult:
    """The first revision of ``file`` in ``good..bad`` whose ``function`` fails
    ``dcpcheck run`` with ``run_options`` (module docstring).

    ``bad`` is run first, then ``good``; only when ``bad`` fails and ``good`` passes are the
    commits between bisected, else the result gives both verdicts.
    """
    path = _repo_path(repo, file)
    history = file_history(repo, path, good, bad)
    if not history:
        raise BisectError(f"{path} did not change in {good}..{bad}: nothing to bisect")
    good_end = Commit(_git(repo, "rev-parse", f"{good}^{{commit}}").strip(), f"(--good {good})")
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="dcpcheck-bisect-") as tmp:
        workdir = Path(tmp)

        def judge(commit: Commit) -> Step:
            step = check_revision(repo, path, commit, function, run_options, workdir)
            steps.append(step)
            return step

        search = _search(len(history), lambda i: judge(_at(history, i, good_end)), Verdict.BAD)
    result = _result(path, function, good, bad, history, steps, search)
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


def check_versions(texts: Sequence[str], op: str = DEFAULT_OP) -> list[str]:
    """``--releases`` as normalised versions, checked before any run: each a version, none
    twice, oldest first, and each known (its ``op`` file cached, else the version
    published by the package index, which is asked only then; a cached release without
    the op's file is refused), every cached file of the op checked (a cache fault is
    refused). :class:`BisectError`, one line, otherwise."""
    versions = []
    for text in texts:
        try:
            versions.append(releases.normalise(text))
        except releases.MalformedVersion as exc:
            raise BisectError(f"--releases: {exc}") from None
    if len(versions) < 2:
        raise BisectError("--releases: bisecting releases needs at least two versions")
    twice = sorted({v for v in versions if versions.count(v) > 1}, key=releases.version_key)
    if twice:
        raise BisectError(f"--releases: {', '.join(twice)} given more than once")
    ordered = sorted(versions, key=releases.version_key)
    if versions != ordered:
        first = next(i for i, (v, o) in enumerate(zip(versions, ordered, strict=True)) if v != o)
        raise BisectError(
            f"--releases: not oldest first ({versions[first]} before {versions[first + 1]}); "
            f"sorted: {','.join(ordered)}"
        )
    members = OPS[op].wheel_members

    def cached(version: str) -> bool:  # any of the op's files: it moved between releases
        # every file checked, so a cache fault in any is found before the first run
        kept = [releases.cached(version, m) for m in members if not releases.lacks(version, m)]
        return any(file is not None for file in kept)

    try:
        unknown = [v for v in versions if not cached(v)]
    except releases.ReleaseError as exc:  # a cache fault
        raise BisectError(f"--releases: {exc}") from None
    if unknown:
        listed = releases.published_versions()
        if listed is None:
            raise BisectError(
                f"--releases: {', '.join(unknown)} not in dcpcheck's cache, and the package "
                f"index cannot be asked whether they exist (fetch them where it can: "
                f"dcpcheck fetch {' '.join(f'vllm=={v}' for v in unknown)})"
            )
        missing = [v for v in unknown if v not in listed]
        if missing:
            nearest = releases.nearest(missing[0], listed)
            raise BisectError(f"--releases: {releases.UnknownRelease(missing[0], nearest)}")
    return versions


def bisect_releases(
    versions: Sequence[str], find: Find, function: str, run_options: RunOptions
) -> BisectResult:
    """The first of ``versions`` (checked by :func:`check_versions`) that fails
    (``Find.FIRST_BAD``) or passes (``Find.FIRST_FIXED``). The newest is run first, then
    the oldest; only when the oldest is the old way round and the newest the new way round
    are the releases between bisected, else the result gives both verdicts."""
    versions = check_versions(versions, run_options.op)
    oldest, *history = (Commit(v, f"vllm {v}") for v in versions)
    new = Verdict.BAD if find is Find.FIRST_BAD else Verdict.GOOD
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="dcpcheck-bisect-") as tmp:

        def judge(release: Commit) -> Step:
            step = check_release(release.sha, function, run_options, Path(tmp))
            steps.append(step)
            return step

        search = _search(len(history), lambda i: judge(_at(history, i, oldest)), new)
    result = _result("vllm releases", function, versions[0], versions[-1], history, steps, search)
    result = dataclasses.replace(result, find=find, old_verdict=_opposite(new))
    if result.first_bad is not None:
        result = dataclasses.replace(
            result, replay=run_options.replay(f"vllm=={result.first_bad.sha}:{function}")
        )
    return result


def _at(history: Sequence[Commit], index: int, old_end: Commit) -> Commit:
    """Revision ``index`` of ``history``, or ``old_end`` for ``OLD_END``."""
    return old_end if index == OLD_END else history[index]


def _result(
    file: str,
    function: str,
    good: str,
    bad: str,
    history: Sequence[Commit],
    steps: list[Step],
    search: Search,
) -> BisectResult:
    low, high, skipped, found = search.low, search.high, search.skipped, search.detail
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
        undecided=() if decided or not found else undecided,
        old_end=search.old_end,
    )


def render(result: BisectResult) -> list[str]:
    """The result as text lines: the range, one line per step (the ends first), then the
    verdict."""
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
    if result.nothing_to_find:
        lines.append(_ends_line(result))
    elif result.first_bad is not None:
        lines.append(f"{target} {kind}: {result.first_bad.sha} {result.first_bad.subject}")
        if not fixed:
            lines.append(f"failing check: {result.failing_check}")
        lines.append(f"replay (exit {0 if fixed else 1}): {result.replay}")
    else:
        lines.append(f"skipped revisions hide the {target} {kind}; it is one of:")
        lines += [f"  {c.sha} {c.subject}" for c in result.undecided]
    lines.append(f"{result.runs} dcpcheck run(s) for {result.revisions} revision(s)")
    return lines


def _ends_line(result: BisectResult) -> str:
    """Why ends judged as they were leave nothing to find, with both verdicts."""
    newest, old_end = result.steps[0], result.old_end
    unjudged = [
        f"{name} could not be judged ({step.detail})"
        for name, step in ((result.good, old_end), (result.bad, newest))
        if step.verdict is Verdict.SKIP
    ]
    if unjudged:
        return f"{'; '.join(unjudged)}: nothing to find"
    ends = f"{result.good} is {old_end.verdict.value}, {result.bad} is {newest.verdict.value}"
    if old_end.verdict is result.new_verdict and newest.verdict is result.old_verdict:
        if result.find is None:
            hint = "the --bad revision passes where --good fails"
        else:
            hint = f"try --find {'first-bad' if result.find is Find.FIRST_FIXED else 'first-fixed'}"
        return f"the endpoints differ the other way round ({ends}): {hint}"
    return f"the endpoints do not differ ({ends}): nothing to find"
