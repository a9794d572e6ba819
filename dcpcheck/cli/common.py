"""What the commands share: their help text and exit-code errors, the options several of
them take, and the set-up steps (backend, kernel, isolation, report paths) that turn bad
input into one line and an exit code before any work starts."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dcpcheck import dcp, report
from dcpcheck.adapters import ADAPTER_NAMES
from dcpcheck.backend import BackendError, select_backend
from dcpcheck.console import err
from dcpcheck.contract import Kernel
from dcpcheck.exit_codes import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_KERNEL_LOAD,
    EXIT_TERMINATED,
    EXIT_USAGE,
)
from dcpcheck.isolation import DEFAULT_CASE_TIMEOUT_S, IsolatedKernel
from dcpcheck.kernel_loading import KernelLoadError, load_kernel
from dcpcheck.kernels import KERNELS
from dcpcheck.runner import CaseResult, KernelUnderTest, RunConfig, run
from dcpcheck.scenario import SCENARIO_DIR, Scenario, ScenarioError

HELP = """Differential checks of fused MLA norm + RoPE + cache-write kernels under DCP.

Exit codes (part of the interface; `git bisect run` relies on 125):

\b
  0    every check passed
  1    a check failed, or the kernel raised, crashed or timed out
  2    usage error or bad input, found before any work starts
  125  the kernel under test could not be loaded or compiled
  130  interrupted (Ctrl-C): the reports so far are written, marked partial
  143  terminated (SIGTERM, e.g. a CI job's timeout): the same, under its own code

A kernel that raises fails its case (error); under --isolate one that crashes or hangs
fails it as crash or timeout; the other cases still run, and the exit code is 1. Where a
kernel and the harness do not fit: a signature that no adapter takes is 125 (the kernel's
source decides it, so `git bisect run` skips such a revision); a shape or dtype the kernel
rejects when called is that case's error (only the kernel knows what it supports).
"""
"""The command group's help: what dcpcheck is and its exit codes (``run`` repeats the codes)."""


DCP_SIZE_MAX = 64
"""Largest ``--dcp``: every rank is simulated in this process, each with its own caches, so
the cost grows with the size; deployed DCP groups are a node or two (8-16 ranks)."""


SEED_MAX = 2**32 - 1
"""Largest seed (``--seed``, a scenario's ``seed``): ``case.build_case`` derives torch
generator seeds as ``seed * 1_000_003 + dcp_size``, which must fit in 64 bits."""


class InputError(click.ClickException):
    """Bad input: one line on stderr, exit 2."""

    exit_code = EXIT_USAGE


class KernelLoadFailure(click.ClickException):
    """The kernel under test cannot be loaded: exit 125 so ``git bisect run`` skips."""

    exit_code = EXIT_KERNEL_LOAD


class KernelFailed(click.ClickException):
    """The kernel under test raised where no case can hold the error (``hash``): exit 1."""

    exit_code = EXIT_FAIL


class Interrupted(click.ClickException):
    """Ctrl-C (exit 130) or SIGTERM (exit 143): one line saying what was kept."""

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C's ``KeyboardInterrupt`` would be, so
    a run that a CI job's timeout stops writes its partial reports the same way."""


def raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def stop_reason(stop: BaseException | None) -> tuple[str, int]:
    """What stopped the command, as printed, and its exit code."""
    if isinstance(stop, Terminated):
        return "terminated", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED


def parse_dcp_sizes(text: str) -> tuple[int, ...]:
    """``--dcp``: ``"4"`` or ``"1,2,4,8"``, each size in 1..DCP_SIZE_MAX."""
    try:
        return dcp.parse_dcp_sizes(text, DCP_SIZE_MAX)
    except ValueError as exc:
        raise InputError(f"--dcp: {exc}") from None


device_option = click.option(
    "--device",
    type=click.Choice(["auto", "cuda", "cpu"]),
    default="auto",
    show_default=True,
    help="auto: CUDA if present, else Triton's interpreter on the CPU.",
)


adapter_option = click.option(
    "--adapter",
    type=click.Choice(ADAPTER_NAMES),
    default="auto",
    show_default=True,
    help="How to call an external kernel: auto picks vLLM's adapter when the function's "
    "signature is a known vLLM fused_norm_rope shape, native the harness's protocol.",
)


kernel_option = click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="Registry name (see `dcpcheck list kernels`), package.module:function, "
    "or path/to/file.py:function implementing the kernel protocol.",
)


scenario_option = click.option(
    "--scenario",
    "patterns",
    multiple=True,
    metavar="NAME|GLOB",
    help="Scenario names or globs (repeatable; default: all shipped scenarios).",
)


scenario_dir_option = click.option(
    "--scenario-dir",
    type=click.Path(path_type=Path),
    default=SCENARIO_DIR,
    show_default=True,
    help="Where scenario TOML files live.",
)


json_option = click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a JSON report here (atomically).",
)


junit_option = click.option(
    "--junit",
    "junit_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a JUnit XML report here (atomically).",
)


no_tokens_option = click.option(
    "--no-tokens",
    is_flag=True,
    help="Skip the end-to-end token-stream check (a tiny MLA model's greedy streams at "
    "DCP1 and the largest --dcp size must hash identically; see `dcpcheck hash`).",
)


