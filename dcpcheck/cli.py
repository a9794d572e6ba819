"""The ``dcpcheck`` command line: a thin layer over ``dcpcheck.runner`` and ``dcpcheck.search``.

Exit codes (part of the interface; ``git bisect run`` relies on 125):

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

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dcpcheck import bisect as bisection
from dcpcheck import dcp, ownership_map, report, search, selftest
from dcpcheck.adapters import ADAPTER_NAMES
from dcpcheck.backend import BackendError, select_backend
from dcpcheck.console import err, out, print_results, print_search, print_stats, print_streams
from dcpcheck.contract import CacheLayout, Kernel
from dcpcheck.exit_codes import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_KERNEL_LOAD,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
)
from dcpcheck.isolation import DEFAULT_CASE_TIMEOUT_S, IsolatedKernel
from dcpcheck.kernel_loading import KernelLoadError, load_kernel
from dcpcheck.kernels import KERNELS
from dcpcheck.runner import (
    CaseResult,
    KernelUnderTest,
    RunConfig,
    run,
    token_stream_case,
)
from dcpcheck.scenario import (
    SCENARIO_DIR,
    Scenario,
    ScenarioError,
    load_scenario,
    load_scenarios,
)
from dcpcheck.token_streams import compare_streams, stream_config_for

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


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def parse_dcp_sizes(text: str) -> tuple[int, ...]:
    """``--dcp``: ``"4"`` or ``"1,2,4,8"``, each size in 1..DCP_SIZE_MAX."""
    try:
        return dcp.parse_dcp_sizes(text, DCP_SIZE_MAX)
    except ValueError as exc:
        raise InputError(f"--dcp: {exc}") from None


@click.group(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    pass


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


@cli.command("run", epilog=__doc__.split("\n\n", 1)[1])
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N...]",
    help="DCP sizes to simulate, e.g. 4 or 1,2,4,8 (default: each scenario's own). "
    "DCP1 always runs as the baseline for the cross-rank checks.",
)
@kernel_option
@scenario_option
@scenario_dir_option
@click.option(
    "--seed",
    type=click.IntRange(0, SEED_MAX),
    default=None,
    help="Override every scenario's value seed (explores new values). For the property "
    "search: Hypothesis's seed, so it draws other scenarios (default: a fixed seed, the "
    "same scenarios on every run).",
)
@click.option(
    "--examples",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="After the named scenarios, run the property search over N drawn scenarios "
    "(default with --profile or --property-only: the profile's count).",
)
@click.option(
    "--property-only",
    is_flag=True,
    help="Run only the property search, no named scenarios.",
)
@click.option(
    "--profile",
    "profile_name",
    type=click.Choice(list(search.PROFILES)),
    default=None,
    help="Property search sizes and counts (runs the search; default ci). "
    + "; ".join(f"{p.name}: {p.description}" for p in search.PROFILES.values())
    + ".",
)
@click.option(
    "--stats",
    is_flag=True,
    help="Report cases / examples run, per second, and how many rank launches had an "
    "all-negative, mixed or fully-owned slot mapping.",
)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    default=search.DEFAULT_HOME,
    show_default=True,
    envvar=search.HOME_ENV,
    help=f"Run directory (env {search.HOME_ENV}): shrunk failures go to HOME/failures/, "
    "Hypothesis's example database to HOME/hypothesis/.",
)
@device_option
@json_option
@junit_option
@adapter_option
@no_tokens_option
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Write a self-contained HTML report and a PNG ownership map per case here: "
    "tokens x ranks colored by ownership, with each field's verdict.",
)
@click.option(
    "--launcher",
    type=click.Choice(["none", "torchrun"]),
    default="none",
    show_default=True,
    help="torchrun: every DCP rank is a real process on its own device (NCCL on GPUs, "
    "gloo on the CPU), results gathered to rank 0; --dcp names one size N (and 1).",
)
@click.option(
    "--rank-timeout",
    type=click.FloatRange(min=1.0),
    default=None,
    metavar="SECONDS",
    help="With --launcher torchrun: seconds without progress from any rank before the run "
    "is stopped, naming the rank(s) that hung.",
)
@fail_fast_option
@isolate_option
@case_timeout_option
@click.pass_context
def run_command(
    ctx: click.Context,
    dcp_text,
    kernel_name,
    patterns,
    scenario_dir,
    seed,
    examples,
    property_only,
    profile_name,
    stats,
    home,
    device,
    json_path,
    junit_path,
    adapter,
    no_tokens,
    report_dir,
    launcher,
    rank_timeout,
    fail_fast,
    isolate,
    case_timeout,
) -> None:
    """Run the contract checks of a kernel over scenarios x DCP sizes, then, if asked, the
    property search over drawn scenarios (a failure is shrunk and saved under HOME).

    A failing named-scenario case is saved too, as a scenario file under HOME/failures/
    (its seed and DCP size baked in) that `dcpcheck repro` replays."""
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    if launcher == "torchrun":
        raise SystemExit(_launch_ranks(ctx, dcp_sizes, rank_timeout))
    if rank_timeout is not None:
        raise InputError("--rank-timeout needs --launcher torchrun")
    if property_only and patterns:
        raise InputError("--scenario and --property-only exclude each other")
    timeout = _case_timeout(kernel_name, isolate, case_timeout)
    _check_report_paths(json_path, junit_path)
    if report_dir is not None:
        _check_report_dir(report_dir)
    search_config = None
    if property_only or examples is not None or profile_name is not None:
        _check_home(home)  # the search writes its example database there
        profile = search.PROFILES[profile_name or "ci"]
        search_config = search.SearchConfig(kernel_name, profile, examples, dcp_sizes, seed, home)
    scenarios = [] if property_only else _scenarios(patterns, scenario_dir, dcp_sizes, seed)
    backend = _backend(device)
    config = RunConfig(kernel_name, dcp_sizes, seed, fail_fast)

    named: list[CaseResult] = []
    saved: dict[tuple[str, int], Path] = {}
    searched: search.SearchResult | None = None
    started = time.perf_counter()
    named_seconds = 0.0
    partial, stopped = True, None
    with _kernel_under_test(kernel_name, adapter, backend, timeout) as kernel:
        by_name = {s.name: s for s in scenarios}
        saving = True  # until HOME turns out not to be writable: then one warning

        def keep(result: CaseResult) -> None:
            nonlocal saving
            named.append(result)
            if result.status == "pass" or not saving:
                return
            try:
                path = _save_failed_case(by_name[result.scenario], result, config, home)
            except OSError as exc:
                saving = False
                err.print(
                    f"dcpcheck: warning: cannot save failing cases under {home}: "
                    f"{exc.strerror} (see --home)",
                    markup=False,
                    soft_wrap=True,
                )
            else:
                saved[(result.scenario, result.dcp_size)] = path

        try:
            _run_with_progress(kernel, scenarios, config, backend, keep)
            failed = any(r.status != "pass" for r in named)
            if scenarios and not no_tokens and not (fail_fast and failed):
                with err.status("token streams: tiny MLA model, DCP1 vs DCPn"):
                    named.append(token_stream_case(kernel, config, backend))
            named_seconds = time.perf_counter() - started
            failed = any(r.status != "pass" for r in named)
            if search_config is not None and not (fail_fast and failed):
                searched = _search_with_progress(kernel, search_config, backend)
            partial = False
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM, wherever the run was
            stopped = stop  # reported below, once the reports are written, the worker gone
        finally:
            # The shrunk failure's replay goes into the reports like any other case.
            replayed = searched.replay if searched is not None else []
            _write_reports(named + replayed, config, backend, json_path, junit_path, partial)
    if scenarios:
        print_results(named, saved)
    if report_dir is not None and stopped is None:
        written = ownership_map.write_report_dir(
            named, scenarios, report_dir, kernel_name=kernel_name
        )
        out.print(f"report: {escape(str(written[0]))}", soft_wrap=True)
    if stopped is not None:
        written = [str(path) for path in (json_path, junit_path) if path is not None]
        kept = f"; partial report(s): {', '.join(written)}" if written else ""
        how, code = _stop_reason(stopped)
        raise Interrupted(f"{how} after {len(named)} case(s){kept}", code)
    if searched is not None:
        print_search(searched, search_config)
    if stats:
        print_stats(named, named_seconds, searched)
    passed = all(r.status == "pass" for r in named) and (searched is None or searched.passed)
    raise SystemExit(EXIT_OK if passed else EXIT_FAIL)


RANK_OPTIONS = (
    "dcp_text",
    "patterns",
    "scenario_dir",
    "seed",
    "kernel_name",
    "adapter",
    "device",
    "json_path",
    "junit_path",
    "no_tokens",
    "fail_fast",
    "stats",
)
"""The ``run`` options a real-rank run passes on to every rank (dcpcheck.distributed)."""


def _launch_ranks(ctx: click.Context, dcp_sizes, rank_timeout: float | None) -> int:
    """``run --launcher torchrun``: start one process per rank; their exit code."""
    sizes = [n for n in (dcp_sizes or ()) if n != 1]
    if len(sizes) != 1:
        raise InputError("--launcher torchrun: --dcp must name one size N > 1 (and maybe 1)")
    given = {
        name
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        and value not in (None, False, ())
    }
    unsupported = given - set(RANK_OPTIONS) - {"launcher", "rank_timeout"}
    if unsupported:
        names = ", ".join(sorted(f"--{n.replace('_', '-')}" for n in unsupported))
        raise InputError(f"--launcher torchrun does not support {names}")
    argv = ["run"]
    for command_param in ctx.command.params:
        name = command_param.name
        if name not in given or name not in RANK_OPTIONS:
            continue
        flag = command_param.opts[0]
        value = ctx.params[name]
        if command_param.is_flag:
            argv.append(flag)
        elif command_param.multiple:
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    from dcpcheck import distributed  # it builds its per-rank commands from this module's options

    timeout = rank_timeout or distributed.DEFAULT_RANK_TIMEOUT_S
    return distributed.launch(sizes[0], argv, timeout)


def _check_report_dir(report_dir: Path) -> None:
    try:
        report.ensure_directory_writable(report_dir)
    except report.ReportPathError as exc:
        raise InputError(str(exc)) from None


@cli.command("selftest")
@click.option(
    "--profile",
    "profile_name",
    type=click.Choice(list(selftest.PROFILES)),
    default="ci",
    show_default=True,
    help="; ".join(f"{name}: {p.description}" for name, p in selftest.PROFILES.items()),
)
@click.option(
    "--mutant",
    "mutant_names",
    multiple=True,
    metavar="NAME",
    help="Only these mutants (repeatable; see `dcpcheck list mutants`).",
)
@device_option
def selftest_command(profile_name: str, mutant_names: tuple[str, ...], device: str) -> None:
    """Run dcpcheck against every mutant of the project's kernel: exit 0 only when the
    correct kernel passes and every mutant is caught."""
    mutants = selftest.MUTANTS
    if mutant_names:
        known = {m.name: m for m in mutants}
        unknown = [n for n in mutant_names if n not in known]
        if unknown:
            raise InputError(f"--mutant: unknown {', '.join(unknown)} (see dcpcheck list mutants)")
        mutants = tuple(known[n] for n in mutant_names)
    backend = _backend(device)
    with err.status("selftest") as status:
        report_ = selftest.run_selftest(
            selftest.PROFILES[profile_name],
            backend,
            mutants=mutants,
            on_row=lambda row: status.update(f"selftest: {row.kernel} {row.status.value}"),
        )
    out.print(selftest.selftest_table(report_))
    raise SystemExit(EXIT_OK if report_.passed else EXIT_FAIL)


@cli.command("repro")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="The kernel to replay it on (as for `dcpcheck run --kernel`).",
)
@click.option(
    "--dcp",
    "dcp_text",
    default=None,
    metavar="N[,N...]",
    help="DCP sizes to simulate instead of the file's own.",
)
@device_option
@adapter_option
@isolate_option
@case_timeout_option
def repro_command(
    file: Path,
    kernel_name: str,
    dcp_text: str | None,
    device: str,
    adapter: str,
    isolate: bool | None,
    case_timeout: float | None,
) -> None:
    """Replay one scenario FILE, such as a failure saved under .dcpcheck/failures/ (by the
    property search or a failing `dcpcheck run`): exit 1 if the kernel still fails it, 0
    if it passes."""
    dcp_sizes = parse_dcp_sizes(dcp_text) if dcp_text is not None else None
    timeout = _case_timeout(kernel_name, isolate, case_timeout)
    try:
        scenario = load_scenario(file)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{file}: cannot read: {exc.strerror}") from None
    _check_overrides(scenario, dcp_sizes, None)
    backend = _backend(device)
    results: list[CaseResult] = []
    with _kernel_under_test(kernel_name, adapter, backend, timeout) as kernel:
        config = RunConfig(kernel_name, dcp_sizes)
        _run_with_progress(kernel, [scenario], config, backend, results.append)
    print_results(results)
    raise SystemExit(EXIT_OK if all(r.status == "pass" for r in results) else EXIT_FAIL)


def _backend(device: str):
    try:
        backend = select_backend(device)
    except BackendError as exc:
        raise InputError(str(exc)) from None
    err.print(f"[bold]backend:[/] {backend.describe()}")
    return backend


def _kernel(name: str, adapter: str = "auto") -> Kernel:
    try:
        return load_kernel(name, adapter)
    except KernelLoadError as exc:
        raise KernelLoadFailure(str(exc)) from None


def _case_timeout(kernel_name: str, isolate: bool | None, case_timeout: float | None):
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
def _kernel_under_test(
    name: str, adapter: str, backend, case_timeout: float | None
) -> Iterator[KernelUnderTest]:
    """The kernel, in this process (``case_timeout`` None) or behind a worker process.

    The kernel is loaded here first in both cases, so a load error is one line and exit
    125 without starting a process; leaving the ``with`` kills the worker, whatever ends it.
    """
    kernel = _kernel(name, adapter)
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


def _check_report_paths(*paths: Path | None) -> None:
    """Every report path must be writable, and each its own file, before any work."""
    given = [path for path in paths if path is not None]
    if len({path.resolve() for path in given}) < len(given):
        raise InputError(f"--json and --junit name the same file: {given[0]}")
    for path in given:
        try:
            report.ensure_writable(path)
        except report.ReportPathError as exc:
            raise InputError(str(exc)) from None


def _check_home(home: Path) -> None:
    try:
        report.ensure_directory_writable(home)
    except report.ReportPathError as exc:
        raise InputError(f"--home: {exc}") from None


def _scenarios(
    patterns: tuple[str, ...], scenario_dir: Path, dcp_sizes: tuple[int, ...] | None, seed
) -> list[Scenario]:
    """The scenarios to run, each checked with the ``--dcp`` / ``--seed`` overrides applied,
    so that a combination that cannot run is an error before any work."""
    if not scenario_dir.is_dir():
        what = "does not exist" if not scenario_dir.exists() else "is not a directory"
        raise InputError(f"--scenario-dir: {scenario_dir} {what}")
    try:
        scenarios = load_scenarios(list(patterns), scenario_dir)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{exc.filename}: cannot read: {exc.strerror}") from None
    if not scenarios:
        raise InputError(f"--scenario-dir: no scenario files (*.toml) in {scenario_dir}")
    for scenario in scenarios:
        _check_overrides(scenario, dcp_sizes, seed)
    return scenarios


def _check_overrides(scenario: Scenario, dcp_sizes: tuple[int, ...] | None, seed) -> None:
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


def _failure_phrase(result: CaseResult) -> str:
    """What failed, as the property search words it; a crash or timeout by its reason."""
    phrases = search.failure_summary([result])
    return phrases[0] if phrases else f"DCP{result.dcp_size}: {result.status} ({result.error})"


def _save_failed_case(
    scenario: Scenario, result: CaseResult, config: RunConfig, home: Path
) -> Path:
    """Save the failing case under ``home/failures/`` with the seed and DCP size it ran at,
    so ``dcpcheck repro FILE`` replays exactly it. ``OSError`` if ``home`` cannot be
    written: the caller warns and goes on (the replay command reproduces the case too)."""
    seed = scenario.seed if config.seed is None else config.seed
    case = dataclasses.replace(scenario, dcp_sizes=(result.dcp_size,), seed=seed)
    description = (
        f"Saved by dcpcheck run: kernel {config.kernel_name} fails scenario "
        f"{scenario.name} at {_failure_phrase(result)}. Replay: dcpcheck repro "
        f"<this file> --kernel {config.kernel_name}"
    )
    stem = f"{scenario.name}-{search.kernel_slug(config.kernel_name)}-dcp{result.dcp_size}"
    return search.save_failure(case, stem, description, home / search.FAILURES_DIR)


def _run_with_progress(
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


def _search_with_progress(
    kernel: KernelUnderTest, config: search.SearchConfig, backend
) -> search.SearchResult:
    """The property search with a count of examples on stderr (shrinking runs past the
    requested count, so no bar)."""
    with Progress(TextColumn("{task.description}"), console=err, transient=True) as progress:
        task = progress.add_task("property search")

        def on_example(count: int) -> None:
            progress.update(task, description=f"property search: example {count}")

        return search.search(kernel, config, backend, on_example=on_example)


def _write_reports(results, config, backend, json_path, junit_path, partial) -> None:
    """Both reports, atomically. Their paths were tried before any work, so failing now
    means the disk changed under the run (full, unmounted): one line, exit 2."""
    backend_name = "interpreter" if backend.interpreted else "cuda"
    reports = []
    if json_path is not None:
        text = report.to_json(
            results, kernel=config.kernel_name, backend=backend_name, partial=partial
        )
        reports.append((json_path, text))
    if junit_path is not None:
        reports.append(
            (junit_path, report.to_junit(results, kernel=config.kernel_name, partial=partial))
        )
    for path, text in reports:
        try:
            report.write_atomic(path, text)
        except OSError as exc:
            raise InputError(f"{path}: cannot write the report: {exc.strerror}") from None


@cli.command("hash")
@click.option(
    "--dcp",
    "dcp_text",
    default="1,4",
    show_default=True,
    metavar="N[,N...]",
    help="DCP sizes to generate at (DCP1 always runs as the baseline).",
)
@click.option(
    "--kernel",
    "kernel_name",
    default="default",
    show_default=True,
    help="The kernel under test (as for `dcpcheck run --kernel`).",
)
@click.option(
    "--prompts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Requests in the batch, of different prompt lengths.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Greedy decode steps per request (crosses block boundaries).",
)
@click.option(
    "--layout",
    "layout_name",
    type=click.Choice([c.value for c in CacheLayout]),
    default="auto",
    show_default=True,
    help="MLA cache layout of the model's caches.",
)
@click.option(
    "--preset",
    default=None,
    help="Model widths: a preset name (default: small-neox on the CPU, deepseek-v3.2 on a GPU).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Weights, prompts and cache bytes."
)
@device_option
@adapter_option
def hash_command(
    dcp_text, kernel_name, prompts, steps, layout_name, preset, seed, device, adapter
) -> None:
    """Generate greedy token streams with a tiny seeded MLA model at each DCP size and
    compare their SHA256 digests: exit 1 when any rank of any size differs from DCP1."""
    dcp_sizes = parse_dcp_sizes(dcp_text)
    backend = _backend(device)
    stream_config = hash_config(backend, layout_name, preset, prompts, steps, seed)
    kernel = _kernel(kernel_name, adapter)
    try:
        with err.status("generating token streams"):
            comparison = compare_streams(kernel, stream_config, dcp_sizes, backend.device)
    except (Exception, SystemExit) as exc:  # the kernel under test raised inside the model
        raise KernelFailed(f"the kernel raised: {type(exc).__name__}: {exc}") from exc
    print_streams(comparison)
    raise SystemExit(EXIT_OK if comparison.identical else EXIT_FAIL)


def hash_config(backend, layout_name: str, preset, prompts: int, steps: int, seed: int):
    """The `hash` options as a ``StreamConfig`` for ``backend``; bad values are exit 2."""
    try:
        return stream_config_for(
            backend,
            CacheLayout(layout_name),
            preset=preset,
            prompts=prompts,
            steps=steps,
            seed=seed,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


@cli.command("bisect")
@click.argument("kernel_spec", metavar="FILE:FUNCTION", required=False)
@click.option(
    "--repo",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("."),
    show_default=True,
    help="The git repository holding the kernel file.",
)
@click.option(
    "--file",
    "rel_file",
    default=None,
    help="The kernel file, relative to --repo (or give FILE:FUNCTION).",
)
@click.option(
    "--function",
    "function",
    default="fused_norm_rope",
    show_default=True,
    help="The kernel function in that file.",
)
@click.option("--good", required=True, help="A revision where the kernel passes.")
@click.option("--bad", default="HEAD", show_default=True, help="A revision where it fails.")
@click.option(
    "--scenario",
    "patterns",
    multiple=True,
    metavar="NAME|GLOB",
    help="Scenarios to check each revision with (default: all; a few small ones "
    "keep each step to seconds).",
)
@click.option("--dcp", "dcp_text", default=None, metavar="N[,N...]", help="DCP sizes.")
@click.option("--seed", type=int, default=None, help="Value seed override.")
@device_option
@click.option(
    "--scenario-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where scenario files live (default: the shipped ones).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds one revision's run may take.",
)
def bisect_command(
    kernel_spec,
    repo,
    rel_file,
    function,
    good,
    bad,
    patterns,
    dcp_text,
    seed,
    device,
    scenario_dir,
    timeout_s,
) -> None:
    """Find the first commit that broke a kernel file: walk its history with `git show`
    (no checkout, no rebuild), run the checks at each midpoint in a fresh process,
    and skip revisions that do not load. Exit 0 when the first bad commit is named."""
    if kernel_spec is not None:
        rel_file, _, named_function = kernel_spec.rpartition(":")
        function = named_function or function
    if not rel_file:
        raise InputError("bisect: give --file REL (or FILE:FUNCTION)")
    if dcp_text is not None:
        parse_dcp_sizes(dcp_text)
    options = bisection.RunOptions(
        scenarios=tuple(patterns),
        dcp=dcp_text,
        seed=seed,
        device=device,
        scenario_dir=scenario_dir,
        timeout_s=timeout_s,
    )
    try:
        result = bisection.bisect(repo, rel_file, good, bad, function, options)
    except bisection.BisectError as exc:
        raise InputError(str(exc)) from None
    for line in bisection.render(result):
        out.print(escape(line), soft_wrap=True)
    raise SystemExit(EXIT_OK if result.first_bad is not None else EXIT_FAIL)


@cli.command("list")
@click.argument("what", type=click.Choice(["kernels", "mutants", "scenarios"]), default="kernels")
def list_command(what: str) -> None:
    """List the registered kernels, the selftest's mutants, or the shipped scenarios."""
    if what == "mutants":
        for variant in selftest.MUTANTS:
            out.print(f"{variant.name:34} {variant.description}", soft_wrap=True)
        return
    if what == "kernels":
        from dcpcheck.kernels import KERNELS

        for entry in KERNELS.values():
            out.print(f"{entry.name:24} {entry.description}")
        return
    try:
        scenarios = load_scenarios([], SCENARIO_DIR)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None
    for s in scenarios:
        out.print(f"{s.name:32} {s.description}")


def main() -> None:
    """Entry point: click's errors become one line on stderr with their exit code.

    Under torchrun (``torchrun --nproc-per-node N -m dcpcheck run ...``) this process is
    one rank of a real-rank run: ``dcpcheck.distributed`` takes over."""
    if sys.argv[1:2] in (["run"], ["hash"]):
        from dcpcheck import distributed  # it builds its commands from this module's options

        if distributed.in_torchrun_environment():
            distributed.main(sys.argv[1:])
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        err.print(f"dcpcheck: {exc.format_message()}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        err.print(f"dcpcheck: error: {exc.format_message()}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:  # Ctrl-C / SIGTERM outside a run's cases
        how, code = _stop_reason(exc.__context__)
        err.print(f"dcpcheck: {how}", markup=False)
        sys.exit(code)


def _stop_reason(stop: BaseException | None) -> tuple[str, int]:
    """What stopped the command, as printed, and its exit code."""
    if isinstance(stop, Terminated):
        return "terminated", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED
