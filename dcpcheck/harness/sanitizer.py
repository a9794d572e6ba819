"""Run the kernel under NVIDIA's compute-sanitizer and file what it reports by case and rank.

``dcpcheck run --sanitize TOOL`` (CUDA only) starts each isolated worker
(``dcpcheck.harness.isolation``) under ``compute-sanitizer --tool TOOL``:

* memcheck: out-of-bounds and misaligned accesses to global, local and shared memory;
* initcheck: reads of global memory nothing wrote;
* racecheck: shared-memory data races between threads of a block;
* synccheck: invalid uses of barriers (``__syncthreads`` reached by part of a block).

What the parent hands each worker and what comes back:

* **One log, one file description.** compute-sanitizer prints its reports on its stdout,
  which the parent points at a temporary file; the worker, its child, inherits that stdout
  and writes a marker line into it around every rank's kernel call
  (``runner.LAUNCH_WATCHER``) and before sending each case's result. Both processes then
  write through one open file description: every write lands after the previous one, in
  the order the writes were made. (``--log-file`` would open a second description with
  its own offset, whose writes could overwrite the worker's markers.)
* **Reports before markers.** The sanitizer reports an error once the kernel that made it
  has finished; the worker synchronizes the device before writing each marker, so the
  reports of the launches before a marker are (as far as compute-sanitizer prints at
  synchronization, which the GPU tests confirm) already in the log when it is written.
* **One job per worker.** A sanitized worker runs one job (a scenario, or the token
  streams) and exits, so compute-sanitizer prints everything it holds, its print limit
  starts afresh for every scenario, and its ``ERROR SUMMARY`` tells whether any report
  went unprinted.

The parent then reads the log (:func:`split_by_markers`, :func:`parse_report`) and adds a
``sanitizer`` check to each case (:func:`attach`): one finding per distinct report (the
same error on many threads is one finding with a count), naming the kernel, the rank whose
call it happened in, and the sanitizer's own text. A report outside every rank's call (the
DCP1 baseline a case is compared with, the harness's own torch kernels, the token-stream
model, which makes no marked calls) stays with the case it happened during, rank ``None``,
and says where it came from: nothing the sanitizer prints is dropped.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import CaseResult, CheckResult, Finding, KernelError

TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")
"""compute-sanitizer's tools, as ``--tool`` names them."""

EXECUTABLE = "compute-sanitizer"

CUDA_BIN_DIRS = ("/usr/local/cuda/bin",)
"""Where a CUDA toolkit installs ``compute-sanitizer`` when neither ``PATH`` nor
``$CUDA_HOME/bin`` has it."""

SANITIZER_CHECK = "sanitizer"
"""The name of the check the sanitizer's reports are filed under, in every report."""

PRINT_LIMIT = 1000
"""``--print-limit``: reports compute-sanitizer prints per worker (one scenario) before it
only counts them. Generous: a faulty kernel reports once per thread, and :func:`attach`
folds those repeats into one finding; past the limit :func:`attach` says how many went
unprinted instead of letting later cases pass."""

PREFIX = "========="
"""compute-sanitizer's prefix on every line it prints (its ``--prefix`` default)."""

MARKER = "dcpcheck-sanitizer-marker"
"""First word of the worker's marker lines; no sanitizer line starts with it."""

NO_CACHING_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
"""The worker's extra environment. PyTorch's caching allocator carves tensors out of large
``cudaMalloc`` segments and reuses freed blocks: memcheck would then see only segment
bounds (a read past a tensor lands in its neighbour) and initcheck would take a reused
block for initialized. Without caching, every tensor is its own allocation."""

