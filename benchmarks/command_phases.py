"""Where one dcpcheck command's wall time goes, part by part and phase by phase, in the
command's own process.

    PYTHONPATH=$PWD python3 benchmarks/command_phases.py [OPTIONS] -- run --dcp 4

When the command returns, one ``[phase]`` line per part is printed on stderr (the
command's own output goes where it always does), then the total. A part is what one
piece of the command does: ``imports`` (starting up: torch, Triton, dcpcheck, before the
command runs), ``command`` (parsing, the kernel's load, what no other part holds),
``preflight`` (reading scenarios, the memory estimates), ``backend`` (choosing the device:
the CUDA context), ``gate binaries`` (the plain gate's binaries compiled ahead by worker
processes, ``dcpcheck.gate_binaries``), ``fused-norm-rope dry pass`` (``compile_ahead``),
each op's cases (the fused op's, then each op package's, as the gate runs them), ``token
streams`` (the tiny MLA model's chain), ``property search``, ``report`` (the JSON and JUnit
files, the judged files' digests) and ``console`` (the results table). Each part's time is
split into the phases:

* ``imports``: modules imported there (late imports; the first use of an op imports it);
* ``build``: a case's inputs and buffers (``build_case``, ``make_activations``,
  ``scenario_inputs``, wherever an op defines them);
* ``oracle``: time in ``reference/``, the torch oracle, whoever calls it;
* ``compile``: Triton's compile or load of a binary on this thread
  (``JITFunction._do_compile``), and the wait for the compile threads at the end of the
  dry pass; ``key``: Triton's cache key (a sha256 of ``libtriton.so``, once a process);
* ``launches``: the kernel under test's calls (the fused op's ``launch_all``, an op
  package's calls through ``op_cases.raising`` or its ``launch_all``). On a GPU they are
  asynchronous: the device's time shows where the host waits for it (mostly ``checks``);
* ``checks``: the contract checks (each op's ``judge``, the fused op's ``check_case``, input
  snapshots, determinism);
* ``gc``: Python's cyclic garbage collector, wherever it ran;
* ``other``: the rest of the part. In the dry pass that is mostly its compile requests
  (the kernel's launch path, each Triton launch turned into a request).

Each second is counted once, in the innermost phase it was spent in, on the main thread
only: the compile threads' work overlaps it. What the whole command takes beyond the total
(starting Python, and leaving it) is its wall time, timed from outside, minus the total.
Under Triton's interpreter (the CPU) there is nothing to compile and no dry pass; the
launches are interpreted there, so compare the other phases across trees. Two options
change the run, to measure what a change would buy before making it:

* ``--no-compile-ahead``: skip ``compile_ahead``, so every case loads or compiles its own
  binaries (with Triton's cache warm: what the dry pass costs);
* ``--no-gate-binaries``: skip ``gate_binaries``, so the gate's binaries compile as its
  cases (and the dry pass) first launch them;
* ``--batched-max N``: up to N scenarios per property-search example instead of
  ``search.BATCHED_SCENARIOS_MAX``.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import builtins  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable  # noqa: E402

PHASES = ("imports", "build", "oracle", "compile", "key", "launches", "checks", "gc", "other")

PHASE_OF_NAME = {
    "build_case": "build",
    "make_activations": "build",
    "scenario_inputs": "build",
    "launch_all": "launches",
    "check_case": "checks",
    "judge": "checks",
    "judge_paths": "checks",
    "chain": "checks",
    "read_agrees_with_write": "checks",
    "input_changes": "checks",
    "snapshot_inputs": "checks",
    "launch_differences": "checks",
    "check_deterministic": "checks",
    "launch_output_tolerances": "checks",
}
"""The phase of a function of ``dcpcheck.ops`` by its name, in whichever op defines it."""


class Clock:
    """Seconds by (part, phase), each counted in the innermost phase entered (module
    docstring); ``parts`` in the order they were first entered."""

    def __init__(self) -> None:
        self.spent: dict[tuple[str, str], float] = defaultdict(float)
        self.parts: list[str] = ["imports", "command"]
        self.stack: list[tuple[str, str]] = [("imports", "imports")]
        self.since = START
        self.main = threading.get_ident()

    def begin(self) -> None:
        """The command starts: what ran before it was starting up (``imports``)."""
        self.leave()
        self.stack.append(("command", "other"))

    def enter(self, part: str | None, phase: str) -> None:
        now = time.perf_counter()
        self.spent[self.stack[-1]] += now - self.since
        part = part or self.stack[-1][0]
        if part not in self.parts:
            self.parts.append(part)
        self.stack.append((part, phase))
        self.since = now

    def leave(self) -> None:
        now = time.perf_counter()
        self.spent[self.stack.pop()] += now - self.since
        self.since = now

    def report(self) -> None:
        self.enter(None, "other")  # counts the command's part up to now
        width = max(len(part) for part in self.parts)
        header = " ".join(f"{phase:>8}" for phase in (*PHASES, "total"))
        print(f"[phase] {'part':<{width}} {header}", file=sys.stderr)
        for part in self.parts:
            seconds = [self.spent.get((part, phase), 0.0) for phase in PHASES]
            cells = " ".join(f"{s:8.3f}" for s in (*seconds, sum(seconds)))
            print(f"[phase] {part:<{width}} {cells}", file=sys.stderr)
        total = time.perf_counter() - START
        print(f"[phase] total, until the command returned: {total:.3f} s", file=sys.stderr)


CLOCK = Clock()
WRAPPED: dict[int, Callable] = {}
"""Each wrapped function's wrapper, by the original's ``id``: a module that imported the
original by name is pointed at the wrapper too (``rebind``)."""


def counter(function: Callable, part: str | None, phase: str, part_of=None) -> Callable:
    """``function`` counted in ``part`` (None: the caller's; ``part_of(*args)`` names it
    from the arguments) and ``phase``."""

    @functools.wraps(function)
    def counted(*args, **kwargs):
        if threading.get_ident() != CLOCK.main:
            return function(*args, **kwargs)
        CLOCK.enter(part_of(*args) if part_of else part, phase)
        try:
            return function(*args, **kwargs)
        finally:
            CLOCK.leave()

    return counted


def timed(function: Callable, part: str | None = None, phase: str = "other", part_of=None):
    """``counter`` of a function that lives as long as the process (a module's), the same
    wrapper each time, kept in ``WRAPPED``."""
    if id(function) not in WRAPPED:
        counted = counter(function, part, phase, part_of)
        WRAPPED[id(function)] = WRAPPED[id(counted)] = counted
    return WRAPPED[id(function)]


def timed_raising(raising: Callable) -> Callable:
    """``op_cases.raising`` whose routine's calls count as launches."""

    @functools.wraps(raising)
    def launches_of(routine):
        return counter(raising(routine), None, "launches")

    return launches_of


SEEN: set[str] = set()


def rebind() -> None:
    """Wrap the functions of modules loaded since the last call that have a phase (all of
    ``reference/``'s, those of ``dcpcheck.ops`` named in ``PHASE_OF_NAME``), and point the
    globals of those modules that hold a wrapped original at its wrapper. A module imports
    by name only from modules loaded before it, whose globals were rebound already."""
    loaded = [(n, m) for n, m in list(sys.modules.items()) if n not in SEEN and m is not None]
    SEEN.update(name for name, _ in loaded)
    ours = [(n, m) for n, m in loaded if n.split(".")[0] in ("dcpcheck", "reference")]
    for name, module in ours:
        for attr, value in vars(module).items():
            if not inspect.isfunction(value) or value.__module__ != name:
                continue
            if name.split(".")[0] == "reference":
                timed(value, phase="oracle")
            elif name.startswith("dcpcheck.ops.") and attr in PHASE_OF_NAME:
                timed(value, phase=PHASE_OF_NAME[attr])
            elif name == "dcpcheck.ops.op_cases" and attr == "raising":
                WRAPPED[id(value)] = timed_raising(value)
    for _, module in ours:
        for attr, value in list(vars(module).items()):
            wrapper = WRAPPED.get(id(value))
            if wrapper is not None and wrapper is not value:
                setattr(module, attr, wrapper)


def counted_imports(importer: Callable) -> Callable:
    """``importer`` (``__import__``, ``import_module``) counted as the ``imports`` phase;
    what it loaded is wrapped and rebound (``rebind``)."""

    @functools.wraps(importer)
    def importing(*args, **kwargs):
        if threading.get_ident() != CLOCK.main:
            return importer(*args, **kwargs)
        loaded = len(sys.modules)
        CLOCK.enter(None, "imports")
        try:
            return importer(*args, **kwargs)
        finally:
            CLOCK.leave()
            if len(sys.modules) != loaded and CLOCK.stack[-1][1] != "imports":
                CLOCK.enter("this script (rebinding)", "other")
                rebind()
                CLOCK.leave()

    return importing


def collecting(phase: str, info: dict) -> None:
    """A ``gc.callbacks`` entry: the collector's pauses on the main thread as ``gc``."""
    if threading.get_ident() != CLOCK.main:
        return
    if phase == "start":
        CLOCK.enter(None, "gc")
    else:
        CLOCK.leave()


def patch(module, name: str, part: str | None = None, phase: str = "other", part_of=None):
    setattr(module, name, timed(getattr(module, name), part, phase, part_of))


def patch_triton() -> None:
    """Triton's compile, key and compile threads' wait: only once the backend is chosen
    (Triton is imported after ``TRITON_INTERPRET`` is set)."""
    from triton.runtime import _async_compile, cache, jit

    patch(jit.JITFunction, "_do_compile", phase="compile")
    patch(cache, "triton_key", phase="key")
    patch(_async_compile.AsyncCompileMode, "__exit__", phase="compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-compile-ahead", action="store_true")
    parser.add_argument("--no-gate-binaries", action="store_true")
    parser.add_argument("--batched-max", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="dcpcheck's arguments")
    args = parser.parse_args()
    gc.callbacks.append(collecting)
    from dcpcheck.__main__ import uncollected

    with uncollected():  # as dcpcheck's entry point loads it
        import dcpcheck.cli as cli
    from dcpcheck.cli import op_run, preflight
    from dcpcheck.cli import run as run_module
    from dcpcheck.ops.fused_norm_rope import search
    from dcpcheck.ops.fused_norm_rope import session as fused_session
    from dcpcheck.workflows import session

    opened = run_module.open_backend

    def open_backend(*args, **kwargs):
        backend = opened(*args, **kwargs)
        if not backend.interpreted:
            patch_triton()
        return backend

    run_module.open_backend = op_run.open_backend = timed(open_backend, "backend")
    # The session reaches the fused op's run, dry pass and search through its SESSION_CASES.
    cases = fused_session.SESSION_CASES
    ahead = timed(cases.compile_ahead, "fused-norm-rope dry pass")
    fused_session.SESSION_CASES = dataclasses.replace(
        cases,
        compile_ahead=(lambda *_, **__: None) if args.no_compile_ahead else ahead,
        run=timed(cases.run, "fused-norm-rope"),
        search=timed(cases.search, "property search"),
    )
    if args.no_gate_binaries:
        run_module._compile_gate_binaries = lambda *_: None
    else:
        patch(run_module, "_compile_gate_binaries", "gate binaries")
    patch(op_run, "judge_cases", part_of=lambda op, *_: op.name)
    patch(session, "token_stream_case", "token streams")
    for name in ("named_scenarios", "check_cost"):
        patch(preflight, name, "preflight")
    for module in (run_module, op_run):
        patch(module, "write_reports", "report")
        patch(module, "print_results", "console")
    if args.batched_max is not None:
        search.BATCHED_SCENARIOS_MAX = args.batched_max
    rebind()
    builtins.__import__ = counted_imports(builtins.__import__)
    importlib.import_module = counted_imports(importlib.import_module)
    command = cli.main

    def reported(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        finally:
            CLOCK.report()

    cli.main = reported
    CLOCK.begin()
    sys.argv = ["dcpcheck", *(a for a in args.command if a != "--")]
    cli.command_line()  # leaves as dcpcheck does


if __name__ == "__main__":
    main()