fail_fast_option = click.option(
    "-x", "--fail-fast", is_flag=True, help="Stop at the first failing case."
)


isolate_option = click.option(
    "--isolate/--no-isolate",
    default=None,
    help="Run the kernel in a worker process, so that a crash (segfault, CUDA illegal "
    "memory access) or a hang fails its case (status crash / timeout) and the run goes on "
    "with a fresh worker. Default: on for kernels from outside the registry "
    "(module:function, file.py:function), off for registry kernels.",
)


case_timeout_option = click.option(
    "--case-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help=f"Seconds to wait for each case's result before killing the worker and reporting "
    f"the case as timeout (default {DEFAULT_CASE_TIMEOUT_S:g}: a scenario's first case "
    "includes its DCP1 baseline and, on a GPU, Triton's compilation). Implies --isolate.",
)


def open_backend(device: str):
    """The ``--device`` backend, announced on stderr (the interpreter says so); exit 2 if
    it cannot be had (``cuda`` without a GPU)."""
    try:
        backend = select_backend(device)
    except BackendError as exc:
        raise InputError(str(exc)) from None
    err.print(f"[bold]backend:[/] {backend.describe()}")
    return backend


def load(name: str, adapter: str = "auto") -> Kernel:
    """The ``--kernel`` under ``--adapter``; exit 125 if it does not load."""
    try:
        return load_kernel(name, adapter)
    except KernelLoadError as exc:
        raise KernelLoadFailure(str(exc)) from None


def case_timeout_for(kernel_name: str, isolate: bool | None, case_timeout: float | None):
    """The per-case timeout if the kernel is to run isolated, else None (in process).

    Isolation defaults to on for kernels from outside the registry (code this project has
    not vetted) and off for registry kernels; an explicit ``--case-timeout`` asks for it,
    since only a worker process can be stopped in the middle of a case.
    """
    if case_timeout is not None and not (math.isfinite(case_timeout) and case_timeout > 0):
        raise InputError(f"--case-timeout: must be a number of seconds > 0, got {case_timeout}")
    if isolate is False and case_timeout is not None:
        raise InputError(
            "--case-timeout needs --isolate: only a worker process can be stopped mid-case"
        )
    if isolate is None:
        isolate = case_timeout is not None or kernel_name not in KERNELS
    if not isolate:
        return None
    return DEFAULT_CASE_TIMEOUT_S if case_timeout is None else case_timeout


@contextlib.contextmanager
def kernel_under_test(
    name: str, adapter: str, backend, case_timeout: float | None
) -> Iterator[KernelUnderTest]:
    """The kernel, in this process (``case_timeout`` None) or behind a worker process.

    The kernel is loaded here first in both cases, so a load error is one line and exit
    125 without starting a process; leaving the ``with`` kills the worker, whatever ends it.
    """
    kernel = load(name, adapter)
    if case_timeout is None:
        yield kernel
        return
    isolated = IsolatedKernel(name, adapter, backend, case_timeout)
    try:
        isolated.start()
    except KernelLoadError as exc:
        raise KernelLoadFailure(str(exc)) from None
    try:
        yield isolated
    finally:
        isolated.close()


def check_report_paths(*paths: Path | None) -> None:
    """Every report path must be writable, and each its own file, before any work."""
    given = [path for path in paths if path is not None]
    if len({path.resolve() for path in given}) < len(given):
        raise InputError(f"--json and --junit name the same file: {given[0]}")
    for path in given:
        try:
            report.ensure_writable(path)
        except report.ReportPathError as exc:
            raise InputError(str(exc)) from None


def check_home(home: Path) -> None:
    try:
        report.ensure_directory_writable(home)
    except report.ReportPathError as exc:
        raise InputError(f"--home: {exc}") from None


def check_overrides(scenario: Scenario, dcp_sizes: tuple[int, ...] | None, seed) -> None:
    """``scenario`` as it will run (``Scenario`` validates the layout at each DCP size), and
    its seed within ``SEED_MAX``."""
    try:
        dataclasses.replace(
            scenario,
            dcp_sizes=dcp_sizes or scenario.dcp_sizes,
            seed=scenario.seed if seed is None else seed,
        )
    except ScenarioError as exc:
        raise InputError(f"{exc} (with the --dcp / --seed given)") from None
    if scenario.seed > SEED_MAX:
        where = scenario.source if scenario.source is not None else scenario.name
        raise InputError(f"{where}: key 'seed': must be <= {SEED_MAX}, got {scenario.seed}")


def run_with_progress(
    kernel: KernelUnderTest,
    scenarios: list[Scenario],
    config: RunConfig,
    backend,
    keep: Callable[[CaseResult], None],
) -> None:
    """Run with a progress bar on stderr, handing each result to ``keep`` as it lands, so
    that an interrupted run still reports what it did (marked partial)."""
    if not scenarios:
        return
    total = sum(len(config.sizes_of(s)) for s in scenarios)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("checking", total=total)

        def on_result(result: CaseResult) -> None:
            keep(result)
            progress.update(
                task, advance=1, description=escape(f"{result.scenario}[dcp{result.dcp_size}]")
            )

        run(kernel, scenarios, config, backend, on_result=on_result)