_EXEC_DYING_WITH_PARENT = """\
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""
"""``python -c`` program that asks Linux to SIGKILL it when its parent (dcpcheck) exits and
then becomes compute-sanitizer (the request survives ``execve``): the worker under it gets
the same request of its own, so a dcpcheck killed outright takes both with it, as an
unsanitized worker is taken (``isolation_worker._die_with_parent``). Python's ``-c``, not a
module of this package: importing one would load torch, for nothing, before every worker."""


class SanitizerUnavailable(Exception):
    """compute-sanitizer cannot run here: no CUDA device, or no executable. One line."""


# ---------------------------------------------------------------------------------------
# The command


def find_executable(environ: Mapping[str, str] = os.environ) -> str:
    """compute-sanitizer's path: on ``PATH``, else in ``$CUDA_HOME/bin``, else in
    ``/usr/local/cuda/bin``; ``SanitizerUnavailable`` if none has it."""
    found = shutil.which(EXECUTABLE, path=environ.get("PATH"))
    if found is not None:
        return found
    candidates = [Path(environ["CUDA_HOME"]) / "bin"] if environ.get("CUDA_HOME") else []
    candidates += [Path(directory) for directory in CUDA_BIN_DIRS]
    for directory in candidates:
        path = directory / EXECUTABLE
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    searched = ", ".join(["PATH", *(str(d) for d in candidates)])
    raise SanitizerUnavailable(
        f"--sanitize needs NVIDIA's {EXECUTABLE} (part of the CUDA toolkit); not found in "
        f"{searched}: put it on PATH or set CUDA_HOME"
    )


def _known(tool: str) -> str:
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r} (expected one of {TOOLS})")
    return tool


def sanitizer_command(executable: str, tool: str) -> list[str]:
    """``compute-sanitizer`` and its options, to be followed by the worker's command."""
    return [
        executable,
        "--tool",
        _known(tool),
        # Reports go to stdout (no --log-file): see the module docstring.
        "--print-limit",
        str(PRINT_LIMIT),
        # Host backtraces of a Python process are libcuda, libtriton and CPython frames, dozens
        # of lines per report that say nothing about the kernel; device frames name the
        # kernel around an inlined function.
        "--show-backtrace",
        "device",
        # A CUDA API call that fails is raised by torch or Triton as an exception (the case's
        # error); the sanitizer's copy of it would fail cases over probes those libraries
        # make and expect to fail.
        "--report-api-errors",
        "no",
        # memcheck stops a faulting kernel. The default ("context") also destroys the CUDA
        # context, which would lose the rest of the scenario: its remaining ranks and cases
        # still run with "kernel" and are attributed one by one.
        "--destroy-on-device-error",
        "kernel",
        # The worker itself is the application; Triton's ptxas and other helpers it starts
        # use no CUDA (the default differs between releases: say it).
        "--target-processes",
        "application-only",
        # One report per pair of racing instructions, with its hazard count ("analysis"),
        # instead of one per pair of threads ("hazard"), or both ("all").
        *(["--racecheck-report", "analysis"] if tool == "racecheck" else []),
    ]


def worker_prefix(tool: str, backend: Backend) -> list[str]:
    """What goes before the worker's own command to run it under ``tool``:
    ``SanitizerUnavailable`` (one line, for exit 2) off CUDA or without the executable."""
    _known(tool)
    if backend.interpreted:
        raise SanitizerUnavailable(
            f"--sanitize {tool} needs a CUDA device: compute-sanitizer checks GPU kernels, and "
            "this run uses Triton's CPU interpreter (no CUDA device in use)"
        )
    return sanitizer_command(find_executable(), tool)


def launched_under(prefix: list[str], worker_argv: list[str]) -> list[str]:
    """The process to start: compute-sanitizer (``prefix``) running ``worker_argv``, behind
    a ``python -c`` that makes it die with this process (``_EXEC_DYING_WITH_PARENT``)."""
    return [
        sys.executable,
        "-c",
        _EXEC_DYING_WITH_PARENT,
        str(os.getpid()),
        *prefix,
        *worker_argv,
    ]


def new_log() -> BinaryIO:
    """A fresh log for one worker: an unnamed temporary file (nothing left on disk, whatever
    ends the run), to be the stdout of compute-sanitizer and the worker both."""
    return tempfile.TemporaryFile()


def take_log(log: BinaryIO) -> str:
    """The text of a worker's ``log``, which is closed after. Read with ``pread``: the file
    offset is the one the writers share, and must stay at the end while they write."""
    fd = log.fileno()
    text = os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
    log.close()
    return text


# ---------------------------------------------------------------------------------------
# Markers (written by the worker)


_LAUNCH = re.compile(rf"^{MARKER} (?P<edge>start|end) rank (?P<rank>\d+) of (?P<case>.+)$")
_CASE_DONE = re.compile(rf"^{MARKER} done (?P<case>.+)$")


def launch_marker(case_label: str, rank: int, started: bool) -> str:
    return f"{MARKER} {'start' if started else 'end'} rank {rank} of {case_label}\n"


def case_done_marker(case_label: str) -> str:
    """Written when a case's result is ready: the log before it is that case's."""
    return f"{MARKER} done {case_label}\n"


def case_label(result: CaseResult) -> str:
    """A result's case as ``Case.label`` names it, and the markers with it."""
    return f"{result.scenario}[dcp{result.dcp_size}]"


def write_marker(line: str) -> None:
    """Write one marker line straight to file descriptor 1 (the log): not through
    ``sys.stdout``, whose buffer would hold it back past the sanitizer's next report."""
    os.write(1, line.encode())


def launch_watcher(device: torch.device) -> Callable[[str, int, bool], None]:
    """The worker's ``runner.LAUNCH_WATCHER``: finish the device's work (compute-sanitizer
    reports a kernel's errors once it completes), then mark the call's start or end.

    A kernel compute-sanitizer stopped may fail that synchronization: the call is then
    the rank's ``KernelError`` (the case's ``error``, the sanitizer's report beside it),
    its end still marked. Whether the CUDA context survives it, the case's result shows
    (``isolation_worker.device_error``: a context that did not makes the case a ``crash``).
    """

    def watch(case: str, rank: int, started: bool) -> None:
        try:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except RuntimeError as exc:  # torch.AcceleratorError is one
            if not started:
                write_marker(launch_marker(case, rank, False))
            edge = "before" if started else "after"
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise KernelError(
                f"rank {rank}: {said} (synchronizing {edge} its kernel call, under "
                "compute-sanitizer)"
            ) from exc
        write_marker(launch_marker(case, rank, started))

    return watch


# ---------------------------------------------------------------------------------------
# Reading compute-sanitizer's text


@dataclass(frozen=True)
class SanitizerError:
    """One report of compute-sanitizer, as it printed it."""

    tool: str
    kind: str  # its first line: "Invalid __global__ read of size 2 bytes"
    kernel: str | None  # the kernel it names, None where it names none
    location: str  # its "at ..." line ("" if none): where in the kernel
    text: str  # the whole report, every line as printed

    @property
    def from_pytorch(self) -> bool:
        """Whether the kernel is one of PyTorch's own (ATen, c10, cub under them)."""
        return self.kernel is not None and any(ns in self.kernel for ns in ("at::", "c10::"))


_FRAMING = re.compile(
    r"^(COMPUTE-SANITIZER$|ERROR SUMMARY:|RACECHECK SUMMARY:|LEAK SUMMARY:"
    r"|Target application returned an error)"
)
"""Lines compute-sanitizer prints around reports, never inside one."""

_CONTINUATION = re.compile(
    r"^(at |and |by thread|Address |Access |Saved host|Host Frame|Device Frame|in |\[)"
)
"""How a report's later lines start, for output that does not indent them (older releases,
copies that lost their spaces); indented lines always continue the report above."""

_ERROR_SUMMARY = re.compile(r"^ERROR SUMMARY: (?P<count>[\d,]+) errors?$")

_NEW_STYLE_AT = re.compile(r"\bat (?P<function>.+?)\+0x[0-9a-fA-F]+\b")
"""``at kernel(args)+0x1a0 in file.py:12`` (recent releases: function, then offset)."""

_OLD_STYLE_AT = re.compile(r"\bat 0x[0-9a-fA-F]+ in (?P<rest>.+?)(?: \[\d[\d,]* hazards?\])?$")
"""``at 0x1a0 in file.py:12:kernel(args)`` or ``at 0x1a0 in kernel(args)`` (older ones)."""

_SOURCE_PREFIX = re.compile(r"^.+?\.\w+:\d+:(?P<function>.+)$")
"""``file.ext:line:`` before a function name, in the older style."""


def _content(line: str) -> str | None:
    """A sanitizer line without its prefix and the one space after it; None for any other
    line (the worker's markers, a kernel's own prints)."""
    if not line.startswith(PREFIX):
        return None
    return line[len(PREFIX) :].removeprefix(" ").rstrip()


def _function(line: str) -> str | None:
    """The function an ``at ...`` line or a ``Device Frame:`` line names."""
    if match := _NEW_STYLE_AT.search(line):
        return match["function"].strip()
    if match := _OLD_STYLE_AT.search(line):
        rest = match["rest"].strip()
        source = _SOURCE_PREFIX.match(rest)
        return source["function"] if source else rest
    frame = line.partition("Device Frame:")[2].strip()
    if frame:
        # "name+0x310 in file:214", or (older) "file:20:name (name : 0x8f0)"
        name = re.split(r"\+0x| \(| in | at line ", frame)[0].strip()
        source = _SOURCE_PREFIX.match(name)
        return source["function"] if source else name
    return None


def _error(tool: str, lines: list[str]) -> SanitizerError:
    body = [_content(line) or "" for line in lines]
    kind = body[0].strip()
    at_lines = [b.strip() for b in body if b.strip().startswith("at ") or " access at " in b]
    frames = [b for b in body if "Device Frame:" in b]
    location = at_lines[0] if at_lines else ""
    # The outermost device frame is the kernel; the "at" line may name a function inlined in it.
    named = _function(frames[-1]) if frames else None
    kernel = named or (_function(location) if location else None)
    return SanitizerError(tool, kind, kernel, location, "\n".join(lines))


def parse_report(text: str, tool: str) -> list[SanitizerError]:
    """Every report in compute-sanitizer's output ``text``, in order.

    A report starts at a line that is neither indented, nor a known continuation, nor
    compute-sanitizer's framing (its banner and summaries), and runs until an empty line,
    the next report or the framing. Lines without the prefix (markers, the kernel's own
    prints) are not the sanitizer's and are skipped. An unfamiliar line of the sanitizer's
    own becomes a report of its own: shown, never dropped.
    """
    errors: list[SanitizerError] = []
    block: list[str] = []

    def close() -> None:
        if block:
            errors.append(_error(tool, block))
            block.clear()

    for line in text.splitlines():
        content = _content(line)
        if content is None:
            continue
        if not content.strip() or _FRAMING.match(content):
            close()
        elif block and (content[0].isspace() or _CONTINUATION.match(content)):
            block.append(line.rstrip())
        else:
            close()
            block.append(line.rstrip())
    close()
    return errors


def error_summary(text: str) -> int | None:
    """The total of compute-sanitizer's ``ERROR SUMMARY: N errors`` (printed as its
    process exits; with unprinted ones too), or None if it printed none."""
    for line in text.splitlines():
        content = _content(line)
        if content is not None and (match := _ERROR_SUMMARY.match(content)):
            return int(match["count"].replace(",", ""))
    return None


def other_output(text: str) -> str:
    """The lines of the log that are neither the sanitizer's nor markers: what the worker's
    own stdout carried (a kernel's prints), for the parent to pass on to stderr."""
    kept = [
        line
        for line in text.splitlines(keepends=True)
        if _content(line) is None and not line.startswith(MARKER)
    ]
    return "".join(kept)


# ---------------------------------------------------------------------------------------
# Attributing reports to cases and ranks


@dataclass(frozen=True)
class Located:
    """A report and the rank's kernel call it was printed during: ``case`` and ``rank``
    None when it came between calls."""

    error: SanitizerError
    case: str | None
    rank: int | None


@dataclass(frozen=True)
class CaseWindow:
    """The reports printed while one case ran: up to its ``done`` marker, ``case`` its
    label; the last window, after every marker (a case the worker died on, or the worker's
    exit), has ``case`` None."""

    case: str | None
    errors: tuple[Located, ...]


def split_by_markers(text: str, tool: str) -> list[CaseWindow]:
    """The log of one worker, cut at its markers: each report located in the rank's call it
    was printed during (or none), reports grouped by the case they were printed during."""
    windows: list[CaseWindow] = []
    located: list[Located] = []
    pending: list[str] = []
    call: tuple[str, int] | None = None

    def flush() -> None:
        where = call if call is not None else (None, None)
        located.extend(Located(e, *where) for e in parse_report("\n".join(pending), tool))
        pending.clear()

    for line in text.splitlines():
        launch, done = _LAUNCH.match(line), _CASE_DONE.match(line)
        if launch is None and done is None:
            pending.append(line)
            continue
        flush()
        if launch is not None:
            call = (launch["case"], int(launch["rank"])) if launch["edge"] == "start" else None
        else:
            windows.append(CaseWindow(done["case"], tuple(located)))
            located.clear()
    flush()
    windows.append(CaseWindow(None, tuple(located)))
    return windows


def _where(located: Located, case: str, trailing: str) -> str:
    if located.case == case:
        return f"in rank {located.rank}'s kernel call"
    if located.case is not None:
        baseline = " (the DCP1 baseline this case is compared with)"
        note = baseline if located.case.endswith("[dcp1]") else ""
        return f"in rank {located.rank}'s kernel call of {located.case}{note}"
    return trailing


OUTSIDE_CALLS = (
    "outside every rank's kernel call (the harness's own work - building buffers, the "
    "oracle, the checks - or launches it does not mark, as the token-stream model's)"
)
AFTER_LAST_CASE = "after the last case's result, while the worker exited"
LOST_DURING = "while this case ran, before its worker was lost"


def _findings(case: str, errors: tuple[Located, ...], trailing: str) -> list[Finding]:
    """One finding per distinct report: repeats (the same kind at the same place in the same
    kernel and call, from other threads or blocks) are counted, the first one's text shown."""
    groups: dict[tuple, list[Located]] = {}
    for located in errors:
        e = located.error
        rank = located.rank if located.case == case else None
        where = _where(located, case, trailing)
        groups.setdefault((rank, where, e.tool, e.kind, e.kernel, e.location), []).append(located)
    findings = []
    for (rank, where, tool, kind, kernel, _), same in groups.items():
        first = same[0].error
        pytorch = " [a PyTorch kernel]" if first.from_pytorch else ""
        repeats = f"; {len(same)} such reports (other threads, blocks or launches)"
        detail = f"{tool}: {kind}, {where}{pytorch}{repeats if len(same) > 1 else ''}:\n"
        findings.append(Finding(kernel or EXECUTABLE, rank, detail + first.text, count=len(same)))
    return findings


def _unprinted(tool: str, total: int, printed: int) -> Finding:
    return Finding(
        EXECUTABLE,
        None,
        f"{tool}: compute-sanitizer counted {total} error(s) in this scenario's worker and "
        f"printed {printed} (--print-limit {PRINT_LIMIT}): the {total - printed} unprinted "
        "error(s) came after the last printed one, during its case or a later one of the "
        "scenario, so none of those cases can be called clean",
        count=total - printed,
    )


def with_sanitizer_check(result: CaseResult, findings: list[Finding]) -> CaseResult:
    """``result`` with the ``sanitizer`` check added: a passing case with findings fails; a
    case whose checks never ran (error, crash, timeout) keeps its status, and its error
    says what the sanitizer reported (the line a JUnit ``<error>`` shows)."""
    check = CheckResult(SANITIZER_CHECK, tuple(findings))
    updated = dataclasses.replace(result, checks=[*result.checks, check])
    if not findings:
        return updated
    if result.status == "pass":
        updated.status = "fail"
    elif result.status != "fail":
        said = f"compute-sanitizer: {findings[0].detail.splitlines()[0]}"
        updated.error = f"{result.error}; {said}" if result.error else said
    return updated


def attach(results: list[CaseResult], log: str, tool: str) -> list[CaseResult]:
    """``results`` of one sanitized job (every case answered or reported unanswered, in
    order) with the ``sanitizer`` check of each, from the job's worker's ``log``."""
    if not results:
        return results
    windows = split_by_markers(log, tool)
    index = {case_label(r): i for i, r in enumerate(results)}
    answered = {w.case for w in windows if w.case in index}
    findings: list[list[Finding]] = [[] for _ in results]
    last_reported = 0
    for window in windows:
        if window.case in index:
            i, trailing = index[window.case], OUTSIDE_CALLS
        else:  # after the last result: the case the worker was lost on, or its exit
            lost = [i for i, r in enumerate(results) if case_label(r) not in answered]
            i, trailing = (lost[0], LOST_DURING) if lost else (len(results) - 1, AFTER_LAST_CASE)
        findings[i] += _findings(case_label(results[i]), window.errors, trailing)
        if window.errors:
            last_reported = i
    total = error_summary(log)
    printed = sum(len(w.errors) for w in windows)
    if total is not None and total > printed:
        for i in range(last_reported, len(results)):
            findings[i].append(_unprinted(tool, total, printed))
    return [with_sanitizer_check(r, f) for r, f in zip(results, findings, strict=True)]
